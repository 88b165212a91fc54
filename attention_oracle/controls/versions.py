"""Implementations that keep to the agreement rule but are worse than an earlier version: what
``--baseline`` exists to catch (``tests/test_baseline.py``).

``InputDtypeMath`` is SDPA computed in the input dtype instead of float64: the naive algorithm
(scores, softmax, P.V, each rounded to the dtype). The rule accepts it by construction (its error
is the rule's own lp term, so its ratio stays below 1/k = 0.5), yet against the oracle (float64,
rounded once: a ratio of at most 1/4, since no result in the dtype is nearer the gold than its
rounding) its worst error ratio grows about 2x or more: the signature of a kernel version that
dropped fp32 accumulation, which a pass/fail verdict alone does not show. (Not everywhere: on
the covering grid's bf16 cases with scores near 1e4 and a row-bias mask it fails
forward_agreement, ratio 19 to 253 measured on the CPU, so a baseline run names that check
newly failing and strided_dout grown ~3x.)

``AmplifiedError`` (``AmplifiedError5``: factor 5) is the oracle with its rounding error made
``factor`` times larger: each output (and gradient) element is gold + factor x (rounded gold -
gold), rounded to the dtype. Its error on a case is about ``factor`` times the oracle's on that
case, and stays inside the rule where the oracle's worst ratio is below 1/``factor`` (the oracle
keeps to at most 1/4 of the bound, commonly ~0.1): the version ``--baseline`` must name as a
regression on the same cases although every test passes.

``NarrowOracle``, ``NarrowAmplifiedError5`` and ``NarrowAmplifiedError1000`` are versions of one
kernel with a narrow declaration (fp32, no mask, not causal, head dims <= 64, small problems: a
covering grid of a few rows, ``tests/run/test_baseline.py``): v1, a v2 still inside the rule, a v3 that fails it.
"""
from __future__ import annotations

import torch

from attention_oracle.oracle.sdpa import scaled_dot_product_attention, sdpa_reference


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


def _amplified(gold: torch.Tensor, dtype: torch.dtype, factor: float) -> torch.Tensor:
    """gold (float64) + factor x (its rounding to ``dtype`` - gold), rounded to ``dtype``."""
    return (gold + factor * (gold.to(dtype).to(torch.float64) - gold)).to(dtype)


class _Amplified(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, kwargs, factor):
        ctx.save_for_backward(q, k, v)
        ctx.mask, ctx.kwargs, ctx.factor = mask, kwargs, factor
        return _amplified(sdpa_reference(q, k, v, attn_mask=mask, **kwargs)["out"], q.dtype, factor)

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        ref = sdpa_reference(q, k, v, dout, attn_mask=ctx.mask, **ctx.kwargs)
        return (*(_amplified(ref[g], t.dtype, ctx.factor) for g, t in zip(("dq", "dk", "dv"), (q, k, v))),
                None, None, None)


class AmplifiedError:
    """SDPA (forward and backward) whose every element errs ``factor`` times the oracle's rounding."""

    def __init__(self, factor: float = 5.0):
        if not factor >= 1.0:
            raise ValueError(f"factor must be >= 1, got {factor!r}")
        self.factor = float(factor)

    def __repr__(self):
        return f"AmplifiedError({self.factor:g})"

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if dropout_p:
            raise NotImplementedError("dropout_p")
        kwargs = {"is_causal": is_causal, "scale": scale, "enable_gqa": enable_gqa}
        return _Amplified.apply(query, key, value, attn_mask, kwargs, self.factor)


AmplifiedError5 = AmplifiedError(5.0)


# small problems only (size "interpreted", as a kernel under Triton's CPU interpreter declares)
NARROW = {"dtypes": ("float32",), "max_head_dim": 64, "masks": ("none",), "causal": "never",
          "size": "interpreted"}


class NarrowOracle:
    """v1: the oracle (float64, rounded once), declaring ``NARROW``."""

    ATTENTION_ORACLE_CAPABILITIES = NARROW

    def __repr__(self):
        return "NarrowOracle"

    def scaled_dot_product_attention(self, *args, **kwargs):
        return scaled_dot_product_attention(*args, **kwargs)


class NarrowAmplified(AmplifiedError):
    """v2: the same declaration, every element erring ``factor`` times the oracle's rounding."""

    ATTENTION_ORACLE_CAPABILITIES = NARROW

    def __repr__(self):
        return f"NarrowAmplified({self.factor:g})"


NarrowAmplifiedError5 = NarrowAmplified(5.0)  # inside the rule: a regression on the same cases
NarrowAmplifiedError1000 = NarrowAmplified(1000.0)  # outside it: a newly failing check
