"""A correct implementation that keeps strictly to the contract passes every conformance check.

``controls/strict_contract.py:StrictContract`` wraps the oracle, requires DSA's
``softmax_scale``, takes int32 indices only and raises its own ValueError naming the argument
otherwise. Each DSA, index and SDPA check runs on it over the conformance strategies (a few
examples each, drawn within its (undeclared, so default) capabilities) and must not fail;
the beyond-contract checks must count its clear refusals as passes.
"""
import pytest
from hypothesis import given

from attention_oracle.checks.dsa import checks as dsa_checks
from attention_oracle.checks.dsa.cases import strategy_for as dsa_strategy
from attention_oracle.checks.dsa.cases import unsupported as dsa_unsupported
from attention_oracle.checks.index import checks as index_checks
from attention_oracle.checks.index.cases import strategy_for as index_strategy
from attention_oracle.checks.sdpa import checks as sdpa_checks
from attention_oracle.checks.sdpa.cases import strategy_for as sdpa_strategy
from attention_oracle.judge import profiles, record
from attention_oracle.judge.targets import load
from attention_oracle.run.runner import run_check

EXAMPLES = 4
VARLEN = ("varlen_agreement", "varlen_isolation", "varlen_int64_indices")


def _strict():
    target = load("attention_oracle.controls.strict_contract:StrictContract")
    assert not target.unavailable, target.unavailable
    return target


def _search(check, cases, target):
    ran = []

    @profiles.control_settings(max_examples=EXAMPLES)
    @given(case=cases)
    def search(case):
        ran.append(run_check(check, target, case))

    with record.silenced():
        search()
    assert any(ran), f"{check.__name__}: every example was refused"


@pytest.mark.parametrize("rope", (False, True), ids=("nope", "rope"))
@pytest.mark.parametrize("name", sorted(dsa_checks.CHECKS))
def test_dsa_check_passes_strict_implementation(name, rope):
    target = _strict()
    why = dsa_unsupported(name, target, rope=rope, varlen=name in VARLEN)
    if why:
        assert name == "default_scale", why  # no default declared: that check does not run
        return
    _search(dsa_checks.CHECKS[name], dsa_strategy(name, target, rope=rope), target)


@pytest.mark.parametrize("name", sorted(index_checks.CHECKS))
def test_index_check_passes_strict_implementation(name):
    target = _strict()
    _search(index_checks.CHECKS[name], index_strategy(name, target), target)


@pytest.mark.parametrize("name", ("forward_agreement", "gradient_agreement", "fully_masked_rows"))
def test_sdpa_check_passes_strict_implementation(name):
    target = _strict()
    _search(sdpa_checks.CHECKS[name], sdpa_strategy(name, target), target)
