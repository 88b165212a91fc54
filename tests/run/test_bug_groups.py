"""Distinct bugs across checks (run/bugs.py): KeyDroppedAtTileEdge is one bug wherever it
fails; ThreeBugs' independent bugs stay apart; the run's report opens with one line per
distinct bug and names its error map."""

import glob
import os

from attention_oracle.checks.sdpa import checks
from attention_oracle.checks.sdpa.cases import SdpaCase
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.judge.targets import load
from attention_oracle.run import bugs, triage
from tests.helpers import run_suite

DROPPED = "attention_oracle.controls.sdpa_broken:KeyDroppedAtTileEdge"
THREE = "attention_oracle.controls.multi_bug:ThreeBugs"


def _signature(impl, check, case):
    """The signature a triaged final example of ``check`` on ``case`` leaves."""
    target = load(impl)
    try:
        checks.CHECKS[check](target, case)
    except OracleMismatch as exc:
        output = triage.output_of(exc)
        found = triage.analyse(checks.CHECKS[check], target, case, f"sdpa.{check}", output)
        return bugs.signature(impl, f"sdpa.{check}", output, found, exc.detail, "", "replay")
    raise AssertionError(f"{check} passed on {case}")


def test_one_dropped_key_is_one_bug_across_checks_and_outputs():
    """The shrunk cases a ci run reports (S 65 and 127, rank 3 and 4, dout transposed)."""
    base = SdpaCase(L=1, S=65, E=1, Ev=1, value_scale=0.3)
    sigs = [_signature(DROPPED, "forward_agreement", base),
            _signature(DROPPED, "gradient_agreement", base),
            _signature(DROPPED, "strided_dout", SdpaCase(L=1, S=65, E=1, Ev=1, value_scale=0.3,
                                                          layout_dout="transposed")),
            _signature(DROPPED, "rank3_equals_rank4", SdpaCase(L=1, S=127, E=1, Ev=1, value_scale=0.3))]
    assert all(s["confirmed"].get("S") == "only when S > 64" for s in sigs), [s["confirmed"] for s in sigs]
    lines = bugs.summary([dict(s, nodeid=s["check"]) for s in sigs])
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"BUG 1: {DROPPED} ") and "S > 64" in lines[0], lines[0]
    assert "(4 failures in 4 tests)" in lines[0], lines[0]


def test_independent_bugs_stay_apart():
    gqa = SdpaCase(batch=(1,), hq=4, hkv=2, gqa=True, L=3, S=5, seed=1)
    mask = SdpaCase(batch=(1,), hq=2, hkv=2, L=4, S=6, mask="bool_full", seed=2)
    tail = SdpaCase(batch=(1,), L=5, S=7, E=8, Ev=8, seed=1)
    sigs = [_signature(THREE, "gradient_agreement", gqa), _signature(THREE, "gradient_agreement", mask),
            _signature(THREE, "forward_agreement", tail)]
    assert [s["output"] for s in sigs] == ["dq", "dv", "out"]
    groups = bugs.group(sigs)
    assert len(groups) == 3, [s["confirmed"] for s in sigs]


def test_the_report_opens_with_one_line_per_bug(tmp_path):
    """A real run of one check against KeyDroppedAtTileEdge: the report opens with one BUG line
    naming the error map, written to --oracle-artifacts (grouping across checks: above)."""
    maps = tmp_path / "maps"
    proc = run_suite("attention_oracle/conformance/test_sdpa.py::test_forward_agreement",
                     "--impl", DROPPED, "--oracle-artifacts", str(maps))
    assert proc.returncode == 1, proc.stdout[-3000:]
    report = proc.stdout.split("attention-oracle report", 1)[1].split("\n", 1)[1]
    assert report.startswith(f"BUG 1: {DROPPED} out fail "), report[:2000]
    assert len([line for line in report.splitlines() if line.startswith("BUG ")]) == 1, report[:3000]
    png = report.splitlines()[0].split("error map: ")[1].strip()
    assert png in glob.glob(os.path.join(str(maps), "*.png")), (png, os.listdir(maps))
    assert f"error map: {png}" in proc.stdout.split("attention-oracle report", 1)[0]  # in the failure too
