"""Varlen index preparation checks (docs/CONTRACT.md "4. Varlen index preparation") on every selected implementation;
``int64_indices`` is beyond the contract (a clear error naming the argument also passes).

One test per declared check (``properties/index/checks.py`` and ``edges.py``,
``harness/registry.py``): ``test_<check>[impl]``.
"""
from attention_oracle.properties.harness import registry

globals().update(registry.conformance_tests("index"))


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
