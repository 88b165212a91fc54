"""The lp ensemble's exclusions: an algorithm without a finite result says nothing there, never
widens the bound, and its other elements still count (docs/agreement-rule.md, "1. The rule")."""
import pytest
import torch

from attention_oracle.judge.agreement import OracleMismatch, assert_agrees, measure_lp
from attention_oracle.oracle.sdpa import ALGORITHMS, sdpa_reference


def test_non_finite_lp_elements_are_left_out_and_the_rest_counts():
    gold = torch.zeros(4, dtype=torch.float64)
    finite = torch.isfinite(gold)
    lp = {"a": torch.tensor([1e-3, float("nan"), 0.0, 0.0]),
          "b": torch.full((4,), float("nan")),
          "c": torch.tensor([0.0, 2e-3, 0.0, float("inf")])}
    errs = measure_lp(lp, gold, finite)
    assert errs["a"] == pytest.approx(1e-3) and errs["c"] == pytest.approx(2e-3)
    assert errs["b"] == float("inf")


def test_an_lp_run_without_a_finite_result_never_widens_a_zero_magnitude_bound():
    """Where every term is zero (magnitude 0: v = 0, say) the floor is 0 and any error fails; an
    lp algorithm with no finite element (error inf) must not make the bound inf there."""
    from attention_oracle.judge.agreement import rule
    verdict = rule(1.0, {"naive": float("inf"), "flash": 0.0}, 0.0, magnitude=0.0,
                   dtype=torch.float32, gradient=False)
    assert verdict.ratio == float("inf") and verdict.excluded == ("naive",)
    assert rule(0.0, {"naive": float("inf")}, 0.0, magnitude=0.0, dtype=torch.float32,
                gradient=False).ratio == 0.0


def _finfo_min_row_case():
    gen = torch.Generator().manual_seed(11)
    q, k, v, dout = (torch.randn(1, 2, 6, 16, generator=gen) for _ in range(4))
    k, v = k[:, :, :5], v[:, :, :5]
    mask = torch.zeros(6, 5)
    mask[2] = torch.finfo(torch.float32).min    # a whole padded row
    return q, k, v, dout, mask


def test_reading_padded_rows_as_masked_is_still_caught():
    """The F10 behaviour (out = 0 on a row of finfo.min biases) against the whole ensemble."""
    q, k, v, dout, mask = _finfo_min_row_case()
    gold = sdpa_reference(q, k, v, attn_mask=mask, magnitudes=True)
    lp = {a: sdpa_reference(q, k, v, attn_mask=mask, algorithm=a, compute_dtype=torch.float32)["out"]
          for a in ALGORITHMS}
    wrong = gold["out"].clone()
    wrong[..., 2, :] = 0
    kw = dict(check="unit", impl="control", name="out", dtype=torch.float32, gradient=False,
              magnitude=gold["magnitude"]["out"], repro="unit")
    assert_agrees(gold["out"].to(torch.float32), gold["out"], lp, **kw)
    with pytest.raises(OracleMismatch):
        assert_agrees(wrong, gold["out"], lp, **kw)


def test_a_nan_gold_is_reproduced_by_nan_and_only_by_nan():
    """Where the oracle's value is NaN (inputs it cannot give a number for), an implementation
    returning NaN there reproduces it; a finite value there does not, nor NaN for an inf."""
    gold = torch.tensor([1.0, float("nan"), float("inf")], dtype=torch.float64)
    lp = {"naive": gold.to(torch.float32)}

    def judge(values):
        return assert_agrees(torch.tensor(values), gold, lp, check="check", impl="impl",
                             name="out", dtype=torch.float32, gradient=False, magnitude=1.0,
                             repro="replay")
    judge([1.0, float("nan"), float("inf")])
    with pytest.raises(OracleMismatch, match="non-finite gold value nan"):
        judge([1.0, 0.0, float("inf")])
    with pytest.raises(OracleMismatch, match="non-finite gold value inf"):
        judge([1.0, float("nan"), float("nan")])
