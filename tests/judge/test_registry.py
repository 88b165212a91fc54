"""The check registry and the judge: every check is declared with its cases, the conformance
tests are generated from the declarations, and a judge's failure names check, implementation,
output and replay exactly as ``agreement``'s messages do."""
import pytest
import torch
from hypothesis import given, settings

from attention_oracle import contract
from attention_oracle.checks import catalogue
from attention_oracle.checks.dsa import cases as dsa_cases
from attention_oracle.checks.index import cases as index_cases
from attention_oracle.checks.sdpa import cases as sdpa_cases
from attention_oracle.checks.sdpa.cases import SdpaCase
from attention_oracle.conformance import test_dsa, test_index, test_sdpa
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.judge.capabilities import Capabilities
from attention_oracle.judge.judge import Judge
from attention_oracle.judge.targets import Target, load

DTYPES = (torch.float32,)
PUBLIC = {contract.SDPA, contract.DSA_NOPE, contract.DSA_ROPE, contract.DSA_NOPE_VARLEN,
          contract.DSA_ROPE_VARLEN, contract.OFFSET_INDICES}
MODULES = {"sdpa": test_sdpa, "dsa": test_dsa, "index": test_index}
CASES = {"sdpa": sdpa_cases, "dsa": dsa_cases, "index": index_cases}
ALL = [(area, name) for area in catalogue.areas() for name in catalogue.checks(area)]


@pytest.mark.parametrize("area,name", ALL)
def test_every_check_has_a_generated_test(area, name):
    check = catalogue.check(f"{area}.{name}")
    test = getattr(MODULES[area], f"test_{name}")
    assert test.oracle_check == check.full_name == f"{area}.{name}"
    assert callable(check) and check.__name__ == name  # check(target, case), named as before
    for variant in check.variants:
        assert check.function(variant) in PUBLIC
        assert check.strategy(DTYPES, variant) is not None
    assert ("beyond_contract" in {m.name for m in getattr(test, "pytestmark", [])}) == check.beyond
    assert set(check.requires) <= set(CASES[area].REQUIREMENTS)


def test_declared_requirements_skip_what_is_not_declared():
    """A check requiring a capability says why it cannot run where it is not declared, by its
    declaration and by its name (``unsupported``, as calibrate asks) alike."""
    plain = Capabilities(layouts=("contiguous",), ranks=(4,))
    assert catalogue.check("sdpa.misaligned_inputs").unsupported(plain) == "misaligned inputs not declared"
    assert sdpa_cases.unsupported("misaligned_inputs", plain) == "misaligned inputs not declared"
    assert catalogue.check("sdpa.rank3_equals_rank4").unsupported(plain) == "needs ranks 3 and 4"
    assert catalogue.check("dsa.default_scale").unsupported(plain, "nope") == "no softmax_scale default"
    assert catalogue.check("dsa.misaligned_inputs").unsupported(Capabilities(), "rope") == ""
    assert catalogue.check("sdpa.forward_agreement").unsupported(plain) == ""


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown check 'sdpa.nope'"):
        catalogue.check("sdpa.nope")
    with pytest.raises(ValueError, match="unknown area 'attn'"):
        catalogue.check("attn.forward_agreement")
    with pytest.raises(ValueError, match="variants"):
        catalogue.check("dsa.forward_agreement").params("sideways")


def test_declared_parameters_reach_the_cases():
    """What a check declares is what it draws: rank 3, empty rows, varlen, NoPE/RoPE."""
    rank3 = catalogue.strategy("sdpa.rank3_equals_rank4", DTYPES)
    masked = catalogue.strategy("sdpa.fully_masked_rows", DTYPES)
    varlen = catalogue.strategy("dsa.varlen_isolation", DTYPES, "nope")
    compacted = catalogue.strategy("index.compacted_attention", DTYPES)

    @settings(max_examples=15, database=None, deadline=None)
    @given(a=rank3, b=masked, c=varlen, d=compacted)
    def draws(a, b, c, d):
        assert a.rank == 3 and b.empty_rows > 0
        assert c.varlen and c.poison_doc >= 0 and not c.rope
        assert d.compact and d.out == "none"
    draws()


def test_judge_fails_with_the_agreement_message():
    target = Target("x")
    case = SdpaCase()
    judge = Judge("sdpa.forward_agreement", target, case)
    gold = torch.zeros(3, dtype=torch.float64)
    judge.agrees("out", gold.float(), gold, gold.float(), magnitude=1.0, gradient=False)  # agrees
    with pytest.raises(OracleMismatch) as info:
        judge.agrees("out", torch.ones(3), gold, gold.float(), magnitude=1.0, gradient=False)
    text = str(info.value)
    assert text.startswith("[sdpa.forward_agreement] implementation=x output=out: max|impl-gold|")
    assert text.endswith(f"reproduce: {case.repro('sdpa.forward_agreement', 'x')}")
    with pytest.raises(OracleMismatch, match=r"output=lse: .*: 1 element\(s\) differ"):
        judge.exact("lse", torch.ones(2), torch.tensor([1.0, 2.0]), what="lse")
    with pytest.raises(OracleMismatch, match=r"\n  note: after"):
        with judge.noted("after"):
            judge.true("dq", False, "wrong")
    derived = judge.for_case(SdpaCase(L=3))
    assert derived.check == judge.check and "\"L\": 3" in derived.repro


def test_a_declared_check_judges_under_its_name():
    """check(target, case) builds the judge: a broken target's failure names the check."""
    target = load("attention_oracle.controls.sdpa_broken:WrongScale")
    check = catalogue.check("sdpa.forward_agreement")
    with pytest.raises(OracleMismatch, match=r"^\[sdpa\.forward_agreement\] implementation=.*WrongScale"):
        check(target, SdpaCase(L=4, S=5, E=8, Ev=8, seed=3))
