"""Host-side helpers for the launchers: integer arithmetic and the device check.

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


def check_device(device):
    """Refuse (NotImplementedError) a device the kernels cannot run on: CUDA natively, the CPU
    only under Triton's interpreter (``TRITON_INTERPRET=1``)."""
    interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if device.type == ("cpu" if interpreting else "cuda"):
        return
    need = "the CPU (TRITON_INTERPRET=1 is set)" if interpreting else (
        "a CUDA device (Triton runs on CUDA; set TRITON_INTERPRET=1 for the CPU)")
    raise NotImplementedError(f"tensors on {device}: fast's kernels need {need}")
