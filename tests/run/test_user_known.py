"""User-owned known failures (``--known-failures FILE``): counted as known, never widened, stale
entries reported.

Real pytest runs in a subprocess against a control that is wrong only for causal cases
(``CausalOffByOne``): an entry covering causal cases turns the run green with the examples
counted as known; an entry covering the wrong class leaves it red and is reported stale; an
entry for an implementation that does not fail is stale.
"""
import json

import pytest

from attention_oracle.checks.sdpa.cases import SdpaCase
from attention_oracle.judge import record
from attention_oracle.run import known_failures as user_known
from tests.helpers import run_suite

CONTROL = "attention_oracle.controls.sdpa_broken:CausalOffByOne"
THREE_BUGS = "attention_oracle.controls.multi_bug:ThreeBugs"
CHECK = "attention_oracle/conformance/test_sdpa.py::test_forward_agreement"


def _pytest(tmp_path, known_text: str, name: str = "known.toml", impls=(CONTROL,)):
    known = tmp_path / name
    known.write_text(known_text)
    report_path = tmp_path / "report.json"
    args = [a for i in impls for a in ("--impl", i)]
    proc = run_suite("--oracle-report", str(report_path), "--known-failures", str(known), CHECK,
                     *args)
    rep = json.loads(report_path.read_text()) if report_path.exists() else None
    return proc, rep


def _write(tmp_path, text, name="known.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ----------------------------------------------------------------------------- loading, matching


def test_toml_and_json_load_the_same_entries(tmp_path):
    toml = _write(tmp_path, '[[known]]\nimplementation = "m"\ncheck = "sdpa.*"\n'
                            'where = {dtype = "float16", causal = true}\nreason = "r"\n')
    js = _write(tmp_path, json.dumps({"known": [{"implementation": "m", "check": "sdpa.*", "reason": "r",
                                                 "where": {"dtype": "float16", "causal": True}}]}),
                "known.json")
    a, b = user_known.load(toml), user_known.load(js)
    assert [(e.implementations, e.checks, e.where, e.reason) for e in a] == \
           [(e.implementations, e.checks, e.where, e.reason) for e in b]


@pytest.mark.parametrize("where, expected", [
    ({"dtype": "float16", "causal": True}, True),
    ({"dtype": ["float32", "float16"]}, True),
    ({"dtype": "float32"}, False),
    ("L % 32 != 0 and causal", True),
    ("E > 128 or not causal", False),
    ("rank == 4 and batch[0] == 2", True),
])
def test_predicates_on_case_fields(tmp_path, where, expected):
    entry = user_known.Entry(0, ("m",), ("sdpa.forward_agreement",), "r", where)
    case = SdpaCase(batch=(2,), L=33, S=5, dtype="float16", causal=True)
    assert entry.applies(case) is expected


@pytest.mark.parametrize("text, message", [
    ('[[known]]\nimplementation = "m"\ncheck = "sdpa.x"\n', "missing 'reason'"),
    ('[[known]]\nimplementation = "m"\ncheck = "sdpa.x"\nreason = "r"\nwhere = {causl = true}\n',
     "unknown field(s) ['causl']"),
    ('[[known]]\nimplementation = "m"\ncheck = "sdpa.x"\nreason = "r"\nwhere = "__import__(1)"\n',
     "calls something other than"),
    ('[[known]]\nimplementation = "m"\ncheck = "sdpa.x"\nreason = "r"\nwhere = "q.T"\n',
     "uses Attribute"),
    ('[[known]]\nimplementation = "m"\ncheck = "sdpa.x"\nreason = "r"\nwhen = 1\n', "unknown key(s) ['when']"),
    ('[[known]\n', "invalid TOML"),
])
def test_malformed_files_name_the_entry(tmp_path, text, message):
    with pytest.raises(user_known.KnownFailuresError) as info:
        user_known.load(_write(tmp_path, text))
    assert message in str(info.value) and "known.toml" in str(info.value)


def test_a_predicate_failing_on_a_case_names_the_entry(tmp_path):
    """A where expression that parses but cannot be evaluated on the case (a string field
    compared with a number) is the entry's error, named, not a TypeError in the check."""
    (entry,) = user_known.load(_write(tmp_path, '[[known]]\nimplementation = "m"\n'
                                                 'check = "sdpa.forward_agreement"\nreason = "r"\n'
                                                 'where = "dtype > 3"\n'))
    with pytest.raises(user_known.KnownFailuresError, match=r"known.toml, entry 1: where = 'dtype > 3' "
                                                            r"fails on a case: TypeError"):
        entry.applies(SdpaCase())


def test_a_match_is_recorded_for_the_stale_report(monkeypatch):
    entry = user_known.Entry(0, ("m*",), ("sdpa.*",), "because", {"causal": True}, source="k.toml")
    monkeypatch.setattr(user_known, "_USER", [entry])
    assert user_known.case_reason("mine", "sdpa.forward_agreement", "cpu", SdpaCase(causal=True)) \
        == "because (k.toml#1)"
    assert user_known.case_reason("mine", "sdpa.forward_agreement", "cpu", SdpaCase()) == ""
    assert user_known.case_reason("other", "sdpa.forward_agreement", "cpu", SdpaCase(causal=True)) == ""
    sink, token = record.open_sink()
    try:
        user_known.record_match(["k.toml#1", "k.toml#1"])
    finally:
        record.close_sink(token)
    assert sink.known_entries == {"k.toml#1": 1}


def test_an_entry_naming_no_check_is_an_error(tmp_path):
    with pytest.raises(user_known.KnownFailuresError, match="names no existing check"):
        user_known.load(_write(tmp_path, '[[known]]\nimplementation = "m"\ncheck = "sdpa.forward"\n'
                                          'reason = "r"\n'))
    with pytest.raises(user_known.KnownFailuresError, match="names no existing check"):
        user_known.load(_write(tmp_path, '[[known]]\nimplementation = "m"\ncheck = "sdpb.*"\n'
                                          'reason = "r"\n'))


# ----------------------------------------------------------------------------- real runs


def test_entry_covering_the_bug_counts_it_as_known(tmp_path):
    proc, rep = _pytest(tmp_path, f'[[known]]\nimplementation = "{CONTROL}"\n'
                                  f'check = "sdpa.forward_agreement"\nwhere = {{causal = true}}\n'
                                  f'reason = "causal off by one, tracked elsewhere"\n')
    assert proc.returncode == 0, proc.stdout[-3000:]
    (row,) = rep["rows"]
    assert row["passed"] == 1 and row["known"] > 0, row
    assert "causal off by one" in row["known_first"]
    kf = rep["known_failures"]
    assert kf["stale"] == [] and kf["entries"][0]["matched"] == row["known"]
    assert "matched" in proc.stdout and "STALE" not in proc.stdout


def test_entry_for_another_class_leaves_the_failure_and_is_stale(tmp_path):
    proc, rep = _pytest(tmp_path, f'[[known]]\nimplementation = "{CONTROL}"\n'
                                  f'check = "sdpa.forward_agreement"\nwhere = "not causal"\n'
                                  f'reason = "wrong class"\n')
    assert proc.returncode == 1, proc.stdout[-3000:]
    (row,) = rep["rows"]
    assert row["failed"] == 1 and row["known"] == 0
    assert rep["known_failures"]["stale"] == ["known.toml#1"]
    assert "STALE" in proc.stdout and "known.toml#1" in proc.stdout


def test_entry_for_a_correct_implementation_is_stale_and_other_checks_are_not_exercised(tmp_path):
    proc, rep = _pytest(tmp_path, json.dumps([
        {"implementation": "oracle", "check": "sdpa.forward_agreement", "reason": "never fails"},
        {"implementation": "oracle", "check": "dsa.*", "reason": "did not run"}]),
        name="known.json", impls=("oracle",))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert rep["known_failures"]["stale"] == ["known.json#1"]
    assert rep["known_failures"]["not_exercised"] == ["known.json#2"]


def test_malformed_file_is_a_usage_error(tmp_path):
    proc, _ = _pytest(tmp_path, '[[known]]\nimplementation = "x"\n')
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "missing 'check'" in proc.stdout + proc.stderr


def test_an_isolated_run_applies_the_known_failures(tmp_path, monkeypatch):
    """A check run in a fresh process (``run_isolated``: the misaligned-input checks on CUDA)
    applies the known failures as an in-process run does: ThreeBugs' dv with a boolean mask,
    inside a user entry's signature, is counted as known there, not raised."""
    from attention_oracle.checks.sdpa import checks
    from attention_oracle.judge.agreement import OracleMismatch
    from attention_oracle.judge.targets import load
    from attention_oracle.run import runner
    target = load(THREE_BUGS)
    case = SdpaCase(batch=(1,), hq=2, hkv=2, L=5, S=6, E=8, Ev=8, mask="bool_full", seed=3)
    check = checks.CHECKS["gradient_agreement"]
    monkeypatch.setattr(user_known, "_USER", [])
    with pytest.raises(OracleMismatch, match="isolated run failed"):
        runner.run_isolated(check, target, case)
    path = _write(tmp_path, f'[[known]]\nimplementation = "{THREE_BUGS}"\n'
                            f'check = "sdpa.gradient_agreement"\nwhere = {{mask = "bool_full"}}\n'
                            f'signature = {{outputs = ["dv"]}}\nreason = "dv ignores bool masks"\n')
    monkeypatch.setattr(user_known, "_USER", user_known.load(str(path)))
    sink, token = record.open_sink()
    try:
        assert runner.run_isolated(check, target, case)
    finally:
        record.close_sink(token)
    assert sink.known == 1 and sink.known_entries == {"known.toml#1": 1}
