"""The agreement rule (docs/CONTRACT.md "5. The agreement rule") and exact comparisons, with precise failure messages.

For an output X with gold ``X_gold`` (float64 oracle), the lp runs ``X_lp[a]`` (the oracle's
math run in the implementation's dtype by each standard algorithm ``a``: naive, flash,
prescaled; ``oracle/flash.py``) and ``X_impl``::

    max|X_impl - X_gold| <= max(k * max_a max|X_lp[a] - X_gold| + 2 * max|X_gold.to(dtype) - X_gold|,
                                FLOOR_ULPS * eps(dtype) * magnitude
                                + FLOOR_ACC * eps(float32) * acc_magnitude)

with k = 2 for forward outputs and k = 3 for gradients. The lp term is the largest error
among the standard algorithms: the rounding the dtype forces is that of the algorithms
correct kernels use, not of one of them (docs/agreement-rule.md derives it and measures it).
An lp run's elements that are not finite where the gold is (an algorithm overflowing in the
dtype) say nothing and are left out; a run whose error exceeds BREAKDOWN x magnitude (no
rounding: the algorithm breaks down on these inputs) is left out of the ensemble; neither is ever
allowed to widen the bound. NaN/Inf in ``X_impl`` where the
gold is finite always fails; where the gold is not finite (lse = -inf on empty rows) the
values must match exactly.

The absolute floor. The rule's right-hand side collapses to zero where the exact result is
zero by cancellation: with a single key per query, P = 1 and dS = P * (dP - Delta) = 0
exactly, and the naive math in the dtype reproduces that zero, while a fused kernel computes
dP and Delta along different paths (Delta from the rounded output) and returns rounding noise.
That noise is of the order of the rounding of the terms that cancel, not of the result, so
the floor is ``FLOOR_ULPS`` units of the dtype's epsilon times ``magnitude``, the largest sum
of absolute terms behind one element (``sdpa_reference(..., magnitudes=True)`` computes it).
FLOOR_ULPS = 4: dq = scale * sum_j P_j (dP_j - Delta) k_j, and each of dP_j, Delta (a sum
formed from the rounded output) and the final product carries at most about one unit of
rounding (eps) of its own absolute terms in a float32 accumulation; the flash ensemble
member measures ~1 eps of the magnitude on such rows (docs/agreement-rule.md); 4 covers
them with no room for a real error (a wrong scale, a dropped key, a misread stride) that
moves results by a visible fraction of the terms. ``tests/test_negative_controls.py``
keeps a control showing an error of 10 floors is caught where the rule collapsed. The
second term, FLOOR_ACC * eps(float32) * acc_magnitude, covers the float32 accumulation of the
two dot products dP and Delta in any order: their error grows with the sums of their absolute
products, not with |dP| + |Delta| (the oracle's ``magnitude_acc``; docs/agreement-rule.md, "4.
The floor").

One implementation: :func:`rule` turns measured maxima into a :class:`Verdict`;
:func:`assert_agrees` measures whole tensors and raises with the full message;
``fixtures``' RunningRule (outputs seen in chunks) and the fast kernels' smoke tests go
through the same two.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from attention_oracle.judge import record

FLOOR_ULPS = 4
# the accumulation term of the floor: each of the two length-n dot products that dS = P (dP -
# Delta) subtracts, summed in any order in the accumulation precision u, errs by at most
# lam sqrt(n) u sum|terms| with high probability (Higham & Mary's probabilistic bound); lam = 4
# gives FLOOR_ACC = lam / 2 = 2 units of eps(accumulation) times the oracle's
# ``magnitude_acc`` (sqrt(n) times those sums: docs/agreement-rule.md, "The floor")
FLOOR_ACC = 2
K_FORWARD = 2
K_GRADIENT = 3
# an lp error above this fraction of the magnitude (the sum of absolute terms behind an
# element) is no rounding but the algorithm breaking down on these inputs (as P from an fp32
# lse that absorbed log(l) on rows of finfo.min biases does: errors ~1.3 x magnitude, F11; the
# flash member avoids that one); such a run is left out of the ensemble (docs/agreement-rule.md)
BREAKDOWN = 0.25
LP_DEFAULT = "naive"   # the name of an lp given as one tensor


class OracleMismatch(AssertionError):
    """A check found an implementation outside the agreement rule (or an exact convention).

    ``detail`` (None for a plain property): what the failure was on, as data, beside the
    message: {"check", "impl", "output", "at" (the worst coordinate, a tuple), "allowed" (the
    bound the error broke, 0 for exact comparisons), "error" (|impl - gold| over the output's
    last two dims at the worst coordinate's leading indices, a CPU float64 tensor; 1 where a
    value is non-finite or differs from an exact expectation), "slice" (those leading
    indices)}. The triage's error maps and bug grouping read it."""

    detail: dict | None = None


# strided_dout checks run the contiguous-dout backward second, after the strided one on the same
# inputs: an implementation caching a plan without dout's strides fails there (docs/FINDINGS.md F9)
AFTER_STRIDED = ("this contiguous-dout backward ran after one with {layout} dout on the same "
                 "inputs in this process; if the gradient is right in a fresh process, the "
                 "implementation reuses a plan built for the other dout layout (docs/FINDINGS.md F9)")


@contextlib.contextmanager
def noted(note: str):
    """Adds one line of context to an OracleMismatch raised inside the block (its ``detail`` kept)."""
    try:
        yield
    except OracleMismatch as exc:
        raise with_detail(OracleMismatch(f"{exc}\n  note: {note}"), exc.detail) from None


def with_detail(exc: OracleMismatch, detail: dict | None) -> OracleMismatch:
    """``exc`` carrying ``detail`` (see :class:`OracleMismatch`)."""
    exc.detail = detail
    return exc


def error_slice(error: torch.Tensor, at: tuple) -> tuple[torch.Tensor, tuple]:
    """(the 2-D slice of ``error`` over its last two dims at ``at``'s leading indices, as a CPU
    float64 tensor; those indices). A 1-D ``error`` is one row; a 0-D one a 1 x 1 map."""
    if error.dim() >= 2:
        lead = tuple(at[:-2])
        return error[lead].detach().to("cpu", torch.float64), lead
    return error.detach().reshape(1, -1).to("cpu", torch.float64), ()


@dataclass
class Verdict:
    """The rule's terms for one output: ``lp`` is max|lp_a - gold| per algorithm (the finite
    ones), ``algorithm`` the one that set the bound, ``excluded`` the non-finite ones."""

    err: float
    bound: float
    floor: float
    ratio: float
    lp: dict = field(default_factory=dict)
    algorithm: str = ""
    round: float = 0.0
    k: int = K_FORWARD
    magnitude: float = 0.0
    excluded: tuple = ()
    acc_magnitude: float = 0.0
    apriori: float = 0.0

    @property
    def allowed(self) -> float:
        return max(self.bound, self.floor)

    @property
    def m_lp(self) -> float:
        return self.lp.get(self.algorithm, 0.0)

    @property
    def set_by(self) -> str:
        """What set the bound: "ensemble" (k times the largest lp error) or "a-priori"."""
        return "a-priori" if self.apriori > self.k * self.m_lp else "ensemble"

    def terms(self, dtype) -> str:
        """The rule's right-hand side, spelled out (one line)."""
        each = ", ".join(f"{a} {_fmt(e)}" for a, e in self.lp.items())
        left_out = (f"; left out (non-finite, or above {BREAKDOWN} x magnitude: no rounding): "
                    f"{', '.join(self.excluded)}" if self.excluded else "")
        apriori = f"max({self.k}*max|lp-gold|, a-priori {_fmt(self.apriori)})" if self.apriori else \
            f"{self.k}*max|lp-gold|"
        return (f"rule: {apriori} ({_fmt(self.m_lp)}, set by {self.algorithm or '-'}; "
                f"{each or 'no lp'}{left_out}) + 2*max|round(gold)-gold| ({_fmt(self.round)}) = "
                f"{_fmt(self.bound)}; floor {FLOOR_ULPS}*eps({dtype})*magnitude({_fmt(self.magnitude)})"
                f"{self._acc_terms(dtype)} = {_fmt(self.floor)}")

    def _acc_terms(self, dtype) -> str:
        if not self.acc_magnitude:
            return ""
        return (f" + {FLOOR_ACC}*eps({accumulation_dtype(dtype)})*magnitude_acc"
                f"({_fmt(self.acc_magnitude)})")


def rule(err: float, lp_errs: Mapping[str, float], round_err: float, magnitude: float,
         dtype: torch.dtype, gradient: bool, acc_magnitude: float = 0.0,
         apriori: float = 0.0) -> Verdict:
    """The agreement rule on measured maxima: ``err`` = max|impl - gold|, ``lp_errs`` =
    {algorithm: max|lp_a - gold|} (non-finite ones are left out), ``round_err`` =
    max|gold.to(dtype) - gold|, ``magnitude`` the floor's sum of absolute terms,
    ``acc_magnitude`` its accumulation term (the oracle's ``magnitude_acc``; 0 where no
    dot products cancel), ``apriori`` the oracle's a-priori bound of the exponent argument's
    rounding in units of the accumulation dtype's unit roundoff (0: none)."""
    k = K_GRADIENT if gradient else K_FORWARD
    limit = BREAKDOWN * float(magnitude) if magnitude > 0 else float("inf")
    # an lp error without a finite value says nothing, whatever the magnitude (with magnitude 0
    # the limit is inf, and an inf error would have made the bound inf)
    finite = {a: float(e) for a, e in lp_errs.items() if e == e and e != float("inf") and e <= limit}
    excluded = tuple(a for a in lp_errs if a not in finite)
    algorithm = max(finite, key=finite.get) if finite else ""
    m_lp = finite.get(algorithm, 0.0)
    apriori = float(apriori) * unit_roundoff(accumulation_dtype(dtype))
    bound = max(k * m_lp, apriori) + 2 * round_err
    floor = floor_of(dtype, magnitude, acc_magnitude)
    allowed = max(bound, floor)
    if err != err:  # NaN error: always a failure
        ratio = float("inf")
    else:
        ratio = 0.0 if err == 0.0 else (err / allowed if allowed > 0 else float("inf"))
    return Verdict(err, bound, floor, ratio, finite, algorithm, round_err, k, float(magnitude),
                   excluded, float(acc_magnitude), apriori)


def floor_of(dtype: torch.dtype, magnitude: float, acc_magnitude: float = 0.0) -> float:
    """The absolute floor: FLOOR_ULPS eps(dtype) magnitude + FLOOR_ACC eps(accumulation)
    acc_magnitude."""
    return (FLOOR_ULPS * eps(dtype) * float(magnitude)
            + FLOOR_ACC * eps(accumulation_dtype(dtype)) * float(acc_magnitude))


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps / 2, the largest relative error of one rounding to nearest."""
    return torch.finfo(dtype).eps / 2


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision kernels accumulate dot products in: float32 for 16-bit and fp32 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _index_of_max(t: torch.Tensor) -> tuple:
    flat = int(torch.argmax(t.reshape(-1)))
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), t.shape))


def _fmt(x: float) -> str:
    return f"{x:.3e}"


def _header(check: str, impl: str, name: str) -> str:
    return f"[{check}] implementation={impl} output={name}"


def _fail(check, impl, name, body, repro, ratio=float("inf"), error=None, at=(), allowed=0.0):
    """Raise the failure; ``error`` (|impl - gold|, or 1 where an element is wrong), ``at`` (the
    worst coordinate) and ``allowed`` go into its ``detail``."""
    record.record_ratio(check, impl, ratio, output=name)
    detail = {"check": check, "impl": impl, "output": name, "at": tuple(at), "allowed": float(allowed),
              "error": None, "slice": ()}
    if error is not None and error.numel():
        detail["error"], detail["slice"] = error_slice(error, tuple(at))
    raise with_detail(OracleMismatch(f"{_header(check, impl, name)}: {body}\n  reproduce: {repro}"), detail)


def lp_runs(x_lp) -> dict:
    """``x_lp`` as {algorithm: tensor}: a dict as given, one tensor as the naive run."""
    if isinstance(x_lp, Mapping):
        if not x_lp:
            raise ValueError("x_lp must hold at least one lp run")
        return dict(x_lp)
    return {LP_DEFAULT: x_lp}


def _max_or_zero(t: torch.Tensor) -> float:
    return float(t.max()) if t.numel() else 0.0


def measure_lp(lp: Mapping[str, torch.Tensor], gold: torch.Tensor, finite: torch.Tensor) -> dict:
    """{algorithm: max|lp_a - gold|} over the elements where both the gold and run a are finite:
    where an algorithm has no finite result (it overflows in the dtype, or has no result on a
    row of finfo.min biases) it says nothing, and its other elements still count; inf for a run
    with no finite result where the gold has one (the rule then leaves it out)."""
    zero = torch.zeros((), dtype=torch.float64, device=gold.device)
    errs = {}
    for a, x in lp.items():
        x = x.detach().to(torch.float64).to(gold.device)
        if tuple(x.shape) != tuple(gold.shape):
            raise ValueError(f"lp run {a!r} has shape {tuple(x.shape)}, gold {tuple(gold.shape)}")
        usable = finite & torch.isfinite(x)
        if bool(finite.any()) and not bool(usable.any()):
            errs[a] = float("inf")
            continue
        errs[a] = _max_or_zero(torch.where(usable, (x - gold).abs(), zero))
    return errs


def round_error(gold: torch.Tensor, finite: torch.Tensor, dtype: torch.dtype) -> float:
    """max|gold.to(dtype) - gold| over the finite gold."""
    zero = torch.zeros((), dtype=torch.float64, device=gold.device)
    return _max_or_zero(torch.where(finite, (gold.to(dtype).to(torch.float64) - gold).abs(), zero))


def assert_agrees(x_impl: torch.Tensor, x_gold: torch.Tensor, x_lp, *, check: str, impl: str,
                  name: str, dtype: torch.dtype, gradient: bool, magnitude: float,
                  repro: str, acc_magnitude: float = 0.0, apriori: float = 0.0) -> Verdict:
    """Apply the agreement rule to one output; raise OracleMismatch with a full message.

    ``x_lp``: one tensor (the naive lp run) or {algorithm: tensor}, the lp runs of the
    standard algorithms (``lp_runs``); the bound takes the largest of their errors.
    ``magnitude`` / ``acc_magnitude`` / ``apriori``: the oracle's ``magnitude`` /
    ``magnitude_acc`` / ``apriori`` of the output.
    """
    lp = lp_runs(x_lp)
    if tuple(x_impl.shape) != tuple(x_gold.shape):
        _fail(check, impl, name, f"shape {tuple(x_impl.shape)} != expected {tuple(x_gold.shape)}", repro)
    impl64 = x_impl.detach().to(torch.float64)
    gold = x_gold.detach().to(torch.float64).to(impl64.device)
    finite = torch.isfinite(gold)
    if not bool(finite.all()):
        bad = (~finite) & (impl64 != gold) & ~(torch.isnan(impl64) & torch.isnan(gold))
        if bool(bad.any()):
            at = _index_of_max(bad.to(torch.int8))
            _fail(check, impl, name, f"non-finite gold value {gold[at].item()} not reproduced: "
                  f"impl={impl64[at].item()} at {at}", repro, error=bad.to(torch.float64), at=at)
    nonfinite_impl = finite & ~torch.isfinite(impl64)
    if bool(nonfinite_impl.any()):
        at = _index_of_max(nonfinite_impl.to(torch.int8))
        _fail(check, impl, name, f"NaN/Inf where the gold is finite: impl={impl64[at].item()}, "
              f"gold={gold[at].item()} at {at}", repro, error=nonfinite_impl.to(torch.float64), at=at)
    zero = torch.zeros((), dtype=torch.float64, device=gold.device)
    diff = torch.where(finite, (impl64 - gold).abs(), zero)
    verdict = rule(_max_or_zero(diff), measure_lp(lp, gold, finite), round_error(gold, finite, dtype),
                   magnitude, dtype, gradient, acc_magnitude, apriori)
    record.record_ratio(check, impl, verdict.ratio, output=name)
    _target_ratio(f"{check}:{name}", verdict.ratio)
    if verdict.err > verdict.allowed:
        at = _index_of_max(diff)
        at_lp = " ".join(f"lp[{a}]={x.detach().to(torch.float64)[at].item():.6g}" for a, x in lp.items())
        body = (f"max|impl-gold| = {_fmt(verdict.err)} > allowed {_fmt(verdict.allowed)} "
                f"(ratio {verdict.ratio:.2f})\n  {verdict.terms(dtype)}\n"
                f"  worst at {at}: impl={impl64[at].item():.6g} gold={gold[at].item():.6g} {at_lp}")
        _fail(check, impl, name, body, repro, verdict.ratio, error=diff, at=at, allowed=verdict.allowed)
    return verdict


def assert_exact(x_impl: torch.Tensor, x_expected: torch.Tensor, *, check: str, impl: str,
                 name: str, repro: str, what: str = "") -> None:
    """Bitwise/exact equality (conventions, index outputs); NaN equals NaN."""
    if tuple(x_impl.shape) != tuple(x_expected.shape):
        _fail(check, impl, name, f"shape {tuple(x_impl.shape)} != expected {tuple(x_expected.shape)}", repro)
    a = x_impl.detach()
    b = x_expected.detach().to(a.device)
    if a.dtype != b.dtype and not (a.is_floating_point() and b.is_floating_point()):
        _fail(check, impl, name, f"dtype {a.dtype} != expected {b.dtype}", repro)
    if a.is_floating_point() or b.is_floating_point():
        a64, b64 = a.to(torch.float64), b.to(torch.float64)
        differ = ~((a64 == b64) | (torch.isnan(a64) & torch.isnan(b64)))
    else:
        differ = a != b
    record.record_ratio(check, impl, 0.0 if not bool(differ.any()) else float("inf"), output=name)
    if bool(differ.any()):
        at = _index_of_max(differ.to(torch.int8))
        count = int(differ.sum())
        _fail(check, impl, name, f"{what + ': ' if what else ''}{count} element(s) differ from the "
              f"exact expectation; first at {at}: impl={a[at].item()} expected={b[at].item()}", repro,
              error=differ.to(torch.float64), at=at)


def assert_true(cond: bool, *, check: str, impl: str, name: str, message: str, repro: str) -> None:
    """A plain property (no tolerance) with the same failure format."""
    if not cond:
        _fail(check, impl, name, message, repro)


def _target_ratio(label: str, ratio: float) -> None:
    """Feed the error ratio to Hypothesis' targeted search (used by the ``fuzz`` profile)."""
    try:
        from hypothesis import target
        from hypothesis.control import currently_in_test_context
    except ImportError:  # pragma: no cover
        return
    if currently_in_test_context() and ratio != float("inf"):
        try:
            target(float(ratio), label=label)
        except Exception:  # a label used twice in one example: keep the first
            pass
