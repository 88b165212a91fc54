"""DSA sparse attention checks (docs/CONTRACT.md "3. DSA sparse attention" and "5. The agreement rule") on every selected implementation.

One test per declared check (``checks/dsa/checks.py`` and ``edges.py``,
``judge/registry.py``): ``test_<check>[impl-variant]``, each on NoPE and RoPE cases
(``variant``); the varlen checks on the ``_varlen`` forms. A target lacking the function is
skipped by ``run_property``. Fixed edge cases (T = 0, K = 1, every slot a hole, every row cut
to length 0) run as plain examples.
"""
import dataclasses

import pytest

from attention_oracle.checks.dsa import checks
from attention_oracle.checks.dsa.cases import VARIANTS, DsaCase
from attention_oracle.conformance import declared_tests
from attention_oracle.judge.case import dtype_name
from attention_oracle.run.runner import run_check

globals().update(declared_tests("dsa"))


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
