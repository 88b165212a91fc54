"""The agreement rule (docs/CONTRACT.md "5. The agreement rule") and exact comparisons, with precise failure messages.

For an output X with gold ``X_gold`` (float64 oracle), ``X_lp`` (the oracle's math run in the
implementation's dtype) and ``X_impl``::

    max|X_impl - X_gold| <= max(k * max|X_lp - X_gold| + 2 * max|X_gold.to(dtype) - X_gold|,
                                FLOOR_ULPS * eps(dtype) * magnitude)

with k = 2 for forward outputs and k = 3 for gradients. NaN/Inf in ``X_impl`` where the gold
is finite always fails; where the gold is not finite (lse = -inf on empty rows) the values
must match exactly.

The absolute floor. The rule's right-hand side collapses to zero where the exact result is
zero by cancellation: with a single key per query, P = 1 and dS = P * (dP - Delta) = 0
exactly, and the naive math in the dtype reproduces that zero, while a fused kernel computes
dP and Delta along different paths (Delta from the rounded output) and returns rounding noise.
That noise is of the order of the rounding of the terms that cancel, not of the result, so
the floor is ``FLOOR_ULPS`` units of the dtype's epsilon times ``magnitude``, the largest sum
of absolute terms behind one element (``sdpa_reference(..., magnitudes=True)`` computes it).
FLOOR_ULPS = 4: the final rounding to the dtype costs half an ulp, an fp32 accumulation in a
different order over n terms costs well under an ulp of the dtype for fp16/bf16, and for fp32
a few ulps; 4 covers these with no room for a real error (a wrong scale, a dropped key, a
misread stride) that moves results by a visible fraction of the terms.
``meta_tests/test_negative_controls.py`` keeps a control showing an error of 10 floors is caught
where the rule collapsed.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from attention_oracle.properties.harness import report

FLOOR_ULPS = 4
K_FORWARD = 2
K_GRADIENT = 3


class OracleMismatch(AssertionError):
    """A check found an implementation outside the agreement rule (or an exact convention)."""


# strided_dout checks run the contiguous-dout backward second, after the strided one on the same
# inputs: an implementation caching a plan without dout's strides fails there (NOTES.md, F9)
AFTER_STRIDED = ("this contiguous-dout backward ran after one with {layout} dout on the same "
                 "inputs in this process; if the gradient is right in a fresh process, the "
                 "implementation reuses a plan built for the other dout layout (NOTES.md, F9)")


@contextlib.contextmanager
def noted(note: str):
    """Adds one line of context to an OracleMismatch raised inside the block."""
    try:
        yield
    except OracleMismatch as exc:
        raise OracleMismatch(f"{exc}\n  note: {note}") from None


@dataclass
class Verdict:
    err: float
    bound: float
    floor: float
    ratio: float

    @property
    def allowed(self) -> float:
        return max(self.bound, self.floor)


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def _index_of_max(t: torch.Tensor) -> tuple:
    flat = int(torch.argmax(t.reshape(-1)))
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), t.shape))


def _fmt(x: float) -> str:
    return f"{x:.3e}"


def _header(check: str, impl: str, name: str) -> str:
    return f"[{check}] implementation={impl} output={name}"


def _fail(check, impl, name, body, repro, ratio=float("inf")):
    report.record_ratio(check, impl, ratio)
    raise OracleMismatch(f"{_header(check, impl, name)}: {body}\n  reproduce: {repro}")


def assert_agrees(x_impl: torch.Tensor, x_gold: torch.Tensor, x_lp: torch.Tensor, *,
                  check: str, impl: str, name: str, dtype: torch.dtype, gradient: bool,
                  magnitude: float, repro: str) -> Verdict:
    """Apply the agreement rule to one output; raise OracleMismatch with a full message."""
    if tuple(x_impl.shape) != tuple(x_gold.shape):
        _fail(check, impl, name, f"shape {tuple(x_impl.shape)} != expected {tuple(x_gold.shape)}", repro)
    impl64 = x_impl.detach().to(torch.float64)
    gold = x_gold.detach().to(torch.float64).to(impl64.device)
    lp = x_lp.detach().to(torch.float64).to(impl64.device)
    finite = torch.isfinite(gold)
    if not bool(finite.all()):
        bad = (~finite) & (impl64 != gold)
        if bool(bad.any()):
            at = _index_of_max(bad.to(torch.int8))
            _fail(check, impl, name, f"non-finite gold value {gold[at].item()} not reproduced: "
                  f"impl={impl64[at].item()} at {at}", repro)
    nonfinite_impl = finite & ~torch.isfinite(impl64)
    if bool(nonfinite_impl.any()):
        at = _index_of_max(nonfinite_impl.to(torch.int8))
        _fail(check, impl, name, f"NaN/Inf where the gold is finite: impl={impl64[at].item()}, "
              f"gold={gold[at].item()} at {at}", repro)
    zero = torch.zeros((), dtype=torch.float64, device=gold.device)
    diff = torch.where(finite, (impl64 - gold).abs(), zero)
    lp_err = torch.where(finite, (lp - gold).abs(), zero)
    round_err = torch.where(finite, (gold.to(dtype).to(torch.float64) - gold).abs(), zero)
    k = K_GRADIENT if gradient else K_FORWARD
    m_lp = float(lp_err.max()) if lp_err.numel() else 0.0
    m_round = float(round_err.max()) if round_err.numel() else 0.0
    bound = k * m_lp + 2 * m_round
    floor = FLOOR_ULPS * eps(dtype) * float(magnitude)
    err = float(diff.max()) if diff.numel() else 0.0
    allowed = max(bound, floor)
    ratio = 0.0 if err == 0.0 else (err / allowed if allowed > 0 else float("inf"))
    report.record_ratio(check, impl, ratio)
    _target_ratio(f"{check}:{name}", ratio)
    if err > allowed:
        at = _index_of_max(diff)
        body = (f"max|impl-gold| = {_fmt(err)} > allowed {_fmt(allowed)} (ratio {ratio:.2f})\n"
                f"  rule: {k}*max|lp-gold| ({_fmt(m_lp)}) + 2*max|round(gold)-gold| ({_fmt(m_round)})"
                f" = {_fmt(bound)}; floor {FLOOR_ULPS}*eps({dtype})*magnitude({_fmt(float(magnitude))})"
                f" = {_fmt(floor)}\n"
                f"  worst at {at}: impl={impl64[at].item():.6g} gold={gold[at].item():.6g} "
                f"lp={lp[at].item():.6g}")
        _fail(check, impl, name, body, repro, ratio)
    return Verdict(err, bound, floor, ratio)


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
    report.record_ratio(check, impl, 0.0 if not bool(differ.any()) else float("inf"))
    if bool(differ.any()):
        at = _index_of_max(differ.to(torch.int8))
        count = int(differ.sum())
        _fail(check, impl, name, f"{what + ': ' if what else ''}{count} element(s) differ from the "
              f"exact expectation; first at {at}: impl={a[at].item()} expected={b[at].item()}", repro)


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
