"""Known failures (run/known_failures.py): counted, never widened; the suite's entries are data.

A mismatch inside an entry is counted in the report's "known" column; the same broken
implementation still fails on a case outside the entry, and another implementation with the
same failure inside it still fails: an entry names one implementation and one class of inputs.
The suite's own entries (known_failures.toml) go through the same loader as a user's file and
each cites its docs/FINDINGS.md ID.
"""
import re

import pytest

from attention_oracle.checks.sdpa import checks as sdpa_checks
from attention_oracle.checks.sdpa.cases import SdpaCase
from attention_oracle.judge import record
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.judge.targets import load
from attention_oracle.run import known_failures
from attention_oracle.run.runner import run_check

CONTROL = "attention_oracle.controls.sdpa_broken:WrongScale"
CAUSAL = SdpaCase(batch=(1,), hq=2, hkv=2, L=5, S=7, E=8, Ev=8, causal=True, seed=3)
NOT_CAUSAL = SdpaCase(batch=(1,), hq=2, hkv=2, L=5, S=7, E=8, Ev=8, causal=False, seed=3)


@pytest.fixture
def causal_is_known(tmp_path, monkeypatch):
    path = tmp_path / "known.toml"
    path.write_text(f'[[known]]\nimplementation = "{CONTROL}"\ncheck = "sdpa.forward_agreement"\n'
                    f'where = {{causal = true}}\nreason = "control: causal cases of WrongScale"\n')
    monkeypatch.setattr(known_failures, "_USER", known_failures.load(str(path)))
    return load(CONTROL)


def _run(target, case, check="forward_agreement"):
    sink, token = record.open_sink()
    try:
        run_check(sdpa_checks.CHECKS[check], target, case)
    finally:
        record.close_sink(token)
    return sink


def test_known_class_is_counted_not_raised(causal_is_known):
    sink = _run(causal_is_known, CAUSAL)
    assert sink.known == 1
    assert "WrongScale" in sink.known_first and "known: control" in sink.known_first
    assert sink.known_entries == {"known.toml#1": 1}
    assert sink.worst == 0.0  # the excused output does not set the worst ratio


def test_outside_the_class_still_fails(causal_is_known):
    with pytest.raises(OracleMismatch, match="WrongScale"):
        _run(causal_is_known, NOT_CAUSAL)


def test_other_implementation_in_the_class_still_fails(causal_is_known):
    other = load("attention_oracle.controls.sdpa_broken:CausalOffByOne")
    with pytest.raises(OracleMismatch, match="CausalOffByOne"):
        _run(other, CAUSAL)


def test_the_suites_entries_are_data_citing_findings():
    entries = known_failures.builtin()
    assert entries and all(e.builtin for e in entries)
    for e in entries:
        assert re.fullmatch(r"F\d+", e.finding), e
        assert e.reason.endswith(f"docs/FINDINGS.md {e.finding}"), e
        assert e.implementations and e.checks and e.device in ("cpu", "cuda")
    findings = {e.finding: e for e in entries}
    assert findings["F2"].signature.rows == "fully_masked"
    assert findings["F10"].signature.rows == findings["F11"].signature.rows == "finfo_min"
    assert findings["F9"].signature.confirm == "sdpa.gradient_agreement"


def test_whole_test_entries_are_xfails_only_where_listed():
    assert "F1" in known_failures.reason("torch-flash", "sdpa.misaligned_inputs", "cuda")
    assert known_failures.reason("torch-flash", "sdpa.misaligned_inputs", "cpu") == ""
    assert known_failures.reason("torch-flash", "sdpa.forward_agreement", "cuda") == ""


def test_the_suites_entries_match_their_class_only():
    finfo = SdpaCase(batch=(1,), L=4, S=6, mask="finfo_min_bcast", empty_rows=1)
    labels = [e.finding for e in known_failures.matching("torch-flash", "sdpa.gradient_agreement",
                                                         "cpu", finfo)]
    assert labels == ["F11"]
    assert known_failures.matching("torch-flash", "sdpa.gradient_agreement", "cpu", SdpaCase()) == []
    assert known_failures.matching("torch-math", "sdpa.gradient_agreement", "cpu", finfo) == []


@pytest.mark.parametrize("written", ["OUT", "Out "])
def test_a_misspelt_signature_output_is_named_in_the_failure(written, tmp_path, monkeypatch):
    """An entry whose signature names an output but for case or punctuation ("OUT" for "out")
    excuses nothing: the failure says which name it gave and that names match exactly.
    Negative control: an entry naming another real output ("lse") gets no such hint."""
    path = tmp_path / "known.toml"
    for outputs, hinted in ((written, True), ("lse", False)):
        path.write_text(f'[[known]]\nimplementation = "{CONTROL}"\n'
                        f'check = "sdpa.forward_agreement"\nreason = "a slip"\n'
                        f'signature = {{outputs = ["{outputs}"]}}\n')
        monkeypatch.setattr(known_failures, "_USER", known_failures.load(str(path)))
        with pytest.raises(OracleMismatch) as info:
            _run(load(CONTROL), CAUSAL)
        text = str(info.value)
        assert "outside the known signature" in text
        assert (f"a signature names '{outputs}', not 'out'" in text) == hinted, text
