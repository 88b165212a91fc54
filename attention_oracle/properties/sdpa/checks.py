"""The SDPA checks. Each is ``check(target, case)`` and raises OracleMismatch on failure.

forward_agreement, gradient_agreement: docs/CONTRACT.md "5. The agreement rule" against the float64 oracle.
strided_dout: gradients for a strided ``dout`` equal those for ``dout.contiguous()`` and
    ``dout`` is not modified.
rank3_equals_rank4: ``[N, L, E]`` inputs give what the same data as ``[1, N, L, E]`` gives.
fully_masked_rows: out = 0 exactly, zero gradients, nothing non-finite, lse = -inf.
determinism: the same call twice gives bitwise-equal outputs and gradients.
misaligned_inputs: q, k, v and dout at odd row strides and offsets (legal strides that
    16-byte vector loads cannot take): outputs and gradients agree, or the call is refused.
    On CUDA it runs each example in a subprocess: a kernel that faults on misaligned
    addresses poisons its CUDA context, and must not take the rest of the run with it.
"""
from __future__ import annotations

import dataclasses

import torch

from attention_oracle.oracle.sdpa import ALGORITHMS, sdpa_reference
from attention_oracle.properties.harness.agreement import AFTER_STRIDED, assert_agrees, assert_exact, assert_true, noted
from attention_oracle.properties.sdpa.cases import SdpaCase, SdpaInputs, build

FN = SdpaCase.function
FN_LSE = "scaled_dot_product_attention_with_lse"


def _call(target, inp: SdpaInputs, q=None, k=None, v=None):
    return target.call(FN, q if q is not None else inp.q, k if k is not None else inp.k,
                       v if v is not None else inp.v, attn_mask=inp.attn_mask, **inp.kwargs)


def _grads(out, inp: SdpaInputs, dout, q=None, k=None, v=None):
    leaves = (q if q is not None else inp.q, k if k is not None else inp.k,
              v if v is not None else inp.v)
    return dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out, leaves, dout)))


def _references(inp: SdpaInputs, case: SdpaCase, dout=None):
    """Gold (float64 naive math, with magnitudes) and lp: {algorithm: the oracle's result in
    the case's dtype} for each standard algorithm (the agreement rule's ensemble)."""
    kw = dict(attn_mask=inp.attn_mask, **inp.kwargs)
    args = (inp.q.detach(), inp.k.detach(), inp.v.detach())
    gold = sdpa_reference(*args, dout, compute_dtype=torch.float64, magnitudes=True, **kw)
    lp = {a: sdpa_reference(*args, dout, compute_dtype=case.torch_dtype, algorithm=a, **kw)
          for a in ALGORITHMS}
    return gold, lp


def _agree(name, x, gold, lp, case, target, check, gradient):
    lp = {a: r[name] for a, r in lp.items()}
    return assert_agrees(x, gold[name], lp, check=check, impl=target.name, name=name,
                         dtype=case.torch_dtype, gradient=gradient,
                         magnitude=gold["magnitude"][name], repro=case.repro(check, target.name))


def forward_agreement(target, case: SdpaCase, check: str = "sdpa.forward_agreement") -> None:
    inp = build(case, target.device, requires_grad=False)
    out = _call(target, inp)
    gold, lp = _references(inp, case)
    assert_true(out.dtype == case.torch_dtype, check=check, impl=target.name, name="out",
                message=f"dtype {out.dtype} != input dtype {case.torch_dtype}",
                repro=case.repro(check, target.name))
    _agree("out", out, gold, lp, case, target, check, gradient=False)
    if target.offers(FN_LSE):
        _, lse = target.call(FN_LSE, inp.q, inp.k, inp.v, attn_mask=inp.attn_mask, **inp.kwargs)
        _agree("lse", lse, gold, lp, case, target, check, gradient=False)


def gradient_agreement(target, case: SdpaCase, check: str = "sdpa.gradient_agreement") -> None:
    inp = build(case, target.device)
    dout = inp.dout.contiguous()
    grads = _grads(_call(target, inp), inp, dout)
    gold, lp = _references(inp, case, dout)
    for name, g in grads.items():
        _agree(name, g, gold, lp, case, target, check, gradient=True)


def strided_dout(target, case: SdpaCase) -> None:
    check = "sdpa.strided_dout"
    inp = build(case, target.device)
    before = inp.dout.clone()
    strided = _grads(_call(target, inp), inp, inp.dout)
    assert_exact(inp.dout, before, check=check, impl=target.name, name="dout", what="dout was modified",
                 repro=case.repro(check, target.name))
    contiguous = _grads(_call(target, inp), inp, before.contiguous())
    gold, lp = _references(inp, case, before.contiguous())
    for name in strided:
        with noted(AFTER_STRIDED.format(layout=case.layout_dout)):
            verdict = _agree(name, contiguous[name], gold, lp, case, target, check, gradient=True)
        gap = float((strided[name].double() - contiguous[name].double()).abs().max()) if strided[name].numel() else 0.0
        assert_true(gap <= verdict.allowed, check=check, impl=target.name, name=name,
                    message=f"gradient with {case.layout_dout} dout (strides {tuple(inp.dout.stride())}) "
                            f"differs from the contiguous-dout gradient by {gap:.3e} > allowed {verdict.allowed:.3e}",
                    repro=case.repro(check, target.name))


def rank3_equals_rank4(target, case: SdpaCase) -> None:
    """``case`` is rank 3; the rank-4 inputs are unsqueezed views of the very same tensors."""
    check = "sdpa.rank3_equals_rank4"
    inp = build(case, target.device)
    dout = inp.dout.contiguous()
    out3 = _call(target, inp)
    g3 = _grads(out3, inp, dout)
    q4, k4, v4 = (t.detach().unsqueeze(0).requires_grad_() for t in (inp.q, inp.k, inp.v))
    mask4 = inp.attn_mask
    inp4 = SdpaInputs(q4, k4, v4, mask4, dout.unsqueeze(0), inp.kwargs)
    out4 = _call(target, inp4)
    g4 = _grads(out4, inp4, dout.unsqueeze(0))
    gold, lp = _references(inp, case, dout)
    pairs = [("out", out3, out4[0])] + [(n, g3[n], g4[n][0]) for n in g3]
    for name, x3, x4 in pairs:
        verdict = _agree(name, x4, gold, lp, case, target, check, gradient=name != "out")
        _agree(name, x3, gold, lp, case, target, check, gradient=name != "out")
        gap = float((x3.detach().double() - x4.detach().double()).abs().max()) if x3.numel() else 0.0
        assert_true(gap <= verdict.allowed, check=check, impl=target.name, name=name,
                    message=f"rank-3 and rank-4 results differ by {gap:.3e} > allowed {verdict.allowed:.3e}",
                    repro=case.repro(check, target.name))


def _empty_rows(inp: SdpaInputs, case: SdpaCase) -> torch.Tensor:
    """Bool [*batch, Hq, L]: query rows with no key left (from the mask)."""
    shape = tuple(inp.q.shape[:-1]) + (case.S,)
    m = inp.attn_mask.expand(shape)
    takes = m if m.dtype == torch.bool else ~torch.isneginf(m)
    return ~takes.any(-1)


def fully_masked_rows(target, case: SdpaCase) -> None:
    check = "sdpa.fully_masked_rows"
    inp = build(case, target.device)
    rows = _empty_rows(inp, case)
    repro = case.repro(check, target.name)
    out = _call(target, inp)
    grads = _grads(out, inp, inp.dout.contiguous())
    for name, x in [("out", out)] + list(grads.items()):
        bad = ~torch.isfinite(x)
        assert_true(not bool(bad.any()), check=check, impl=target.name, name=name,
                    message=f"{int(bad.sum())} non-finite value(s) with fully masked rows present",
                    repro=repro)
    zeros = torch.zeros_like(out[rows])
    assert_exact(out[rows], zeros, check=check, impl=target.name, name="out", what="out on fully masked rows",
                 repro=repro)
    assert_exact(grads["dq"][rows], torch.zeros_like(grads["dq"][rows]), check=check, impl=target.name,
                 name="dq", what="dq on fully masked rows", repro=repro)
    if target.offers(FN_LSE):
        _, lse = target.call(FN_LSE, inp.q, inp.k, inp.v, attn_mask=inp.attn_mask, **inp.kwargs)
        assert_exact(lse[rows], torch.full_like(lse[rows], float("-inf")), check=check, impl=target.name,
                     name="lse", what="lse on fully masked rows", repro=repro)


def determinism(target, case: SdpaCase) -> None:
    check = "sdpa.determinism"
    inp = build(case, target.device)
    dout = inp.dout.contiguous()
    results = []
    for _ in range(2):
        out = _call(target, inp)
        results.append({"out": out.detach(), **_grads(out, inp, dout)})
    for name in results[0]:
        assert_exact(results[1][name], results[0][name], check=check, impl=target.name, name=name,
                     what="second identical call differs", repro=case.repro(check, target.name))


def misaligned_inputs(target, case: SdpaCase) -> None:
    check = "sdpa.misaligned_inputs"
    case = dataclasses.replace(case, layout_q="misaligned", layout_k="misaligned",
                               layout_v="misaligned", layout_dout="misaligned")
    forward_agreement(target, case, check)
    gradient_agreement(target, case, check)


misaligned_inputs.ISOLATE_ON_CUDA = True

CHECKS = {f.__name__: f for f in (forward_agreement, gradient_agreement, strided_dout,
                                   rank3_equals_rank4, fully_masked_rows, determinism,
                                   misaligned_inputs)}
