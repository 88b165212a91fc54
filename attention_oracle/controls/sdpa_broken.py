"""Deliberately broken SDPA implementations: each must be caught by the suite's checks.

Each is a namespace (a class instance) offering ``scaled_dot_product_attention``; any of them
can also be run through the whole suite: ``pytest --impl attention_oracle.controls.sdpa_broken:WrongScale``.
Most wrap the oracle and break one thing.
"""
from __future__ import annotations

import math

import torch

from attention_oracle import oracle
from attention_oracle.oracle.sdpa import sdpa_reference


class _Base:
    def __repr__(self):
        return type(self).__name__


class WrongScale(_Base):
    """Uses 1/E instead of 1/sqrt(E) when no scale is given, and 1.05x an explicit one."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        scale = 1.0 / query.shape[-1] if scale is None else scale * 1.05
        if scale == 1.0:  # E = 1: 1/E is the right answer; break it anyway
            scale = 0.5
        return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                   False if not is_causal else True, scale, enable_gqa)


class CausalOffByOne(_Base):
    """Causal lets query i see key i + 1 as well."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if is_causal:
            L, S = query.shape[-2], key.shape[-2]
            attn_mask = torch.ones(L, S, dtype=torch.bool, device=query.device).tril(diagonal=1)
        return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, False,
                                                   scale, enable_gqa)


class WrongGqaMapping(_Base):
    """Query head h uses kv head h % Hkv instead of h // (Hq // Hkv)."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        hq, hkv = query.shape[-3], key.shape[-3]
        if enable_gqa and hq != hkv:
            heads = torch.arange(hq, device=query.device) % hkv
            key = key.index_select(-3, heads)
            value = value.index_select(-3, heads)
        return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                   is_causal, scale, enable_gqa)


class _ExplicitBackward(torch.autograd.Function):
    """Oracle forward; backward hook ``fix_dout`` decides how dout is (mis)read."""

    @staticmethod
    def forward(ctx, q, k, v, mask, kwargs, fix_dout):
        ctx.save_for_backward(q, k, v)
        ctx.mask, ctx.kwargs, ctx.fix_dout = mask, kwargs, fix_dout
        ref = sdpa_reference(q, k, v, attn_mask=mask, **kwargs)
        return ref["out"].to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        ref = sdpa_reference(q, k, v, ctx.fix_dout(dout), attn_mask=ctx.mask, **ctx.kwargs)
        return ref["dq"].to(q.dtype), ref["dk"].to(k.dtype), ref["dv"].to(v.dtype), None, None, None


def _contiguous_misread(dout):
    """Read dout's storage as if it were contiguous (the classic strided-dout bug)."""
    if dout.is_contiguous():
        return dout
    strides, acc = [], 1
    for size in reversed(dout.shape):
        strides.insert(0, acc)
        acc *= size
    base = dout.detach()
    span = base.untyped_storage().nbytes() // base.element_size() - base.storage_offset()
    if span < acc:  # stride-0 / small buffers: read what is there, repeating it
        flat = base.as_strided((span,), (1,)).repeat(acc // max(span, 1) + 1)[:acc]
        return flat.view(dout.shape)
    return base.as_strided(dout.shape, strides)


def _modify_in_place(dout):
    if dout.stride(-1) != 0 and all(s != 0 for s in dout.stride()):
        dout.mul_(2.0)
        return dout / 2.0
    return dout


class _OracleForward(torch.autograd.Function):
    """The oracle's forward, saving what a written-out backward needs; subclasses break the backward."""

    @staticmethod
    def forward(ctx, q, k, v, mask, kwargs):
        ctx.save_for_backward(q, k, v)
        ctx.mask, ctx.kwargs = mask, kwargs
        return sdpa_reference(q, k, v, attn_mask=mask, **kwargs)["out"].to(q.dtype)


class _ForgetsKeyGradScale(_OracleForward):
    """Oracle forward; backward returns dk without the softmax scale (dS^T Q, not scale dS^T Q)."""

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        ref = sdpa_reference(q, k, v, dout, attn_mask=ctx.mask, **ctx.kwargs)
        scale = ctx.kwargs["scale"] or 1.0 / math.sqrt(q.shape[-1])
        return (ref["dq"].to(q.dtype), (ref["dk"] / scale).to(k.dtype), ref["dv"].to(v.dtype),
                None, None)


class KeyGradientMissesScale(_Base):
    """dK lacks the softmax scale factor (the forward and dq, dv are right)."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        kw = dict(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        return _ForgetsKeyGradScale.apply(query, key, value, attn_mask, kw)


class StridedDoutMisread(_Base):
    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        kw = dict(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        return _ExplicitBackward.apply(query, key, value, attn_mask, kw, _contiguous_misread)


class DoutPlanCachedByShape(_Base):
    """Models F9 (PyTorch's cuDNN backward, docs/FINDINGS.md): the backward keeps the dout strides of
    the first call per shape and reads every later dout of that shape with them."""

    def __init__(self):
        self._strides: dict = {}

    def _read_with_cached_strides(self, dout):
        cached = self._strides.setdefault(tuple(dout.shape), dout.stride())
        if cached == dout.stride():
            return dout
        flat = dout.detach().contiguous().reshape(-1)
        span = 1 + sum((n - 1) * st for n, st in zip(dout.shape, cached))
        if span > flat.numel():  # the cached layout reaches past this buffer: wrap around
            flat = flat.repeat(span // max(flat.numel(), 1) + 1)
        return flat.as_strided(dout.shape, cached)

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        kw = dict(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        return _ExplicitBackward.apply(query, key, value, attn_mask, kw,
                                       self._read_with_cached_strides)


class DoutModified(_Base):
    """Scales dout in place (and compensates), leaving the caller's dout changed."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        kw = dict(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        return _ExplicitBackward.apply(query, key, value, attn_mask, kw, _modify_in_place)


class NanOnEmptyRows(_Base):
    """Plain softmax: a fully masked row gives NaN (0/0) instead of 0."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        out = oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                  is_causal, scale, enable_gqa)
        if attn_mask is not None:
            m = attn_mask.expand(tuple(query.shape[:-1]) + (key.shape[-2],))
            takes = m if m.dtype == torch.bool else ~torch.isneginf(m)
            empty = ~takes.any(-1, keepdim=True)
            out = torch.where(empty, torch.full_like(out, float("nan")), out)
        return out


class Nondeterministic(_Base):
    """Every other call returns the output one ulp higher (an accumulation order that changes
    between calls) while declaring itself deterministic: invisible to the agreement rule,
    visible to the determinism check."""

    ATTENTION_ORACLE_CAPABILITIES = {"deterministic": True}

    def __init__(self):
        self.calls = 0

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        out = oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                  is_causal, scale, enable_gqa)
        self.calls += 1
        if self.calls % 2 == 0:
            up = torch.nextafter(out.detach(), torch.full_like(out.detach(), float("inf")))
            out = out + (up - out.detach())  # gradients flow as through out itself
        return out


class NondeterministicOnRequest(Nondeterministic):
    """The same drift, declared repeatable only under ``torch.use_deterministic_algorithms``
    (as PyTorch's backends and fast's "auto" backward are) and drifting under it too: the
    determinism check judges it under that mode and catches it."""

    ATTENTION_ORACLE_CAPABILITIES = {"deterministic_on_request": True}


class RepeatableOnRequest(Nondeterministic):
    """Not a control: the drift only while ``torch.use_deterministic_algorithms`` is off, as
    declared. The determinism check must pass it (the positive beside
    ``NondeterministicOnRequest``)."""

    ATTENTION_ORACLE_CAPABILITIES = {"deterministic_on_request": True}

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if torch.are_deterministic_algorithms_enabled():
            return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                       is_causal, scale, enable_gqa)
        return super().scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                    is_causal, scale, enable_gqa)


class Rank3ScaleHalved(_Base):
    """Rank-3 inputs (with N, L > 1) get half the scale; rank 4 is right."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if query.dim() == 3 and query.shape[0] > 1 and query.shape[1] > 1:
            scale = (1.0 / math.sqrt(query.shape[-1]) if scale is None else scale) * 0.5
        return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                   is_causal, scale, enable_gqa)


def _as_if_contiguous(t):
    """The storage read from the view's start with contiguous strides (ignores the strides)."""
    if t.is_contiguous():
        return t
    n = t.numel()
    flat = torch.as_strided(t.detach(), (n,), (1,))
    return flat.reshape(t.shape).requires_grad_(t.requires_grad)


class InputsAssumedContiguous(_Base):
    """Reads q, k, v as if contiguous (a kernel that ignores the strides it is given)."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        return oracle.scaled_dot_product_attention(_as_if_contiguous(query), _as_if_contiguous(key),
                                                   _as_if_contiguous(value), attn_mask, dropout_p,
                                                   is_causal, scale, enable_gqa)


class ValueRowsUnchecked(_Base):
    """Takes S from the key and reads only that many value rows, whatever value's shape."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        return oracle.scaled_dot_product_attention(query, key, value[..., :key.shape[-2], :],
                                                   attn_mask, dropout_p, is_causal, scale, enable_gqa)


CONTROLS = {
    # control -> the check that must catch it
    "WrongScale": "forward_agreement",
    "CausalOffByOne": "forward_agreement",
    "WrongGqaMapping": "forward_agreement",
    "StridedDoutMisread": "strided_dout",
    "DoutModified": "strided_dout",
    "DoutPlanCachedByShape": "strided_dout",
    "NanOnEmptyRows": "fully_masked_rows",
    "Nondeterministic": "determinism",
    "NondeterministicOnRequest": "determinism",
    "Rank3ScaleHalved": "rank3_equals_rank4",
    "InputsAssumedContiguous": "misaligned_inputs",
    "KeyGradientMissesScale": "gradient_agreement",
    "ValueRowsUnchecked": "mismatched_value_rows",
}


class RefusesEverything(_Base):
    """Offers SDPA but raises NotImplementedError for every input: verifies nothing."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        raise NotImplementedError("refuses everything")


class UnwrittenRows(_Base):
    """Allocates its output with ``torch.empty`` and never writes the last query row (a grid
    that misses the tail tile); every other element is right. The checks catch it because they
    poison new tensors (``run/poison.py``): the row reads NaN. Unpoisoned, it
    holds whatever the allocator left there, often zeros, and may pass."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        ref = oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                  is_causal, scale, enable_gqa)
        out = torch.empty(ref.shape, dtype=ref.dtype, device=ref.device)
        written = max(ref.shape[-2] - 1, 0)
        out[..., :written, :] = ref[..., :written, :]
        if ref.requires_grad and not out.requires_grad:  # L = 1: nothing written, keep autograd's graph
            out = out + 0 * ref
        return out


CONTROLS["UnwrittenRows"] = "forward_agreement"


# ----------------------------------------------------------------------------- value regimes


class FiniteMinReadAsMasked(_Base):
    """Treats a very negative finite bias (<= -1e4: ``finfo(dtype).min`` padding, -1e4) as -inf:
    a row whose every key holds it comes out as a fully masked row (0) instead of its softmax."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            attn_mask = attn_mask.masked_fill(attn_mask <= -1e4, float("-inf"))
        return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                   is_causal, scale, enable_gqa)


FP32_EXP_UNDERFLOW = -87.3  # log of float32's smallest normal: exp() of less is 0 (or subnormal)


class _UnstableBackward(_OracleForward):
    """Oracle forward; the backward recomputes P as exp(s) / exp(lse) in float32, without
    subtracting lse first: a row whose lse is below float32's exp range gives 0/0 = NaN."""

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        ref = sdpa_reference(q, k, v, dout, attn_mask=ctx.mask, **ctx.kwargs)
        under = (ref["lse"] < FP32_EXP_UNDERFLOW) & torch.isfinite(ref["lse"])
        dq, dk, dv = ref["dq"], ref["dk"], ref["dv"]
        if bool(under.any()):
            dq = dq.masked_fill(under[..., None], float("nan"))
            dk, dv = torch.full_like(dk, float("nan")), torch.full_like(dv, float("nan"))
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


class NanGradientOnUnderflowingRows(_Base):
    """Right forward; NaN gradients where a row's lse < -87.3 (every key biased far down)."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        kw = dict(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        return _UnstableBackward.apply(query, key, value, attn_mask, kw)


TILE_EDGE = 64


class KeyDroppedAtTileEdge(_Base):
    """Key 64 (the first key of the second 64-key tile) never takes part: a tile loop that
    skips the first key of every tile after the first, seen only when S > 64."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        L, S = query.shape[-2], key.shape[-2]
        if S > TILE_EDGE:
            keep = torch.ones(L, S, dtype=torch.bool, device=query.device)
            keep[:, TILE_EDGE] = False
            if is_causal:
                keep &= torch.ones_like(keep).tril()
                is_causal = False
            if attn_mask is None or attn_mask.dtype == torch.bool:
                attn_mask = keep if attn_mask is None else attn_mask & keep
            else:
                attn_mask = attn_mask.masked_fill(~keep, float("-inf"))
        return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                   is_causal, scale, enable_gqa)


class NonzeroOnEmptyRows(_Base):
    """A fully masked row attends to every key instead of giving 0 (cuDNN's F2): its out and
    gradients are those of an unmasked row."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None:
            m = attn_mask.expand(tuple(query.shape[:-1]) + (key.shape[-2],))
            takes = m if m.dtype == torch.bool else ~torch.isneginf(m)
            empty = ~takes.any(-1, keepdim=True)
            attn_mask = m | empty if m.dtype == torch.bool else m.masked_fill(empty, 0.0)
        return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                   is_causal, scale, enable_gqa)


CONTROLS.update({
    "NonzeroOnEmptyRows": "fully_masked_rows",
    "FiniteMinReadAsMasked": "forward_agreement",
    "NanGradientOnUnderflowingRows": "gradient_agreement",
    "KeyDroppedAtTileEdge": "forward_agreement",
})


# ----------------------------------------------------------------------------- bugs at an intersection of conditions
# Each needs two or three conditions at once (a length class, a mask kind, a value regime):
# random draws rarely meet them together; the covering grid (``run/grid.py``) does.

TAIL_TILE = 64


class LastKeyDroppedAtTailTile(_Base):
    """When S % 64 == 63, without a mask and not causal, the last key never takes part (a tail
    tile one key short)."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        L, S = query.shape[-2], key.shape[-2]
        if S % TAIL_TILE == TAIL_TILE - 1 and attn_mask is None and not is_causal:
            attn_mask = torch.ones(L, S, dtype=torch.bool, device=query.device)
            attn_mask[:, S - 1] = False
        return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                   is_causal, scale, enable_gqa)


class _HalfTileUnstableBackward(_OracleForward):
    """Oracle forward; when L % 128 == 64 the backward's dq is NaN on rows whose lse is below
    float32's exp range (P recomputed as exp(s) / exp(lse) in one half-filled query tile)."""

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        ref = sdpa_reference(q, k, v, dout, attn_mask=ctx.mask, **ctx.kwargs)
        dq = ref["dq"]
        if q.shape[-2] % (2 * TAIL_TILE) == TAIL_TILE:
            under = (ref["lse"] < FP32_EXP_UNDERFLOW) & torch.isfinite(ref["lse"])
            dq = dq.masked_fill(under[..., None], float("nan"))
        return dq.to(q.dtype), ref["dk"].to(k.dtype), ref["dv"].to(v.dtype), None, None


class NanDqOnUnderflowAtHalfTile(_Base):
    """Right forward; dq NaN only when L % 128 == 64, on rows whose lse is below -87.3."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        kw = dict(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        return _HalfTileUnstableBackward.apply(query, key, value, attn_mask, kw)


CONTROLS.update({
    "LastKeyDroppedAtTailTile": "forward_agreement",
    "NanDqOnUnderflowAtHalfTile": "gradient_agreement",
})


class BroadcastMaskFirstBatch(_Base):
    """A mask with one head ([*batch, 1, L, S] or a key-padding [*batch, 1, 1, S]) is read for
    the first batch entry only: every sequence gets sequence 0's padding (a kernel that takes
    the mask's batch stride as 0 whenever its head stride is)."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None and attn_mask.dim() >= 4 and attn_mask.shape[-3] == 1:
            attn_mask = attn_mask[tuple(slice(0, 1) for _ in attn_mask.shape[:-3])]
        return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                   is_causal, scale, enable_gqa)


CONTROLS["BroadcastMaskFirstBatch"] = "forward_agreement"
