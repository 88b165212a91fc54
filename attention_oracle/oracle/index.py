"""Varlen index preparation for DSA (docs/CONTRACT.md "4. Varlen index preparation"), in plain vectorised PyTorch.

Conventions
-----------
* ``T`` query tokens are packed document after document; ``cu_seqlens_q`` ([n+1], int32/int64,
  starting at 0, non-decreasing) cuts them into documents, ``cu_seqlens_k`` ([n+1]) cuts the
  packed key rows the same way. Empty documents (equal neighbours) are allowed.
* ``gather_kv_indices`` ([T, K], int32/int64) holds key indices *local* to the token's document.
* Query ``t`` of document ``d`` sits at key position
  ``pos = (seqlen_k[d] - seqlen_q[d]) + (t - cu_seqlens_q[d])``: the query segment is the tail
  of its key segment. (If ``seqlen_k[d] < seqlen_q[d]`` the first positions are negative and,
  under ``causal=True``, those rows are empty.)
* A local index ``j`` in slot ``s`` is valid iff ``s < topk_length[t]`` (when given),
  ``0 <= j < seqlen_k[d]`` and, with ``causal=True``, ``j <= pos``. Valid ``j`` becomes the
  global row ``j + cu_seqlens_k[d]``; every invalid slot becomes ``-1``.

Everything runs on the device of ``gather_kv_indices``; the validation reads a few scalars
back to the host (this is a reference, not a fast path).
"""

from __future__ import annotations

import torch

from ..validation import check_flags, check_index_inputs

__all__ = [
    "offset_gather_kv_indices",
    "document_of_token",
    "key_position",
    "valid_local_slots",
]

_INT32_MAX = 2**31 - 1


# --------------------------------------------------------------------------- validation
# (types, dtypes, shapes and devices: attention_oracle/validation.py, shared with fast; the
# values of cu_seqlens are checked here, on the host)

def _check_cu_seqlens_values(name: str, cu: torch.Tensor) -> None:
    if int(cu[0]) != 0:
        raise ValueError(f"{name} must start at 0, got {int(cu[0])}")
    if cu.numel() > 1 and bool((cu[1:] < cu[:-1]).any()):
        first = int(torch.nonzero(cu[1:] < cu[:-1])[0, 0])
        raise ValueError(
            f"{name} must be non-decreasing; {name}[{first + 1}] = {int(cu[first + 1])} "
            f"< {name}[{first}] = {int(cu[first])}")


def _validate(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, out, topk_length) -> None:
    T, _ = check_index_inputs(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, topk_length, out)
    _check_cu_seqlens_values("cu_seqlens_q", cu_seqlens_q)
    _check_cu_seqlens_values("cu_seqlens_k", cu_seqlens_k)
    if int(cu_seqlens_q[-1]) != T:
        raise ValueError(
            f"cu_seqlens_q[-1] = {int(cu_seqlens_q[-1])} must equal the token count "
            f"T = {T} of gather_kv_indices")
    if int(cu_seqlens_k[-1]) > _INT32_MAX:
        raise ValueError(f"cu_seqlens_k[-1] = {int(cu_seqlens_k[-1])} does not fit int32 rows")


# --------------------------------------------------------------------------- helpers

def document_of_token(cu_seqlens_q: torch.Tensor, T: int) -> torch.Tensor:
    """Document id (int64 ``[T]``) of each packed query token.

    Token ``t`` belongs to the document ``d`` with ``cu_seqlens_q[d] <= t < cu_seqlens_q[d+1]``;
    empty documents own no token.
    """
    tokens = torch.arange(T, device=cu_seqlens_q.device, dtype=torch.int64)
    return torch.searchsorted(cu_seqlens_q[1:].to(torch.int64), tokens, right=True)


def key_position(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, T: int,
                 doc: torch.Tensor | None = None) -> torch.Tensor:
    """Key position (int64 ``[T]``, local to the document) at which each query token sits.

    ``pos = (seqlen_k[d] - seqlen_q[d]) + (t - cu_seqlens_q[d])``; may be negative when a
    document has fewer keys than queries.
    """
    if doc is None:
        doc = document_of_token(cu_seqlens_q, T)
    cu_q = cu_seqlens_q.to(torch.int64)
    cu_k = cu_seqlens_k.to(torch.int64)
    seqlen_q = (cu_q[1:] - cu_q[:-1])[doc]
    seqlen_k = (cu_k[1:] - cu_k[:-1])[doc]
    tokens = torch.arange(T, device=cu_q.device, dtype=torch.int64)
    return (seqlen_k - seqlen_q) + (tokens - cu_q[doc])


def valid_local_slots(gather_kv_indices: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, *, causal: bool = False,
                      topk_length: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean ``[T, K]``: which slots hold a valid local index (no validation of arguments)."""
    T, K = gather_kv_indices.shape
    doc = document_of_token(cu_seqlens_q, T)
    cu_k = cu_seqlens_k.to(torch.int64)
    seqlen_k = (cu_k[1:] - cu_k[:-1])[doc]
    local = gather_kv_indices.to(torch.int64)
    valid = (local >= 0) & (local < seqlen_k[:, None])
    if causal:
        pos = key_position(cu_seqlens_q, cu_seqlens_k, T, doc)
        valid &= local <= pos[:, None]
    if topk_length is not None:
        slots = torch.arange(K, device=local.device, dtype=torch.int64)
        valid &= slots[None, :] < topk_length.to(torch.int64)[:, None]
    return valid


def _row_lengths_holey(valid: torch.Tensor) -> torch.Tensor:
    """Last valid slot + 1 per row, 0 for an empty row."""
    K = valid.shape[1]
    slot_plus_one = torch.arange(1, K + 1, device=valid.device, dtype=torch.int64)
    if K == 0:
        return torch.zeros(valid.shape[0], dtype=torch.int64, device=valid.device)
    return torch.where(valid, slot_plus_one, 0).amax(dim=1)


def _stable_compact(rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Move valid entries of each row to its front in their original order; the rest is -1."""
    T, K = rows.shape
    destination = torch.cumsum(valid.to(torch.int64), dim=1) - 1
    # Invalid slots go to a spill column K that is dropped afterwards.
    destination = torch.where(valid, destination, K)
    compacted = torch.full((T, K + 1), -1, dtype=rows.dtype, device=rows.device)
    compacted.scatter_(1, destination, torch.where(valid, rows, -1))
    return compacted[:, :K]


# --------------------------------------------------------------------------- public

def offset_gather_kv_indices(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, *, causal=False,
                             out=None, return_topk_length=False, compact=False,
                             topk_length=None):
    """Turn per-document top-k indices into global key rows (docs/CONTRACT.md "4. Varlen index preparation").

    Args:
        gather_kv_indices: int32/int64 ``[T, K]``, indices local to each token's document.
        cu_seqlens_q, cu_seqlens_k: int32/int64 ``[n+1]`` document boundaries (start at 0,
            non-decreasing, same length; ``cu_seqlens_q[-1] == T``).
        causal: also drop local indices ``j > pos`` (a query sees its own key).
        out: optional int32 ``[T, K]`` tensor the result is written into (and returned). It may
            alias ``gather_kv_indices``: the result is computed before it is written.
        return_topk_length: also return the int32 ``[T]`` row lengths.
        compact: move valid rows to the front of each row in slot order (stable partition);
            the length is then the count of valid slots. Without it slots keep their places
            and the length is (last valid slot + 1), 0 for an empty row.
        topk_length: optional int32/int64 ``[T]``; slots ``s >= topk_length[t]`` are invalid.

    Returns:
        int32 ``[T, K]`` global rows (``-1`` for invalid slots), and the int32 ``[T]`` lengths
        when ``return_topk_length``.

    Raises:
        TypeError: an argument is not a tensor or has a wrong dtype (indices, cu_seqlens and
            topk_length must be int32/int64, ``out`` int32).
        ValueError: wrong rank or shape, cu_seqlens not starting at 0 / decreasing / of
            different lengths, ``cu_seqlens_q[-1] != T``, tensors on different devices.
    """
    check_flags(causal=causal, compact=compact, return_topk_length=return_topk_length)
    _validate(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, out, topk_length)
    T, _ = gather_kv_indices.shape
    valid = valid_local_slots(gather_kv_indices, cu_seqlens_q, cu_seqlens_k,
                              causal=causal, topk_length=topk_length)
    doc = document_of_token(cu_seqlens_q, T)
    key_offset = cu_seqlens_k.to(torch.int64)[doc]
    rows = torch.where(valid, gather_kv_indices.to(torch.int64) + key_offset[:, None], -1)
    if compact:
        rows = _stable_compact(rows, valid)
        lengths = valid.sum(dim=1)
    else:
        lengths = _row_lengths_holey(valid)
    rows = rows.to(torch.int32)
    if out is not None:
        out.copy_(rows)
        rows = out
    if return_topk_length:
        return rows, lengths.to(torch.int32)
    return rows
