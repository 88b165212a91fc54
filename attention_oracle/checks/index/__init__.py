"""Varlen index preparation (offset_gather_kv_indices): cases, checks, edge cases and triage variations.

The area's modules: ``cases`` (strategies, Case building; registers the area), ``checks``
(inside the contract), ``edges`` (beyond it), ``triage`` (how a failing case is varied).
``checks.catalogue`` imports them all."""
