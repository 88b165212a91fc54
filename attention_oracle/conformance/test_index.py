"""Varlen index preparation checks (docs/CONTRACT.md "4. Varlen index preparation") on every selected implementation;
``int64_indices`` is beyond the contract (a clear error naming the argument also passes)."""
import pytest

from attention_oracle.properties.harness.runner import run_property
from attention_oracle.properties.index import checks
from attention_oracle.properties.index.cases import strategy_for

FN = checks.FN


def _run(name, impl):
    run_property(checks.CHECKS[name], impl, strategy_for(name, impl), function=FN)


def test_offset_equals_oracle(impl):
    _run("offset_equals_oracle", impl)


def test_compaction_stable(impl):
    _run("compaction_stable", impl)


def test_compaction_idempotent(impl):
    _run("compaction_idempotent", impl)


def test_lengths_right(impl):
    _run("lengths_right", impl)


def test_compacted_attention(impl):
    if not impl.offers(checks.ATTN_FN):
        pytest.skip(f"{impl.name} does not offer {checks.ATTN_FN}")
    _run("compacted_attention", impl)


def test_int64_indices(impl):
    _run("int64_indices", impl)


def test_cases_round_trip():
    """Drawn index cases rebuild exactly from their JSON (replay and the regression corpus)."""
    import json

    from hypothesis import given, settings

    from attention_oracle.properties.harness.case import load_case
    from attention_oracle.properties.index.cases import index_cases

    @settings(max_examples=30, database=None)
    @given(case=index_cases())
    def round_trip(case):
        again = load_case(json.loads(case.to_json()))
        assert again == case and again.to_json() == case.to_json()
    round_trip()
