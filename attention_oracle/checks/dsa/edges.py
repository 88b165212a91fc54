"""DSA checks beyond the contract (declared in the ``dsa`` area, ``harness/registry.py``).

default_scale: ``softmax_scale=None`` gives the contract's 1/sqrt(Dl + Dr) (NoPE 1/sqrt(D));
    run only for implementations that declare ``default_scale`` (oracle and fast do; other
    libraries document other defaults, FlashInfer's NoPE default is 1/16).
int64_indices: int64 ``indices`` (the contract's are int32): the right result, or a clear
    TypeError/ValueError/NotImplementedError naming ``indices``
    (``judge/beyond.py``); declared ``index_dtypes`` with int64: the right result.
varlen_int64_indices: the same for the varlen form's ``gather_kv_indices``.
int64_topk_length: int32 indices with an int64 ``topk_length`` whose values lie outside
    [0, K] and past int32 (2**32 + K // 2 means every slot, -(2**32) + K none, 2**31 every
    slot): the right result (the validation takes int64 lengths, so the contract's clamp
    applies), or a clear error naming ``topk_length``. A kernel that narrows the length to
    int32 before clamping sees K // 2, K and -2**31 (docs/FINDINGS.md F30).
strided_index_inputs: ``indices`` and ``topk_length`` as strided views (the contract promises
    strided ``dout`` only): ``topk_length`` a column of a ``[T, 2]`` buffer whose other column
    is 0, ``indices`` a window of a larger buffer poisoned with invalid indices, and
    K-major (transposed) ``indices``; each the right result (forward and gradients), or a
    clear error naming the argument. A kernel that reads either as contiguous gets other
    rows' lengths or slots (docs/FINDINGS.md F34).
varlen_strided_index_inputs: the same for the varlen forms: ``gather_kv_indices`` (a window,
    K-major), ``topk_length``, ``cu_seqlens_q`` and ``cu_seqlens_k`` (stride-2 columns).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from attention_oracle.checks.dsa import checks as base
from attention_oracle.checks.dsa.cases import DsaCase, build
from attention_oracle.checks.index.edges import column
from attention_oracle.judge.beyond import Declined, attempt
from attention_oracle.judge.capabilities import resolve
from attention_oracle.judge.judge import Judge
from attention_oracle.judge.layouts import lay_out
from attention_oracle.judge.registry import declare


def _forward_and_gradients(judge: Judge, inp, out, gold, lp) -> None:
    judge.agrees_with("out", out, gold, lp, gradient=False)
    got = base.grads(out, inp, inp.dout.contiguous())
    for name, g in got.items():
        judge.agrees_with(name, g, gold, lp, gradient=True)


@declare("dsa", requires=("default_scale",), beyond=True)
def default_scale(judge: Judge, case: DsaCase) -> None:
    """softmax_scale=None is the contract's 1/sqrt(D), where the implementation declares it."""
    explicit = dataclasses.replace(case, scale=1.0 / math.sqrt(case.qk_dim))
    implicit = dataclasses.replace(case, scale=None)
    inp = build(implicit, judge.target.device)   # values equal explicit's (same effective scale)
    out = base.call(judge.target, inp)
    gold, lp = base.references(build(explicit, judge.target.device), inp.dout.contiguous())
    _forward_and_gradients(judge.for_case(explicit), inp, out, gold, lp)


def _int64_check(judge: Judge, case: DsaCase, argument: str) -> None:
    target = judge.target
    inp = build(case, target.device)
    declared = torch.int64 in resolve(target, case.function).index_dtypes
    wide = inp.indices.to(torch.int64)
    try:
        out = attempt(lambda: base.call(target, inp, indices=wide), argument=argument,
                      what=f"int64 {argument}", declared=declared, judge=judge)
    except Declined:
        return
    gold, lp = base.references(inp, inp.dout.contiguous())
    _forward_and_gradients(judge, inp, out, gold, lp)


@declare("dsa", beyond=True)
def int64_indices(judge: Judge, case: DsaCase) -> None:
    """int64 indices (beyond the contract): right, or a clear error naming ``indices``."""
    if case.varlen:
        raise ValueError("int64_indices runs on global-index cases")
    _int64_check(judge, case, "indices")


@declare("dsa", cases=dict(varlen=True), beyond=True)
def varlen_int64_indices(judge: Judge, case: DsaCase) -> None:
    """int64 gather_kv_indices (beyond the contract): right, or a clear error naming it."""
    if not case.varlen:
        raise ValueError("varlen_int64_indices runs on varlen cases")
    _int64_check(judge, case, "gather_kv_indices")


def wide_lengths(lengths, T: int, K: int) -> torch.Tensor:
    """int64 [T] lengths past int32, cycling over rows: 2**32 + K // 2 (every slot; narrowed:
    K // 2), -(2**32) + K (no slot; narrowed: K), 2**31 (every slot; narrowed: -2**31), and
    the case's own length (K where it has none)."""
    own = torch.full((T,), K, dtype=torch.int64) if lengths is None else lengths.to(torch.int64)
    picks = torch.tensor([2 ** 32 + K // 2, -(2 ** 32) + K, 2 ** 31], dtype=torch.int64)
    rows = torch.arange(T)
    wide = torch.where(rows % 4 < 3, picks[(rows % 4).clamp(max=2)], own.cpu())
    return wide.to(own.device)


@declare("dsa", beyond=True)
def int64_topk_length(judge: Judge, case: DsaCase) -> None:
    """int64 topk_length past int32 (beyond the contract): right, or a clear error naming it."""
    if case.varlen:
        raise ValueError("int64_topk_length runs on global-index cases")
    target = judge.target
    inp = build(case, target.device)
    declared = torch.int64 in resolve(target, case.function).index_dtypes
    wide = wide_lengths(inp.topk_length, case.T, case.K).to(inp.indices.device)
    try:
        out = attempt(lambda: base.call(target, inp, topk_length=wide), argument="topk_length",
                      what="int64 topk_length", declared=declared, judge=judge)
    except Declined:
        return
    wide_inp = dataclasses.replace(inp, topk_length=wide)
    gold, lp = base.references(wide_inp, inp.dout.contiguous())
    _forward_and_gradients(judge, inp, out, gold, lp)


def strided_indices(indices: torch.Tensor) -> dict:
    """{layout: ``indices`` [T, K] in it}: ``sliced`` (a window of a larger buffer poisoned
    with invalid indices, judge/layouts.py) and ``transposed`` (stored K-major)."""
    return {layout: lay_out(indices, layout, dims=(0, 1)) for layout in ("sliced", "transposed")}


@declare("dsa", cases=dict(topk="random"), beyond=True)
def strided_index_inputs(judge: Judge, case: DsaCase) -> None:
    """indices and topk_length as strided views (beyond the contract): right, or a clear error
    naming the argument."""
    if case.varlen:
        raise ValueError("strided_index_inputs runs on global-index cases")
    target = judge.target
    inp = build(case, target.device)
    gold, lp = base.references(inp, inp.dout.contiguous())
    views = [("topk_length", "a stride-2 column", dict(topk_length=column(inp.topk_length)))]
    views += [("indices", f"{layout} (strides {tuple(v.stride())})", dict(indices=v))
              for layout, v in strided_indices(inp.indices).items()]
    _judge_views(judge, inp, views, gold, lp)


@declare("dsa", cases=dict(varlen=True, topk="random"), beyond=True)
def varlen_strided_index_inputs(judge: Judge, case: DsaCase) -> None:
    """gather_kv_indices, topk_length and the cu_seqlens as strided views in the varlen forms
    (beyond the contract): right, or a clear error naming the argument."""
    if not case.varlen:
        raise ValueError("varlen_strided_index_inputs runs on varlen cases")
    target = judge.target
    inp = build(case, target.device)
    gold, lp = base.references(inp, inp.dout.contiguous())
    views = [("gather_kv_indices", f"{layout} (strides {tuple(v.stride())})", dict(indices=v))
             for layout, v in strided_indices(inp.indices).items()]
    views += [(name, "a stride-2 column", dict(inputs={name: column(getattr(inp, name))}))
              for name in ("topk_length", "cu_seqlens_q", "cu_seqlens_k")]
    _judge_views(judge, inp, views, gold, lp)


def _judge_views(judge: Judge, inp, views, gold, lp) -> None:
    """Each (argument, layout, call keywords) of ``views`` (``inputs``: fields of ``inp``
    replaced) called and judged against the gold of the contiguous inputs."""
    for argument, layout, kwargs in views:
        what = f"{argument} as {layout}"
        view_inp = dataclasses.replace(inp, **kwargs.pop("inputs", {}))
        try:
            out = attempt(lambda kw=kwargs, vi=view_inp: base.call(judge.target, vi, **kw),
                          argument=argument, what=what, declared=False, judge=judge)
        except Declined:
            continue
        with judge.noted(f"{what}; the same values contiguous are the gold's"):
            _forward_and_gradients(judge, inp, out, gold, lp)
