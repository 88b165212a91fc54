"""The end-of-run report, exercised through real pytest runs in a subprocess.

Negative controls of the report itself: a broken implementation shows up as failed in the
table with its worst ratio, and a function that refuses every input fails the run.
"""
import json
import re

from attention_oracle.plugin import progress_line
from tests.helpers import run_suite


def _pytest(*args, tmp_path):
    report = tmp_path / "report.json"
    proc = run_suite("--oracle-report", str(report), *args)
    return proc, json.loads(report.read_text()) if report.exists() else None


def test_refusing_everything_fails_the_run(tmp_path):
    proc, rep = _pytest("attention_oracle/conformance/test_sdpa.py::test_forward_agreement",
                        "--impl", "attention_oracle.controls.sdpa_broken:RefusesEverything", tmp_path=tmp_path)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "verified nothing" in proc.stdout
    assert rep["verified_nothing"] == ["attention_oracle.controls.sdpa_broken:RefusesEverything.scaled_dot_product_attention"]
    (row,) = rep["rows"]
    assert row["failed"] == 1 and row["passed"] == 0  # a test that judged nothing fails


def test_broken_implementation_is_reported_failed_with_message(tmp_path):
    proc, rep = _pytest("attention_oracle/conformance/test_sdpa.py::test_forward_agreement", "--impl", "oracle",
                        "--impl", "attention_oracle.controls.sdpa_broken:WrongScale", tmp_path=tmp_path)
    assert proc.returncode == 1
    rows = {r["implementation"]: r for r in rep["rows"]}
    assert rows["oracle"]["passed"] == 1 and rows["oracle"]["worst_ratio"] < 1
    broken = rows["attention_oracle.controls.sdpa_broken:WrongScale"]
    assert broken["failed"] == 1
    assert broken["worst_ratio"] == "inf" or broken["worst_ratio"] > 1
    for piece in ("[sdpa.forward_agreement]", "max|impl-gold|", "worst at", "python -m attention_oracle replay"):
        assert piece in proc.stdout, piece


def test_isolated_runs_are_recorded_under_the_function_they_call():
    """Isolated examples (misaligned inputs on CUDA) count towards the function the case calls,
    as in-process calls do; recorded under the check's name, a backend that rightly refuses
    every misaligned input (torch-flash) was reported as verifying nothing (docs/DESIGN.md "6. Running: poisoning, the grid, triage, known failures, time, crashes, baseline").
    Negative control: the refusal is still recorded, so a function refused everywhere still
    fails the run (test_refusing_everything_fails_the_run)."""
    from attention_oracle.checks.catalogue import load_case
    from attention_oracle.checks.sdpa import checks as sdpa_checks
    from attention_oracle.judge import record
    from attention_oracle.judge.targets import load
    from attention_oracle.run.runner import run_isolated
    case = load_case({"E": 8, "Ev": 8, "L": 2, "S": 3, "area": "sdpa", "batch": [1],
                      "causal": False, "dtype": "float32", "empty_rows": 0, "gqa": False,
                      "hkv": 1, "hq": 1, "layout_dout": "contiguous", "layout_k": "contiguous",
                      "layout_q": "contiguous", "layout_v": "contiguous", "mask": "none",
                      "scale": None, "seed": 0, "value_scale": 1.0})
    sink, token = record.open_sink()
    try:
        ran = run_isolated(sdpa_checks.CHECKS["forward_agreement"],
                           load("attention_oracle.controls.sdpa_broken:RefusesEverything"), case)
    finally:
        record.close_sink(token)
    assert ran is False
    assert sink.functions == {"scaled_dot_product_attention"} and sink.refused == 1, sink.as_dict()


class _Crashes:
    """An SDPA whose every call raises an error other than a refusal or a mismatch."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        raise RuntimeError("kernel crashed")


def test_an_error_shows_an_infinite_worst_ratio():
    """A test failed by an error (no ratio judged) shows worst ratio inf, not the 0 of a test
    that judged nothing wrong. Negative control: the same case on the oracle leaves it below 1."""
    import pytest

    from attention_oracle.checks.catalogue import load_case
    from attention_oracle.checks.sdpa import checks as sdpa_checks
    from attention_oracle.judge import record
    from attention_oracle.judge.targets import Target, load
    from attention_oracle.run.runner import run_check
    case = load_case({"E": 8, "Ev": 8, "L": 2, "S": 3, "area": "sdpa", "batch": [1],
                      "causal": False, "dtype": "float32", "empty_rows": 0, "gqa": False,
                      "hkv": 1, "hq": 1, "layout_dout": "contiguous", "layout_k": "contiguous",
                      "layout_q": "contiguous", "layout_v": "contiguous", "mask": "none",
                      "scale": None, "seed": 0, "value_scale": 1.0})
    check = sdpa_checks.CHECKS["forward_agreement"]
    worst = {}
    for name, target in (("oracle", load("oracle")), ("crashes", Target("crashes", _Crashes()))):
        sink, token = record.open_sink()
        try:
            if name == "crashes":
                with pytest.raises(RuntimeError, match="kernel crashed"):
                    run_check(check, target, case)
            else:
                assert run_check(check, target, case)
        finally:
            record.close_sink(token)
        worst[name] = (sink.worst, sink.judged[-1][2])
    assert worst["oracle"][0] < 1 and worst["oracle"][1] < 1, worst
    assert worst["crashes"] == (float("inf"), float("inf")), worst


def test_the_progress_line_counts_examples_judged_by_refusal():
    """sdpa.mismatched_value_rows judges by an expected refusal (value with one row more than
    key), comparing no call: its progress line counts the examples as the table does, not the
    calls (it said "0 calls judged" for a check that had judged hundreds)."""
    proc = run_suite("attention_oracle/conformance/test_sdpa.py::test_mismatched_value_rows",
                     "--impl", "oracle", "--oracle-progress")
    assert proc.returncode == 0, proc.stdout[-2000:]
    (line,) = [x for x in proc.stdout.splitlines()  # after pytest's progress dot
               if "attention-oracle: oracle sdpa.mismatched_value_rows" in x]
    judged = int(re.search(r"passed: (\d+) examples judged", line).group(1))
    assert judged > 0 and "0 calls compared" in line and "NOTHING JUDGED" not in line, line


def test_the_progress_line_says_when_nothing_was_judged():
    ident = {"impl": "x", "check": "sdpa.forward_agreement"}
    refused_all = {"examples": 5, "refused": 5, "refused_examples": 5, "judged_examples": 0}
    assert "NOTHING JUDGED" in progress_line(ident, "unsupported", refused_all, 40, "t")
    assert "NOTHING JUDGED" not in progress_line(ident, "skipped", {}, 40, "t")
    judged = {"examples": 3, "refused": 0, "judged_examples": 2, "grid": 2}
    line = progress_line(ident, "passed", judged, 40, "t")
    assert "2 examples judged (2 grid, 0 search, 0 replay), 0 refused, 3 calls compared;" in line, line


def test_a_regression_replay_counts_as_judged(tmp_path):
    """A replayed corpus case is an example judged: its progress line and its row count it as
    a replay (they said "0 examples judged - NOTHING JUDGED" for a replay that had compared
    its calls and passed)."""
    proc, rep = _pytest("attention_oracle/conformance/test_regressions.py::"
                        "test_regression[oracle-sdpa_all_rows_masked]", "--impl", "oracle",
                        "--oracle-progress", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:]
    (line,) = [x for x in proc.stdout.splitlines() if "attention-oracle: oracle regressions" in x]
    assert "1 examples judged (0 grid, 0 search, 1 replay)" in line, line
    assert "NOTHING JUDGED" not in line, line
    (row,) = rep["rows"]
    assert row["replay"] == 1 and row["judged_examples"] == 1, row

