"""FlexAttention (``torch.nn.attention.flex_attention``) behind PyTorch's SDPA signature.

Masks become a ``score_mod`` (bool: -inf where False; float: added), causal a score_mod too.
On CUDA the call goes through ``torch.compile`` (the fused Triton kernel users run); on the
CPU flex runs its eager reference. flex takes rank-4 inputs only: other ranks are refused.
"""
from __future__ import annotations

import functools
import warnings

import torch


@functools.lru_cache(maxsize=1)
def _flex(compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, dynamic=False) if compiled else flex_attention


class TorchFlex:
    def __repr__(self):
        return "TorchFlex()"

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if query.dim() != 4:
            raise NotImplementedError(f"flex_attention takes rank-4 inputs only, got rank {query.dim()}")
        if dropout_p != 0.0:
            raise NotImplementedError("flex_attention has no dropout")
        if query.dtype == torch.float64:
            raise NotImplementedError("float64 is not a flex_attention target here")
        score_mod = None
        if attn_mask is not None:
            b, h, l, _ = query.shape
            mask = attn_mask.expand(b, h, l, key.shape[-2])
            if mask.dtype == torch.bool:
                def score_mod(score, bi, hi, qi, ki):
                    return torch.where(mask[bi, hi, qi, ki], score, -float("inf"))
            else:
                def score_mod(score, bi, hi, qi, ki):
                    return score + mask[bi, hi, qi, ki].to(score.dtype)
        elif is_causal:
            def score_mod(score, bi, hi, qi, ki):
                return torch.where(ki <= qi, score, -float("inf"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                return _flex(query.is_cuda)(query, key, value, score_mod=score_mod, scale=scale,
                                            enable_gqa=enable_gqa)
            except Exception as exc:
                refusal = _refusal(exc)
                if refusal is None:
                    raise
                raise NotImplementedError(f"flex_attention refused: {refusal}") from exc


def _refusal(exc: BaseException) -> str | None:
    """flex's own "not implemented" (e.g. "NYI: embedding dimension ... must be at least 16"),
    which under torch.compile arrives wrapped in InductorError(LoweringException(...)): the
    library refusing an input, not a wrong result. Any other exception is not a refusal."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NotImplementedError):
            return str(exc).strip().splitlines()[0][:200]
        inner = getattr(exc, "inner_exception", None)
        exc = inner if inner is not None else (exc.__cause__ or exc.__context__)
    return None
