"""The conformance suite: the tests that judge an implementation, one module per area.

:func:`declared_tests` turns an area's declared checks into ``test_<check>(impl[, variant])`` tests; a
conformance module puts them in its namespace (``globals().update(declared_tests("sdpa"))``)."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from attention_oracle.checks import catalogue
from attention_oracle.judge.registry import BEYOND_MARKER, Check
from attention_oracle.run.runner import run_declared


def declared_tests(area: str) -> dict[str, Callable]:
    """``{test_<check>: test}`` for every check of ``area``. Each takes the ``impl`` fixture (and
    ``variant``, parametrized, where the area has several), carries ``oracle_check`` (the name the
    report rows and known-failure files use) and the check's markers."""
    return {f"test_{c.name}": _test_of(c) for c in catalogue.checks(area).values()}


def _test_of(spec: Check) -> Callable:
    if spec.variants == ("",):
        def test(impl):
            run_declared(spec, impl)
    else:
        def test(impl, variant):
            run_declared(spec, impl, variant)
        test = pytest.mark.parametrize("variant", spec.variants)(test)
    test.__name__ = test.__qualname__ = f"test_{spec.name}"
    summary = (spec.__doc__ or "").strip().splitlines()
    test.__doc__ = f"{spec.full_name}: {summary[0]}" if summary else spec.full_name
    test.oracle_check = spec.full_name
    for marker in spec.markers + ((BEYOND_MARKER,) if spec.beyond else ()):
        test = getattr(pytest.mark, marker)(test)
    return test
