"""Every distinct bug, and what it depends on (run/triage.py).

``controls/multi_bug.py:ThreeBugs`` has three independent bugs: ``out`` wrong when L % 16 != 0,
``dq`` wrong with GQA, ``dv`` wrong with boolean masks. One search of gradient_agreement must
report both gradient bugs apart (one exception class per check and output), and every final
failure must say which field it depends on. A real pytest run shows the forward bug's rule.
"""

import dataclasses
import re

import pytest
from hypothesis import settings
from hypothesis import strategies as st

from attention_oracle import oracle
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
    assert re.search(r"    mask: fails only with (bool masks|mask='bool_\w+')", dv), dv


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


# ----------------------------------------------------------------------------- rules that hold


class ValueLottery:
    """out x 1.5 when int(sum|q| * 1000) is odd: a failure that depends on the drawn values and
    on no field. Varying any field redraws the values, so a rule read off one case ("E == 1")
    is luck; triage must not report it."""

    def __repr__(self):
        return "ValueLottery"

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        out = oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                                  scale, enable_gqa)
        return out * 1.5 if int(float(query.detach().abs().sum()) * 1000) % 2 else out


LOTTERY = "tests.run.test_triage:ValueLottery"
FORWARD = checks.CHECKS["forward_agreement"]


def _fails(target, case) -> bool:
    return triage._outcome(FORWARD, target, case, "out") == "fails"


def _one_case_says_e_is_1(target):
    """The first seed whose E = 1 case fails while its E 8, 16 and 64 variants all pass: one
    case's variants alone give the rule "E == 1"."""
    for seed in range(400):
        case = SdpaCase(batch=(1,), L=3, S=5, E=1, Ev=8, seed=seed)
        if _fails(target, case) and not any(_fails(target, dataclasses.replace(case, E=e)) for e in (8, 16, 64)):
            return case
    raise AssertionError("no such seed in 0..399")


def test_a_rule_read_off_one_case_is_not_reported():
    target = load(LOTTERY)
    case = _one_case_says_e_is_1(target)
    seen = _variant_outcomes_of(target, case)
    fails = [case] + [c for (lab, _, _, c, o) in seen if lab == "E" and o == "fails"]
    passes = [c for (lab, _, _, c, o) in seen if lab == "E" and o == "passes"]
    assert triage._rule("E", case, fails, passes)[0] == "only when E == 1"  # what one case says
    found = triage.analyse(FORWARD, target, case, "sdpa.forward_agreement", "out")
    assert "E" not in found.confirmed, found.text
    assert "E: fails" not in found.text and "E == 1" not in found.headline(), found.text


def _variant_outcomes_of(target, case):
    return triage._run_variants(FORWARD, target, case, float("inf"), "out")[0]


def test_a_threshold_is_confirmed_on_a_second_case_and_fresh_values():
    """Key 64 dropped: from S = 65 (S 1..64 pass) the rule is S > 64, not S == 65; it holds on
    the seed variant and on fresh S values (66 fails, 63 passes)."""
    target = load("attention_oracle.controls.sdpa_broken:KeyDroppedAtTileEdge")
    case = SdpaCase(L=1, S=65, E=1, Ev=1, value_scale=0.3)
    found = triage.analyse(FORWARD, target, case, "sdpa.forward_agreement", "out")
    assert found.confirmed.get("S") == "only when S > 64", found.text
    assert "E" not in found.confirmed and "L" not in found.confirmed, found.text
    assert found.runs <= triage.MAX_VARIANTS


def test_triage_is_deterministic():
    target = load(CONTROL)
    case = SdpaCase(batch=(1,), L=5, S=7, E=8, Ev=8, seed=1)
    first = triage.analyse(FORWARD, target, case)
    again = triage.analyse(FORWARD, target, case)
    assert (first.confirmed, first.unconfirmed, first.independent) == \
        (again.confirmed, again.unconfirmed, again.independent)


def test_variants_see_the_known_failures_a_run_applies(monkeypatch):
    """Triage judges a variant as a run would: a failure inside a known signature (ThreeBugs' dv
    with a boolean mask, excused by an entry) neither fails the variant nor hides the dq bug
    being triaged, so dropping GQA reads "passes", not "other:dv"."""
    from attention_oracle.judge import known
    from attention_oracle.run import known_failures
    target = load(CONTROL)
    case = SdpaCase(batch=(1,), hq=4, hkv=2, gqa=True, L=5, S=6, E=8, Ev=8, mask="bool_full", seed=3)
    no_gqa = dataclasses.replace(case, hq=2, gqa=False)
    check = checks.CHECKS["gradient_agreement"]
    assert triage._outcome(check, target, case, "dq") == "fails"
    assert triage._outcome(check, target, no_gqa, "dq") == "other:dv"
    entry = known_failures.Entry(0, (target.name,), ("sdpa.gradient_agreement",), "dv ignores bool masks",
                                 {"mask": "bool_full"}, source="k.toml",
                                 signature=known.Signature(("dv",)))
    monkeypatch.setattr(known_failures, "_USER", [entry])
    assert triage._outcome(check, target, no_gqa, "dq") == "passes"
    assert triage._outcome(check, target, case, "dq") == "fails"
