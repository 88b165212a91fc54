"""The executable contract (attention_oracle.contract): signatures checked when a target loads.

Controls (attention_oracle/controls/contract_broken.py) break one signature each and must be
reported naming the function and the parameter; a conformance run on them fails with that
message instead of a TypeError deep inside a check. Every built-in, adapter and numeric
control keeps to the contract.
"""
import inspect
import os

import pytest

from attention_oracle import contract, fast, oracle
from attention_oracle.judge import targets
from tests.helpers import ROOT, run_suite

CONTROLS = "attention_oracle.controls.contract_broken"


def _problems(name):
    return targets.load(f"{CONTROLS}:{name}").broken


def test_missing_parameter_is_named():
    (why,) = _problems("NoEnableGqa").values()
    assert why.startswith("scaled_dot_product_attention: missing parameter 'enable_gqa'"), why
    assert "contract:" in why and "offered:" in why


def test_swapped_positions_are_named():
    why = _problems("SwappedKeyValue")["scaled_dot_product_attention"]
    assert "'key' is at position 2, the contract has it at position 1" in why, why


def test_required_optional_parameter_is_named_and_only_that_function_is_broken():
    problems = _problems("RequiredTopkLength")
    assert set(problems) == {"dsa_sparse_attention_nope"}, problems
    assert "'topk_length' must be optional" in problems["dsa_sparse_attention_nope"]


def test_extra_optional_parameters_are_allowed():
    assert _problems("ExtraOptionalParameter") == {}


def test_keyword_only_parameter_must_be_accepted_by_keyword():
    def positional_only(q, kv, indices, topk_length=None, softmax_scale=None, return_lse=False, /):
        pass
    why = contract.signature_problem("dsa_sparse_attention_nope", positional_only)
    assert "'topk_length' must be accepted by keyword" in why, why


def test_var_arguments_cover_everything():
    def wrapper(*args, **kwargs):
        pass
    for name in contract.FUNCTIONS:
        assert contract.signature_problem(name, wrapper) == ""


def test_broken_function_fails_at_call_with_the_message():
    target = targets.load(f"{CONTROLS}:NoEnableGqa")
    with pytest.raises(targets.ContractViolation, match="missing parameter 'enable_gqa'"):
        target.call("scaled_dot_product_attention", None, None, None)


@pytest.mark.parametrize("name", targets.BUILTINS)
def test_builtins_keep_to_the_contract(name):
    assert targets.load(name).broken == {}


def test_oracle_and_fast_signatures_are_the_contract_stubs():
    for module in (oracle, fast):
        for name in contract.FUNCTIONS + contract.EXTENSIONS:
            have = inspect.signature(getattr(module, name))
            assert have == contract.signature(name), (module.__name__, name, have)


def test_adapters_and_numeric_controls_keep_to_the_contract():
    from attention_oracle.controls import dsa_broken, index_broken, sdpa_broken
    from attention_oracle.judge.adapters.lse_base2 import LseBase2
    from attention_oracle.judge.adapters.lse_posinf_empty import LsePosinfEmpty
    from attention_oracle.judge.adapters.no_lse import NoLse
    for adapter in (LseBase2, LsePosinfEmpty, NoLse):
        assert contract.signature_problems(adapter("attention_oracle.oracle")) == {}, adapter
    for module in (sdpa_broken, dsa_broken, index_broken):
        for attr, cls in vars(module).items():
            if isinstance(cls, type) and cls.__module__ == module.__name__ and contract.offered(cls):
                try:
                    ns = cls()
                except TypeError:  # a control that needs arguments
                    continue
                assert contract.signature_problems(ns) == {}, (module.__name__, attr)


def test_contract_functions_are_the_one_list():
    assert targets.CONTRACT_FUNCTIONS is contract.FUNCTIONS
    assert set(contract.FUNCTIONS) == {f for fs in contract.AREA_FUNCTIONS.values() for f in fs}


def test_conformance_run_fails_with_the_message_not_a_collection_error(tmp_path):
    proc = run_suite("attention_oracle/conformance/test_sdpa.py::test_forward_agreement",
                     "--impl", f"{CONTROLS}:NoEnableGqa")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "1 failed" in out, out[-3000:]
    assert "missing parameter 'enable_gqa'" in out, out[-3000:]
    assert "Traceback" not in out and "contract: scaled_dot_product_attention(query, key, value" in out


def test_citations_name_sections_that_exist():
    """Docstrings cite docs/CONTRACT.md by section name; every cited name is a heading there."""
    import re
    headings = set(re.findall(r"^## (.+)$", open(os.path.join(ROOT, "docs", "CONTRACT.md")).read(), re.M))
    bad = []
    for base in ("attention_oracle", "tests", "benchmarks"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, base)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                text = open(os.path.join(dirpath, f)).read()
                bad += [f"{f}: {m}" for m in re.findall(r"CONTRACT sections? \d", text)]
                cited = (" ".join(m.split()) for m in re.findall(r'docs/CONTRACT\.md,? "([^"]+)"', text))
                bad += [f"{f}: {m}" for m in cited if m not in headings]
    assert not bad, bad
