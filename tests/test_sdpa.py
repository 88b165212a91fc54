"""SDPA checks (CONTRACT sections 2 and 5) on every selected implementation."""
from properties import sdpa_checks as checks
from properties.runner import run_property
from properties.sdpa_cases import sdpa_cases

FN = checks.FN


def test_forward_agreement(impl):
    run_property(checks.forward_agreement, impl, sdpa_cases(impl.dtypes), function=FN)


def test_gradient_agreement(impl):
    run_property(checks.gradient_agreement, impl, sdpa_cases(impl.dtypes), function=FN)


def test_strided_dout(impl):
    cases = sdpa_cases(impl.dtypes, dout_layouts=("transposed", "sliced", "broadcast"))
    run_property(checks.strided_dout, impl, cases, function=FN)


def test_rank3_equals_rank4(impl):
    run_property(checks.rank3_equals_rank4, impl, sdpa_cases(impl.dtypes, rank=3), function=FN)


def test_fully_masked_rows(impl):
    run_property(checks.fully_masked_rows, impl, sdpa_cases(impl.dtypes, empty_rows=True), function=FN)


def test_determinism(impl):
    run_property(checks.determinism, impl, sdpa_cases(impl.dtypes), function=FN)
