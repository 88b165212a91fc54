"""Deliberately broken DSA implementations: each must be caught by the DSA checks.

Each is a namespace (a class instance) offering the four DSA functions and
``offset_gather_kv_indices``; run any of them through the suite with
``pytest --impl attention_oracle.controls.dsa_broken:LseBase2``. They wrap the oracle and break one thing.
"""
from __future__ import annotations

import math

import torch

import attention_oracle.oracle.dsa as dsa
from attention_oracle.controls.index_broken import CausalUnseenRowsSeeKeyZero as _UnseenRowsIndex
from attention_oracle.controls.index_broken import DocumentLeak as _LeakyIndex
from attention_oracle.controls.index_broken import read_as_contiguous, slice_end_lengths
from attention_oracle.oracle.dsa import dsa_reference, without_duplicates
from attention_oracle.oracle.index import offset_gather_kv_indices

CONTROLS = {
    # control -> the DSA check that must catch it (RoPE cases unless noted in the test)
    "LseBase2": "forward_agreement",
    "NanOnEmptyRows": "empty_rows",
    "MinusOneReadAsRowZero": "forward_agreement",
    "DuplicatesCollapsed": "duplicates_counted",
    "TopkLengthIgnored": "forward_agreement",
    "DocumentLeak": "varlen_isolation",
    "DoutAssumedContiguous": "strided_dout",
    "GradientsForInvalidSlots": "gradient_agreement",
    "DoutModified": "strided_dout",
}

# Further (control, check) pairs: every DSA check has a control it must catch.
MORE_CONTROLS = [
    ("GradientsForInvalidSlots", "chunked_backward"),
    ("DocumentLeak", "varlen_agreement"),
    ("TopkLengthOffByOne", "forward_agreement"),
    ("MinusOneReadAsRowZero", "misaligned_inputs"),
]


def _valid(indices, topk_length, S):
    valid = (indices >= 0) & (indices < S)
    if topk_length is not None:
        K = indices.shape[1]
        valid &= torch.arange(K, device=indices.device)[None, :] < topk_length.to(torch.int64)[:, None]
    return valid


class _Base:
    """The oracle, with the varlen forms built from this class's own index preparation."""

    def __repr__(self):
        return type(self).__name__

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, softmax_scale,
               return_lse):
        kw = dict(topk_length=topk_length, softmax_scale=softmax_scale, return_lse=return_lse)
        if q_rope is None:
            return dsa.dsa_sparse_attention_nope(q_latent, kv_latent, indices, **kw)
        return dsa.dsa_sparse_attention(q_latent, q_rope, kv_latent, k_rope, indices, **kw)

    def offset_gather_kv_indices(self, *args, **kwargs):
        return offset_gather_kv_indices(*args, **kwargs)

    def dsa_sparse_attention_nope(self, q, kv, indices, *, topk_length=None, softmax_scale=None,
                                  return_lse=False):
        return self.attend(q, None, kv, None, indices, topk_length, softmax_scale, return_lse)

    def dsa_sparse_attention(self, q_latent, q_rope, kv_latent, k_rope, indices, *, topk_length=None,
                             softmax_scale=None, return_lse=False):
        return self.attend(q_latent, q_rope, kv_latent, k_rope, indices, topk_length, softmax_scale,
                           return_lse)

    def _varlen(self, ql, qr, kv, kr, gather, cu_q, cu_k, causal, topk_length, softmax_scale,
                return_lse):
        rows = self.offset_gather_kv_indices(gather, cu_q, cu_k, causal=causal, topk_length=topk_length)
        return self.attend(ql, qr, kv, kr, rows, None, softmax_scale, return_lse)

    def dsa_sparse_attention_nope_varlen(self, q, kv, gather_kv_indices, cu_seqlens_q, cu_seqlens_k,
                                         max_seqlen_q=None, max_seqlen_k=None, *, causal=False,
                                         topk_length=None, softmax_scale=None, return_lse=False):
        return self._varlen(q, None, kv, None, gather_kv_indices, cu_seqlens_q, cu_seqlens_k, causal,
                            topk_length, softmax_scale, return_lse)

    def dsa_sparse_attention_varlen(self, q_latent, q_rope, kv_latent, k_rope, gather_kv_indices,
                                    cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                                    *, causal=False, topk_length=None, softmax_scale=None,
                                    return_lse=False):
        return self._varlen(q_latent, q_rope, kv_latent, k_rope, gather_kv_indices, cu_seqlens_q,
                            cu_seqlens_k, causal, topk_length, softmax_scale, return_lse)


class LseBase2(_Base):
    """Returns lse in base 2."""

    def attend(self, *args):
        result = super().attend(*args)
        if not args[-1]:
            return result
        return result[0], result[1] / math.log(2.0)


class NanOnEmptyRows(_Base):
    """out (and lse) NaN on rows without a valid slot (0/0 of a naive softmax)."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, scale, return_lse):
        out, lse = super().attend(q_latent, q_rope, kv_latent, k_rope, indices, topk_length, scale, True)
        S = kv_latent.shape[0]
        empty = ~_valid(indices, topk_length, S).any(dim=1)
        out = torch.where(empty[:, None, None], torch.full_like(out, float("nan")), out)
        lse = torch.where(empty[:, None], torch.full_like(lse, float("nan")), lse)
        return (out, lse) if return_lse else out


class MinusOneReadAsRowZero(_Base):
    """A -1 slot reads key row 0 instead of being skipped."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, *rest):
        return super().attend(q_latent, q_rope, kv_latent, k_rope,
                              torch.where(indices == -1, 0, indices), *rest)


class DuplicatesCollapsed(_Base):
    """A repeated valid index counts once (later slots naming it become holes)."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, *rest):
        once, _ = without_duplicates(indices, _valid(indices, topk_length, kv_latent.shape[0]))
        return super().attend(q_latent, q_rope, kv_latent, k_rope, once, topk_length, *rest)


class TopkLengthIgnored(_Base):
    """Every slot up to K is used whatever topk_length says."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, *rest):
        return super().attend(q_latent, q_rope, kv_latent, k_rope, indices, None, *rest)


class TopkLengthOffByOne(_Base):
    """Slot s is used only while s < topk_length - 1: the last slot of every cut row is lost."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, *rest):
        if topk_length is not None:
            topk_length = (topk_length - 1).clamp(min=0)
        return super().attend(q_latent, q_rope, kv_latent, k_rope, indices, topk_length, *rest)


class DocumentLeak(_Base):
    """Varlen index preparation keeps local index seqlen_k: the next document's first key."""

    def offset_gather_kv_indices(self, *args, **kwargs):
        return _LeakyIndex().offset_gather_kv_indices(*args, **kwargs)


# ----------------------------------------------------------------------------- broken backward


class _Explicit(torch.autograd.Function):
    """Oracle forward; backward delegated to ``control.backward`` (float64 reference grads)."""

    @staticmethod
    def forward(ctx, control, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, scale):
        ctx.control, ctx.scale = control, scale
        ctx.save_for_backward(q_latent, q_rope, kv_latent, k_rope, indices, topk_length)
        res = dsa_reference(q_latent, q_rope, kv_latent, k_rope, indices, topk_length=topk_length,
                            softmax_scale=scale, magnitudes=False)
        lse = res["lse"]
        ctx.mark_non_differentiable(lse)
        return res["out"].to(q_latent.dtype), lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        ql, qr, kv, kr, idx, topk = ctx.saved_tensors
        g = ctx.control.backward(ql, qr, kv, kr, idx, topk, ctx.scale, dout)
        cast = lambda x, like: None if x is None else x.to(like.dtype)  # noqa: E731
        return (None, cast(g["dq_latent"], ql), cast(g["dq_rope"], qr if qr is not None else ql),
                cast(g["dkv_latent"], kv), cast(g["dk_rope"], kr if kr is not None else kv),
                None, None, None)


class _BrokenBackward(_Base):
    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, scale, return_lse):
        out, lse = _Explicit.apply(self, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, scale)
        return (out, lse) if return_lse else out

    def backward(self, ql, qr, kv, kr, idx, topk, scale, dout):
        return dsa_reference(ql, qr, kv, kr, idx, dout, topk_length=topk, softmax_scale=scale,
                             magnitudes=False)


class DoutAssumedContiguous(_BrokenBackward):
    """The backward reads dout's storage as if it were contiguous."""

    def backward(self, ql, qr, kv, kr, idx, topk, scale, dout):
        if dout.numel() and not dout.is_contiguous() and 0 not in dout.stride():
            dout = torch.as_strided(dout, dout.shape, torch.empty(dout.shape).stride(),
                                    dout.storage_offset())
        return super().backward(ql, qr, kv, kr, idx, topk, scale, dout)


class GradientsForInvalidSlots(_BrokenBackward):
    """Invalid slots scatter a gradient into the key row their index clamps to."""

    def backward(self, ql, qr, kv, kr, idx, topk, scale, dout):
        g = super().backward(ql, qr, kv, kr, idx, topk, scale, dout)
        S = g["dkv_latent"].shape[0]
        invalid = ~_valid(idx, topk, S)
        if S and bool(invalid.any()):
            rows = idx.to(torch.int64).clamp(0, S - 1)[invalid]
            junk = torch.ones(rows.numel(), *g["dkv_latent"].shape[1:], dtype=g["dkv_latent"].dtype,
                              device=rows.device)
            g["dkv_latent"] = g["dkv_latent"].index_add(0, rows, junk)
        return g


class DoutModified(_BrokenBackward):
    """The backward scales dout in place (a fused kernel reusing it as scratch)."""

    def backward(self, ql, qr, kv, kr, idx, topk, scale, dout):
        g = super().backward(ql, qr, kv, kr, idx, topk, scale, dout)
        if 0 not in dout.stride():
            dout.mul_(0.5)
        return g


class DqOffByFloors(_BrokenBackward):
    """dq shifted by ``floors`` times the agreement rule's absolute floor (docs/CONTRACT.md "5. The agreement rule").

    With one valid slot per row the exact dq is 0 by cancellation (P = 1, dS = dP - Delta = 0)
    and the rule's bound collapses; the floor must still catch 10 floors and admit half of one.
    """

    def __init__(self, floors: float, floor_of):
        """``floor_of(dtype, magnitude, acc_magnitude)``: the rule's floor (``judge.agreement.floor_of``),
        passed in so that the control imports nothing but the oracle."""
        self.floors, self.floor_of = floors, floor_of

    def __repr__(self):
        return f"DqOffByFloors({self.floors})"

    def backward(self, ql, qr, kv, kr, idx, topk, scale, dout):
        g = dsa_reference(ql, qr, kv, kr, idx, dout, topk_length=topk, softmax_scale=scale)
        floor = self.floor_of(ql.dtype, g["magnitude"]["dq_latent"], g["magnitude_acc"]["dq_latent"])
        g["dq_latent"] = g["dq_latent"] + self.floors * floor
        return g


class UnwrittenRows(_Base):
    """Allocates out with ``torch.empty`` and never writes the last query token's rows (a grid
    that misses the tail); lse and every other element are right. Caught because the checks
    poison new tensors (``run/poison.py``)."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, scale, return_lse):
        out, lse = super().attend(q_latent, q_rope, kv_latent, k_rope, indices, topk_length, scale, True)
        partial = torch.empty(out.shape, dtype=out.dtype, device=out.device)
        written = max(out.shape[0] - 1, 0)
        partial[:written] = out[:written]
        if out.requires_grad and not partial.requires_grad:  # T <= 1: nothing written
            partial = partial + 0 * out
        return (partial, lse) if return_lse else partial


CONTROLS["UnwrittenRows"] = "forward_agreement"


# ----------------------------------------------------------------------------- value regimes, beyond the contract


TILE_EDGE_SLOT = 64


class SlotDroppedAtTileEdge(_Base):
    """Slot 64 of every row (the first slot of the second 64-slot tile) never takes part."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, *rest):
        if indices.shape[1] > TILE_EDGE_SLOT:
            indices = indices.clone()
            indices[:, TILE_EDGE_SLOT] = -1
        return super().attend(q_latent, q_rope, kv_latent, k_rope, indices, *rest)


def _as_int32_words(indices: torch.Tensor) -> torch.Tensor:
    if indices.dtype != torch.int64:
        return indices
    return indices.contiguous().view(torch.int32)[:, :indices.shape[1]]


class Int64ReadAsInt32(_Base):
    """int64 indices (global or varlen) reinterpreted as int32 words: the low and high halves
    of each index become two slots."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, *rest):
        return super().attend(q_latent, q_rope, kv_latent, k_rope, _as_int32_words(indices), *rest)

    def offset_gather_kv_indices(self, gather_kv_indices, *args, **kwargs):
        return super().offset_gather_kv_indices(_as_int32_words(gather_kv_indices), *args, **kwargs)


class Int64UnclearError(_Base):
    """Refuses int64 indices with an error that names neither a clear type nor the argument."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, *rest):
        if indices.dtype == torch.int64:
            raise RuntimeError("expected scalar type Int but found Long")
        return super().attend(q_latent, q_rope, kv_latent, k_rope, indices, *rest)


class TopkLengthNarrowedToInt32(_Base):
    """Narrows topk_length to int32 before clamping it (fast's I32 slot count did, F30):
    2**32 + 3 becomes 3 slots."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, *rest):
        if topk_length is not None:
            topk_length = topk_length.to(torch.int32)
        return super().attend(q_latent, q_rope, kv_latent, k_rope, indices, topk_length, *rest)


class WrongDefaultScale(_Base):
    """Declares the contract's default softmax_scale but uses FlashInfer's NoPE 1/16."""

    ATTENTION_ORACLE_CAPABILITIES = {"default_scale": True}

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, scale, return_lse):
        return super().attend(q_latent, q_rope, kv_latent, k_rope, indices, topk_length,
                              1.0 / 16 if scale is None else scale, return_lse)


MORE_CONTROLS += [
    ("SlotDroppedAtTileEdge", "forward_agreement"),
    ("Int64ReadAsInt32", "int64_indices"),
    ("Int64ReadAsInt32", "varlen_int64_indices"),
    ("Int64UnclearError", "int64_indices"),
    ("WrongDefaultScale", "default_scale"),
    ("TopkLengthNarrowedToInt32", "int64_topk_length"),
]


# ----------------------------------------------------------------------------- bugs at an intersection of conditions
# Each needs two or three conditions at once (a slot count, a topk_length, a hole pattern, a
# document pattern): random draws rarely meet them together; the covering grid does.

TILE_SLOTS = 64


class TopkLengthTileReadsOneMore(_Base):
    """A topk_length that is a multiple of 64 reads one slot more (slot topk_length, where
    the row has one)."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, *rest):
        if topk_length is not None:
            tile = (topk_length > 0) & (topk_length % TILE_SLOTS == 0)
            topk_length = torch.where(tile, topk_length + 1, topk_length).clamp(max=indices.shape[1])
        return super().attend(q_latent, q_rope, kv_latent, k_rope, indices, topk_length, *rest)


class CausalUnseenRowsSeeKeyZero(_Base):
    """Varlen index preparation, causal, in a document with more queries than keys: the queries
    that should see no key see key 0 of their document."""

    def offset_gather_kv_indices(self, *args, **kwargs):
        return _UnseenRowsIndex().offset_gather_kv_indices(*args, **kwargs)


class NanAfterEmptyFirstChunk(_Base):
    """A row whose first 64 slots are all holes, with valid slots after them, comes out NaN (a
    running max started from an empty first chunk: -inf - -inf)."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, scale, return_lse):
        out, lse = super().attend(q_latent, q_rope, kv_latent, k_rope, indices, topk_length, scale, True)
        valid = _valid(indices, topk_length, kv_latent.shape[0])
        bad = ~valid[:, :TILE_SLOTS].any(dim=1) & valid[:, TILE_SLOTS:].any(dim=1)
        out = torch.where(bad[:, None, None], torch.full_like(out, float("nan")), out)
        return (out, lse) if return_lse else out


MORE_CONTROLS += [
    ("TopkLengthTileReadsOneMore", "forward_agreement"),
    ("CausalUnseenRowsSeeKeyZero", "varlen_agreement"),
    ("NanAfterEmptyFirstChunk", "forward_agreement"),
]


class TopkLengthStrideIgnored(_Base):
    """Reads topk_length from its data pointer as if contiguous (fast's kernels did, F34)."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, *rest):
        if topk_length is not None:
            topk_length = read_as_contiguous(topk_length)
        return super().attend(q_latent, q_rope, kv_latent, k_rope, indices, topk_length, *rest)


class IndexStridesIgnored(_Base):
    """Reads indices from their data pointer as if contiguous [T, K]."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, *rest):
        return super().attend(q_latent, q_rope, kv_latent, k_rope, read_as_contiguous(indices),
                              *rest)


class VarlenSegmentStartsStrideIgnored(_Base):
    """The varlen forms read cu_seqlens_k from its data pointer as if contiguous (fast's index
    preparation did, F34)."""

    def _varlen(self, ql, qr, kv, kr, gather, cu_q, cu_k, *rest):
        return super()._varlen(ql, qr, kv, kr, gather, cu_q, read_as_contiguous(cu_k), *rest)


MORE_CONTROLS += [
    ("TopkLengthStrideIgnored", "strided_index_inputs"),
    ("IndexStridesIgnored", "strided_index_inputs"),
    ("VarlenSegmentStartsStrideIgnored", "varlen_strided_index_inputs"),
]


class TopkLengthAsSliceEnd(_Base):
    """A negative topk_length counts from the end of the row, as a Python slice end does
    (-1: every slot but the last), instead of leaving no slot; lengths past K are right."""

    def attend(self, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, *rest):
        if topk_length is not None:
            topk_length = slice_end_lengths(topk_length, indices.shape[1])
        return super().attend(q_latent, q_rope, kv_latent, k_rope, indices, topk_length, *rest)


MORE_CONTROLS += [("TopkLengthAsSliceEnd", "forward_agreement")]
