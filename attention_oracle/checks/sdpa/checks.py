"""The SDPA checks. Each is declared (``harness/registry.py``) with the cases it runs on, and
called as ``check(target, case)``; its body judges through a ``Judge`` and raises OracleMismatch
on failure.

forward_agreement, gradient_agreement: docs/CONTRACT.md "5. The agreement rule" against the float64 oracle.
strided_dout: gradients for a strided ``dout`` equal those for ``dout.contiguous()`` and
    ``dout`` is not modified.
rank3_equals_rank4: ``[N, L, E]`` inputs give what the same data as ``[1, N, L, E]`` gives.
fully_masked_rows: out = 0 exactly, zero gradients, nothing non-finite, lse = -inf.
determinism: the same call twice gives bitwise-equal outputs and gradients (under
    ``torch.use_deterministic_algorithms`` where only that is declared).
misaligned_inputs: q, k, v and dout at odd row strides and offsets (legal strides that
    16-byte vector loads cannot take): outputs and gradients agree, or the call is refused.
    On CUDA it runs each example in a subprocess: a kernel that faults on misaligned
    addresses poisons its CUDA context, and must not take the rest of the run with it.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch

from attention_oracle.checks.sdpa.cases import SdpaCase, SdpaInputs, build
from attention_oracle.judge import known
from attention_oracle.judge.agreement import AFTER_STRIDED
from attention_oracle.judge.capabilities import resolve
from attention_oracle.judge.judge import Judge
from attention_oracle.judge.registry import declare, declared
from attention_oracle.oracle.sdpa import ALGORITHMS, lp_algorithms, sdpa_reference

FN = SdpaCase.function
FN_LSE = "scaled_dot_product_attention_with_lse"


def call(target, inp: SdpaInputs, q=None, k=None, v=None):
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
    gold = sdpa_reference(*args, dout, compute_dtype=torch.float64, magnitudes=True,
                          apriori=case.torch_dtype == torch.float32, **kw)
    lp = {a: sdpa_reference(*args, dout, compute_dtype=case.torch_dtype, algorithm=a, **kw)
          for a in lp_algorithms(case.torch_dtype, ALGORITHMS)}
    return gold, lp


@declare("sdpa")
def forward_agreement(judge: Judge, case: SdpaCase) -> None:
    """out (and lse, where offered) against the float64 oracle under the agreement rule."""
    target = judge.target
    inp = build(case, target.device, requires_grad=False)
    out = call(target, inp)
    gold, lp = _references(inp, case)
    judge.true("out", out.dtype == case.torch_dtype, f"dtype {out.dtype} != input dtype {case.torch_dtype}")
    judge.agrees_with("out", out, gold, lp, gradient=False)
    if target.offers(FN_LSE):
        _, lse = target.call(FN_LSE, inp.q, inp.k, inp.v, attn_mask=inp.attn_mask, **inp.kwargs)
        judge.agrees_with("lse", lse, gold, lp, gradient=False)


@declare("sdpa", requires=("gradients",))
def gradient_agreement(judge: Judge, case: SdpaCase) -> None:
    """dq, dk, dv for a contiguous dout against the float64 oracle under the agreement rule."""
    inp = build(case, judge.target.device)
    dout = inp.dout.contiguous()
    grads = _grads(call(judge.target, inp), inp, dout)
    gold, lp = _references(inp, case, dout)
    for name, g in grads.items():
        judge.agrees_with(name, g, gold, lp, gradient=True)


@declare("sdpa", cases=dict(dout_layouts=("transposed", "sliced", "broadcast")), requires=("gradients",))
def strided_dout(judge: Judge, case: SdpaCase) -> None:
    """Gradients for a strided dout equal those for ``dout.contiguous()``; dout is not modified."""
    target = judge.target
    inp = build(case, target.device)
    before = inp.dout.clone()
    strided = _grads(call(target, inp), inp, inp.dout)
    judge.exact("dout", inp.dout, before, what="dout was modified")
    contiguous = _grads(call(target, inp), inp, before.contiguous())
    gold, lp = _references(inp, case, before.contiguous())
    for name in strided:
        with judge.noted(AFTER_STRIDED.format(layout=case.layout_dout)):
            verdict = judge.agrees_with(name, contiguous[name], gold, lp, gradient=True)
        judge.close(name, strided[name], contiguous[name], verdict.allowed,
                    f"gradient with {case.layout_dout} dout (strides {tuple(inp.dout.stride())}) "
                    f"and the contiguous-dout gradient")


@declare("sdpa", cases=dict(rank=3), requires=("ranks_3_and_4", "gradients"))
def rank3_equals_rank4(judge: Judge, case: SdpaCase) -> None:
    """``[N, L, E]`` inputs give what the same data as ``[1, N, L, E]`` gives; ``case`` is rank 3,
    the rank-4 inputs are unsqueezed views of the very same tensors."""
    target = judge.target
    inp = build(case, target.device)
    dout = inp.dout.contiguous()
    out3 = call(target, inp)
    g3 = _grads(out3, inp, dout)
    q4, k4, v4 = (t.detach().unsqueeze(0).requires_grad_() for t in (inp.q, inp.k, inp.v))
    mask4 = inp.attn_mask
    inp4 = SdpaInputs(q4, k4, v4, mask4, dout.unsqueeze(0), inp.kwargs)
    out4 = call(target, inp4)
    g4 = _grads(out4, inp4, dout.unsqueeze(0))
    gold, lp = _references(inp, case, dout)
    pairs = [("out", out3, out4[0])] + [(n, g3[n], g4[n][0]) for n in g3]

    def without(name):
        def pair(rows):  # both ranks again, the rows' dout zero: those rows add nothing to dk, dv
            d = dout.clone()
            d[rows.to(d.device)] = 0
            return (_grads(call(target, inp), inp, d)[name],
                    _grads(call(target, inp4), inp4, d.unsqueeze(0))[name][0])
        return pair

    for name, x3, x4 in pairs:
        verdict = judge.agrees_with(name, x4, gold, lp, gradient=name != "out")
        judge.agrees_with(name, x3, gold, lp, gradient=name != "out")
        judge.close(name, x3, x4, verdict.allowed, "rank-3 and rank-4 results", without=without(name))


def _empty_rows(inp: SdpaInputs, case: SdpaCase) -> torch.Tensor:
    """Bool [*batch, Hq, L]: query rows with no key left (from the mask)."""
    shape = tuple(inp.q.shape[:-1]) + (case.S,)
    m = inp.attn_mask.expand(shape)
    takes = m if m.dtype == torch.bool else ~torch.isneginf(m)
    return ~takes.any(-1)


# ----------------------------------------------------------------------------- known signatures
# (judge/known.py): the query rows a known failure's signature names, and the gradients
# without them; the outputs indexed by query rows first: out, lse, dq

known.area("sdpa").row_outputs = ("out", "lse", "dq")


def _mask_rows(case: SdpaCase, keep) -> torch.Tensor:
    """Bool [*batch, Hq, L] (on the CPU): rows where ``keep(mask)`` [.., L, S] takes no key."""
    inp = build(case, torch.device("cpu"), requires_grad=False)
    rows = tuple(inp.q.shape[:-1])
    if inp.attn_mask is None:
        return torch.zeros(rows, dtype=torch.bool)
    return ~keep(inp.attn_mask.expand(rows + (case.S,))).any(-1)


@known.selector("sdpa", "fully_masked")
def fully_masked(case: SdpaCase) -> torch.Tensor:
    """Rows no key takes part in (False / -inf everywhere): docs/FINDINGS.md F2."""
    return _mask_rows(case, lambda m: m if m.dtype == torch.bool else ~torch.isneginf(m))


@known.selector("sdpa", "finfo_min")
def finfo_min(case: SdpaCase) -> torch.Tensor:
    """Rows whose every key holds the dtype's finite minimum or -inf, at least one the minimum
    (Hugging Face padding, not masked in PyTorch's semantics): docs/FINDINGS.md F10, F11."""
    low = torch.finfo(case.torch_dtype).min
    return _mask_rows(case, lambda m: (torch.ones_like(m) if m.dtype == torch.bool else m > low)) \
        & ~fully_masked(case)


def _gradients_without(judge: Judge, case: SdpaCase, rows: torch.Tensor):
    """(dq, dk, dv, gold, lp) for a contiguous dout whose ``rows`` are zero: those rows add
    nothing to dk and dv (dS = P (dP - Delta) = 0 there), whatever their P."""
    inp = build(case, judge.target.device)
    dout = inp.dout.contiguous().clone()
    dout[rows.to(dout.device)] = 0
    grads = _grads(call(judge.target, inp), inp, dout)
    gold, lp = _references(inp, case, dout)
    return grads, gold, lp


known.area("sdpa").rerun = _gradients_without


@declare("sdpa", cases=dict(empty_rows=True), requires=("masks", "gradients"))
def fully_masked_rows(judge: Judge, case: SdpaCase) -> None:
    """out = 0 exactly, zero gradients, nothing non-finite, lse = -inf on rows no key takes part in."""
    target = judge.target
    inp = build(case, target.device)
    rows = _empty_rows(inp, case)
    out = call(target, inp)
    grads = _grads(out, inp, inp.dout.contiguous())
    for name, x in [("out", out)] + list(grads.items()):
        bad = ~torch.isfinite(x)
        judge.true(name, not bool(bad.any()),
                   f"{int(bad.sum())} non-finite value(s) with fully masked rows present")
    for name, x in (("out", out), ("dq", grads["dq"])):
        judge.exact(name, x, torch.zeros_like(x), what=f"{name} on fully masked rows",
                    select=rows.to(x.device)[..., None].expand(x.shape))
    if target.offers(FN_LSE):
        _, lse = target.call(FN_LSE, inp.q, inp.k, inp.v, attn_mask=inp.attn_mask, **inp.kwargs)
        judge.exact("lse", lse, torch.full_like(lse, float("-inf")), what="lse on fully masked rows",
                    select=rows.to(lse.device))


@contextlib.contextmanager
def _deterministic_algorithms(on: bool):
    """``torch.use_deterministic_algorithms(True, warn_only=True)`` inside (when ``on``), the
    process's setting restored after."""
    if not on:
        yield
        return
    was, warn = torch.are_deterministic_algorithms_enabled(), \
        torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn)


@declare("sdpa", requires=("deterministic", "gradients"))
def determinism(judge: Judge, case: SdpaCase) -> None:
    """The same call twice gives bitwise-equal outputs and gradients (beyond the contract: only
    for implementations that declare ``deterministic``, or ``deterministic_on_request``: then
    both calls run under ``torch.use_deterministic_algorithms``)."""
    inp = build(case, judge.target.device)
    dout = inp.dout.contiguous()
    results = []
    with _deterministic_algorithms(not resolve(judge.target, FN).deterministic):
        for _ in range(2):
            out = call(judge.target, inp)
            results.append({"out": out.detach(), **_grads(out, inp, dout)})
    for name in results[0]:
        judge.exact(name, results[1][name], results[0][name], what="second identical call differs")


@declare("sdpa", cases=dict(layouts=False, dout_layouts=("contiguous",)), requires=("misaligned", "gradients"),
         isolate_on_cuda=True)
def misaligned_inputs(judge: Judge, case: SdpaCase) -> None:
    """q, k, v and dout at odd row strides and offsets: outputs and gradients agree, or refuse."""
    case = dataclasses.replace(case, layout_q="misaligned", layout_k="misaligned",
                               layout_v="misaligned", layout_dout="misaligned")
    forward_agreement.body(judge.for_case(case), case)
    gradient_agreement.body(judge.for_case(case), case)



CHECKS = declared("sdpa")
