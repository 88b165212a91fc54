"""The calibration report (``tools/calibrate.py``) on a tiny run: SDPA only, two
examples, the oracle and one negative control; its JSON, PNG and exit status."""
import json

import pytest

from attention_oracle.judge import profiles
from attention_oracle.run import poison
from attention_oracle.tools import calibrate


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("calibration")
    before = (profiles.name(), profiles.size())
    code = calibrate.main(["--area", "sdpa", "--impl", "oracle", "--controls",
                           "--control", "UnwrittenRows", "--examples", "2", "--control-examples", "2",
                           "--dtypes", "float32", "--out", str(out)])
    assert (profiles.name(), profiles.size()) == before, "the active profile must be restored"
    assert not poison.is_active()
    with open(out / "calibration.json") as f:
        return code, json.load(f), out


def test_oracle_meets_the_correct_target(tiny_run):
    code, data, _ = tiny_run
    (row,) = [r for r in data["correct"] if r["impl"] == "oracle"]
    assert row["dtype"] == "float32" and row["examples"] > 0
    assert row["worst"] <= calibrate.CORRECT_TARGET and row["meets_target"]
    checks = {g["check"] for g in data["groups"] if g["kind"] == "correct"}
    assert {"sdpa.forward_agreement", "sdpa.gradient_agreement"} <= checks


def test_control_reported_caught(tiny_run):
    code, data, _ = tiny_run
    (control,) = data["controls"]
    assert control["control"] == "sdpa_broken:UnwrittenRows"
    assert control["check"] == "sdpa.forward_agreement"
    assert control["caught"] >= 1 and control["ratio"] == "inf" and control["meets_target"]
    assert code == 0, "every target met: exit status 0"


def test_examples_and_png_written(tiny_run):
    _, data, out = tiny_run
    assert data["meta"]["poison"] is True and data["meta"]["examples"] == 2
    kinds = {e["kind"] for e in data["examples"]}
    assert kinds == {"correct", "control"}
    caught = [e for e in data["examples"] if e["kind"] == "control" and e["outcome"] == "failed"]
    assert caught and all("case" in e and e["outputs"] for e in caught)
    assert (out / "calibration.png").stat().st_size > 1000


def test_a_missed_target_fails_the_run(tmp_path):
    """A control the check cannot catch on the drawn cases (WrongGqaMapping on 1 example: the
    minimal case has one head) is reported NOT CAUGHT and turns the exit status to 1."""
    code = calibrate.main(["--area", "sdpa", "--impl", "controls", "--control", "WrongGqaMapping",
                           "--examples", "1", "--control-examples", "1", "--dtypes", "float32", "--out", str(tmp_path),
                           "--no-png"])
    data = json.loads((tmp_path / "calibration.json").read_text())
    (control,) = data["controls"]
    assert control["caught"] == 0 and not control["meets_target"]
    assert code == 1
