"""Deliberately broken ``offset_gather_kv_indices``: each must be caught by the index checks.

Each is a namespace (a class instance); run any of them through the suite with
``pytest --impl attention_oracle.controls.index_broken:CausalOffByOne``. They share one plain
implementation of docs/CONTRACT.md "4. Varlen index preparation" and break one step of it.
"""
from __future__ import annotations

import torch

from attention_oracle.oracle.index import document_of_token, key_position

CONTROLS = {
    # control -> the index check that must catch it
    "CausalOffByOne": "offset_equals_oracle",
    "DocumentLeak": "offset_equals_oracle",
    "UnstableCompaction": "compaction_stable",
    "LengthsCountValidSlots": "lengths_right",
}

# Further (control, check) pairs: every index check has a control it must catch.
MORE_CONTROLS = [
    ("UnstableCompaction", "compaction_idempotent"),
    # the attention kernel behind compacted_attention loses the last slot of each cut row
    ("dsa_broken:TopkLengthOffByOne", "compacted_attention"),
]


class _Prepare:
    """docs/CONTRACT.md "4. Varlen index preparation" written out; subclasses override one step."""

    def __repr__(self):
        return type(self).__name__

    def valid(self, local, seqlen_k, pos, causal):
        valid = (local >= 0) & (local < seqlen_k[:, None])
        if causal:
            valid &= local <= pos[:, None]
        return valid

    def compact_row(self, row: torch.Tensor) -> torch.Tensor:
        return row[row >= 0]

    def offset_gather_kv_indices(self, gather_kv_indices, cu_seqlens_q, cu_seqlens_k, *,
                                 causal=False, out=None, return_topk_length=False, compact=False,
                                 topk_length=None):
        T, K = gather_kv_indices.shape
        local = gather_kv_indices.to(torch.int64)
        doc = document_of_token(cu_seqlens_q, T)
        cu_k = cu_seqlens_k.to(torch.int64)
        seqlen_k = (cu_k[1:] - cu_k[:-1])[doc]
        valid = self.valid(local, seqlen_k, key_position(cu_seqlens_q, cu_seqlens_k, T, doc), causal)
        if topk_length is not None:
            valid &= torch.arange(K, device=local.device)[None, :] < topk_length.to(torch.int64)[:, None]
        rows = torch.where(valid, local + cu_k[doc][:, None], -1)
        if compact:
            packed = torch.full_like(rows, -1)
            for t in range(T):
                kept = self.compact_row(rows[t])
                packed[t, :kept.numel()] = kept
            rows, lengths = packed, valid.sum(dim=1)
        else:
            slot = torch.arange(1, K + 1, device=local.device)
            lengths = torch.where(valid, slot, 0).amax(dim=1) if K else valid.sum(dim=1)
        rows = rows.to(torch.int32)
        if out is not None:
            out.copy_(rows)
            rows = out
        return (rows, lengths.to(torch.int32)) if return_topk_length else rows


class CausalOffByOne(_Prepare):
    """Causal lets a query see one future key (j <= pos + 1)."""

    def valid(self, local, seqlen_k, pos, causal):
        return super().valid(local, seqlen_k, pos + 1 if causal else pos, causal)


class DocumentLeak(_Prepare):
    """A local index equal to seqlen_k is kept: it reads the next document's first key."""

    def valid(self, local, seqlen_k, pos, causal):
        return super().valid(local, seqlen_k + 1, pos, causal)


class UnstableCompaction(_Prepare):
    """Compaction keeps the valid rows but reverses their slot order."""

    def compact_row(self, row):
        return row[row >= 0].flip(0)


class LengthsCountValidSlots(_Prepare):
    """Without compaction, the length is the count of valid slots, not the last valid slot + 1."""

    def offset_gather_kv_indices(self, *args, return_topk_length=False, compact=False, **kwargs):
        rows, lengths = super().offset_gather_kv_indices(*args, return_topk_length=True,
                                                         compact=compact, **kwargs)
        if not compact:
            lengths = (rows >= 0).sum(dim=1).to(torch.int32)
        return (rows, lengths) if return_topk_length else rows


class Int64ReadAsInt32(_Prepare):
    """int64 gather_kv_indices reinterpreted as int32 words (low and high halves as slots)."""

    def offset_gather_kv_indices(self, gather_kv_indices, *args, **kwargs):
        if gather_kv_indices.dtype == torch.int64:
            K = gather_kv_indices.shape[1]
            gather_kv_indices = gather_kv_indices.contiguous().view(torch.int32)[:, :K]
        return super().offset_gather_kv_indices(gather_kv_indices, *args, **kwargs)


class Int64ErrorNamesNothing(_Prepare):
    """Refuses int64 with a ValueError that does not say which argument is wrong."""

    def offset_gather_kv_indices(self, gather_kv_indices, *args, **kwargs):
        if gather_kv_indices.dtype == torch.int64:
            raise ValueError("unsupported dtype")
        return super().offset_gather_kv_indices(gather_kv_indices, *args, **kwargs)


class Int64NarrowedToInt32(_Prepare):
    """int64 gather_kv_indices cast to int32 by value first: an index past int32 wraps (2**32
    reads as 0, a valid key)."""

    def offset_gather_kv_indices(self, gather_kv_indices, *args, **kwargs):
        return super().offset_gather_kv_indices(gather_kv_indices.to(torch.int32), *args, **kwargs)


MORE_CONTROLS += [
    ("Int64ReadAsInt32", "int64_indices"),
    ("Int64ErrorNamesNothing", "int64_indices"),
    ("Int64NarrowedToInt32", "int64_indices"),
]


# ----------------------------------------------------------------------------- bugs at an intersection of conditions


class CausalUnseenRowsSeeKeyZero(_Prepare):
    """Causal, in a document with more queries than keys: a query before the document's first
    key (pos < 0, it sees no key) keeps local index 0 (key 0 of its document)."""

    def valid(self, local, seqlen_k, pos, causal):
        valid = super().valid(local, seqlen_k, pos, causal)
        if causal:
            valid |= (pos[:, None] < 0) & (local == 0) & (seqlen_k[:, None] > 0)
        return valid


MORE_CONTROLS += [("CausalUnseenRowsSeeKeyZero", "offset_equals_oracle")]


def slice_end_lengths(topk_length: torch.Tensor, K: int) -> torch.Tensor:
    """topk_length [T] read as Python slice ends over rows of K slots: a negative length counts
    from the row's end (-1: K - 1 slots; below -K: none), in the lengths' own dtype."""
    wide = topk_length.to(torch.int64)
    return torch.where(wide < 0, (wide + K).clamp(min=0), wide).to(topk_length.dtype)


class TopkLengthAsSliceEnd(_Prepare):
    """The topk_length cut as Python's slice end (``row[:n]``): a negative length counts from
    the end of the row, so -1 keeps K - 1 slots instead of none."""

    def offset_gather_kv_indices(self, gather_kv_indices, *args, topk_length=None, **kwargs):
        if topk_length is not None:
            topk_length = slice_end_lengths(topk_length, gather_kv_indices.shape[1])
        return super().offset_gather_kv_indices(gather_kv_indices, *args, topk_length=topk_length,
                                                **kwargs)


MORE_CONTROLS += [("TopkLengthAsSliceEnd", "offset_equals_oracle")]


def read_as_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t``'s storage from its first element read as a contiguous tensor of its shape (a
    kernel that takes a data pointer and ignores the strides)."""
    return torch.as_strided(t, t.shape, torch.empty(t.shape, device="meta").stride(),
                            t.storage_offset())


class StridesIgnored(_Prepare):
    """Reads its tensors from their data pointers as if contiguous (the fast kernel did with
    topk_length and the cu_seqlens, docs/FINDINGS.md F34)."""

    def offset_gather_kv_indices(self, gather_kv_indices, cu_seqlens_q, cu_seqlens_k, *,
                                 topk_length=None, **kwargs):
        lengths = None if topk_length is None else read_as_contiguous(topk_length)
        return super().offset_gather_kv_indices(
            read_as_contiguous(gather_kv_indices), read_as_contiguous(cu_seqlens_q),
            read_as_contiguous(cu_seqlens_k), topk_length=lengths, **kwargs)


class SegmentStartsStrideIgnored(_Prepare):
    """Reads cu_seqlens_k from its data pointer as if contiguous (as fast did, F34): a strided
    one gives other documents' key offsets."""

    def offset_gather_kv_indices(self, gather_kv_indices, cu_seqlens_q, cu_seqlens_k, **kwargs):
        return super().offset_gather_kv_indices(gather_kv_indices, cu_seqlens_q,
                                                read_as_contiguous(cu_seqlens_k), **kwargs)


MORE_CONTROLS += [("StridesIgnored", "strided_inputs"),
                  ("SegmentStartsStrideIgnored", "strided_inputs")]
