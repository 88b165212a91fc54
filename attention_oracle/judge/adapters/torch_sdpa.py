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
