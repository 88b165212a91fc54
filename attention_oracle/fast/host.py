"""Host-side helpers for the launchers: integer arithmetic, the device check and the process-wide
options (the device a launch runs on is :mod:`fast.launch`'s: the tensors travel there, not here).

Plain Python on purpose: ``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr
functions whose call wrapper costs a few microseconds per call on the host, and a launch
computes several of them.
"""
import os


def cdiv(a, b):
    """ceil(a / b) for non-negative ints."""
    return -(-a // b)


def next_pow2(n):
    """Smallest power of two >= n (1 for n <= 1)."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def slot_offsets_pass_int32(rows):
    """Whether a [T, K] index tensor's in-row offsets, slot * stride, can pass 2**31: the DSA
    and index-preparation kernels form them in int32 (docs/FINDINGS.md F35)."""
    K = rows.shape[1]
    return K > 1 and (K - 1) * abs(rows.stride(1)) >= 2 ** 31 - 1


# Triton chooses its interpreter when a kernel is defined (at import), so this is read once too:
# the environment lookup would be ~0.7 us of every call
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_KERNEL_DEVICE = "cpu" if _INTERPRETING else "cuda"


def check_device(device):
    """Refuse (NotImplementedError) a device the kernels cannot run on: CUDA natively, the CPU
    only under Triton's interpreter (``TRITON_INTERPRET=1`` when fast was imported)."""
    if device.type == _KERNEL_DEVICE:
        return
    need = "the CPU (TRITON_INTERPRET=1 is set)" if _INTERPRETING else (
        "a CUDA device (Triton runs on CUDA; set TRITON_INTERPRET=1 for the CPU)")
    raise NotImplementedError(f"tensors on {device}: fast's kernels need {need}")


# the largest |scale| the kernels take: they get scale and scale * log2(e) as float32 arguments
MAX_SCALE = 3.4028234663852886e38 / 1.4426950408889634  # float32's largest / log2(e)


def check_scale(name, scale):
    """Refuse (NotImplementedError naming ``name``) a scale the kernels would receive as inf:
    |scale| past :data:`MAX_SCALE` (docs/FINDINGS.md F44, F54)."""
    if abs(scale) > MAX_SCALE:
        raise NotImplementedError(f"{name} {scale:g} is beyond fast's float32 kernels "
                                  f"(|{name}| <= {MAX_SCALE:.6g})")


class Choice:
    """A process-wide option among ``choices``: ``$ENV`` at import (else ``default``), changed
    by :meth:`set`. A bad value raises ``ValueError`` naming the variable or the argument."""

    def __init__(self, env, choices, default):
        self.choices = tuple(choices)
        self.value = os.environ.get(env, default)
        if self.value not in self.choices:
            raise ValueError(f"{env} must be one of {self.choices}, got {self.value!r}")

    def set(self, value):
        """Make ``value`` the option of later calls; returns the previous one."""
        if value not in self.choices:
            raise ValueError(f"mode must be one of {self.choices}, got {value!r}")
        previous, self.value = self.value, value
        return previous


def _scratch(size, alignment, stream):
    import torch
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_scratch_allocator():
    """Give Triton an allocator (torch's caching one, on the current device) for the global
    scratch of kernels that build tensor descriptors on the device, where this thread has none:
    Triton keeps it per thread, and autograd runs the backward on a thread of its own."""
    import triton
    from triton.runtime import _allocation
    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_scratch)
