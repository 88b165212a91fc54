"""The checks, one package per area (``sdpa``, ``dsa``, ``index``): cases, checks, edge cases and
triage variations. Each area's ``__init__`` registers an :class:`~attention_oracle.judge.registry.Area`;
:mod:`attention_oracle.checks.catalogue` imports every area and looks checks up by name."""
