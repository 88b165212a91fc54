"""The agreement rule's absolute floor and its accumulation term (docs/agreement-rule.md, "4. The floor").

Where one key is visible, dq and dk are 0 by cancellation (P = 1, dS = dP - Delta = 0) and a
correct kernel returns the difference of two length-Ev dot products summed in its own orders.
The accumulation term FLOOR_ACC eps(float32) magnitude_acc admits that noise for any summation
order; it must not admit a real error (10 floors), and it must not loosen 16-bit checks.
"""
import math

import pytest
import torch

from attention_oracle.judge.agreement import (
    FLOOR_ACC,
    FLOOR_ULPS,
    OracleMismatch,
    assert_agrees,
    eps,
    floor_of,
)
from attention_oracle.oracle.dsa import dsa_reference
from attention_oracle.oracle.sdpa import ALGORITHMS, sdpa_reference


def single_key_problem(E, positive, seed=0, dtype=torch.float32):
    """q [1, 2, 6, E], k and v [1, 2, 1, E], dout [1, 2, 6, E]: P = 1, exact dq = 0."""
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(*shape, generator=gen, dtype=torch.float64)
          for shape in ((1, 2, 6, E), (1, 2, 1, E), (1, 2, 1, E), (1, 2, 6, E))]
    if positive:
        xs = [x.abs() for x in xs]
    return [x.to(dtype) for x in xs]


def reordered_dq(q, k, v, dout, scale):
    """A correct fp32 single-key backward whose dP is a sequential float32 dot and Delta a
    pairwise sum over the rounded output (out = v: P = 1): the F7 mechanism."""
    out = v.expand_as(dout)
    dp = torch.cumsum(dout * v, dim=-1, dtype=torch.float32)[..., -1:]
    delta = (dout * out).sum(-1, keepdim=True)
    return (dp - delta) * k * scale


def lp_dq(q, k, v, dout, scale):
    return {a: sdpa_reference(q, k, v, dout, scale=scale, algorithm=a, compute_dtype=torch.float32)["dq"]
            for a in ALGORITHMS}


@pytest.mark.parametrize("E", [64, 256, 512])
def test_positive_inputs_give_sqrt_length_times_the_magnitude(E):
    """With every input positive |dP| = sum|dO V| and |Delta| = sum|dO out|: magnitude_acc is
    sqrt(Ev) times the floor's magnitude, for dq and dk alike."""
    q, k, v, dout = single_key_problem(E, positive=True, dtype=torch.float64)
    gold = sdpa_reference(q, k, v, dout, scale=0.1, magnitudes=True)
    for name in ("dq", "dk"):
        assert gold["magnitude_acc"][name] == pytest.approx(math.sqrt(E) * gold["magnitude"][name], rel=1e-12)


@pytest.mark.parametrize("E", [64, 256, 512])
@pytest.mark.parametrize("positive", [False, True])
def test_a_reordered_correct_backward_passes_within_half_the_floor(E, positive):
    """The other summation order of a correct kernel stays within half the floor."""
    worst = 0.0
    for seed in range(8):
        q, k, v, dout = single_key_problem(E, positive, seed)
        scale = 1 / math.sqrt(E)
        gold = sdpa_reference(q, k, v, dout, scale=scale, magnitudes=True, compute_dtype=torch.float64)
        verdict = assert_agrees(reordered_dq(q, k, v, dout, scale), gold["dq"], lp_dq(q, k, v, dout, scale),
                                check="unit", impl="reordered", name="dq", dtype=torch.float32,
                                gradient=True, magnitude=gold["magnitude"]["dq"], repro="unit",
                                acc_magnitude=gold["magnitude_acc"]["dq"])
        worst = max(worst, verdict.ratio)
    assert worst <= 0.5, worst


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ten_floors_caught_half_a_floor_admitted_where_dq_cancels(dtype):
    q, k, v, dout = single_key_problem(128, positive=False, seed=3, dtype=dtype)
    gold = sdpa_reference(q, k, v, dout, magnitudes=True)
    lp = sdpa_reference(q, k, v, dout)["dq"]
    mag, acc = gold["magnitude"]["dq"], gold["magnitude_acc"]["dq"]
    floor = floor_of(dtype, mag, acc)
    kw = dict(check="unit", impl="control", name="dq", dtype=dtype, gradient=True, magnitude=mag,
              repro="unit", acc_magnitude=acc)
    assert_agrees(gold["dq"] + 0.5 * floor, gold["dq"], lp, **kw)
    with pytest.raises(OracleMismatch, match="magnitude_acc"):
        assert_agrees(gold["dq"] + 10 * floor, gold["dq"], lp, **kw)


def test_the_accumulation_term_is_in_float32_units_for_16_bit_inputs():
    """In bf16 the accumulation term (fp32 eps) is a few thousandths of the dtype's term: the
    16-bit floor stays what it was."""
    q, k, v, dout = single_key_problem(128, positive=False, seed=4, dtype=torch.bfloat16)
    gold = sdpa_reference(q, k, v, dout, magnitudes=True)
    mag, acc = gold["magnitude"]["dq"], gold["magnitude_acc"]["dq"]
    term = FLOOR_ACC * eps(torch.float32) * acc
    assert term < 0.01 * FLOOR_ULPS * eps(torch.bfloat16) * mag


def test_dsa_accumulation_rows_sum_over_query_chunks():
    """A chunked caller (the fixtures' RunningRule) sums key-gradient terms over chunks: the
    per-chunk magnitude_acc_rows add up to the whole call's maxima."""
    gen = torch.Generator().manual_seed(5)
    T, H, S, Dl, Dr, K = 6, 2, 9, 16, 8, 4
    ql, qr = torch.randn(T, H, Dl, generator=gen), torch.randn(T, H, Dr, generator=gen)
    kv, kr = torch.randn(S, Dl, generator=gen), torch.randn(S, Dr, generator=gen)
    idx = torch.randint(-1, S, (T, K), generator=gen, dtype=torch.int32)
    dout = torch.randn(T, H, Dl, generator=gen)
    whole = dsa_reference(ql, qr, kv, kr, idx, dout, softmax_scale=0.2)
    parts = [dsa_reference(ql[a:b], qr[a:b], kv, kr, idx[a:b], dout[a:b], softmax_scale=0.2)
             for a, b in ((0, 2), (2, 6))]
    for name in ("dkv_latent", "dk_rope"):
        summed = sum(p["magnitude_acc_rows"][name] for p in parts)
        assert float(summed.max()) == pytest.approx(whole["magnitude_acc"][name], rel=1e-12)
    assert whole["magnitude_acc"]["dq_latent"] == pytest.approx(
        max(p["magnitude_acc"]["dq_latent"] for p in parts), rel=1e-12)
