"""Known failure classes (properties/known_failures.KNOWN_CASES) are counted, never widened.

A mismatch inside a listed class is counted in the report's "known" column; the same broken
implementation still fails on a case outside the class, and another implementation with the
same failure inside the class still fails: the exemption names one implementation and one
class of inputs, nothing more.
"""
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
def causal_is_known(monkeypatch):
    target = load(CONTROL)
    entry = known_failures.KnownCase((target.name,), ("sdpa.forward_agreement",),
                                     (target.device.type,), lambda case: case.causal,
                                     "control: causal cases of WrongScale are a known failure")
    monkeypatch.setattr(known_failures, "KNOWN_CASES", (entry,))
    return target


def _run(target, case):
    sink, token = record.open_sink()
    try:
        run_check(sdpa_checks.CHECKS["forward_agreement"], target, case)
    finally:
        record.close_sink(token)
    return sink


def test_known_class_is_counted_not_raised(causal_is_known):
    sink = _run(causal_is_known, CAUSAL)
    assert sink.known == 1
    assert "WrongScale" in sink.known_first and "known: control" in sink.known_first
    assert sink.worst == 0.0  # the known example does not set the worst ratio


def test_outside_the_class_still_fails(causal_is_known):
    with pytest.raises(OracleMismatch, match="WrongScale"):
        _run(causal_is_known, NOT_CAUSAL)


def test_other_implementation_in_the_class_still_fails(causal_is_known):
    other = load("attention_oracle.controls.sdpa_broken:CausalOffByOne")
    with pytest.raises(OracleMismatch, match="CausalOffByOne"):
        _run(other, CAUSAL)


def test_listed_classes_name_real_findings():
    for entry in known_failures.KNOWN_CASES:
        assert "NOTES.md, Findings, F" in entry.reason, entry
        assert entry.impls and entry.checks and entry.devices
