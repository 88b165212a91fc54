"""Change validation (``--baseline OLD.json``) on the same examples: a run replays the baseline's
judged cases first; against its own report it passes on every profile; a version that keeps to
the rule but errs more on those cases, and one that now fails, are regressions.

Versions of one kernel are in ``controls/versions.py``: v1 ``NarrowOracle`` (the oracle under a
narrow declaration, so its covering grid has a few rows), v2 ``NarrowAmplifiedError5`` (the same
with its rounding error made 5x larger: every test passes, its worst ratio on the same cases
grows ~5x) and v3 ``NarrowAmplifiedError1000`` (fails the rule).
"""
import json
import math

import pytest

from attention_oracle.run import baseline, report
from tests.helpers import run_suite

CHECK = "attention_oracle/conformance/test_sdpa.py::test_forward_agreement"
V1 = "attention_oracle.controls.versions:NarrowOracle"
V2 = "attention_oracle.controls.versions:NarrowAmplifiedError5"
V3 = "attention_oracle.controls.versions:NarrowAmplifiedError1000"


def _pytest(*args, report=None):
    extra = ["--oracle-report", str(report)] if report else []
    return run_suite(CHECK, *extra, *args)


@pytest.fixture(scope="module")
def oracle_report(tmp_path_factory):
    """v1's report under ``dev`` (randomized: each run draws other examples)."""
    path = tmp_path_factory.mktemp("baseline") / "oracle.json"
    proc = _pytest("--impl", V1, "--hypothesis-profile", "dev", report=path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return path


def test_the_report_records_the_judged_cases(oracle_report):
    (row,) = json.loads(oracle_report.read_text())["rows"]
    assert row["cases"] and all(c["check"] == "sdpa.forward_agreement" and c["variant"] == ""
                                and 0 <= c["ratio"] < 1 for c in row["cases"]), row["cases"]
    assert max(c["ratio"] for c in row["cases"]) == row["worst_ratio"]


def test_a_randomized_run_passes_against_its_own_report(oracle_report, tmp_path):
    proc = _pytest("--impl", V1, "--hypothesis-profile", "dev", "--baseline", str(oracle_report),
                   report=tmp_path / "r.json")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "baseline: no regression in 1 matched check(s)" in proc.stdout
    rep = json.loads((tmp_path / "r.json").read_text())
    (row,) = rep["baseline"]["rows"]
    judged = len({c["case"] for c in json.loads(oracle_report.read_text())["rows"][0]["cases"]})
    assert row["status"] == "ok" and row["growth"] == 1.0 and 0 < row["same_cases"] <= judged, row
    assert row["noise"] == 0.0, row


def test_an_amplified_error_is_a_regression_on_the_same_cases(oracle_report, tmp_path):
    proc = _pytest("--impl", V2, "--hypothesis-profile", "dev", "--baseline", str(oracle_report),
                   report=tmp_path / "r.json")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 passed" in proc.stdout
    assert "REGRESSION sdpa.forward_agreement" in proc.stdout and "over the same" in proc.stdout
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["baseline"]["matched_by"] == "check"
    assert rep["baseline"]["regressions"] == ["sdpa.forward_agreement"]
    (row,) = rep["baseline"]["rows"]
    assert row["worst_same_after"] < 1 and row["growth"] >= 2, row


def test_a_newly_failing_check_is_a_regression(oracle_report):
    proc = _pytest("--impl", V3, "--no-triage",
                   "--baseline", str(oracle_report))
    assert proc.returncode == 1
    assert "regression: newly failing" in proc.stdout, proc.stdout[-3000:]


def test_not_a_report_is_a_usage_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"something": 1}')
    proc = _pytest("--impl", "oracle", "--baseline", str(bad))
    assert proc.returncode == 4 and "not an --oracle-report JSON" in proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- matching rules


def _row(impl, check, worst, failed=0, passed=1, cases=None):
    """A report row; ``cases``: {case JSON: ratio or [ratios]} (the worst over all defaults to
    ``worst``)."""
    entries = []
    for case, ratios in (cases or {}).items():
        for r in ratios if isinstance(ratios, list) else [ratios]:
            entries.append({"variant": "", "check": check, "case": case,
                            "ratio": "inf" if r == math.inf else r})
    return (impl, check), {"implementation": impl, "check": check, "worst_ratio": worst,
                           "failed": failed, "passed": passed, "cases": entries}


def test_rows_match_by_implementation_when_both_runs_have_it():
    before = dict([_row("a", "x", 0.2, cases={"c1": 0.2}), _row("b", "x", 0.2, cases={"c1": 0.2}),
                   _row("a", "y", 0.1)])
    after = dict([_row("a", "x", 0.2, cases={"c1": 0.2}), _row("b", "x", 0.5, cases={"c1": 0.5}),
                  _row("c", "x", 0.1)])
    c = baseline.compare(before, after)
    assert c.matched_by == "implementation and check"
    assert [(r.impl_after, r.status) for r in c.rows] == [
        ("a", "ok"), ("b", "regression: worst ratio over the same 1 cases grown 2.50x")]
    assert c.unmatched_before == [("a", "y")] and c.unmatched_after == [("c", "x")]


def test_rows_match_by_check_with_one_implementation_each():
    c = baseline.compare(dict([_row("v1", "x", 0.2, cases={"c1": 0.2})]),
                         dict([_row("v2", "x", 0.1, cases={"c1": 0.1})]))
    assert c.matched_by == "check" and c.rows[0].status == "ok" and not c.regressions


@pytest.mark.parametrize("before, after, failed, status", [
    (0.3, 0.3, (0, 0), "ok"),
    (0.3, 0.3 * (1 + 0.5 * baseline.REL_TOL), (0, 0), "ok"),               # float printing
    (0.3, 0.3 * (1 + 2 * baseline.REL_TOL), (0, 0), "regression: worst ratio over the same 2 cases grown 1.00x"),
    (0.016, 0.08, (0, 0), "regression: worst ratio over the same 2 cases grown 5.00x"),  # small, still counted
    (0.3, 0.2, (0, 0), "ok"),
    (0.0, 0.0, (0, 0), "ok"),
    (0.0, 0.01, (0, 0), "regression: worst ratio over the same 2 cases grown inf"),
    (0.2, math.inf, (0, 1), "regression: newly failing"),
    (math.inf, 0.3, (1, 0), "fixed"),
    (math.inf, math.inf, (1, 1), "ok"),
])
def test_statuses_on_the_same_cases(before, after, failed, status):
    b = dict([_row("a", "x", before, failed=failed[0], passed=0 if failed[0] else 1,
                   cases={"c1": before, "c2": 0.0})])
    a = dict([_row("a", "x", after, failed=failed[1], passed=0 if failed[1] else 1,
                   cases={"c1": after, "c2": 0.0})])
    (row,) = baseline.compare(b, a).rows
    assert row.status == status


def test_a_case_newly_failing_beside_an_old_failure_is_a_regression():
    """A check already failing (one case at inf) and failing now on another case that passed
    before: its worst over the same cases stays inf, but the new failure is a regression."""
    b = dict([_row("a", "x", math.inf, failed=1, passed=0, cases={"c1": math.inf, "c2": 0.3})])
    a = dict([_row("a", "x", math.inf, failed=1, passed=0, cases={"c1": 0.2, "c2": math.inf})])
    (row,) = baseline.compare(b, a).rows
    assert row.status == "regression: 1 of the same 2 cases newly failing"


def test_a_harder_new_case_is_information_not_a_regression():
    """The issue's measurement: the same kernel, a worst over all grown 30x (0.016 -> 0.488)
    because the second run drew a harder case; over the same cases nothing changed."""
    b = dict([_row("a", "x", 0.016, cases={"c1": 0.016, "c2": 0.01})])
    a = dict([_row("a", "x", 0.488, cases={"c1": 0.016, "c2": 0.01, "new": 0.488})])
    (row,) = baseline.compare(b, a).rows
    assert row.status == "ok" and row.same == 2 and row.growth == 1.0
    assert row.growth_all == pytest.approx(30.5)
    assert row.notes and row.notes[0].startswith("new case harder: worst over all the cases 0.016 -> 0.488")
    assert "note x (a): new case harder" in baseline.render(baseline.compare(b, a))


def test_the_tolerance_grows_with_the_noise_measured_on_repeated_cases():
    """A nondeterministic implementation: one case judged twice within a run gave 0.20 and 0.21
    (spread 0.048); a growth of the worst by less than twice that is noise, more is not."""
    b = dict([_row("a", "x", 0.21, cases={"c1": [0.20, 0.21], "c2": 0.1})])
    within = dict([_row("a", "x", 0.22, cases={"c1": 0.22, "c2": 0.1})])
    beyond = dict([_row("a", "x", 0.24, cases={"c1": 0.24, "c2": 0.1})])
    (row,) = baseline.compare(b, within).rows
    assert row.noise == pytest.approx(0.01 / 0.21) and row.repeated == 1
    assert row.tolerance == pytest.approx(baseline.NOISE_MARGIN * 0.01 / 0.21)
    assert row.status == "ok"
    (row,) = baseline.compare(b, beyond).rows
    assert row.regression


def test_a_baseline_without_cases_is_not_compared_on_ratios():
    b = dict([_row("a", "x", 0.016)])
    (row,) = baseline.compare(b, dict([_row("a", "x", 0.488, cases={"c1": 0.488})])).rows
    assert row.status == "not compared: the baseline recorded no cases" and not row.regression
    (row,) = baseline.compare(b, dict([_row("a", "x", math.inf, failed=1, passed=0)])).rows
    assert row.status == "regression: newly failing"


def test_replay_order_puts_the_worst_first_and_twice():
    entries = [{"case": f"c{i}", "ratio": r} for i, r in enumerate([0.1, 0.5, "inf", 0.3, 0.2, 0.5])]
    assert baseline.replay_order(entries) == ["c1", "c1", "c5", "c5", "c3", "c3", "c0", "c2", "c4"]
    many = [{"case": f"c{i}", "ratio": 0.0} for i in range(baseline.MAX_REPLAY + 50)]
    order = baseline.replay_order(many)
    assert len(set(order)) == baseline.MAX_REPLAY and len(order) == baseline.MAX_REPLAY + baseline.REPEATS


def test_a_baseline_with_malformed_cases_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": [{"implementation": "a", "check": "x", "cases": [{"x": 1}]}]}))
    with pytest.raises(baseline.BaselineError, match="'cases' is not a list"):
        baseline.load(str(bad))


def test_the_report_keeps_repeats_past_its_cap():
    """A grid larger than the cap (fuzz: strength 3) fills it; a case judged again is still kept,
    so the noise is measured."""
    table = report.Table()
    judged = [["x", f"c{i}", 0.1] for i in range(report.CASES_CAP + 10)] + [["x", "c0", 0.1]]
    table.add("a", "x", "passed", {"judged": judged, "variant": ""})
    cases = table.rows[("a", "x")]["cases"]
    assert len(cases) == report.CASES_CAP + 1 and cases[-1]["case"] == "c0"
    assert baseline.spread(baseline._ratios(table.rows[("a", "x")])) == (0.0, 1)
