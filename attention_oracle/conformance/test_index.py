"""Varlen index preparation checks (docs/CONTRACT.md "4. Varlen index preparation") on every selected implementation."""
import pytest

from attention_oracle.properties.harness.runner import run_property
from attention_oracle.properties.index import checks
from attention_oracle.properties.index.cases import strategy_for

FN = checks.FN


def test_offset_equals_oracle(impl):
    run_property(checks.offset_equals_oracle, impl, strategy_for("offset_equals_oracle", impl.dtypes),
                 function=FN)


def test_compaction_stable(impl):
    run_property(checks.compaction_stable, impl, strategy_for("compaction_stable", impl.dtypes),
                 function=FN)


def test_compaction_idempotent(impl):
    run_property(checks.compaction_idempotent, impl, strategy_for("compaction_idempotent", impl.dtypes),
                 function=FN)


def test_lengths_right(impl):
    run_property(checks.lengths_right, impl, strategy_for("lengths_right", impl.dtypes), function=FN)


def test_compacted_attention(impl):
    if not impl.offers(checks.ATTN_FN):
        pytest.skip(f"{impl.name} does not offer {checks.ATTN_FN}")
    run_property(checks.compacted_attention, impl, strategy_for("compacted_attention", impl.dtypes),
                 function=FN)


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
