"""SDPA checks (docs/CONTRACT.md "2. SDPA" and "5. The agreement rule") on every selected implementation.

Cases are drawn within what the implementation declares (``Target.capabilities``); a check
that needs something it declares away is skipped with that reason.
"""
import pytest

from attention_oracle.properties.harness.runner import run_property
from attention_oracle.properties.sdpa import checks
from attention_oracle.properties.sdpa.cases import strategy_for, unsupported

FN = checks.FN


def _run(name, impl):
    why = unsupported(name, impl)
    if why:
        pytest.skip(f"not verified: {why} (capabilities declared by {impl.name})")
    run_property(checks.CHECKS[name], impl, strategy_for(name, impl), function=FN)


def test_forward_agreement(impl):
    _run("forward_agreement", impl)


def test_gradient_agreement(impl):
    _run("gradient_agreement", impl)


def test_strided_dout(impl):
    _run("strided_dout", impl)


def test_rank3_equals_rank4(impl):
    _run("rank3_equals_rank4", impl)


def test_fully_masked_rows(impl):
    _run("fully_masked_rows", impl)


def test_determinism(impl):
    _run("determinism", impl)


def test_misaligned_inputs(impl):
    _run("misaligned_inputs", impl)
