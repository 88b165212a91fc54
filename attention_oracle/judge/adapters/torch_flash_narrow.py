"""PyTorch's FLASH_ATTENTION backend alone, declared as the narrow kernel it is.

A real narrow kernel under test: ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)`` and
nothing else, with a capability declaration (README, "Capability declaration";
``judge/capabilities.py``) saying what PyTorch's flash path takes, so that the
strategies spend the example budget on calls it runs::

    attention-oracle check --impl attention_oracle.judge.adapters.torch_flash_narrow:NarrowFlash \
        --hypothesis-profile gpu --oracle-report narrow.json

What PyTorch's CUDA flash backend takes (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``,
``can_use_flash_attention``), and how it is declared:

- fp16 and bf16 only: ``dtypes``;
- head dims up to 256 (multiples of 8 declared: smaller multiples are padded inside the call):
  ``head_dims``;
- no ``attn_mask`` (only ``is_causal``): ``masks = ("none",)``, ``causal = "allowed"``;
- rank-4 inputs ([B, H, L, E]; rank 3 goes to MATH or is refused): ``ranks = (4,)``;
- GQA (``enable_gqa``) is supported by flash: ``gqa = True``;
- strided views with a unit last stride: ``contiguous``, ``transposed``, ``sliced``; the
  odd-aligned ``misaligned`` layout is left out (PyTorch's fused CUDA backends fail on it:
  a known failure of the whole check).

- q, k and v share one head dim: ``same_head_dims``;
- ``is_causal`` only with ``L == S`` (FlashAttention-2 aligns a non-square causal mask
  bottom-right, PyTorch's contract top-left, so PyTorch refuses the call): ``causal_square``.

``benchmarks/h200_calibration.sh`` prints the refused and judged counts of a run.

Refusals ("No available kernel") become NotImplementedError (``torch_sdpa.TorchSDPA``); any
other exception is a failure. On the CPU the flash backend also runs (fp16 and bf16 included,
torch 2.14), with its own constraints (it takes masks, refuses ``E != Ev``).
"""
from __future__ import annotations

from attention_oracle.judge.adapters.torch_sdpa import TorchSDPA

MAX_HEAD_DIM = 256
HEAD_DIMS = tuple(range(8, MAX_HEAD_DIM + 1, 8))

CAPABILITIES = {
    "dtypes": ("float16", "bfloat16"),
    "head_dims": HEAD_DIMS,
    "max_head_dim": MAX_HEAD_DIM,
    "masks": ("none",),
    "causal": "allowed",
    "causal_square": True,
    "same_head_dims": True,
    "ranks": (4,),
    "gqa": True,
    "layouts": ("contiguous", "transposed", "sliced"),
}


class NarrowFlash(TorchSDPA):
    """``scaled_dot_product_attention`` through PyTorch's FLASH_ATTENTION backend only."""

    ATTENTION_ORACLE_CAPABILITIES = CAPABILITIES

    def __init__(self):
        super().__init__("flash")

    def __repr__(self):
        return "NarrowFlash()"
