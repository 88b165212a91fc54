"""A control with several independent bugs, each in its own output and its own class of inputs:
the suite must report every one (not only the first that shrinks) and say what each depends on
(``tests/test_triage.py``).

``ThreeBugs`` (SDPA; the numbers are the oracle's except for):

- ``out``: the last query row is scaled by 1.25 when L % 16 != 0 (a tail-tile bug);
- ``dq``: with GQA, query head h takes its gradient from kv head ``h % Hkv`` instead of
  ``h // (Hq / Hkv)`` (the classic mapping bug, in the backward only);
- ``dv``: the backward ignores a boolean mask.
"""
from __future__ import annotations

import torch

from attention_oracle.oracle.sdpa import sdpa_reference


def _modulo_heads(t: torch.Tensor, hq: int) -> torch.Tensor:
    heads = torch.arange(hq, device=t.device) % t.shape[-3]
    return t.index_select(-3, heads)


class _ThreeBugs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, kwargs):
        ctx.save_for_backward(q, k, v)
        ctx.mask, ctx.kwargs = mask, kwargs
        out = sdpa_reference(q, k, v, attn_mask=mask, **kwargs)["out"].to(q.dtype)
        if q.shape[-2] % 16 != 0:
            out[..., -1, :] *= 1.25
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        mask, kw = ctx.mask, ctx.kwargs
        ref = sdpa_reference(q, k, v, dout, attn_mask=mask, **kw)
        dq = ref["dq"]
        hq, hkv = q.shape[-3], k.shape[-3]
        if kw["enable_gqa"] and hq != hkv:
            wrong = sdpa_reference(q, _modulo_heads(k, hq), _modulo_heads(v, hq), dout, attn_mask=mask,
                                   **{**kw, "enable_gqa": False})
            dq = wrong["dq"]
        dv = ref["dv"]
        if mask is not None and mask.dtype == torch.bool:
            dv = sdpa_reference(q, k, v, dout, attn_mask=None, **kw)["dv"]
        return dq.to(q.dtype), ref["dk"].to(k.dtype), dv.to(v.dtype), None, None


class ThreeBugs:
    def __repr__(self):
        return "ThreeBugs"

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        kwargs = {"is_causal": is_causal, "scale": scale, "enable_gqa": enable_gqa}
        return _ThreeBugs.apply(query, key, value, attn_mask, kwargs)
