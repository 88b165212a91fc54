"""The SDPA oracle's own tests: against torch's math backend in float64, gradcheck, validation."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_oracle import oracle
from attention_oracle.oracle.sdpa import sdpa_reference
from attention_oracle.properties.sdpa.cases import build, sdpa_cases

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
    ref = sdpa_reference(q.detach(), k.detach(), v.detach(), dout, attn_mask=mask, **inp.kwargs)
    out = _math(q, k, v, attn_mask=mask, **inp.kwargs)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    torch.testing.assert_close(ref["out"], out.detach(), rtol=1e-10, atol=1e-12)
    for name, g in zip(("dq", "dk", "dv"), grads):
        torch.testing.assert_close(ref[name], g, rtol=1e-9, atol=1e-11, msg=name)


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
    (_qkv(shape_q=(2, 3, 4)), {}, ValueError, "rank"),
])
def test_validation_errors_name_the_argument(args, kwargs, error, word):
    with pytest.raises(error, match=word):
        oracle.scaled_dot_product_attention(*args, **kwargs)
