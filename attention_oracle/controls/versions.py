"""Implementations that keep to the agreement rule but are worse than an earlier version: what
``--baseline`` exists to catch (``tests/test_baseline.py``).

``InputDtypeMath`` is SDPA computed in the input dtype instead of float64: the naive algorithm
(scores, softmax, P.V, each rounded to the dtype). The rule accepts it by construction (its error
is the rule's own lp term, so its ratio stays below 1/k = 0.5), yet against the oracle (float64,
rounded once: a ratio of at most 1/4, since no result in the dtype is nearer the gold than its
rounding) its worst error ratio grows about 2x or more: the signature of a kernel version that
dropped fp32 accumulation, which a pass/fail verdict alone does not show.
"""
from __future__ import annotations

import torch

from attention_oracle.oracle.sdpa import sdpa_reference


class _InDtype(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, kwargs):
        ctx.save_for_backward(q, k, v)
        ctx.mask, ctx.kwargs = mask, kwargs
        return sdpa_reference(q, k, v, attn_mask=mask, compute_dtype=q.dtype, **kwargs)["out"]

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        ref = sdpa_reference(q, k, v, dout, attn_mask=ctx.mask, compute_dtype=q.dtype, **ctx.kwargs)
        return ref["dq"], ref["dk"], ref["dv"], None, None


class InputDtypeMath:
    def __repr__(self):
        return "InputDtypeMath"

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if dropout_p:
            raise NotImplementedError("dropout_p")
        kwargs = {"is_causal": is_causal, "scale": scale, "enable_gqa": enable_gqa}
        return _InDtype.apply(query, key, value, attn_mask, kwargs)
