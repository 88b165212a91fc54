"""Every distinct bug, and what it depends on (run/triage.py).

``controls/multi_bug.py:ThreeBugs`` has three independent bugs: ``out`` wrong when L % 16 != 0,
``dq`` wrong with GQA, ``dv`` wrong with boolean masks. One search of gradient_agreement must
report both gradient bugs apart (one exception class per check and output), and every final
failure must say which field it depends on. A real pytest run shows the forward bug's rule.
"""

import pytest
from hypothesis import settings
from hypothesis import strategies as st

from attention_oracle.checks.sdpa import checks
from attention_oracle.checks.sdpa.cases import SdpaCase
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.judge.targets import load
from attention_oracle.run import triage
from tests.helpers import run_suite

CONTROL = "attention_oracle.controls.multi_bug:ThreeBugs"
SEARCH = settings(max_examples=30, derandomize=True, database=None, deadline=None,
                  report_multiple_bugs=True)


@st.composite
def _small_cases(draw):
    """Small cases where each bug is common (the suite's own strategies make the dv bug rare)."""
    gqa = draw(st.booleans())
    return SdpaCase(batch=(1,), hq=4 if gqa else 2, hkv=2, gqa=gqa, L=draw(st.integers(1, 8)),
                    S=draw(st.integers(1, 8)), E=8, Ev=8,
                    mask=draw(st.sampled_from(("none", "bool_full", "float_full"))),
                    seed=draw(st.integers(0, 1000)))


def test_independent_gradient_bugs_are_reported_apart_with_their_dependencies():
    from attention_oracle.run.runner import run_property
    target = load(CONTROL)
    with pytest.raises(BaseException) as info:
        run_property(checks.CHECKS["gradient_agreement"], target, _small_cases(), function=checks.FN,
                     settings_=SEARCH)
    leaves = {type(e).__name__: str(e) for e in triage._leaves(info.value) if isinstance(e, OracleMismatch)}
    assert set(leaves) == {"OracleMismatch[sdpa.gradient_agreement:dq]",
                           "OracleMismatch[sdpa.gradient_agreement:dv]"}, list(leaves)
    dq = leaves["OracleMismatch[sdpa.gradient_agreement:dq]"]
    dv = leaves["OracleMismatch[sdpa.gradient_agreement:dv]"]
    assert "depends on (triage:" in dq and "    gqa: fails only with gqa" in dq, dq
    assert "    mask: fails only with bool masks" in dv, dv


def _variant_outcomes(case):
    target = load(CONTROL)
    rows, _ = triage._run_variants(checks.CHECKS["forward_agreement"], target, case, float("inf"))
    return {(label, value): outcome for label, _, value, _, outcome in rows}


def test_variants_keep_one_field_changed_and_the_rule_is_the_simplest_consistent_one():
    case = SdpaCase(batch=(1,), L=5, S=7, E=8, Ev=8, seed=1)
    seen = _variant_outcomes(case)
    assert seen[("L", 16)] == seen[("L", 32)] == "passes" and seen[("L", 2)] == "fails"
    assert seen[("causal", True)] == "fails" and seen[("dtype", "float16")] == "fails"
    text = triage.explain(checks.CHECKS["forward_agreement"], load(CONTROL), case)
    assert "L: fails only when L % 16 != 0" in text, text
    assert "does not depend on:" in text and "causal" in text.split("does not depend on:")[1]


def test_a_failure_on_another_output_is_not_the_same_failure():
    """dv's bug with a bool mask: a variant that also trips dq (GQA on) fails on another output,
    which is a different bug, not evidence that dv's failure stays."""
    case = SdpaCase(batch=(1,), hq=2, hkv=2, L=4, S=6, mask="bool_full", seed=2)
    target = load(CONTROL)
    with pytest.raises(OracleMismatch, match="output=dv"):
        checks.CHECKS["gradient_agreement"](target, case)
    text = triage.explain(checks.CHECKS["gradient_agreement"], target, case, "sdpa.gradient_agreement",
                          output="dv")
    assert "mask: fails only with bool masks" in text, text
    assert "hidden by another failure when varied: gqa" in text, text


def test_distinct_classes_per_check_and_output():
    a = triage.mismatch_class("sdpa.forward_agreement", "out")
    assert a is triage.mismatch_class("sdpa.forward_agreement", "out")
    assert a is not triage.mismatch_class("sdpa.gradient_agreement", "out")
    assert issubclass(a, OracleMismatch)
    exc = OracleMismatch("[sdpa.forward_agreement] implementation=x output=lse: max|impl-gold| ...")
    assert triage.output_of(exc) == "lse"


def test_real_run_prints_the_dependency(tmp_path):
    proc = run_suite("attention_oracle/conformance/test_sdpa.py::test_forward_agreement",
                     "--impl", CONTROL)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "OracleMismatch[sdpa.forward_agreement:out]" in proc.stdout
    assert "L: fails only when L % 16 != 0" in proc.stdout, proc.stdout[-4000:]
