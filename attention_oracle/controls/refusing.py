"""Controls of what a run verifies: refusals and capability declarations.

``RefusesAllButOne`` offers SDPA but raises NotImplementedError for every input except one
trivial shape (rank 4, one head, L = S = 1, E = Ev = 8, fp32, no mask, not causal) and declares
nothing: a check whose every example it refused verified nothing, and the run must fail.

``NarrowFp32`` takes fp32 only, no mask, no is_causal, head dims <= 64, and declares exactly
that; outside it, it returns a wrong result (the output of a kernel fed inputs it was never
built for), not a refusal. ``UndeclaredNarrowFp32`` is the same kernel without the declaration:
every case the regression corpus replays outside the declaration fails on it, and none may fail
on ``NarrowFp32``.
"""
from __future__ import annotations

import torch

from attention_oracle import oracle


def _oracle(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                               scale, enable_gqa)


class RefusesAllButOne:
    """Refuses every SDPA input but ``[1, 1, 1, 8]`` fp32 q, k, v without mask or causal."""

    def __repr__(self):
        return type(self).__name__

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        trivial = (query.dtype == torch.float32 and attn_mask is None and not is_causal
                   and all(tuple(t.shape) == (1, 1, 1, 8) for t in (query, key, value)))
        if not trivial:
            raise NotImplementedError("only [1, 1, 1, 8] fp32 inputs without mask or causal")
        return _oracle(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


class UndeclaredNarrowFp32:
    """Right for fp32, unmasked, non-causal calls with head dims <= 64; wrong (scaled by 1.5)
    for anything else."""

    MAX_HEAD_DIM = 64

    def __repr__(self):
        return type(self).__name__

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        out = _oracle(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        inside = (query.dtype == torch.float32 and attn_mask is None and not is_causal
                  and max(query.shape[-1], value.shape[-1]) <= self.MAX_HEAD_DIM)
        return out if inside else out * 1.5


class NarrowFp32(UndeclaredNarrowFp32):
    ATTENTION_ORACLE_CAPABILITIES = {
        "dtypes": ("float32",),
        "max_head_dim": 64,
        "masks": ("none",),
        "causal": "never",
    }
