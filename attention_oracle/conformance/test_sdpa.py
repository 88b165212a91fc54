"""SDPA checks (docs/CONTRACT.md "2. SDPA" and "5. The agreement rule") on every selected implementation.

One test per declared check (``properties/sdpa/checks.py``, ``harness/registry.py``):
``test_<check>[impl]``. Cases are drawn within what the implementation declares
(``Target.capabilities``); a check that needs something it declares away is skipped with that
reason.
"""
from attention_oracle.properties.harness import registry

globals().update(registry.conformance_tests("sdpa"))
