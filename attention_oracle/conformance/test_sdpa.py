"""SDPA checks (docs/CONTRACT.md "2. SDPA" and "5. The agreement rule") on every selected implementation.

One test per declared check (``checks/sdpa/checks.py``, ``judge/registry.py``):
``test_<check>[impl]``. Cases are drawn within what the implementation declares
(``Target.capabilities``); a check that needs something it declares away is skipped with that
reason.
"""
from attention_oracle.conformance import declared_tests

globals().update(declared_tests("sdpa"))
