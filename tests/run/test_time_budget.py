"""Bounded time (``run/budget.py``): a check's search ends in a verdict when its time budget is
spent, and an implementation that compiles per shape gets few new shapes per check."""
from __future__ import annotations

import json
import time

import pytest
from hypothesis.errors import UnsatisfiedAssumption

from attention_oracle.checks.sdpa.cases import SdpaCase
from attention_oracle.run import budget
from tests.helpers import run_suite

SLOW_JIT = "attention_oracle.controls.slow_jit"


def test_a_spent_budget_ends_the_check_with_a_verdict(tmp_path):
    """slow_jit pays 2 s per new (L, S): with a 5 s budget the check ends after a few examples,
    passing, and says so. Under the profile a user gets on the CPU (``dev``), whose budget covers
    the covering grid too (``ci`` spares the grid, so that its verdict depends on the commit
    alone)."""
    report = tmp_path / "r.json"
    start = time.monotonic()
    proc = run_suite("--hypothesis-profile", "dev", "--impl", SLOW_JIT, "--oracle-check-budget", "5",
                     "--oracle-report", str(report),
                     "attention_oracle/conformance/test_sdpa.py", "-k", "test_forward_agreement")
    took = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "budget reached after" in out, out[-3000:]
    notes = json.loads(report.read_text())["budget_reached"]
    assert notes and notes[0]["outcome"] == "passed"
    assert took < 60, f"took {took:.0f} s (interpreter start included)"


def test_a_budget_spent_before_any_example_fails_the_check():
    """A budget too short for one example judges nothing: the check fails, it does not pass."""
    proc = run_suite("--hypothesis-profile", "dev", "--impl", "oracle", "--oracle-check-budget", "1e-6",
                     "attention_oracle/conformance/test_sdpa.py", "-k", "test_forward_agreement")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "judged nothing: the check's budget ended its search before any example ran" in out


class _Case:
    def __init__(self, L, S):
        self.L, self.S, self.E = L, S, 8


# CheckBudget.before rejects (hypothesis.reject) inside the runner's property; called here
# outside one, Hypothesis warns that this use is deprecated
@pytest.mark.filterwarnings("ignore:Using `reject` outside a property-based test")
def test_a_compiling_implementation_gets_few_new_shapes():
    shapes = budget.shapes("a-test-only-kernel")
    shapes.record(budget.shape_of(_Case(1, 1)), 2.0)   # first call of (1, 1): a compile
    assert not shapes.compiling
    shapes.record(budget.shape_of(_Case(1, 1)), 0.01)  # again: cheap (a warm-up, or a compile)
    assert not shapes.compiling
    shapes.record(budget.shape_of(_Case(1, 2)), 2.0)
    shapes.record(budget.shape_of(_Case(1, 2)), 0.01)  # a second shape: it compiles per shape
    assert shapes.compiling
    unbounded = budget.CheckBudget("a-test-only-kernel", seconds=None)  # ci: no budget of either kind
    for n in range(budget.NEW_SHAPES_PER_CHECK + 2):
        unbounded.before(_Case(50 + n, 3))
        unbounded.after(True, failed=False)
    limits = budget.CheckBudget("a-test-only-kernel", seconds=600.0)
    for n in range(budget.NEW_SHAPES_PER_CHECK):
        limits.before(_Case(2 + n, 3))
        limits.after(True, failed=False)
    with pytest.raises(UnsatisfiedAssumption):  # a new shape beyond the budget: not run
        limits.before(_Case(100, 100))
    limits.before(_Case(1, 1))  # a compiled shape still runs


def test_the_time_budget_stops_only_a_round_without_failures():
    limits = budget.CheckBudget("another-test-only-kernel", seconds=0.0)
    time.sleep(0.01)
    limits.failing = True  # a failure of this round is still shrinking: not stopped
    limits.before(_Case(1, 2))
    limits.after(True, failed=True)
    limits.new_round()
    with pytest.raises(budget.BudgetReached):
        limits.before(_Case(1, 2))
    assert "budget reached after 0 judged examples" in limits.note()


def test_shape_of_reads_size_fields_and_dtype():
    fields = dict(budget.shape_of(SdpaCase(L=5)))
    assert fields["L"] == 5 and fields["dtype"] == "float32" and "seed" not in fields


@pytest.mark.parametrize("seconds", [-1.0, float("nan")])
def test_a_budget_below_zero_or_nan_is_refused(seconds):
    """``--oracle-check-budget`` takes 0 (none) or more seconds; NaN compared false against every
    bound and meant no budget at all."""
    from attention_oracle.judge import profiles
    with pytest.raises(ValueError, match="check budget must be >= 0 seconds"):
        profiles.set_check_budget(seconds)
