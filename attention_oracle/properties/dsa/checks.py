"""The DSA checks (docs/CONTRACT.md sections 3-5). Each is ``check(target, case)`` and raises
OracleMismatch on a failure; the implementation is reached only through ``target.call``.

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

from attention_oracle.oracle.dsa import ALGORITHMS, dsa_reference
from attention_oracle.oracle.index import offset_gather_kv_indices as oracle_offset
from attention_oracle.properties.dsa.cases import (
    FUNCTIONS,
    DsaCase,
    DsaInputs,
    build,
    document_key_mask,
    document_query_mask,
)
from attention_oracle.properties.harness.agreement import AFTER_STRIDED, assert_agrees, assert_exact, assert_true, noted
from attention_oracle.properties.harness.targets import Refused

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
    gold = dsa_reference(*args, idx, dout, compute_dtype=torch.float64, **kw)
    return gold, lp_references(*args, idx, dout, compute_dtype=c.torch_dtype, **kw)


def _repro(case, check, target):
    return case.repro(check, target.name)


def agree(name, x, gold, lp, case, target, check, *, gradient, select=None):
    g, l = gold[name], {a: r[name] for a, r in lp.items()}
    if select is not None:
        x, g, l = x[select], g[select], {a: t[select] for a, t in l.items()}
    return assert_agrees(x, g, l, check=check, impl=target.name, name=name, dtype=case.torch_dtype,
                         gradient=gradient, magnitude=gold["magnitude"][name],
                         repro=_repro(case, check, target))


def assert_close_to(name, x, y, allowed, what, case, target, check):
    """``max|x - y| <= allowed`` (two results of the implementation that must agree)."""
    gap = float((x.detach().double() - y.detach().double()).abs().max()) if x.numel() else 0.0
    assert_true(gap <= allowed, check=check, impl=target.name, name=name,
                message=f"{what}: differ by {gap:.3e} > allowed {allowed:.3e}",
                repro=_repro(case, check, target))


def _lse_or_none(target, inp: DsaInputs, check: str, **kw):
    """The implementation's lse, or None when it refuses ``return_lse=True`` (e.g. no_lse)."""
    return _out_and_lse(target, inp, check, recompute_out=False, **kw)[1]


def _out_and_lse(target, inp: DsaInputs, check: str, *, recompute_out=True, **kw):
    """``(out, lse)`` from one ``return_lse=True`` call; if lse is refused, ``(out, None)``
    with out from a plain call (``(None, None)`` without ``recompute_out``)."""
    try:
        result = call(target, inp, return_lse=True, **kw)
    except Refused:
        return (call(target, inp, **kw) if recompute_out else None), None
    ok = isinstance(result, (tuple, list)) and len(result) == 2
    assert_true(ok, check=check, impl=target.name, name="lse",
                message=f"return_lse=True must give (out, lse), got {type(result).__name__}",
                repro=_repro(inp.case, check, target))
    lse = result[1]
    assert_true(lse.dtype == torch.float32, check=check, impl=target.name, name="lse",
                message=f"lse dtype {lse.dtype} != float32", repro=_repro(inp.case, check, target))
    return result[0], lse


# ----------------------------------------------------------------------------- checks


def forward_agreement(target, case: DsaCase, check: str = "dsa.forward_agreement") -> None:
    inp = build(case, target.device)
    out = call(target, inp)
    gold, lp = references(inp)
    assert_true(out.dtype == case.torch_dtype, check=check, impl=target.name, name="out",
                message=f"dtype {out.dtype} != input dtype {case.torch_dtype}",
                repro=_repro(case, check, target))
    agree("out", out, gold, lp, case, target, check, gradient=False)
    lse = _lse_or_none(target, inp, check)
    if lse is not None:
        agree("lse", lse, gold, lp, case, target, check, gradient=False)


def gradient_agreement(target, case: DsaCase, check: str = "dsa.gradient_agreement") -> None:
    inp = build(case, target.device)
    dout = inp.dout.contiguous()
    got = grads(call(target, inp), inp, dout)
    gold, lp = references(inp, dout)
    for name, g in got.items():
        agree(name, g, gold, lp, case, target, check, gradient=True)


def empty_rows(target, case: DsaCase) -> None:
    check = "dsa.empty_rows"
    inp = build(case, target.device)
    repro = _repro(case, check, target)
    valid = valid_slots(inp)
    empty = ~valid.any(dim=1)
    out = call(target, inp)
    got = grads(out, inp, inp.dout.contiguous())
    for name, x in [("out", out)] + list(got.items()):
        bad = ~torch.isfinite(x)
        assert_true(not bool(bad.any()), check=check, impl=target.name, name=name,
                    message=f"{int(bad.sum())} non-finite value(s) with empty rows present", repro=repro)
    assert_exact(out[empty], torch.zeros_like(out[empty]), check=check, impl=target.name,
                 name="out", what="out on empty rows", repro=repro)
    for name in ("dq_latent", "dq_rope"):
        if name in got:
            x = got[name][empty]
            assert_exact(x, torch.zeros_like(x), check=check, impl=target.name, name=name,
                         what=f"{name} on empty rows", repro=repro)
    rows, _ = global_rows(inp)
    named = torch.zeros(case.S, dtype=torch.bool, device=valid.device)
    named[rows[valid].to(torch.int64)] = True
    for name in ("dkv_latent", "dk_rope"):
        if name in got:
            x = got[name].flatten(1)[~named]
            assert_exact(x, torch.zeros_like(x), check=check, impl=target.name, name=name,
                         what=f"{name} on key rows no valid slot names", repro=repro)
    lse = _lse_or_none(target, inp, check)
    if lse is not None:
        assert_exact(lse[empty], torch.full_like(lse[empty], float("-inf")), check=check,
                     impl=target.name, name="lse", what="lse on empty rows", repro=repro)


def without_duplicates(indices: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices with every repeated valid index (after its first slot) made a hole; the rows touched."""
    once = indices.clone()
    touched = torch.zeros(indices.shape[0], dtype=torch.bool)
    for t in range(indices.shape[0]):
        seen = set()
        for s in torch.nonzero(valid[t]).flatten().tolist():
            j = int(indices[t, s])
            if j in seen:
                once[t, s] = -1
                touched[t] = True
            seen.add(j)
    return once, touched


def duplicates_counted(target, case: DsaCase) -> None:
    check = "dsa.duplicates_counted"
    if case.varlen:
        raise ValueError("duplicates_counted runs on global-index cases")
    inp = build(case, target.device)
    dout = inp.dout.contiguous()
    out = call(target, inp)
    got = grads(out, inp, dout)
    gold, lp = references(inp, dout)
    v_twice = agree("out", out, gold, lp, case, target, check, gradient=False)
    for name, g in got.items():
        agree(name, g, gold, lp, case, target, check, gradient=True)
    once_idx, touched = without_duplicates(inp.indices.cpu(), valid_slots(inp).cpu())
    if not bool(touched.any()):
        return
    once_idx = once_idx.to(inp.indices.device)
    out_once = call(target, inp, indices=once_idx)
    gold1, lp1 = references(inp, rows=once_idx)
    v_once = agree("out", out_once, gold1, lp1, case, target, check, gradient=False)
    rows = touched.to(out.device)
    gold_gap = float((gold["out"][rows] - gold1["out"][rows]).abs().max())
    slack = v_twice.allowed + v_once.allowed
    if gold_gap > slack:
        impl_gap = float((out[rows].detach().double() - out_once[rows].detach().double()).abs().max())
        assert_true(impl_gap >= gold_gap - slack, check=check, impl=target.name, name="out",
                    message=f"rows with a duplicate slot and the same rows with it removed differ by "
                            f"{impl_gap:.3e}; the oracle's differ by {gold_gap:.3e} (slack {slack:.3e}): "
                            f"duplicates are not counted once per slot",
                    repro=_repro(case, check, target))


def strided_dout(target, case: DsaCase) -> None:
    check = "dsa.strided_dout"
    inp = build(case, target.device)
    before = inp.dout.clone()
    strided = grads(call(target, inp), inp, inp.dout)
    assert_exact(inp.dout, before, check=check, impl=target.name, name="dout", what="dout was modified",
                 repro=_repro(case, check, target))
    contiguous = grads(call(target, inp), inp, before.contiguous())
    gold, lp = references(inp, before.contiguous())
    for name in strided:
        with noted(AFTER_STRIDED.format(layout=case.layout_dout)):
            verdict = agree(name, contiguous[name], gold, lp, case, target, check, gradient=True)
        assert_close_to(name, strided[name], contiguous[name], verdict.allowed,
                        f"gradient with {case.layout_dout} dout (strides {tuple(inp.dout.stride())}) "
                        f"vs contiguous dout", case, target, check)


def chunked_backward(target, case: DsaCase) -> None:
    check = "dsa.chunked_backward"
    if case.varlen:
        raise ValueError("chunked_backward runs on global-index cases")
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
        agree("out", torch.cat(outs), gold, lp, case, target, check, gradient=False)
    for name, total in summed.items():
        verdict = agree(name, one_shot[name], gold, lp, case, target, check, gradient=True)
        agree(name, total, gold, lp, case, target, check, gradient=True)
        assert_close_to(name, total, one_shot[name], 2 * verdict.allowed,
                        f"backward summed over query chunks of {step} vs one-shot", case, target, check)


def varlen_agreement(target, case: DsaCase) -> None:
    check = "dsa.varlen_agreement"
    inp = build(case, target.device)
    dout = inp.dout.contiguous()
    out, lse = _out_and_lse(target, inp, check)
    got = grads(out, inp, dout)
    gold, lp = references(inp, dout)
    verdict = agree("out", out, gold, lp, case, target, check, gradient=False)
    for name, g in got.items():
        agree(name, g, gold, lp, case, target, check, gradient=True)
    if lse is not None:
        agree("lse", lse, gold, lp, case, target, check, gradient=False)
    fn = GLOBAL[case.rope]
    if target.offers(INDEX_FN) and target.offers(fn):
        rows = target.call(INDEX_FN, inp.indices, inp.cu_seqlens_q, inp.cu_seqlens_k,
                           causal=case.causal, topk_length=inp.topk_length)
        composed = call(target, inp, indices=rows, topk_length=None, function=fn)
        agree("out", composed, gold, lp, case, target, check, gradient=False)
        assert_close_to("out", out, composed, 2 * verdict.allowed,
                        "varlen form vs offset_gather_kv_indices + global form", case, target, check)


def varlen_isolation(target, case: DsaCase) -> None:
    check = "dsa.varlen_isolation"
    if case.poison_doc < 0:
        raise ValueError("varlen_isolation needs a case with poison_doc set")
    inp = build(case, target.device)
    repro = _repro(case, check, target)
    queries = document_query_mask(case).to(target.device)
    keys = document_key_mask(case).to(target.device)
    dout = inp.dout.contiguous()
    out = call(target, inp)
    got = grads(out, inp, dout)
    gold, lp = references(inp, dout)
    agree("out", out, gold, lp, case, target, check, gradient=False, select=queries)
    for name, g in got.items():
        if name.startswith("dq"):
            agree(name, g, gold, lp, case, target, check, gradient=True, select=queries)
        else:
            outside = g.flatten(1)[~keys]
            assert_exact(outside, torch.zeros_like(outside), check=check, impl=target.name, name=name,
                         what=f"gradient reached key rows outside document {case.poison_doc}",
                         repro=repro)
            agree(name, g, gold, lp, case, target, check, gradient=True)


def misaligned_inputs(target, case: DsaCase) -> None:
    """q, q_rope, key rows and dout at odd row strides and offsets: agree, or refuse."""
    check = "dsa.misaligned_inputs"
    case = dataclasses.replace(case, layout_q="misaligned", layout_q_rope="misaligned",
                               layout_kv="misaligned", layout_dout="misaligned")
    forward_agreement(target, case, check)
    gradient_agreement(target, case, check)


misaligned_inputs.ISOLATE_ON_CUDA = True  # a faulting kernel must not poison the run's context

CHECKS = {f.__name__: f for f in (forward_agreement, gradient_agreement, empty_rows,
                                   duplicates_counted, strided_dout, chunked_backward,
                                   varlen_agreement, varlen_isolation, misaligned_inputs)}


# beyond-contract checks live in their own module; registered here so replay and the corpus see them
from attention_oracle.properties.dsa import edges as _edges  # noqa: E402

CHECKS.update(_edges.CHECKS)
