"""DSA sparse attention checks (docs/CONTRACT.md "3. DSA sparse attention" and "5. The agreement rule") on every selected implementation.

One test per declared check (``properties/dsa/checks.py`` and ``edges.py``,
``harness/registry.py``): ``test_<check>[impl-variant]``, each on NoPE and RoPE cases
(``variant``); the varlen checks on the ``_varlen`` forms. A target lacking the function is
skipped by ``run_property``. Fixed edge cases (T = 0, K = 1, every slot a hole, every row cut
to length 0) run as plain examples.
"""
import dataclasses

import pytest

from attention_oracle.properties.dsa import checks
from attention_oracle.properties.dsa.cases import VARIANTS, DsaCase
from attention_oracle.properties.harness import registry
from attention_oracle.properties.harness.case import dtype_name
from attention_oracle.properties.harness.runner import run_check

globals().update(registry.conformance_tests("dsa"))


def _edge_cases(dtype: str):
    base = dict(H=2, Dl=8, Dr=4, dtype=dtype, scale=0.3, seed=7)
    return {
        "T0": DsaCase(T=0, S=5, K=4, **base),
        "K1": DsaCase(T=6, S=9, K=1, **base),
        "all_holes": DsaCase(T=5, S=9, K=6, holes="random", density=1.0, invalid="mixed", **base),
        "topk_all_zero": DsaCase(T=5, S=9, K=6, topk="zeros", empty_rows=5, **base),
        "varlen_empty_docs": DsaCase(docs=((0, 0), (3, 7), (0, 4), (0, 0), (2, 2)), K=5,
                                     causal=True, holes="head", density=0.758, **base),
        "varlen_all_docs_empty": DsaCase(docs=((0, 0), (0, 0)), K=3, causal=True, **base),
    }


@pytest.mark.parametrize("edge", sorted(_edge_cases("float32")))
@pytest.mark.parametrize("variant", VARIANTS)
def test_edge_cases(impl, variant, edge):
    case = dataclasses.replace(_edge_cases(dtype_name(impl.dtypes[0]))[edge], **VARIANTS[variant])
    if not impl.offers(case.function):
        pytest.skip(f"{impl.name} does not offer {case.function}")
    ran = 0
    for check in (checks.forward_agreement, checks.gradient_agreement, checks.empty_rows):
        ran += run_check(check, impl, case)
    if ran == 0:
        pytest.skip(f"unsupported: {impl.name} refused the {edge} case")


def test_cases_round_trip():
    """Drawn DSA cases rebuild exactly from their JSON (replay and the regression corpus)."""
    import json

    import torch
    from hypothesis import given, settings

    from attention_oracle.properties.dsa.cases import dsa_cases
    from attention_oracle.properties.harness.case import load_case

    @settings(max_examples=30, database=None)
    @given(case=dsa_cases((torch.float32, torch.float16), rope=True, varlen=True, poison=True)
           | dsa_cases((torch.float32,), rope=False, empty_rows=True, duplicates=True))
    def round_trip(case):
        again = load_case(json.loads(case.to_json()))
        assert again == case and again.to_json() == case.to_json()
    round_trip()
