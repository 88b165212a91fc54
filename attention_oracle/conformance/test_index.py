"""Varlen index preparation checks (docs/CONTRACT.md "4. Varlen index preparation") on every selected implementation;
``int64_indices`` is beyond the contract (a clear error naming the argument also passes).

One test per declared check (``checks/index/checks.py`` and ``edges.py``,
``judge/registry.py``): ``test_<check>[impl]``.
"""
from attention_oracle.conformance import declared_tests

globals().update(declared_tests("index"))
