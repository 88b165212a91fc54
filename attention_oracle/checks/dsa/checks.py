"""The DSA checks (docs/CONTRACT.md sections 3-5). Each is declared (``harness/registry.py``)
with the cases it runs on and called as ``check(target, case)``; its body judges through a
``Judge`` and raises OracleMismatch on a failure; the implementation is reached only through
``target.call``.

forward_agreement: out (and lse, where ``return_lse=True`` is answered) against the float64
    oracle under the agreement rule; out in the input dtype, lse float32.
gradient_agreement: dq_latent, dq_rope, dkv_latent, dk_rope (NoPE: dq_latent = dq,
    dkv_latent = dkv) for a contiguous dout.
empty_rows: rows with no valid slot give out = 0, lse = -inf, dq = 0 exactly; key rows named by
    no valid slot get exactly zero gradient; nothing is non-finite.
duplicates_counted: rows with planted duplicate indices agree with the oracle, and the same
    rows with each duplicate slot turned into a hole give a different answer (as the oracle's).
strided_dout: gradients for a strided dout equal those for ``dout.contiguous()``; dout is not
    modified.
chunked_backward: the trainer's pattern: forward+backward per query chunk over the whole key
    row, gradients summed, equals the one-shot backward (both under the rule).
varlen_agreement: the ``_varlen`` form against the oracle's index preparation + global math,
    and against the implementation's own ``offset_gather_kv_indices`` + global function.
misaligned_inputs: q, q_rope, key rows and dout at odd row strides and offsets (legal strides
    that 16-byte vector loads cannot take): forward and gradients agree, or the call is
    refused. On CUDA each example runs in a subprocess (a faulting kernel poisons its context).
varlen_isolation: keys outside one document are poisoned with +-64 and dout is zero outside
    its queries: its outputs still agree, and no key row outside it gets any gradient. (The
    rule's floor there comes from the whole problem, poison included, so it is loose; the
    exact zero gradient outside the document is the sharp part: a leaked slot gets
    P * dout != 0.)

Where two results of the implementation must agree with each other (chunked vs one-shot,
varlen vs composed), each is first held to the rule against the gold; their gap is then
bounded by the sum of the two allowances (2 * allowed).
"""
from __future__ import annotations

import dataclasses

import torch

from attention_oracle.checks.dsa.cases import (
    FUNCTIONS,
    DsaCase,
    DsaInputs,
    build,
    document_key_mask,
    document_query_mask,
)
from attention_oracle.judge.agreement import AFTER_STRIDED
from attention_oracle.judge.judge import Judge
from attention_oracle.judge.registry import declare, declared
from attention_oracle.judge.targets import Refused
from attention_oracle.oracle.dsa import ALGORITHMS, dsa_reference, without_duplicates
from attention_oracle.oracle.index import offset_gather_kv_indices as oracle_offset

GLOBAL = {True: FUNCTIONS[(True, False)], False: FUNCTIONS[(False, False)]}
INDEX_FN = "offset_gather_kv_indices"


# ----------------------------------------------------------------------------- calling


def _max_seqlens(case: DsaCase) -> tuple[int, int]:
    return (max((q for q, _ in case.docs), default=0), max((k for _, k in case.docs), default=0))


def call(target, inp: DsaInputs, *, return_lse=False, rows: slice | None = None,
         indices=None, topk_length="same", function=None):
    """Call the case's function (or ``function``) with the inputs; ``rows`` slices the queries."""
    c = inp.case
    q_l, q_r = inp.q_latent, inp.q_rope
    idx = inp.indices if indices is None else indices
    topk = inp.topk_length if isinstance(topk_length, str) else topk_length
    if rows is not None:
        q_l, idx = q_l[rows], idx[rows]
        q_r = None if q_r is None else q_r[rows]
        topk = None if topk is None else topk[rows]
    fn = function or c.function
    keys = (q_l, q_r, inp.kv_latent, inp.k_rope, idx) if c.rope else (q_l, inp.kv_latent, idx)
    kw = dict(topk_length=topk, softmax_scale=c.scale, return_lse=return_lse)
    if fn.endswith("_varlen"):
        return target.call(fn, *keys, inp.cu_seqlens_q, inp.cu_seqlens_k, *_max_seqlens(c),
                           causal=c.causal, **kw)
    return target.call(fn, *keys, **kw)


def grads(out, inp: DsaInputs, dout) -> dict:
    """Gradients of ``out`` for every differentiable input (an unused input gets zeros)."""
    leaves = inp.differentiable
    got = torch.autograd.grad(out, leaves, dout, allow_unused=True)
    return {n: torch.zeros_like(t) if g is None else g
            for n, t, g in zip(inp.grad_names, leaves, got)}


def global_rows(inp: DsaInputs):
    """(rows, topk_length) for the oracle's global math: varlen goes through the oracle's prep."""
    c = inp.case
    if not c.varlen:
        return inp.indices, inp.topk_length
    rows = oracle_offset(inp.indices, inp.cu_seqlens_q, inp.cu_seqlens_k, causal=c.causal,
                         topk_length=inp.topk_length)
    return rows, None


def valid_slots(inp: DsaInputs) -> torch.Tensor:
    """Bool ``[T, K]``: the slots that take part (docs/CONTRACT.md "3. DSA sparse attention")."""
    rows, topk = global_rows(inp)
    valid = (rows >= 0) & (rows < inp.case.S)
    if topk is not None:
        K = rows.shape[1]
        valid &= torch.arange(K, device=rows.device)[None, :] < topk.to(torch.int64)[:, None]
    return valid


def lp_references(*args, compute_dtype, **kw) -> dict:
    """{algorithm: ``dsa_reference(*args, **kw)`` in ``compute_dtype``} for each standard
    algorithm: the lp ensemble of the agreement rule."""
    return {a: dsa_reference(*args, compute_dtype=compute_dtype, magnitudes=False, algorithm=a, **kw)
            for a in ALGORITHMS}


def references(inp: DsaInputs, dout=None, *, rows=None, topk="same") -> tuple[dict, dict]:
    """Gold (float64 naive math, with magnitudes) and lp: {algorithm: the oracle's result in
    the case's dtype} for each standard algorithm."""
    c = inp.case
    idx, tk = global_rows(inp) if rows is None else (rows, inp.topk_length if topk == "same" else topk)
    args = [t.detach() if t is not None else None
            for t in (inp.q_latent, inp.q_rope, inp.kv_latent, inp.k_rope)]
    kw = dict(topk_length=tk, softmax_scale=c.scale)
    gold = dsa_reference(*args, idx, dout, compute_dtype=torch.float64,
                         apriori=c.torch_dtype == torch.float32, **kw)
    return gold, lp_references(*args, idx, dout, compute_dtype=c.torch_dtype, **kw)


def _lse_or_none(judge: Judge, inp: DsaInputs, **kw):
    """The implementation's lse, or None when it refuses ``return_lse=True`` (e.g. no_lse)."""
    return _out_and_lse(judge, inp, recompute_out=False, **kw)[1]


def _out_and_lse(judge: Judge, inp: DsaInputs, *, recompute_out=True, **kw):
    """``(out, lse)`` from one ``return_lse=True`` call; if lse is refused, ``(out, None)``
    with out from a plain call (``(None, None)`` without ``recompute_out``)."""
    target = judge.target
    try:
        result = call(target, inp, return_lse=True, **kw)
    except Refused:
        return (call(target, inp, **kw) if recompute_out else None), None
    ok = isinstance(result, (tuple, list)) and len(result) == 2
    judge.true("lse", ok, f"return_lse=True must give (out, lse), got {type(result).__name__}")
    lse = result[1]
    judge.true("lse", lse.dtype == torch.float32, f"lse dtype {lse.dtype} != float32")
    return result[0], lse


# ----------------------------------------------------------------------------- checks


@declare("dsa")
def forward_agreement(judge: Judge, case: DsaCase) -> None:
    """out (and lse, where return_lse=True is answered) against the float64 oracle under the rule."""
    inp = build(case, judge.target.device)
    out = call(judge.target, inp)
    gold, lp = references(inp)
    judge.true("out", out.dtype == case.torch_dtype, f"dtype {out.dtype} != input dtype {case.torch_dtype}")
    judge.agrees_with("out", out, gold, lp, gradient=False)
    lse = _lse_or_none(judge, inp)
    if lse is not None:
        judge.agrees_with("lse", lse, gold, lp, gradient=False)


@declare("dsa")
def gradient_agreement(judge: Judge, case: DsaCase) -> None:
    """The gradients of every differentiable input for a contiguous dout, under the rule."""
    inp = build(case, judge.target.device)
    dout = inp.dout.contiguous()
    got = grads(call(judge.target, inp), inp, dout)
    gold, lp = references(inp, dout)
    for name, g in got.items():
        judge.agrees_with(name, g, gold, lp, gradient=True)


@declare("dsa", cases=dict(empty_rows=True))
def empty_rows(judge: Judge, case: DsaCase) -> None:
    """Rows with no valid slot: out = 0, lse = -inf, dq = 0; unnamed key rows get zero gradient."""
    inp = build(case, judge.target.device)
    valid = valid_slots(inp)
    empty = ~valid.any(dim=1)
    out = call(judge.target, inp)
    got = grads(out, inp, inp.dout.contiguous())
    for name, x in [("out", out)] + list(got.items()):
        bad = ~torch.isfinite(x)
        judge.true(name, not bool(bad.any()), f"{int(bad.sum())} non-finite value(s) with empty rows present")
    judge.exact("out", out[empty], torch.zeros_like(out[empty]), what="out on empty rows")
    for name in ("dq_latent", "dq_rope"):
        if name in got:
            x = got[name][empty]
            judge.exact(name, x, torch.zeros_like(x), what=f"{name} on empty rows")
    rows, _ = global_rows(inp)
    named = torch.zeros(case.S, dtype=torch.bool, device=valid.device)
    named[rows[valid].to(torch.int64)] = True
    for name in ("dkv_latent", "dk_rope"):
        if name in got:
            x = got[name].flatten(1)[~named]
            judge.exact(name, x, torch.zeros_like(x), what=f"{name} on key rows no valid slot names")
    lse = _lse_or_none(judge, inp)
    if lse is not None:
        judge.exact("lse", lse[empty], torch.full_like(lse[empty], float("-inf")), what="lse on empty rows")


@declare("dsa", cases=dict(duplicates=True, min_T=1))
def duplicates_counted(judge: Judge, case: DsaCase) -> None:
    """Duplicate indices count once per slot: agreement, and removing them changes the answer."""
    if case.varlen:
        raise ValueError("duplicates_counted runs on global-index cases")
    target = judge.target
    inp = build(case, target.device)
    dout = inp.dout.contiguous()
    out = call(target, inp)
    got = grads(out, inp, dout)
    gold, lp = references(inp, dout)
    v_twice = judge.agrees_with("out", out, gold, lp, gradient=False)
    for name, g in got.items():
        judge.agrees_with(name, g, gold, lp, gradient=True)
    once_idx, touched = without_duplicates(inp.indices.cpu(), valid_slots(inp).cpu())
    if not bool(touched.any()):
        return
    once_idx = once_idx.to(inp.indices.device)
    out_once = call(target, inp, indices=once_idx)
    gold1, lp1 = references(inp, rows=once_idx)
    v_once = judge.agrees_with("out", out_once, gold1, lp1, gradient=False)
    rows = touched.to(out.device)
    gold_gap = float((gold["out"][rows] - gold1["out"][rows]).abs().max())
    slack = v_twice.allowed + v_once.allowed
    if gold_gap > slack:
        impl_gap = float((out[rows].detach().double() - out_once[rows].detach().double()).abs().max())
        judge.true("out", impl_gap >= gold_gap - slack,
                   f"rows with a duplicate slot and the same rows with it removed differ by "
                   f"{impl_gap:.3e}; the oracle's differ by {gold_gap:.3e} (slack {slack:.3e}): "
                   f"duplicates are not counted once per slot")


@declare("dsa", cases=dict(dout_layouts=("transposed", "sliced", "broadcast")))
def strided_dout(judge: Judge, case: DsaCase) -> None:
    """Gradients for a strided dout equal those for ``dout.contiguous()``; dout is not modified."""
    target = judge.target
    inp = build(case, target.device)
    before = inp.dout.clone()
    strided = grads(call(target, inp), inp, inp.dout)
    judge.exact("dout", inp.dout, before, what="dout was modified")
    contiguous = grads(call(target, inp), inp, before.contiguous())
    gold, lp = references(inp, before.contiguous())
    for name in strided:
        with judge.noted(AFTER_STRIDED.format(layout=case.layout_dout)):
            verdict = judge.agrees_with(name, contiguous[name], gold, lp, gradient=True)
        judge.close(name, strided[name], contiguous[name], verdict.allowed,
                    f"gradient with {case.layout_dout} dout (strides {tuple(inp.dout.stride())}) "
                    f"vs contiguous dout")


@declare("dsa", cases=dict(min_T=2))
def chunked_backward(judge: Judge, case: DsaCase) -> None:
    """Forward+backward per query chunk, gradients summed, equals the one-shot backward."""
    if case.varlen:
        raise ValueError("chunked_backward runs on global-index cases")
    target = judge.target
    inp = build(case, target.device)
    step = max(1, case.q_chunk)
    summed = {n: torch.zeros_like(t, dtype=torch.float64) for n, t in
              zip(inp.grad_names, inp.differentiable)}
    outs = []
    for a in range(0, case.T, step):
        rows = slice(a, min(case.T, a + step))
        out_c = call(target, inp, rows=rows)
        outs.append(out_c.detach())
        for name, g in grads(out_c, inp, inp.dout[rows]).items():
            summed[name] += g.double()
    dout = inp.dout.contiguous()
    one_shot = grads(call(target, inp), inp, dout)
    gold, lp = references(inp, dout)
    if outs:
        judge.agrees_with("out", torch.cat(outs), gold, lp, gradient=False)
    for name, total in summed.items():
        verdict = judge.agrees_with(name, one_shot[name], gold, lp, gradient=True)
        judge.agrees_with(name, total, gold, lp, gradient=True)
        judge.close(name, total, one_shot[name], 2 * verdict.allowed,
                    f"backward summed over query chunks of {step} vs one-shot")


@declare("dsa", cases=dict(varlen=True))
def varlen_agreement(judge: Judge, case: DsaCase) -> None:
    """The ``_varlen`` form against the oracle, and against the implementation's own
    ``offset_gather_kv_indices`` + global form."""
    target = judge.target
    inp = build(case, target.device)
    dout = inp.dout.contiguous()
    out, lse = _out_and_lse(judge, inp)
    got = grads(out, inp, dout)
    gold, lp = references(inp, dout)
    verdict = judge.agrees_with("out", out, gold, lp, gradient=False)
    for name, g in got.items():
        judge.agrees_with(name, g, gold, lp, gradient=True)
    if lse is not None:
        judge.agrees_with("lse", lse, gold, lp, gradient=False)
    fn = GLOBAL[case.rope]
    if target.offers(INDEX_FN) and target.offers(fn):
        rows = target.call(INDEX_FN, inp.indices, inp.cu_seqlens_q, inp.cu_seqlens_k,
                           causal=case.causal, topk_length=inp.topk_length)
        composed = call(target, inp, indices=rows, topk_length=None, function=fn)
        judge.agrees_with("out", composed, gold, lp, gradient=False)
        judge.close("out", out, composed, 2 * verdict.allowed,
                    "varlen form vs offset_gather_kv_indices + global form")


@declare("dsa", cases=dict(varlen=True, poison=True))
def varlen_isolation(judge: Judge, case: DsaCase) -> None:
    """Keys outside one document poisoned: its outputs agree, no key row outside gets gradient."""
    if case.poison_doc < 0:
        raise ValueError("varlen_isolation needs a case with poison_doc set")
    target = judge.target
    inp = build(case, target.device)
    queries = document_query_mask(case).to(target.device)
    keys = document_key_mask(case).to(target.device)
    dout = inp.dout.contiguous()
    out = call(target, inp)
    got = grads(out, inp, dout)
    gold, lp = references(inp, dout)
    judge.agrees_with("out", out, gold, lp, gradient=False, select=queries)
    for name, g in got.items():
        if name.startswith("dq"):
            judge.agrees_with(name, g, gold, lp, gradient=True, select=queries)
        else:
            outside = g.flatten(1)[~keys]
            judge.exact(name, outside, torch.zeros_like(outside),
                        what=f"gradient reached key rows outside document {case.poison_doc}")
            judge.agrees_with(name, g, gold, lp, gradient=True)


@declare("dsa", requires=("misaligned",), isolate_on_cuda=True)  # a faulting kernel must not poison the run's context
def misaligned_inputs(judge: Judge, case: DsaCase) -> None:
    """q, q_rope, key rows and dout at odd row strides and offsets: agree, or refuse."""
    case = dataclasses.replace(case, layout_q="misaligned", layout_q_rope="misaligned",
                               layout_kv="misaligned", layout_dout="misaligned")
    forward_agreement.body(judge.for_case(case), case)
    gradient_agreement.body(judge.for_case(case), case)



CHECKS = declared("dsa")
