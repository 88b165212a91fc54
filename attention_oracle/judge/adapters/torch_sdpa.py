"""PyTorch's SDPA as an implementation under test: default dispatch or one forced backend.

A forced backend that cannot take an input makes PyTorch raise "No available kernel"
(with the reasons as warnings); the adapter translates that refusal into
NotImplementedError. Every other exception passes through as a failure.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


REFUSALS = ("No available kernel", "No viable backend")


def refused(exc: RuntimeError) -> bool:
    """PyTorch's own way of saying a forced backend cannot take this input."""
    return any(r in str(exc) for r in REFUSALS)


class TorchSDPA:
    """Namespace offering ``scaled_dot_product_attention`` through one backend (None: default)."""

    def __init__(self, backend: str | None = None):
        self.backend = backend

    def __repr__(self):
        return f"TorchSDPA({self.backend or 'default'})"

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if self.backend is None:
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                                  dropout_p=dropout_p, is_causal=is_causal,
                                                  scale=scale, enable_gqa=enable_gqa)
        try:
            with sdpa_kernel([BACKENDS[self.backend]]), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                                      dropout_p=dropout_p, is_causal=is_causal,
                                                      scale=scale, enable_gqa=enable_gqa)
        except RuntimeError as exc:
            if refused(exc):
                raise NotImplementedError(f"torch {self.backend} backend refused: {exc}") from exc
            raise


_HEAD_DIMS_8 = tuple(range(8, 257, 8))  # multiples of 8 up to 256
_FUSED_LAYOUTS = ("contiguous", "transposed", "sliced")  # 16-byte aligned (F1: misaligned faults)

# What each forced backend takes, per device type, as a capability declaration
# (judge/capabilities.py), so that the strategies draw inside it. From PyTorch's selectors
# (aten/src/ATen/native/transformers/{cuda/sdp_utils.cpp, sdp_utils_cpp.cpp}) and, on the CPU,
# measured (torch 2.14.1: FLASH refuses rank 5 and E != Ev, takes masks, causal L != S, GQA).
# The CUDA declarations are the conservative side of those rules: what they leave out is listed
# in the report as not verified.
LIMITS = {
    ("math", "cpu"): {},
    ("math", "cuda"): {},
    ("flash", "cpu"): {"ranks": (3, 4), "same_head_dims": True},
    # FlashAttention-2: fp16/bf16, head dim <= 256, no attn_mask, is_causal only top-left square
    ("flash", "cuda"): {"dtypes": ("float16", "bfloat16"), "head_dims": _HEAD_DIMS_8,
                        "max_head_dim": 256, "masks": ("none",), "causal_square": True,
                        "same_head_dims": True, "ranks": (4,), "gqa": True,
                        "layouts": _FUSED_LAYOUTS},
    # EFFICIENT (xformers' cutlass kernels): every dtype, masks, head dims a multiple of 16
    # bytes' worth of elements (8 covers fp32's 4 and 16-bit's 8), E != Ev; no enable_gqa
    ("efficient", "cuda"): {"head_dims": _HEAD_DIMS_8, "max_head_dim": 256, "ranks": (4,),
                            "gqa": False, "layouts": _FUSED_LAYOUTS},
    # cuDNN: fp16/bf16, head dims a multiple of 8 up to 128, is_causal only with L == S (its
    # non-square causal mask is bottom-right, PyTorch's top-left)
    ("cudnn", "cuda"): {"dtypes": ("float16", "bfloat16"), "head_dims": _HEAD_DIMS_8[:16],
                        "max_head_dim": 128, "causal_square": True, "same_head_dims": True,
                        "ranks": (4,), "gqa": False, "layouts": _FUSED_LAYOUTS},
}


def limits(backend: str | None, device_type: str) -> dict:
    """The capability declaration of a forced backend on a device type ({} for the default
    dispatch, which falls back to MATH, and for a backend not listed)."""
    return dict(LIMITS.get((backend, device_type), {})) if backend else {}


def backend_available(backend: str, device: torch.device) -> tuple[bool, str]:
    """Whether a forced backend exists on this device at all (not whether it takes a given input)."""
    if backend == "math":
        return True, ""
    if device.type == "cpu":
        if backend == "flash":
            return True, ""
        return False, f"the {backend} backend runs on CUDA only"
    if backend == "cudnn" and not torch.backends.cudnn.is_available():
        return False, "cuDNN is not available"
    return True, ""
