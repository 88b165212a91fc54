"""Index-preparation checks beyond the contract (declared in the ``index`` area, ``harness/registry.py``).

int64_indices: ``offset_gather_kv_indices`` on int64 ``gather_kv_indices`` (the contract's
    are int32): the oracle's int32 rows and lengths exactly, or a clear TypeError/ValueError/
    NotImplementedError naming ``gather_kv_indices`` (``judge/beyond.py``);
    an implementation declaring int64 in ``index_dtypes`` must give the right rows. Out-of-range
    slots are moved past int32 (2**32 and -(2**32), still out of range; narrowed to int32
    they read as 0, a valid key), so a narrowing cast shows.
strided_inputs: ``topk_length`` (a random one where the case has none), ``cu_seqlens_q`` and
    ``cu_seqlens_k`` each as column 0 of a two-column buffer whose other column is 0, and
    ``gather_kv_indices`` as a window of a larger buffer poisoned with invalid indices: the
    oracle's rows and lengths exactly, or a clear error naming the argument
    (docs/FINDINGS.md F34).
"""
from __future__ import annotations

import torch

from attention_oracle.checks.index import checks as base
from attention_oracle.checks.index.cases import IndexCase, build_index, topk_lengths
from attention_oracle.judge.beyond import Declined, attempt
from attention_oracle.judge.capabilities import resolve
from attention_oracle.judge.judge import Judge
from attention_oracle.judge.layouts import lay_out
from attention_oracle.judge.registry import declare
from attention_oracle.oracle.index import offset_gather_kv_indices as oracle_offset
from attention_oracle.oracle.index import valid_local_slots

ARGUMENT = "gather_kv_indices"


def widened(indices: torch.Tensor, cu_seqlens_q: torch.Tensor,
            cu_seqlens_k: torch.Tensor) -> torch.Tensor:
    """``indices`` as int64 with out-of-range slots past int32: slot s % 3 == 0 gets 2**32,
    s % 3 == 1 gets -(2**32) (both still out of range, both 0 once narrowed to int32), s % 3 == 2
    keeps its value."""
    wide = indices.to(torch.int64, copy=True)  # keeps the layout
    slots = torch.arange(wide.shape[1], device=wide.device)[None, :]
    out_of_range = ~valid_local_slots(indices, cu_seqlens_q, cu_seqlens_k)
    past = torch.where(slots % 3 == 0, 2 ** 32, -(2 ** 32))
    return wide.copy_(torch.where(out_of_range & (slots % 3 < 2), past, wide))


@declare("index", cases=dict(out_modes=("none", "fresh")), beyond=True)
def int64_indices(judge: Judge, case: IndexCase) -> None:
    """int64 gather_kv_indices (beyond the contract): the oracle's rows, or a clear error naming it."""
    target = judge.target
    inp = build_index(case, target.device)
    wide = widened(inp.gather_kv_indices, inp.cu_seqlens_q, inp.cu_seqlens_k)
    declared = torch.int64 in resolve(target, case.function).index_dtypes
    expected = oracle_offset(inp.gather_kv_indices, inp.cu_seqlens_q, inp.cu_seqlens_k,
                             causal=case.causal, return_topk_length=True, compact=case.compact,
                             topk_length=inp.topk_length)
    try:
        result = attempt(lambda: base._call(target, inp, case, indices=wide, return_topk_length=True),
                         argument=ARGUMENT, what=f"int64 {ARGUMENT}", declared=declared, judge=judge)
    except Declined:
        return
    rows, lengths = base._split(judge, result, True)
    judge.exact("rows", rows, expected[0], what="global rows from int64 indices")
    judge.exact("lengths", lengths, expected[1], what="lengths from int64 indices")


def column(values: torch.Tensor) -> torch.Tensor:
    """``values`` [n] as column 0 of an ``[n, 2]`` buffer (stride 2) whose column 1 is 0 (a
    length or segment start that changes the answer where it is read instead)."""
    return torch.stack([values, torch.zeros_like(values)], dim=1)[:, 0]


@declare("index", cases=dict(out_modes=("none",)), beyond=True)
def strided_inputs(judge: Judge, case: IndexCase) -> None:
    """topk_length and gather_kv_indices as strided views (beyond the contract): the oracle's
    rows, or a clear error naming the argument."""
    target = judge.target
    inp = build_index(case, target.device)
    lengths = inp.topk_length
    if lengths is None:
        lengths = topk_lengths(case.T, case.K, "random", torch.Generator().manual_seed(case.seed))
        lengths = lengths.to(target.device)
    expected = oracle_offset(inp.gather_kv_indices, inp.cu_seqlens_q, inp.cu_seqlens_k,
                             causal=case.causal, return_topk_length=True, compact=case.compact,
                             topk_length=lengths)
    window = lay_out(inp.gather_kv_indices, "sliced", dims=(0, 1))
    views = (("topk_length", "a stride-2 column", dict(topk_length=column(lengths))),
             (ARGUMENT, f"a window of a larger buffer (strides {tuple(window.stride())})",
              dict(indices=window, topk_length=lengths)),
             ("cu_seqlens_q", "a stride-2 column", dict(cu_seqlens_q=column(inp.cu_seqlens_q),
                                                        topk_length=lengths)),
             ("cu_seqlens_k", "a stride-2 column", dict(cu_seqlens_k=column(inp.cu_seqlens_k),
                                                        topk_length=lengths)))
    for argument, layout, kwargs in views:
        what = f"{argument} as {layout}"
        try:
            result = attempt(lambda kw=kwargs: base._call(target, inp, case, return_topk_length=True,
                                                          **kw),
                             argument=argument, what=what, declared=False, judge=judge)
        except Declined:
            continue
        rows, got_lengths = base._split(judge, result, True)
        judge.exact("rows", rows, expected[0], what=f"global rows with {what}")
        judge.exact("lengths", got_lengths, expected[1], what=f"lengths with {what}")
