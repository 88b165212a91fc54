"""Change validation (``--baseline OLD.json``): a run passes against its own report; a version
that still keeps to the rule but lost precision, and one that now fails, are regressions.

The subtly broken version is ``controls/versions.py:InputDtypeMath`` (SDPA in the input dtype
instead of float64): every test passes, but its worst ratio grows from the oracle's (correctly
rounded, <= 1/4) to the naive algorithm's (<= 1/2), and the run must fail naming the regression.
"""
import json
import math

import pytest

from attention_oracle.run import baseline
from tests.helpers import run_suite

CHECK = "attention_oracle/conformance/test_sdpa.py::test_forward_agreement"
SUBTLE = "attention_oracle.controls.versions:InputDtypeMath"


def _pytest(*args, report=None):
    extra = ["--oracle-report", str(report)] if report else []
    return run_suite(CHECK, *extra, *args)


@pytest.fixture(scope="module")
def oracle_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("baseline") / "oracle.json"
    proc = _pytest("--impl", "oracle", report=path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return path


def test_a_run_passes_against_its_own_report(oracle_report, tmp_path):
    proc = _pytest("--impl", "oracle", "--baseline", str(oracle_report), report=tmp_path / "r.json")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "baseline: no regression in 1 matched check(s)" in proc.stdout
    (row,) = json.loads((tmp_path / "r.json").read_text())["baseline"]["rows"]
    assert row["status"] == "ok" and row["growth"] == 1.0, row


def test_lost_precision_is_a_regression_although_every_test_passes(oracle_report, tmp_path):
    proc = _pytest("--impl", SUBTLE, "--baseline", str(oracle_report), report=tmp_path / "r.json")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 passed" in proc.stdout
    assert "REGRESSION sdpa.forward_agreement" in proc.stdout and "regression" in proc.stdout
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["baseline"]["matched_by"] == "check"
    assert rep["baseline"]["regressions"] == ["sdpa.forward_agreement"]
    (row,) = rep["baseline"]["rows"]
    assert row["worst_after"] < 1 and row["growth"] >= baseline.GROWTH, row


def test_a_newly_failing_check_is_a_regression(oracle_report):
    proc = _pytest("--impl", "attention_oracle.controls.sdpa_broken:WrongScale",
                   "--baseline", str(oracle_report))
    assert proc.returncode == 1
    assert "regression: newly failing" in proc.stdout, proc.stdout[-3000:]


def test_not_a_report_is_a_usage_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"something": 1}')
    proc = _pytest("--impl", "oracle", "--baseline", str(bad))
    assert proc.returncode == 4 and "not an --oracle-report JSON" in proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- matching rules


def _row(impl, check, worst, failed=0, passed=1):
    return (impl, check), {"implementation": impl, "check": check, "worst_ratio": worst,
                           "failed": failed, "passed": passed}


def test_rows_match_by_implementation_when_both_runs_have_it():
    before = dict([_row("a", "x", 0.2), _row("b", "x", 0.2), _row("a", "y", 0.1)])
    after = dict([_row("a", "x", 0.3), _row("b", "x", 0.5), _row("c", "x", 0.1)])
    c = baseline.compare(before, after)
    assert c.matched_by == "implementation and check"
    assert [(r.impl_after, r.status) for r in c.rows] == [
        ("a", "ok"), ("b", "regression: worst ratio grown 2.50x")]
    assert c.unmatched_before == [("a", "y")] and c.unmatched_after == [("c", "x")]


def test_rows_match_by_check_with_one_implementation_each():
    c = baseline.compare(dict([_row("v1", "x", 0.2)]), dict([_row("v2", "x", 0.1)]))
    assert c.matched_by == "check" and c.rows[0].status == "ok" and not c.regressions


@pytest.mark.parametrize("before, after, failed, status", [
    (0.3, 0.59, (0, 0), "ok"),
    (0.3, 0.6, (0, 0), "regression: worst ratio grown 2.00x"),
    (0.01, 0.04, (0, 0), "grown, below 0.05"),
    (0.0, 0.0, (0, 0), "ok"),
    (0.2, "inf", (0, 1), "regression: newly failing"),
    ("inf", 0.3, (1, 0), "fixed"),
    ("inf", "inf", (1, 1), "ok"),
])
def test_statuses(before, after, failed, status):
    b = dict([_row("a", "x", before, failed=failed[0], passed=0 if failed[0] else 1)])
    a = dict([_row("a", "x", math.inf if after == "inf" else after, failed=failed[1],
                   passed=0 if failed[1] else 1)])
    (row,) = baseline.compare(b, a).rows
    assert row.status == status
