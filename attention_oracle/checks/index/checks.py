"""The varlen index-preparation checks (docs/CONTRACT.md "4. Varlen index preparation"). Each is
declared (``harness/registry.py``) with the cases it runs on and called as ``check(target, case)``;
its body judges through a ``Judge``.

offset_equals_oracle: ``offset_gather_kv_indices`` equals the oracle exactly for every option
    (causal, compact, topk_length, return_topk_length, ``out`` fresh or aliasing the input,
    int32 input; int64 has its own check in ``edges.py``); int32 results; ``out`` is the returned tensor; the input is untouched
    unless it is ``out``.
compaction_stable: the compacted row is the holey row's valid entries in slot order, then -1
    (judged on the implementation's own two outputs).
compaction_idempotent: compacting the compacted rows again (as local indices, with the
    returned lengths) changes neither rows nor lengths.
lengths_right: the returned lengths are the count of valid slots (compact) or the last valid
    slot + 1 (holey), read off the implementation's own rows.
compacted_attention: NoPE attention over the compacted rows with their lengths equals
    attention over the holey rows (both under the agreement rule against the oracle).
"""
from __future__ import annotations

import torch

from attention_oracle.checks.dsa.checks import lp_references
from attention_oracle.checks.index.cases import ATTENTION_FN, IndexCase, IndexInputs, build_index
from attention_oracle.judge.judge import Judge
from attention_oracle.judge.registry import declare, declared
from attention_oracle.judge.targets import Refused
from attention_oracle.oracle.dsa import dsa_reference
from attention_oracle.oracle.index import document_of_token
from attention_oracle.oracle.index import offset_gather_kv_indices as oracle_offset

FN = IndexCase.function
ATTN_FN = ATTENTION_FN


def _call(target, inp: IndexInputs, case: IndexCase, *, compact=None, return_topk_length=None,
          out=None, indices=None, topk_length="same", cu_seqlens_q=None, cu_seqlens_k=None):
    result = target.call(
        FN, inp.gather_kv_indices if indices is None else indices,
        inp.cu_seqlens_q if cu_seqlens_q is None else cu_seqlens_q,
        inp.cu_seqlens_k if cu_seqlens_k is None else cu_seqlens_k, causal=case.causal, out=out,
        return_topk_length=case.return_topk_length if return_topk_length is None else return_topk_length,
        compact=case.compact if compact is None else compact,
        topk_length=inp.topk_length if isinstance(topk_length, str) else topk_length)
    return result


def _split(judge: Judge, result, with_lengths: bool):
    if not with_lengths:
        return result, None
    ok = isinstance(result, (tuple, list)) and len(result) == 2
    judge.true("lengths", ok, f"return_topk_length=True must give (rows, lengths), got {type(result).__name__}")
    return result[0], result[1]


def _rows_and_lengths(judge: Judge, inp, case, *, compact):
    return _split(judge, _call(judge.target, inp, case, compact=compact, return_topk_length=True), True)


@declare("index")
def offset_equals_oracle(judge: Judge, case: IndexCase) -> None:
    """``offset_gather_kv_indices`` equals the oracle exactly for every option."""
    inp = build_index(case, judge.target.device)
    original = inp.gather_kv_indices.clone()
    expected = oracle_offset(original, inp.cu_seqlens_q, inp.cu_seqlens_k, causal=case.causal,
                             return_topk_length=True, compact=case.compact,
                             topk_length=inp.topk_length)
    out = None
    if case.out == "fresh":
        out = torch.full(original.shape, 7777, dtype=torch.int32, device=original.device)
    elif case.out == "alias":
        out = inp.gather_kv_indices
    rows, lengths = _split(judge, _call(judge.target, inp, case, out=out), case.return_topk_length)
    judge.exact("rows", rows, expected[0],
                what=f"global rows (causal={case.causal}, compact={case.compact}, topk={case.topk})")
    if lengths is not None:
        judge.exact("lengths", lengths, expected[1], what="returned topk lengths")
    if out is not None:
        judge.true("rows", rows.data_ptr() == out.data_ptr() or rows.numel() == 0,
                   "the result is not the given `out` tensor")
    if case.out != "alias":
        judge.exact("gather_kv_indices", inp.gather_kv_indices, original, what="the input was modified")


def _stable_partition(holey: torch.Tensor) -> torch.Tensor:
    """Each row's valid (>= 0) entries in slot order, then -1 (computed independently)."""
    expected = torch.full_like(holey, -1)
    for t in range(holey.shape[0]):
        kept = holey[t][holey[t] >= 0]
        expected[t, :kept.numel()] = kept
    return expected


@declare("index", cases=dict(compact=True))
def compaction_stable(judge: Judge, case: IndexCase) -> None:
    """The compacted row is the holey row's valid entries in slot order, then -1."""
    inp = build_index(case, judge.target.device)
    holey, _ = _rows_and_lengths(judge, inp, case, compact=False)
    compacted, _ = _rows_and_lengths(judge, inp, case, compact=True)
    judge.exact("rows", compacted.cpu(), _stable_partition(holey.cpu()),
                what="compacted rows are not the holey rows' valid entries in slot order")


@declare("index", cases=dict(compact=True))
def compaction_idempotent(judge: Judge, case: IndexCase) -> None:
    """Compacting the compacted rows again changes neither rows nor lengths."""
    inp = build_index(case, judge.target.device)
    rows, lengths = _rows_and_lengths(judge, inp, case, compact=True)
    doc = document_of_token(inp.cu_seqlens_q, rows.shape[0])
    start = inp.cu_seqlens_k.to(torch.int64)[doc]
    local = torch.where(rows >= 0, rows.to(torch.int64) - start[:, None], -1).to(torch.int32)
    again, again_lengths = _split(judge, _call(judge.target, inp, case, compact=True, return_topk_length=True,
                                               indices=local, topk_length=lengths), True)
    judge.exact("rows", again, rows, what="compacting compacted rows changed them")
    judge.exact("lengths", again_lengths, lengths, what="compacting compacted rows changed the lengths")


@declare("index")
def lengths_right(judge: Judge, case: IndexCase) -> None:
    """The returned lengths are the count of valid slots (compact) or the last valid slot + 1."""
    inp = build_index(case, judge.target.device)
    rows, lengths = _rows_and_lengths(judge, inp, case, compact=case.compact)
    valid = rows >= 0
    K = rows.shape[1]
    if case.compact:
        expected = valid.sum(dim=1)
    else:
        slot_plus_one = torch.arange(1, K + 1, device=rows.device)
        expected = torch.where(valid, slot_plus_one, 0).amax(dim=1) if K else valid.sum(dim=1)
    judge.exact("lengths", lengths, expected.to(torch.int32),
                what=f"lengths vs the rows returned (compact={case.compact})")


def _attention_values(case: IndexCase, device):
    g = torch.Generator().manual_seed(case.seed + 1)
    q = torch.randn(case.T, case.H, case.D, generator=g)
    kv = torch.randn(case.S, case.D, generator=g)
    return q.to(device, case.torch_dtype), kv.to(device, case.torch_dtype)


@declare("index", cases=dict(compact=True, max_tokens=24, out_modes=("none",)), needs=(ATTN_FN,))
def compacted_attention(judge: Judge, case: IndexCase) -> None:
    """NoPE attention over the compacted rows equals attention over the holey rows."""
    target = judge.target
    if not target.offers(ATTN_FN):  # counted as not run (skipped), never as a vacuous pass
        raise Refused(f"{target.name} does not offer {ATTN_FN}, needed to attend over its rows")
    inp = build_index(case, target.device)
    q, kv = _attention_values(case, target.device)
    holey, holey_len = _rows_and_lengths(judge, inp, case, compact=False)
    compacted, compact_len = _rows_and_lengths(judge, inp, case, compact=True)
    gold_rows = oracle_offset(inp.gather_kv_indices, inp.cu_seqlens_q, inp.cu_seqlens_k,
                              causal=case.causal, topk_length=inp.topk_length)
    scale = case.D ** -0.5  # explicit: the contract leaves softmax_scale=None to each implementation
    gold = dsa_reference(q, None, kv, None, gold_rows, compute_dtype=torch.float64, softmax_scale=scale,
                         apriori=case.torch_dtype == torch.float32)
    lp = lp_references(q, None, kv, None, gold_rows, compute_dtype=case.torch_dtype,
                       softmax_scale=scale)
    for label, rows, lengths in (("holey", holey, holey_len), ("compacted", compacted, compact_len)):
        out, lse = target.call(ATTN_FN, q, kv, rows, topk_length=lengths, softmax_scale=scale,
                               return_lse=True)
        for name, x in (("out", out), ("lse", lse)):
            judge.agrees_with(name, x, gold, lp, gradient=False, label=f"{name} ({label} rows)")



CHECKS = declared("index")
