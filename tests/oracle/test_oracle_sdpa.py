"""The SDPA oracle's own tests: against torch's math backend in float64, gradcheck, validation."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_oracle import oracle
from attention_oracle.checks.sdpa.cases import build, sdpa_cases
from attention_oracle.oracle.sdpa import _accumulate_rows, sdpa_reference

F64 = (torch.float64,)


def _math(q, k, v, **kw):
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, **kw)


@settings(max_examples=25)
@given(case=sdpa_cases((torch.float32,)))
def test_matches_torch_math_in_float64(case):
    inp = build(case, torch.device("cpu"))
    q, k, v = (t.detach().double().requires_grad_() for t in (inp.q, inp.k, inp.v))
    mask = inp.attn_mask if inp.attn_mask is None or inp.attn_mask.dtype == torch.bool else inp.attn_mask.double()
    dout = inp.dout.double()
    ref = sdpa_reference(q.detach(), k.detach(), v.detach(), dout, attn_mask=mask, magnitudes=True,
                         **inp.kwargs)
    out = _math(q, k, v, attn_mask=mask, **inp.kwargs)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    # float64 rounding of the terms behind an element (scores near 1e4 make dk ~1e-11 where it
    # cancels to 0): the absolute tolerance scales with their magnitude
    atol = {n: max(1e-11, 1e3 * torch.finfo(torch.float64).eps * m) for n, m in ref["magnitude"].items()}
    torch.testing.assert_close(ref["out"], out.detach(), rtol=1e-10, atol=min(1e-12, atol["out"]))
    for name, g in zip(("dq", "dk", "dv"), grads):
        torch.testing.assert_close(ref[name], g, rtol=1e-9, atol=atol[name], msg=name)


@pytest.mark.parametrize("kw", [dict(), dict(is_causal=True), dict(enable_gqa=True), dict(scale=0.3)])
def test_gradcheck(kw):
    g = torch.Generator().manual_seed(1)
    hkv = 1 if kw.get("enable_gqa") else 2
    q = torch.randn(1, 2, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, hkv, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, hkv, 3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: oracle.scaled_dot_product_attention(a, b, c, **kw),
                                    (q, k, v))


def test_gradcheck_with_masked_rows():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 5, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.rand(4, 4, generator=g) < 0.6
    mask[1] = False
    assert torch.autograd.gradcheck(lambda a, b, c: oracle.scaled_dot_product_attention(a, b, c, mask), (q, k, v))


def test_fully_masked_row_convention():
    q, k, v = (torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    out, lse = oracle.scaled_dot_product_attention_with_lse(q, k, v, mask)
    assert torch.equal(out[0, 1], torch.zeros(4, dtype=torch.float64))
    assert torch.isneginf(lse[0, 1]) and torch.isfinite(lse[0, [0, 2]]).all()
    (dq,) = torch.autograd.grad(out, (q,), torch.ones_like(out))
    assert torch.equal(dq[0, 1], torch.zeros(4, dtype=torch.float64))


def test_chunking_is_exact():
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(2, 3, 17, 8, generator=g, dtype=torch.float64) for _ in range(4))
    a = sdpa_reference(q, k, v, do, is_causal=True)
    b = sdpa_reference(q, k, v, do, is_causal=True, chunk_bytes=1)
    for name in ("out", "lse", "dq", "dk", "dv"):
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-13)


def test_hand_worked_two_keys():
    """One query, two keys with scores 0 and ln 3 (scale 1): p = (1/4, 3/4)."""
    q = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    k = torch.tensor([[[0.0, 5.0], [0.0, 0.0]]], dtype=torch.float64)
    k[0, 1, 0] = torch.log(torch.tensor(3.0, dtype=torch.float64))
    v = torch.tensor([[[4.0], [8.0]]], dtype=torch.float64)
    out, lse = oracle.scaled_dot_product_attention_with_lse(q, k, v, scale=1.0)
    assert abs(out.item() - (0.25 * 4 + 0.75 * 8)) < 1e-12
    assert lse.dtype == torch.float32  # the contract: lse is float32
    assert abs(lse.item() - torch.log(torch.tensor(4.0, dtype=torch.float64)).item()) < 1e-6


def _qkv(shape_q=(1, 2, 3, 4), shape_k=(1, 2, 5, 4), shape_v=(1, 2, 5, 4), dtype=torch.float32):
    return torch.randn(shape_q).to(dtype), torch.randn(shape_k).to(dtype), torch.randn(shape_v).to(dtype)


@pytest.mark.parametrize("args,kwargs,error,word", [
    (_qkv(shape_k=(1, 2, 5, 3)), {}, ValueError, "key"),
    (_qkv(shape_v=(1, 2, 4, 4)), {}, ValueError, "value"),
    (_qkv(shape_k=(1, 3, 5, 4), shape_v=(1, 3, 5, 4)), {}, ValueError, "heads"),
    (_qkv(shape_q=(1, 3, 3, 4), shape_k=(1, 2, 5, 4), shape_v=(1, 2, 5, 4)), {"enable_gqa": True}, ValueError, "multiple"),
    ((torch.ones(1, 2, 3, 4, dtype=torch.int32),) + _qkv()[1:], {}, TypeError, "query"),
    ((torch.ones(1, 2, 3, 4, dtype=torch.complex64),) + _qkv()[1:], {}, TypeError, "query"),
    (_qkv(), {"attn_mask": torch.ones(4, 5, dtype=torch.bool)}, ValueError, "attn_mask"),
    (_qkv(), {"attn_mask": torch.ones(3, 5, dtype=torch.int64)}, TypeError, "attn_mask"),
    (_qkv(shape_q=(3, 4)), {}, ValueError, "rank"),
])
def test_validation_errors_name_the_argument(args, kwargs, error, word):
    with pytest.raises(error, match=word):
        oracle.scaled_dot_product_attention(*args, **kwargs)


# ----------------------------------------------------------------------------- lp algorithms

_ALGORITHM_CASES = [
    dict(),
    dict(is_causal=True, scale=2.0),
    dict(mask="bool"),
    dict(mask="float", scale=0.7),
    dict(enable_gqa=True, scale=-0.4),
]


def _algorithm_inputs(kw, S=150, dtype=torch.float64):
    """S > flash.TILE keys (several tiles), a fully masked row under the bool mask."""
    g = torch.Generator().manual_seed(7)
    hkv = 1 if kw.get("enable_gqa") else 2
    q = torch.randn(2, 2, 9, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, hkv, S, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, hkv, S, 8, generator=g, dtype=torch.float64)
    do = torch.randn(2, 2, 9, 8, generator=g, dtype=torch.float64)
    kw = dict(kw)
    mask = kw.pop("mask", None)
    if mask == "bool":
        kw["attn_mask"] = torch.rand(9, S, generator=g) < 0.6
        kw["attn_mask"][4] = False
    elif mask == "float":
        kw["attn_mask"] = torch.randn(9, S, generator=g, dtype=torch.float64)
    return [t.to(dtype) for t in (q, k, v, do)], kw


@pytest.mark.parametrize("algorithm", ["flash", "prescaled"])
@pytest.mark.parametrize("kw", _ALGORITHM_CASES, ids=lambda kw: ",".join(kw) or "plain")
def test_lp_algorithms_are_the_same_math_in_float64(algorithm, kw):
    (q, k, v, do), kw = _algorithm_inputs(kw)
    naive = sdpa_reference(q, k, v, do, **kw)
    other = sdpa_reference(q, k, v, do, algorithm=algorithm, **kw)
    assert torch.equal(torch.isneginf(other["lse"]), torch.isneginf(naive["lse"]))
    for name in ("out", "lse", "dq", "dk", "dv"):
        torch.testing.assert_close(other[name], naive[name], rtol=1e-11, atol=1e-12, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prescaled_with_an_exact_root_is_the_naive_math(dtype):
    """scale 4: q * 2 and k * 2 round nothing, so prescaled must equal naive bitwise (the
    wiring of the prescaling and of its chain rule, dq = sqrt(scale) dS K). Not fp16: there
    small gradients are subnormal, where x and 2x do not round alike."""
    (q, k, v, do), kw = _algorithm_inputs(dict(is_causal=True, scale=4.0), S=9, dtype=dtype)
    naive = sdpa_reference(q, k, v, do, compute_dtype=dtype, **kw)
    pre = sdpa_reference(q, k, v, do, compute_dtype=dtype, algorithm="prescaled", **kw)
    for name in ("out", "dq", "dk", "dv"):
        if dtype == torch.float32 and name in ("dk", "dv"):  # naive chains rows, prescaled blocks
            torch.testing.assert_close(pre[name], naive[name], rtol=1e-5, atol=1e-6, msg=name)
        else:
            assert torch.equal(pre[name], naive[name]), name


@pytest.mark.parametrize("group", [1, 3])
def test_row_chain_adds_the_group_heads_in_turn_row_by_row(group):
    """_accumulate_rows: one accumulator per key head, the group's query heads in turn, each
    row by row, every product rounded then added (bitwise against that loop written out)."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(2, 2 * group, 11, 7, generator=g)
    b = torch.randn(2, 2 * group, 11, 5, generator=g)
    got = _accumulate_rows(torch.zeros(2, 2, 7, 5), a, b)
    a5, b5 = a.reshape(2, 2, group, 11, 7), b.reshape(2, 2, group, 11, 5)
    acc = torch.zeros(2, 2, 7, 5)
    for h in range(group):
        for i in range(11):
            acc = acc + a5[:, :, h, i, :, None] * b5[:, :, h, i, None, :]
    assert torch.equal(got, acc)


def test_fp32_naive_dv_is_the_chained_sum_of_equal_terms():
    """F13's mechanism: one key (P = 1) and a dout equal along the rows make every dv term of a
    head the same value; the fp32 naive run's dv is the sequential sum over the group's heads
    and rows (PyTorch's CPU flash value), not the per-head sums added afterwards."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, 63, 1, generator=g)
    k, v = torch.randn(2, 1, 1, generator=g), torch.randn(2, 1, 1, generator=g)
    do = (torch.randn(4, 1, 1, generator=g) * 2).expand(4, 63, 1)
    dv = sdpa_reference(q, k, v, do, enable_gqa=True, compute_dtype=torch.float32)["dv"]
    terms = do.reshape(2, 2 * 63)
    chained = torch.zeros(2)
    for i in range(2 * 63):
        chained = chained + terms[:, i]
    per_head = do.reshape(2, 2, 63).sum(-1).sum(-1)
    assert torch.equal(dv.flatten(), chained)
    assert not torch.equal(chained, per_head)  # the order matters on these inputs


def test_prescaled_rounds_q_and_k():
    """scale 2 (F3): sqrt(2) rounds every q and k element; prescaled differs from naive."""
    (q, k, v, do), kw = _algorithm_inputs(dict(is_causal=True, scale=2.0), dtype=torch.float32)
    naive = sdpa_reference(q, k, v, compute_dtype=torch.float32, **kw)
    pre = sdpa_reference(q, k, v, compute_dtype=torch.float32, algorithm="prescaled", **kw)
    assert not torch.equal(pre["out"], naive["out"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_keeps_float32_softmax_for_16_bit(dtype):
    """flash: lse float32 (not the dtype) and a far smaller out error than the naive math,
    whose scores and P are rounded to the 16-bit dtype."""
    (q, k, v, do), kw = _algorithm_inputs(dict(), dtype=dtype)
    gold = sdpa_reference(q, k, v, **kw)
    fl = sdpa_reference(q, k, v, compute_dtype=dtype, algorithm="flash", **kw)
    nv = sdpa_reference(q, k, v, compute_dtype=dtype, **kw)
    assert fl["lse"].dtype == torch.float32 and fl["out"].dtype == dtype
    err = {n: float((r["out"].double() - gold["out"]).abs().max()) for n, r in (("f", fl), ("n", nv))}
    assert err["f"] < err["n"] / 2


def test_flash_single_key_p_comes_from_the_stored_lse():
    """One key: the exact P is 1 and dv = dout; flash recomputes P from the float32 lse with
    the scale folded into log2(e), so its dv may differ from dout by a few ulps, never more."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 64, 72, generator=g) * 3
    k, v = torch.randn(1, 4, 1, 72, generator=g) * 3, torch.randn(1, 4, 1, 8, generator=g)
    do = torch.randn(1, 4, 64, 8, generator=g)
    fl = sdpa_reference(q, k, v, do, compute_dtype=torch.float32, algorithm="flash", scale=1.2812)
    exact = do.sum(-2, keepdim=True)
    err = float((fl["dv"].double() - exact.double()).abs().max())
    assert 0 < err <= 64 * torch.finfo(torch.float32).eps * float(do.abs().sum(-2).max())


@pytest.mark.parametrize("kwargs,word", [(dict(algorithm="tiled"), "algorithm"),
                                         (dict(algorithm="flash", magnitudes=True), "magnitudes")])
def test_algorithm_arguments_are_checked(kwargs, word):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=word):
        sdpa_reference(q, k, v, **kwargs)


def test_flash_keeps_rows_of_finite_minimum_biases_right():
    """A bias of finfo.min on a whole row (Hugging Face padding) is that row's softmax: in log2
    units the row's scores overflow, so flash subtracts the max first there, and its backward
    forms P from m and log l apart where the float32 lse absorbed log l (P from that lse would
    be 1 per key: F11)."""
    q, k, v, dout = (torch.randn(1, 1, 3, 8) for _ in range(4))
    mask = torch.zeros(3, 3)
    mask[1] = torch.finfo(torch.float32).min
    mask[2, 0] = torch.finfo(torch.float32).min
    gold = sdpa_reference(q, k, v, dout, attn_mask=mask)
    fl = sdpa_reference(q, k, v, dout, attn_mask=mask, compute_dtype=torch.float32, algorithm="flash")
    for name in ("out", "lse", "dq", "dk", "dv"):
        torch.testing.assert_close(fl[name].double(), gold[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_large_score_cases_stay_finite_in_their_dtype(dtype):
    """The large-score regime (|scale q.k| up to 1e4) with one channel and a small scale: q
    alone would pass fp16's range (it overflowed to inf and the oracle's gold was NaN, found by
    fuzzing torch-math); q and k then share the factor. The peak score is the target."""
    from attention_oracle.checks.sdpa.cases import SdpaCase
    case = SdpaCase(E=1, Ev=1, L=1, S=1, dtype=dtype, scale=0.5, score_target=1e4, seed=0,
                    value_scale=0.3)
    inp = build(case, torch.device("cpu"))
    for t in (inp.q, inp.k):
        assert torch.isfinite(t).all()
    peak = float((inp.q.double() * inp.k.double()).sum().abs()) * 0.5
    assert peak == pytest.approx(1e4, rel=1e-2)  # q and k each rounded to the dtype
