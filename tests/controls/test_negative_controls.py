"""Negative controls: deliberately broken implementations that the checks must catch.

Each SDPA control runs the check meant to catch it, its covering grid and then its search
under the active profile's settings (no shrinking, first failure wins), and must raise
OracleMismatch. The agreement rule's
absolute floor gets its own controls: it must still catch an error of ten floors where
the rule's bound collapsed to zero.
"""

import pytest
import torch

from attention_oracle.checks.catalogue import load_case
from attention_oracle.checks.sdpa import checks as sdpa_checks
from attention_oracle.checks.sdpa.cases import strategy_for
from attention_oracle.controls import sdpa_broken
from attention_oracle.judge import record
from attention_oracle.judge.agreement import FLOOR_ULPS, OracleMismatch, assert_agrees, eps
from attention_oracle.judge.targets import load
from attention_oracle.run import grid
from attention_oracle.run.runner import run_check
from tests.helpers import caught_message

DTYPES = (torch.float32, torch.float16)


@pytest.mark.parametrize("control", sorted(sdpa_broken.CONTROLS))
def test_sdpa_control_is_caught(control):
    check_name = sdpa_broken.CONTROLS[control]
    target = load(f"attention_oracle.controls.sdpa_broken:{control}")
    assert not target.unavailable, target.unavailable
    check = sdpa_checks.CHECKS[check_name]

    cases = strategy_for(check_name, target.capabilities.narrowed(dtypes=DTYPES))
    message = caught_message(check, target, cases)
    assert f"sdpa.{check_name}" in message
    assert control in message


def test_determinism_on_request_is_judged_under_the_deterministic_mode():
    """An implementation declared repeatable only under torch.use_deterministic_algorithms
    (``RepeatableOnRequest``: drifts without it) passes the determinism check on its grid,
    which turns the mode on for it and restores the process's setting after; the same drift
    under the mode too (``NondeterministicOnRequest``) is caught by test_sdpa_control_is_caught."""
    target = load("attention_oracle.controls.sdpa_broken:RepeatableOnRequest")
    check = sdpa_checks.CHECKS["determinism"]
    was = torch.are_deterministic_algorithms_enabled()
    judged = 0
    with record.silenced():
        for _, case in grid.cases(check, target, ""):
            run_check(check, target, case)
            judged += 1
    assert judged and torch.are_deterministic_algorithms_enabled() == was


def _zero_gold(n=16):
    z = torch.zeros(n, dtype=torch.float64)
    return z, z.clone()


@pytest.mark.parametrize("dtype", DTYPES + (torch.bfloat16,))
def test_floor_catches_ten_floors_where_rule_collapsed(dtype):
    gold, lp = _zero_gold()
    magnitude = 3.0
    floor = FLOOR_ULPS * eps(dtype) * magnitude
    impl = gold.clone()
    impl[5] = 10 * floor
    with record.silenced(), pytest.raises(OracleMismatch) as caught:
        assert_agrees(impl.to(dtype), gold, lp, check="rule.floor", impl="control", name="dq",
                      dtype=dtype, gradient=True, magnitude=magnitude, repro="unit")
    assert "(5,)" in str(caught.value) and "ratio" in str(caught.value)


@pytest.mark.parametrize("dtype", DTYPES + (torch.bfloat16,))
def test_floor_admits_rounding_noise_where_rule_collapsed(dtype):
    gold, lp = _zero_gold()
    magnitude = 3.0
    impl = gold.clone()
    impl[5] = 0.5 * FLOOR_ULPS * eps(dtype) * magnitude
    with record.silenced():
        verdict = assert_agrees(impl.to(dtype), gold, lp, check="rule.floor", impl="control",
                                name="dq", dtype=dtype, gradient=True, magnitude=magnitude, repro="unit")
    assert verdict.bound == 0.0 and 0.4 < verdict.ratio <= 0.6


def test_single_key_cancellation_uses_floor():
    """S = 1: dq is exactly 0 in gold and in lp; a 1e-3 relative error in dq must still fail."""
    torch.manual_seed(0)
    q = torch.randn(1, 2, 5, 8)
    k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    dout = torch.randn(1, 2, 5, 8)
    from attention_oracle.oracle.sdpa import sdpa_reference
    gold = sdpa_reference(q, k, v, dout, magnitudes=True)
    lp = sdpa_reference(q, k, v, dout, compute_dtype=torch.float32)
    assert float(gold["dq"].abs().max()) < 1e-15 and float(lp["dq"].abs().max()) == 0.0
    bad = torch.full_like(q, 1e-3 * gold["magnitude"]["dq"])
    with record.silenced(), pytest.raises(OracleMismatch):
        assert_agrees(bad, gold["dq"], lp["dq"], check="rule.floor", impl="control", name="dq",
                      dtype=torch.float32, gradient=True, magnitude=gold["magnitude"]["dq"], repro="unit")


def test_plan_reuse_failure_names_the_call_order():
    """F9's model: the failure of the contiguous-dout backward says it ran after a strided one
    (the message a user of PyTorch's cuDNN backend sees; docs/FINDINGS.md F9)."""
    target = load("attention_oracle.controls.sdpa_broken:DoutPlanCachedByShape")
    case = load_case({"E": 8, "Ev": 8, "L": 2, "S": 2, "area": "sdpa", "batch": [1], "causal": False,
                      "dtype": "float32", "empty_rows": 0, "gqa": False, "hkv": 2, "hq": 2,
                      "layout_dout": "transposed", "layout_k": "contiguous",
                      "layout_q": "contiguous", "layout_v": "contiguous", "mask": "none",
                      "scale": None, "seed": 0, "value_scale": 0.3})
    with record.silenced(), pytest.raises(OracleMismatch) as caught:
        run_check(sdpa_checks.CHECKS["strided_dout"], target, case)
    assert "note: this contiguous-dout backward ran after one with transposed dout" in str(caught.value)
    # the same case on a fresh instance with a contiguous dout only: nothing cached, no failure
    run_check(sdpa_checks.CHECKS["gradient_agreement"],
              load("attention_oracle.controls.sdpa_broken:DoutPlanCachedByShape"), case)
