"""A narrow but correct kernel with a capability declaration (the README's example).

It takes fp16/bf16 only, head dims <= 128, no masks, and refuses anything else with
NotImplementedError, as many real fused kernels do. Its ``ATTENTION_ORACLE_CAPABILITIES``
tell the strategies so: every drawn example is one it runs, and the report lists what was
not verified (float32, head dims > 128, boolean and additive masks)::

    pytest --impl attention_oracle.controls.narrow:NarrowKernel attention_oracle/conformance/test_sdpa.py

``UndeclaredNarrowKernel`` is the same kernel without the declaration: most drawn examples
are refused.
"""
from __future__ import annotations

import torch

from attention_oracle import oracle


class UndeclaredNarrowKernel:
    MAX_HEAD_DIM = 128

    def __repr__(self):
        return type(self).__name__

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if query.dtype not in (torch.float16, torch.bfloat16):
            raise NotImplementedError(f"query dtype {query.dtype}: fp16/bf16 only")
        if max(query.shape[-1], value.shape[-1]) > self.MAX_HEAD_DIM:
            raise NotImplementedError(f"head dim > {self.MAX_HEAD_DIM}")
        if attn_mask is not None:
            raise NotImplementedError("attn_mask is not supported")
        return oracle.scaled_dot_product_attention(query, key, value, None, dropout_p,
                                                   is_causal, scale, enable_gqa)


class NarrowKernel(UndeclaredNarrowKernel):
    ATTENTION_ORACLE_CAPABILITIES = {
        "dtypes": ("float16", "bfloat16"),
        "max_head_dim": 128,
        "masks": ("none",),
    }
