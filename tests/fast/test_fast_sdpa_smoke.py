"""Quick correctness checks of the Triton SDPA (fast/sdpa.py) against a float64 reference.

On CPU the kernels run under Triton's interpreter (fp32/fp16, small shapes); with a CUDA device
they run natively and bf16 is added. gold is this file's own float64 naive math; every check
goes through the suite's agreement rule (``agreement.assert_agrees``, docs/agreement-rule.md):
    max|impl - gold| <= max(k * max_a max|lp_a - gold| + 2 * max|gold.to(dtype) - gold|, floor)
(k = 2 outputs, 3 gradients); the lp runs are this file's naive math in the input dtype
(autograd) and the oracle's standard algorithms (naive, flash, prescaled), and the floor is
4 eps(dtype) times the oracle's magnitude of the terms behind an element;
``test_floor_still_catches_real_error`` is its negative control here.
"""
import contextlib
import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from attention_oracle.fast.kernels.sdpa_common import causal_program  # noqa: E402
from attention_oracle.fast.sdpa import scaled_dot_product_attention, scaled_dot_product_attention_with_lse  # noqa: E402
from attention_oracle.judge import record
from attention_oracle.judge.agreement import FLOOR_ULPS, assert_agrees  # noqa: E402
from attention_oracle.oracle.sdpa import ALGORITHMS, sdpa_reference  # noqa: E402
from tests.fast.tf32x3_emulation import emulated_tf32x3  # noqa: E402

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
TMA = ON_GPU and torch.cuda.get_device_capability()[0] >= 9  # Hopper's tensor memory accelerator


# ----------------------------------------------------------------------------- reference

def naive_attention(q, k, v, mask=None, is_causal=False, scale=None, enable_gqa=False):
    """QK^T -> masked softmax -> PV in the inputs' dtype; rows with no key give 0."""
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    if enable_gqa:
        rep = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(rep, dim=-3)
        v = v.repeat_interleave(rep, dim=-3)
    s = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.to(s.dtype)
    if S == 0:
        return s.new_zeros(s.shape[:-1] + (v.shape[-1],)) + 0 * v.sum() + 0 * q.sum()
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m).detach()
    e = torch.exp(s - m)
    den = e.sum(-1, keepdim=True)
    p = e / torch.where(den == 0, torch.ones_like(den), den)
    return p @ v


def reference_lse(q, k, mask=None, is_causal=False, scale=None, enable_gqa=False):
    q, k = q.double(), k.double()
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    if enable_gqa:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    s = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    return torch.logsumexp(s, -1).float()


def agreement(name, impl, gold, lp, k, magnitude, dtype=None):
    """The suite's agreement rule (module docstring): ``lp`` one tensor or {algorithm: tensor},
    ``magnitude`` the floor's sum of absolute terms; ``dtype`` the inputs' (default impl's)."""
    assert_agrees(impl, gold, lp, check="smoke.fast_sdpa", impl="fast", name=name,
                  dtype=dtype or impl.dtype, gradient=k == 3, magnitude=magnitude,
                  repro="pytest tests/test_fast_sdpa_smoke.py")


def oracle_terms(q, k, v, mask, is_causal, scale, enable_gqa, dout):
    """The oracle's lp runs (its standard algorithms in the inputs' dtype) and its float64 gold
    with magnitudes, on the inputs broadcast to one batch shape; gradients summed back onto
    broadcast leaves."""
    keep = 3 if enable_gqa else 2  # without GQA the head dim broadcasts too
    batch = torch.broadcast_shapes(q.shape[:-keep], k.shape[:-keep], v.shape[:-keep])
    xs = [t.detach().expand(batch + t.shape[-keep:]) for t in (q, k, v)]
    do = None if dout is None else dout.expand(batch + dout.shape[-keep:])
    kw = dict(attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    gold = sdpa_reference(*xs, do, magnitudes=True, **kw)
    runs = {a: sdpa_reference(*xs, do, compute_dtype=q.dtype, algorithm=a, **kw) for a in ALGORITHMS}
    copies = {"dq": q, "dk": k, "dv": v}
    for name, leaf in copies.items():
        if name in gold:
            n = gold[name].numel() // max(leaf.numel(), 1)
            gold["magnitude"][name] *= n
            for r in [gold, *runs.values()]:
                r[name] = r[name].sum_to_size(leaf.shape)
    return gold, runs


def check_case(q, k, v, mask=None, is_causal=False, scale=None, enable_gqa=False, dout=None,
               backward=True):
    """Run impl, lp and gold on the same inputs and check outputs, gradients and lse."""
    leaves = [t.detach().requires_grad_(backward) for t in (q, k, v)]
    out, lse = scaled_dot_product_attention_with_lse(*leaves, attn_mask=mask, is_causal=is_causal,
                                                     scale=scale, enable_gqa=enable_gqa)
    gold_in = [t.detach().double().requires_grad_(backward) for t in (q, k, v)]
    gmask = mask.double() if mask is not None and mask.dtype != torch.bool else mask
    gold = naive_attention(*gold_in, gmask, is_causal, scale, enable_gqa)
    lp_in = [t.detach().clone().requires_grad_(backward) for t in (q, k, v)]
    lp_mask = mask.to(q.dtype) if mask is not None and mask.dtype != torch.bool else mask
    lp = naive_attention(*lp_in, lp_mask, is_causal, scale, enable_gqa)
    assert out.shape == gold.shape and out.dtype == q.dtype
    if backward and dout is None:
        dout = torch.randn(out.shape, dtype=q.dtype, device=q.device)
    terms = oracle_terms(q, k, v, mask, is_causal, scale, enable_gqa, dout if backward else None)
    runs = terms[1]

    def lp_of(name, own=None):
        return {**({"naive-autograd": own} if own is not None else {}),
                **{a: r[name].reshape(gold.shape if name == "out" else r[name].shape)
                   for a, r in runs.items()}}

    def magnitude(name):
        return terms[0]["magnitude"][name]

    agreement("out", out, gold, lp_of("out", lp), 2, magnitude("out"))
    ref_lse = reference_lse(q, k, mask, is_causal, scale, enable_gqa)
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), empty), "lse: -inf rows differ"
    if (~empty).any():
        gold_lse = terms[0]["lse"].reshape(lse.shape)
        agreement("lse", lse, gold_lse, {a: t.reshape(lse.shape) for a, t in lp_of("lse").items()}, 2,
                  magnitude("lse"), dtype=q.dtype)
    if not backward:
        return out
    before = dout.clone()
    grads = torch.autograd.grad(out, leaves, dout)
    assert torch.equal(dout, before), "dout was modified"
    ggrads = torch.autograd.grad(gold, gold_in, dout.double())
    lgrads = torch.autograd.grad(lp, lp_in, dout)
    for name, g, gg, lg in zip(("dq", "dk", "dv"), grads, ggrads, lgrads):
        assert g.shape == gg.shape and g.dtype == q.dtype
        agreement(name, g, gg, lp_of(name, lg), 3, magnitude(name))
    return out, grads


def scale_of(q, k, scale):
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else abs(scale)
    return s * q.abs().max().item() * k.abs().max().item()


def randn(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(DEVICE, dtype)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


# ----------------------------------------------------------------------------- cases

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("L,S", [(64, 64), (37, 53), (70, 20)])
def test_rank4_basic(dtype, is_causal, L, S, gen):
    q = randn(2, 2, L, 40, dtype=dtype, gen=gen)
    k = randn(2, 2, S, 40, dtype=dtype, gen=gen)
    v = randn(2, 2, S, 24, dtype=dtype, gen=gen)
    check_case(q, k, v, is_causal=is_causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_rank3_and_rank5(dtype, gen):
    q, k, v = (randn(3, 33, 16, dtype=dtype, gen=gen) for _ in range(3))
    check_case(q, k, v, is_causal=True)
    q5 = randn(2, 1, 2, 20, 16, dtype=dtype, gen=gen)
    k5 = randn(2, 3, 2, 24, 16, dtype=dtype, gen=gen)  # q broadcasts over dim 1
    v5 = randn(1, 3, 2, 24, 32, dtype=dtype, gen=gen)  # v broadcasts over dim 0
    check_case(q5, k5, v5)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("E,Ev", [(72, 72), (200, 40), (8, 130)])
def test_head_dims(dtype, E, Ev, gen):
    q = randn(1, 2, 24, E, dtype=dtype, gen=gen)
    k = randn(1, 2, 40, E, dtype=dtype, gen=gen)
    v = randn(1, 2, 40, Ev, dtype=dtype, gen=gen)
    check_case(q, k, v, is_causal=True, scale=0.3)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("is_causal", [False, True])
def test_gqa(dtype, is_causal, gen):
    q = randn(2, 6, 40, 32, dtype=dtype, gen=gen)
    k = randn(2, 2, 48, 32, dtype=dtype, gen=gen)
    v = randn(2, 2, 48, 32, dtype=dtype, gen=gen)
    check_case(q, k, v, is_causal=is_causal, enable_gqa=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_bool_masks_with_empty_rows(dtype, gen):
    L, S = 40, 36
    q, k, v = randn(2, 2, L, 32, dtype=dtype, gen=gen), randn(2, 2, S, 32, dtype=dtype, gen=gen), \
        randn(2, 2, S, 32, dtype=dtype, gen=gen)
    g = torch.Generator().manual_seed(7)
    mask2d = (torch.rand(L, S, generator=g) > 0.5).to(DEVICE)
    mask2d[3] = False  # fully masked rows: out = 0, zero gradients, lse = -inf
    mask2d[17] = False
    out, grads = check_case(q, k, v, mask=mask2d)
    assert torch.all(out[..., [3, 17], :] == 0)
    assert torch.all(grads[0][..., [3, 17], :] == 0)
    full = (torch.rand(2, 2, L, S, generator=g) > 0.3).to(DEVICE)
    full[1, 0, 5] = False
    check_case(q, k, v, mask=full)
    keypad = torch.ones(2, 1, 1, S, dtype=torch.bool, device=DEVICE)
    keypad[0, ..., 30:] = False
    check_case(q, k, v, mask=keypad)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_additive_masks(dtype, gen):
    L, S = 33, 45
    q, k, v = randn(2, 3, L, 16, dtype=dtype, gen=gen), randn(2, 3, S, 16, dtype=dtype, gen=gen), \
        randn(2, 3, S, 16, dtype=dtype, gen=gen)
    g = torch.Generator().manual_seed(8)
    add = torch.randn(2, 3, L, S, generator=g).to(DEVICE, dtype)
    add[0, 1, 4] = float("-inf")  # an empty row through an additive mask
    add[1, 2, :, 7:20] = float("-inf")
    check_case(q, k, v, mask=add)
    check_case(q, k, v, mask=torch.randn(L, S, generator=g).to(DEVICE, dtype))
    check_case(q, k, v, mask=torch.randn(3, 1, S, generator=g).to(DEVICE, dtype), scale=0.5)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_strided_inputs_and_douts(dtype, gen):
    B, H, L, S, E = 2, 3, 36, 40, 32
    # head-major q (a [B, L, H, E] buffer), k sliced from a wider buffer, v with non-unit last stride
    q = randn(B, L, H, E, dtype=dtype, gen=gen).transpose(1, 2)
    k = randn(B, H, S, 2 * E, dtype=dtype, gen=gen)[..., 5:5 + E]
    v = randn(B, H, E, S, dtype=dtype, gen=gen).transpose(-1, -2)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    dout_c = randn(B, H, L, E, dtype=dtype, gen=gen)
    _, g_c = check_case(q, k, v, is_causal=True, dout=dout_c)
    dout_hm = dout_c.transpose(1, 2).contiguous().transpose(1, 2)  # head-major, same values
    _, g_hm = check_case(q, k, v, is_causal=True, dout=dout_hm)
    for a, b in zip(g_c, g_hm):
        assert torch.equal(a, b), "head-major dout changed the gradients"
    dout_b = randn(1, 1, 1, E, dtype=dtype, gen=gen).expand(B, H, L, E)  # stride-0 dout
    check_case(q, k, v, dout=dout_b)


def test_edge_lengths(gen):
    for L, S in [(1, 1), (1, 17), (17, 1), (0, 5), (5, 0)]:
        q, k, v = randn(1, 2, L, 16, dtype=torch.float32, gen=gen), \
            randn(1, 2, S, 16, dtype=torch.float32, gen=gen), randn(1, 2, S, 16, dtype=torch.float32, gen=gen)
        for causal in (False, True):
            out = check_case(q, k, v, is_causal=causal, backward=False)
            if S == 0:
                assert out.shape == (1, 2, L, 16) and torch.all(out == 0)


def test_matches_torch_sdpa_float64(gen):
    """Our float64 reference is PyTorch's SDPA where no row is empty."""
    q, k, v = (randn(2, 2, 20, 16, dtype=torch.float32, gen=gen).double() for _ in range(3))
    for causal in (False, True):
        a = naive_attention(q, k, v, is_causal=causal)
        b = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        assert (a - b).abs().max().item() < 1e-12


def test_floor_still_catches_real_error(gen):
    """Negative control: an error of 10 floors in a result that cancels to zero fails, half a
    floor passes."""
    gold = torch.zeros(4, 4, dtype=torch.float64)
    lp = gold.clone().float()
    mag = 3.0
    bad = torch.zeros(4, 4, dtype=torch.float32)
    bad[1, 2] = 10 * FLOOR_ULPS * torch.finfo(torch.float32).eps * mag
    with record.silenced(), pytest.raises(AssertionError):
        agreement("neg", bad, gold, lp, 3, mag)
    agreement("pos", bad / 20, gold, lp, 3, mag)


def test_torch_compile_traces():
    q, k, v = (torch.randn(1, 2, 16, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    fn = torch.compile(lambda a, b, c: scaled_dot_product_attention(a, b, c, is_causal=True),
                       backend="aot_eager", fullgraph=True)
    out = fn(q, k, v)
    ref = scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(out, ref)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_rejections(gen):
    q = randn(1, 2, 8, 16, dtype=torch.float32, gen=gen)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(TypeError, match="dtype"):
        scaled_dot_product_attention(q, q.half(), q)
    with pytest.raises(NotImplementedError, match="dtype"):
        scaled_dot_product_attention(q.double(), q.double(), q.double())
    with pytest.raises(ValueError, match="attn_mask"):
        scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool,
                                                                   device=DEVICE), is_causal=True)
    with pytest.raises(ValueError, match="attn_mask"):
        scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 8, dtype=torch.bool, device=DEVICE))
    with pytest.raises(TypeError, match="attn_mask"):
        scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="enable_gqa"):
        scaled_dot_product_attention(q, randn(1, 3, 8, 16, dtype=torch.float32, gen=gen), q)
    with pytest.raises(ValueError, match="multiple"):
        scaled_dot_product_attention(randn(1, 3, 8, 16, dtype=torch.float32, gen=gen), q, q,
                                     enable_gqa=True)
    with pytest.raises(NotImplementedError, match="head dim"):
        big = randn(1, 1, 4, 264, dtype=torch.float32, gen=gen)
        scaled_dot_product_attention(big, big, big)
    with pytest.raises(TypeError, match="query"):
        scaled_dot_product_attention(q.tolist(), q, q)
    with pytest.raises(ValueError, match="rank"):
        scaled_dot_product_attention(q[0, 0], q[0, 0], q[0, 0])


def test_head_broadcast_and_rank6(gen):
    q = randn(2, 1, 12, 16, dtype=torch.float32, gen=gen)  # one query head against two kv heads
    k, v = randn(2, 2, 10, 16, dtype=torch.float32, gen=gen), randn(2, 2, 10, 16, dtype=torch.float32, gen=gen)
    out, _ = check_case(q, k, v)
    assert out.shape == (2, 2, 12, 16)
    q6, k6, v6 = (randn(2, 1, 2, 2, 9, 16, dtype=torch.float32, gen=gen) for _ in range(3))
    check_case(q6, k6, v6, is_causal=True)


@pytest.mark.parametrize("planned", [False, True], ids=["masked", "cached_plan"])
def test_rank6_dout_whose_batch_dims_do_not_merge(planned, gen):
    """A rank-6 dout whose leading batch dims cannot be merged without a copy (what autograd
    passes when the output is permuted downstream): copied, not refused, through the masked
    path and the cached unmasked plan; the gradients equal those for dout.contiguous()."""
    q, k, v = (randn(2, 2, 2, 3, 8, 16, dtype=torch.float32, gen=gen).requires_grad_()
               for _ in range(3))
    mask = None if planned else torch.ones(8, 8, dtype=torch.bool, device=q.device).tril()
    dout = randn(2, 2, 2, 3, 8, 16, dtype=torch.float32, gen=gen)
    dout = dout.permute(2, 1, 0, 3, 4, 5).contiguous().permute(2, 1, 0, 3, 4, 5)
    with pytest.raises(RuntimeError):
        dout.view(-1, 3, 8, 16)
    got = torch.autograd.grad(scaled_dot_product_attention(q, k, v, attn_mask=mask), (q, k, v), dout)
    want = torch.autograd.grad(scaled_dot_product_attention(q, k, v, attn_mask=mask), (q, k, v),
                               dout.contiguous())
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.fixture
def grid_dim_of(monkeypatch):
    """Sets the batch x head rows one launch takes (CUDA's 65535 made small enough for the
    interpreter), with an empty plan cache so no plan made under the real limit serves a call;
    returns the calls the split path made, counted by the public function."""
    from attention_oracle.fast import sdpa
    calls = []
    real = sdpa._in_batch_chunks

    def counted(*args):
        calls.append(args[1].args[1])
        return real(*args)

    def set_limit(rows):
        monkeypatch.setattr(sdpa, "_MAX_GRID_Y", rows)
        monkeypatch.setattr(sdpa, "_CALL_PLANS", {})
        monkeypatch.setattr(sdpa, "_in_batch_chunks", counted)
        return calls
    return set_limit


@pytest.mark.parametrize("case", ["rank4", "rank5_inner_split", "gqa_masked_broadcast_key"])
def test_more_batch_heads_than_a_grid_dim_split_along_the_batch(case, grid_dim_of, gen):
    """The kernels put batch x heads on the grid's second dim, which CUDA caps at 65535 (F37):
    a call with more is split along its batch dims (each chunk within the cap; an outer dim
    split one index at a time when an inner dim alone is past it), and out, lse and every
    gradient still agree with the float64 gold: masks, broadcast keys and GQA included."""
    f32 = dict(dtype=torch.float32, gen=gen)
    mask, gqa = None, False
    if case == "rank4":  # 5 x 3 rows, 4 a launch: chunks of one batch index
        limit, q, k, v = 4, randn(5, 3, 9, 16, **f32), randn(5, 3, 7, 16, **f32), randn(5, 3, 7, 8, **f32)
    elif case == "rank5_inner_split":  # 3 x 4 x 2 rows, 5 a launch: dim 0 one by one, dim 1 by 2
        limit = 5
        q, k, v = randn(3, 4, 2, 6, 16, **f32), randn(3, 4, 2, 6, 16, **f32), randn(3, 4, 2, 6, 16, **f32)
    else:  # 6 x 4 query heads on 2 kv heads; key/value broadcast over the batch; masks of both kinds
        limit, gqa = 9, True
        q = randn(6, 4, 8, 16, **f32)
        k, v = randn(1, 2, 11, 16, **f32), randn(1, 2, 11, 16, **f32)
        mask = torch.rand(6, 1, 8, 11, generator=gen).to(DEVICE) > 0.3
    calls = grid_dim_of(limit)
    if mask is None:
        for is_causal in (False, True):
            check_case(q, k, v, is_causal=is_causal)
    else:
        check_case(q, k, v, mask=mask, enable_gqa=gqa)
        check_case(q, k, v, mask=torch.randn(1, 4, 8, 11, generator=gen).to(DEVICE), enable_gqa=gqa)
        check_case(q, k, v, is_causal=True, enable_gqa=gqa)
    assert calls, "the split path never ran"


def test_split_call_traces_under_compile(grid_dim_of, gen):
    """torch.compile (fullgraph) traces a call that is split along its batch: the same out as
    the eager split, and gradients."""
    grid_dim_of(4)
    q, k, v = (randn(3, 2, 16, 16, dtype=torch.float32, gen=gen).requires_grad_() for _ in range(3))
    fn = torch.compile(lambda a, b, c: scaled_dot_product_attention(a, b, c, is_causal=True),
                       backend="aot_eager", fullgraph=True)
    out = fn(q, k, v)
    assert torch.equal(out, scaled_dot_product_attention(q, k, v, is_causal=True))
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_heads_alone_past_a_grid_dim_are_refused(grid_dim_of, gen):
    """Query heads alone past the cap leave no batch dim to split: refused by name
    (NotImplementedError), on every device, not left to fail at launch."""
    grid_dim_of(4)
    q = randn(2, 5, 3, 16, dtype=torch.float32, gen=gen)
    for mask in (None, torch.ones(3, 3, dtype=torch.bool, device=DEVICE)):
        with pytest.raises(NotImplementedError, match="query: 5 batch x head rows exceed"):
            scaled_dot_product_attention(q[:1], q[:1], q[:1], attn_mask=mask)
    from attention_oracle.fast.sdpa import _check_row_span
    _check_row_span(2, 2, 16, 16, (2, 2), 1)  # 4: taken


@pytest.mark.skipif(not ON_GPU, reason="CUDA's own grid cap; the interpreter has none")
def test_past_the_cuda_grid_dim_on_the_gpu(gen):
    """4100 sequences x 16 heads (65600 rows, past CUDA's 65535) launch on CUDA itself, and
    every row equals the same row from a call within the cap (rows are independent)."""
    q, k, v = (randn(4100, 16, 4, 64, dtype=torch.bfloat16, gen=gen).requires_grad_()
               for _ in range(3))
    out = scaled_dot_product_attention(q, k, v, is_causal=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for part in (slice(0, 1000), slice(3100, 4100)):
        some = [t[part].detach().requires_grad_() for t in (q, k, v)]
        want = scaled_dot_product_attention(*some, is_causal=True)
        assert torch.equal(out[part], want), "out"
        for name, g, w in zip("qkv", grads, torch.autograd.grad(want, some, dout[part])):
            assert torch.equal(g[part], w), f"d{name}"


def test_refuses_int32_overflowing_head_span():
    from attention_oracle.fast.sdpa import _check_tile_offsets
    huge = torch.empty_strided((1, 1, 2, 16), (0, 0, 2**31, 1), device="meta")  # never allocated
    with pytest.raises(NotImplementedError, match="int32"):
        _check_tile_offsets([("key", huge)])
    _check_tile_offsets([("key", torch.empty_strided((1, 1, 2, 16), (0, 0, 2**30, 1), device="meta"))])


# ----------------------------------------------------------------------------- fp32 scores (F5)

def rounded_exact_score(q_row, k_row, scale):
    """fl32(exact q.k * fl32(scale)): what one rounding of the exact score gives."""
    scale32 = float(torch.tensor(scale, dtype=torch.float32))
    return ((q_row.double() * k_row.double()).sum(-1) * scale32).float()


def assert_bitwise(name, got, expected):
    differ = got != expected
    assert not differ.any(), (
        f"{name}: {int(differ.sum())} element(s) differ from fl32(exact score), first at "
        f"{differ.nonzero()[0].tolist()}: {got[differ][0].item()!r} vs {expected[differ][0].item()!r}")


@pytest.fixture
def accurate_fp32():
    """fp32 calls in fast's "accurate" mode for the test (the default is "tf32x3")."""
    import attention_oracle.fast.sdpa as fast_sdpa
    previous = fast_sdpa.set_fp32_mode("accurate")
    try:
        yield
    finally:
        fast_sdpa.set_fp32_mode(previous)


@pytest.mark.usefixtures("accurate_fp32")
@pytest.mark.parametrize("E,scale", [(256, None), (72, 2.0), (8, 0.5), (200, 0.125)])
def test_fp32_single_key_lse_is_the_rounded_exact_score(E, scale, gen):
    """F5 (docs/FINDINGS.md): under is_causal, row 0 sees key 0 only, so lse = its score. fp32 in
    "accurate" mode forms the score from an fp64-accumulated dot with one rounding, so lse equals
    fl32(exact score) bitwise (E 256 and 200 exceed tf32x3's head dims and run "accurate" in any
    mode). The log2-unit kernel with fp32 dots was 14 ulps off at E = 256 (the F5 case) and
    fails this test (checked against the pre-fix tree)."""
    q = randn(2, 3, 4, E, dtype=torch.float32, gen=gen) * 3
    k = randn(2, 3, 4, E, dtype=torch.float32, gen=gen)
    v = randn(2, 3, 4, 16, dtype=torch.float32, gen=gen)
    out, lse = scaled_dot_product_attention_with_lse(q, k, v, is_causal=True, scale=scale)
    sc = 1.0 / math.sqrt(E) if scale is None else scale
    assert_bitwise("lse[row 0]", lse[..., 0], rounded_exact_score(q[..., 0, :], k[..., 0, :], sc))
    assert torch.equal(out[..., 0, :], v[..., 0, :]), "a single-key row's output is its value row"


def test_bitwise_score_check_catches_one_ulp():
    """Negative control for the test above: one ulp off the rounded exact score fails."""
    exact = torch.tensor([1.5, -2.1768, 30.25, -0.001])
    with pytest.raises(AssertionError, match="differ"):
        assert_bitwise("control", torch.nextafter(exact, torch.full_like(exact, math.inf)), exact)
    assert_bitwise("control", exact.clone(), exact)


# ----------------------------------------------------------------------------- finfo.min rows (F11)

MIN_ROW_CASES = [(d, "accurate") for d in DTYPES] + [(torch.float32, m) for m in ("plain", "tf32x3")]


def finfo_min_inputs(dtype, gen, empty_row=True):
    """GQA inputs with an additive mask holding ``finfo(dtype).min`` on every key of some rows
    (Hugging Face padding), on some keys of another, and (``empty_row``) -inf on a whole row."""
    L, S, E = 12, 31, 32
    q = randn(2, 4, L, E, dtype=dtype, gen=gen)
    k = randn(2, 2, S, E, dtype=dtype, gen=gen)
    v = randn(2, 2, S, E, dtype=dtype, gen=gen)
    low = torch.finfo(dtype).min
    mask = torch.zeros(2, 1, L, S)
    mask[:, :, 3] = low
    mask[1, :, 0] = low
    mask[0, :, 5, 7:] = low
    if empty_row:
        mask[1, :, 9] = float("-inf")
    return q, k, v, mask.to(DEVICE, dtype)


@pytest.mark.parametrize("dtype,fp32_mode", MIN_ROW_CASES,
                         ids=lambda x: str(x).split(".")[-1])
def test_finfo_min_rows(dtype, fp32_mode, gen):
    """F11 (docs/FINDINGS.md): a row whose every key carries finfo(dtype).min has scores that all round
    to min (even in fp64), so m = min and m + log(l) rounds to m: a backward recomputing
    P = exp(s - lse) gets 1 per key instead of 1 / l. The kernels keep m and log l apart; out,
    lse and every gradient agree with the oracle (16-bit and every fp32 mode: the log2-unit
    kernels would also overflow log2(e) * min to -inf and call the row empty)."""
    import attention_oracle.fast.sdpa as fast_sdpa
    previous = fast_sdpa.set_fp32_mode(fp32_mode)
    try:
        q, k, v, mask = finfo_min_inputs(dtype, gen)
        out, grads = check_case(q, k, v, mask=mask, enable_gqa=True)
    finally:
        fast_sdpa.set_fp32_mode(previous)
    assert torch.all(out[1, :, 9] == 0) and torch.all(grads[0][1, :, 9] == 0)


def dq_with_p_from_rounded_lse(q, k, v, mask, dout, scale):
    """Negative control for the test above: float64 dq with P = exp(s - fl32(lse)), the broken
    flash backward (enable_gqa inputs, no empty row)."""
    rep = q.shape[1] // k.shape[1]
    q, k, v, dout = (t.double() for t in (q, k, v, dout))
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-2, -1) * scale + mask.double()
    p = torch.exp(s - torch.logsumexp(s, -1, keepdim=True).float().double())
    delta = (dout * (torch.softmax(s, -1) @ v)).sum(-1, keepdim=True)
    return scale * (p * (dout @ v.transpose(-2, -1) - delta)) @ k


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != torch.float16],
                         ids=lambda d: str(d).split(".")[-1])
def test_finfo_min_rows_catch_p_from_rounded_lse(dtype, gen):
    """The agreement check of test_finfo_min_rows fails dq whose P was recomputed from the
    rounded lse on those inputs (not for fp16: its min, -65504, is small enough that a float32
    lse keeps log l)."""
    q, k, v, mask = finfo_min_inputs(dtype, gen, empty_row=False)
    dout = randn(2, 4, q.shape[2], v.shape[3], dtype=dtype, gen=gen)
    gold, runs = oracle_terms(q, k, v, mask, False, None, True, dout)
    bad = dq_with_p_from_rounded_lse(q, k, v, mask, dout, 1.0 / math.sqrt(q.shape[-1]))
    with record.silenced(), pytest.raises(AssertionError):
        agreement("dq", bad.to(dtype), gold["dq"], {a: r["dq"] for a, r in runs.items()}, 3,
                  gold["magnitude"]["dq"])


# ----------------------------------------------------------------------------- call plans

def _general_path(q, k, v, is_causal, enable_gqa=False):
    """fast's general eager path (the one masked calls take), bypassing the call plans."""
    import attention_oracle.fast.sdpa as fsdpa
    batch, hq, hkv, _, scale = fsdpa.check_sdpa_inputs(q, k, v, None, 0.0, is_causal, None,
                                                       enable_gqa)
    out_shape = tuple(batch) + (hq, q.shape[-2], v.shape[-1])
    out, _ = fsdpa._EagerSdpa.apply(q, k, v, None, is_causal, scale,
                                    (tuple(batch), hq, hkv, out_shape))
    return out


@pytest.mark.parametrize("layout", ["rank3", "rank4_strided", "rank5", "batch_broadcast",
                                    "head_broadcast", "gqa"])
def test_call_plan_matches_general_path(layout, gen):
    """A planned call (first sight and repeated) gives bitwise the general path's output and
    gradients: the plan's saved strides, shapes and launch arguments are the general path's."""
    f32 = dict(dtype=torch.float32, gen=gen)
    gqa = layout == "gqa"
    if layout == "rank3":
        q, k, v = (randn(3, 20, 16, **f32) for _ in range(3))
    elif layout == "rank4_strided":
        q = randn(2, 20, 3, 16, **f32).transpose(1, 2)
        k, v = randn(2, 3, 18, 32, **f32)[..., 3:19], randn(2, 3, 16, 18, **f32).transpose(-1, -2)
    elif layout == "rank5":
        q, k, v = (randn(2, 2, 3, 20, 16, **f32) for _ in range(3))
    elif layout == "batch_broadcast":
        q, k, v = randn(2, 3, 20, 16, **f32), randn(1, 3, 18, 16, **f32), randn(3, 18, 16, **f32)
    elif layout == "head_broadcast":
        q, k, v = randn(2, 3, 20, 16, **f32), randn(2, 1, 18, 16, **f32), randn(2, 1, 18, 16, **f32)
    else:
        q, k, v = randn(2, 4, 20, 16, **f32), randn(2, 2, 18, 16, **f32), randn(2, 2, 18, 16, **f32)
    results = []
    for run in ("plan", "plan", "general"):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = (scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=gqa)
               if run == "plan" else _general_path(*leaves, True, gqa))
        dout = torch.ones_like(out) if not results else results[0][0].new_ones(out.shape)
        results.append((out, *torch.autograd.grad(out, leaves, dout)))
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), *results):
        assert a.shape == c.shape, f"{layout} {name}: shape {tuple(a.shape)} vs {tuple(c.shape)}"
        assert torch.equal(a, b), f"{layout} {name}: the repeated (cached) call differs"
        assert torch.equal(a, c), f"{layout} {name}: the planned call differs from the general path"


def test_call_plans_key_on_options_and_never_cache_a_refusal(gen):
    """Kernel options and the fp32 mode are part of a plan's key; an input validation refuses
    is refused again on every call (nothing is cached for it)."""
    import attention_oracle.fast.sdpa as fsdpa
    q, k, v = (randn(1, 2, 12, 16, dtype=torch.float32, gen=gen) for _ in range(3))
    scaled_dot_product_attention(q, k, v)
    before = len(fsdpa._CALL_PLANS)
    previous = fsdpa.set_kernel_options(fold=not fsdpa.KERNEL_OPTIONS["fold"])
    try:
        scaled_dot_product_attention(q, k, v)
        assert len(fsdpa._CALL_PLANS) == before + 1, "a kernel option did not change the key"
    finally:
        fsdpa.set_kernel_options(**previous)
    for _ in range(2):
        with pytest.raises(ValueError, match="scale"):
            scaled_dot_product_attention(q, k, v, scale=float("nan"))
        with pytest.raises(NotImplementedError, match="dropout_p"):
            scaled_dot_product_attention(q, k, v, dropout_p=0.5)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != torch.float32],
                         ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("fuse", [True, False], ids=["one_launch", "three_launches"])
@pytest.mark.parametrize("is_causal,gqa", [(False, False), (True, True)], ids=["plain", "causal_gqa"])
def test_small_backward_fused_or_not(dtype, fuse, is_causal, gqa, gen):
    """A small backward (S <= 64, few query rows per kv head) runs as one dK/dV launch that also
    forms Delta and stores dQ, or, switched off, as the three launches every larger one takes:
    both agree with the oracle."""
    import attention_oracle.fast.sdpa as fsdpa
    hq, hkv, L, S = (4, 2, 37, 53) if gqa else (2, 2, 37, 53)
    previous = fsdpa.set_kernel_options(fuse_bwd=fuse)
    try:
        assert fsdpa._fuse_bwd(False, "tf32", L, S, hq // hkv) is fuse
        q = randn(2, hq, L, 40, dtype=dtype, gen=gen)
        k = randn(2, hkv, S, 40, dtype=dtype, gen=gen)
        v = randn(2, hkv, S, 24, dtype=dtype, gen=gen)
        check_case(q, k, v, is_causal=is_causal, enable_gqa=gqa)
    finally:
        fsdpa.set_kernel_options(**previous)


@triton.jit
def _dealt_blocks(Out, rows, row_bytes, group, SECTION: tl.constexpr, HEAVY_LAST: tl.constexpr):
    """Out[2 p], Out[2 p + 1] = the (block, head) causal_program gives program p (launch order)."""
    blk, head = causal_program(rows, row_bytes, group, SECTION, HEAVY_LAST)
    p = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    tl.store(Out + 2 * p, blk)
    tl.store(Out + 2 * p + 1, head)


def assert_dealt_in_sections(dealt, n_blk, n_head, per, heavy_last):
    """``dealt`` [(block, head)] in launch order: every block of every head once, the heads in
    sections of ``per`` (the last may be short), within a section level by level from the
    heaviest block (the last one where ``heavy_last``), the section's heads in order."""
    assert sorted(dealt) == [(b, h) for b in range(n_blk) for h in range(n_head)], \
        "not every (block, head) exactly once"
    expected = []
    for first in range(0, n_head, per):
        heads = range(first, min(first + per, n_head))
        for level in range(n_blk):
            expected += [(n_blk - 1 - level if heavy_last else level, h) for h in heads]
    assert dealt == expected, "the launch order is not sections dealt heaviest first"


@pytest.mark.parametrize("n_blk,n_head,rows,row_bytes,group,section,heavy_last,per", [
    (8, 10, 100, 10, 1, 3000, True, 3),       # sections of 3, the last one short
    (8, 10, 100, 10, 2, 3000, False, 6),      # of 3 sets of 2 heads that share keys
    (5, 4, 1000, 1000, 1, 1, False, 1),       # no head fits: one a section
    (4, 9, 10, 10, 4, 2**31 - 1, True, 9),    # every head in one section
    (3, 7, 1, 1, 1, 0, True, 1),              # SECTION 0: one head's blocks after another
])
def test_causal_program_deals_every_block_once(n_blk, n_head, rows, row_bytes, group, section,
                                               heavy_last, per):
    """The causal launch order (sdpa_common.causal_program), read back from a kernel of its own:
    a permutation of the grid, in sections of heads, the heaviest blocks of a section first."""
    out = torch.full((2 * n_blk * n_head,), -1, dtype=torch.int32, device=DEVICE)
    _dealt_blocks[(n_blk, n_head)](out, rows, row_bytes, group, section, heavy_last)
    dealt = [tuple(x) for x in out.view(-1, 2).tolist()]
    assert_dealt_in_sections(dealt, n_blk, n_head, per, heavy_last)


def test_dealt_order_check_catches_a_lost_block():
    """Negative control of assert_dealt_in_sections: a block dealt twice, or in row order."""
    dealt = [(b, h) for h in range(2) for b in range(3)]
    assert_dealt_in_sections(dealt, 3, 2, 1, False)
    with pytest.raises(AssertionError, match="exactly once"):
        assert_dealt_in_sections(dealt[:-1] + [dealt[0]], 3, 2, 1, False)
    with pytest.raises(AssertionError, match="heaviest first"):
        assert_dealt_in_sections(dealt, 3, 2, 2, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("section", [0, 9000, 35840], ids=["rows", "group_a_section", "short_last"])
def test_causal_sections_agree(dtype, section, gen):
    """Causal forward and backward (three launches, GQA) with the heads dealt in small sections
    (set_kernel_options(causal_section=...)): L 70 gives two query blocks a head. In float32,
    9000 bytes hold one group of 3 query heads' keys and values a forward section (two in
    float16) and one kv head's queries a dK/dV section; 35840 hold four groups (the 30 heads
    dealt 12, 12, 6: a short last section; float16 24, 6)."""
    import attention_oracle.fast.sdpa as fsdpa
    previous = fsdpa.set_kernel_options(causal_section=section, fuse_bwd=False)
    try:
        q = randn(5, 6, 70, 16, dtype=dtype, gen=gen)
        k = randn(5, 2, 70, 16, dtype=dtype, gen=gen)
        v = randn(5, 2, 70, 16, dtype=dtype, gen=gen)
        check_case(q, k, v, is_causal=True, enable_gqa=True)
    finally:
        fsdpa.set_kernel_options(**previous)


def test_causal_section_option_is_checked():
    import attention_oracle.fast.sdpa as fsdpa
    for bad in (-1, 2**31, 1.5, True):
        with pytest.raises(ValueError, match="causal_section"):
            fsdpa.set_kernel_options(causal_section=bad)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != torch.float32] + ["plain", "tf32x3"],
                         ids=lambda d: d if isinstance(d, str) else str(d).split(".")[-1])
@pytest.mark.parametrize("case", ["causal_gqa", "bool_mask", "edges"])
@pytest.mark.parametrize("mode", ["atomic", "atomic_element"] if TMA else ["atomic"])
def test_atomic_dq_backward_agrees(dtype, case, mode, gen):
    """The atomic-dQ mode (each key block's share of dQ added in fp32 by the dK/dV kernel) over
    several key and query blocks, tails past the tile edges, GQA, causal and a mask (rows left
    with no key), by per-element atomics or (sm_90) a TMA reduce per tile: within the agreement
    rule as the dQ kernel is, and declared nondeterministic while on."""
    import attention_oracle.fast.sdpa as fsdpa
    from attention_oracle.judge.targets import load
    fp32 = fsdpa.set_fp32_mode(dtype) if isinstance(dtype, str) else None
    dtype = torch.float32 if isinstance(dtype, str) else dtype
    declared = _determinism(load("fast").capabilities)
    previous = fsdpa.set_dq_mode(mode)
    try:
        assert not fsdpa.deterministic() and not fsdpa.deterministic_on_request()
        assert _determinism(load("fast").capabilities) == (False, False)
        hq, hkv = (4, 2) if case == "causal_gqa" else (2, 2)
        L, S = (70, 131) if case == "edges" else (100, 150)
        assert fsdpa._atomic_dq(False, fsdpa._precision(dtype, 40), False, 40,
                                torch.device(DEVICE)) == (2 if TMA and mode == "atomic" else 1)
        assert not fsdpa._fuse_bwd(False, fsdpa._precision(dtype, 40), L, S, hq // hkv)
        q = randn(2, hq, L, 40, dtype=dtype, gen=gen)
        k = randn(2, hkv, S, 40, dtype=dtype, gen=gen)
        v = randn(2, hkv, S, 24, dtype=dtype, gen=gen)
        mask = None
        if case == "bool_mask":
            mask = torch.rand(L, S, generator=gen) > 0.7
            mask[3] = False  # a row with no key: dQ exactly 0
            mask = mask.to(DEVICE)
        check_case(q, k, v, mask=mask, is_causal=case == "causal_gqa", enable_gqa=hq != hkv)
    finally:
        fsdpa.set_dq_mode(previous)
        if fp32 is not None:
            fsdpa.set_fp32_mode(fp32)
    assert _determinism(load("fast").capabilities) == declared


def _determinism(caps):
    return caps.deterministic, caps.deterministic_on_request


def test_atomic_dq_tf32x3_head_dim_128_with_a_float_mask(gen):
    """fp32 "tf32x3" under the atomic mode at head dim 128 (the widest it takes), a float mask
    with a fully masked row, GQA and a short sequence (the safe tile): its dK/dV kernel fits
    shared memory (a 64-key tile asked the H200 for 274624 B) and agrees."""
    import attention_oracle.fast.sdpa as fsdpa
    fp32, previous = fsdpa.set_fp32_mode("tf32x3"), fsdpa.set_dq_mode("atomic")
    try:
        assert fsdpa._atomic_dq(False, fsdpa._precision(torch.float32, 128), False, 128,
                                torch.device(DEVICE)) == (2 if TMA else 1)
        q = randn(1, 4, 65, 128, dtype=torch.float32, gen=gen)
        k, v = (randn(1, 2, 65, 128, dtype=torch.float32, gen=gen) for _ in range(2))
        mask = torch.randn(65, 65, generator=gen)
        mask[5] = float("-inf")
        check_case(q, k, v, mask=mask.to(DEVICE), enable_gqa=True)
    finally:
        fsdpa.set_dq_mode(previous)
        fsdpa.set_fp32_mode(fp32)


def test_atomic_dq_leaves_accurate_and_fused_calls_alone():
    """fp32 "accurate" keeps the dQ kernel, and a fused backward its own dQ store, under the
    atomic mode; "tf32x3" takes it; a bad mode is refused by name."""
    import attention_oracle.fast.sdpa as fsdpa
    previous = fsdpa.set_dq_mode("atomic")
    try:
        cpu = torch.device("cpu")
        assert fsdpa._atomic_dq(False, "tf32x3", False, 40, cpu) == 1
        assert fsdpa._atomic_dq(True, "ieee", False, 40, cpu) == 0
        assert fsdpa._atomic_dq(False, "tf32", True, 40, cpu) == 0
        assert fsdpa._atomic_dq(False, "tf32", False, 40, cpu) == 1  # the interpreter's
        with pytest.raises(ValueError, match="mode"):
            fsdpa.set_dq_mode("atomics")
    finally:
        fsdpa.set_dq_mode(previous)
    assert fsdpa._atomic_dq(False, "tf32", False, 40, torch.device("cpu")) == 0


def test_auto_dq_takes_atomic_dq_where_measured_ahead(monkeypatch, gen):
    """"auto" dQ mode (the default) gives fp32 "tf32x3" calls of at least
    AUTO_ATOMIC_DQ_MIN_SCORES scores, unmasked and without GQA, atomic dQ while
    torch.use_deterministic_algorithms is off, and they agree; with the flag on the same call
    gets a plan of its own with the dQ kernel, and a backward run after the flag was turned on
    takes it too; 16-bit, "plain", "accurate", fused, masked,
    GQA and smaller calls keep the dQ kernel. Deterministic on request, not otherwise."""
    import attention_oracle.fast.sdpa as fsdpa
    shapes = (1, 2, 2, 100, 40), (1, 2, 2, 150, 40)
    monkeypatch.setattr(fsdpa, "AUTO_ATOMIC_DQ_MIN_SCORES", 2 * 2 * 100 * 150)
    previous, fp32 = fsdpa.set_dq_mode("auto"), fsdpa.set_fp32_mode("tf32x3")
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    device = torch.device(DEVICE)
    atomic = 2 if TMA else 1
    try:
        assert not fsdpa.deterministic() and fsdpa.deterministic_on_request()
        assert fsdpa._auto_dq_shapes(*shapes, False)
        assert not fsdpa._auto_dq_shapes(*shapes, True)
        assert not fsdpa._auto_dq_shapes(shapes[0], (1, 2, 1, 150, 40), False)
        assert not fsdpa._auto_dq_shapes((1, 2, 2, 99, 40), shapes[1], False)
        assert fsdpa._atomic_dq(False, "tf32x3", False, 40, device, True) == atomic
        assert fsdpa._atomic_dq(False, "tf32x3", False, 40, device, False) == 0
        for natural, prec, fuse in ((False, "tf32", False), (False, "ieee", False),
                                    (True, "ieee", False), (False, "tf32x3", True)):
            assert fsdpa._atomic_dq(natural, prec, fuse, 40, device, True) == 0
        q = randn(2, 2, 100, 40, dtype=torch.float32, gen=gen)
        k, v = (randn(2, 2, 150, 40, dtype=torch.float32, gen=gen) for _ in range(2))
        check_case(q, k, v, is_causal=True)
        assert fsdpa._call_plan(q, k, v, 0.0, True, None, False).atomic == atomic
        sums = []
        dq_sum = fsdpa._dq_sum
        monkeypatch.setattr(fsdpa, "_dq_sum", lambda dq, a: sums.append(a) or dq_sum(dq, a))
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = scaled_dot_product_attention(*leaves, is_causal=True)
        torch.use_deterministic_algorithms(True, warn_only=True)
        out.backward(torch.ones_like(out))  # the forward's plan went atomic; the flag is on now
        assert sums == [0], sums
        assert fsdpa.deterministic()
        assert fsdpa._atomic_dq(False, "tf32x3", False, 40, device, True) == 0
        assert fsdpa._call_plan(q, k, v, 0.0, True, None, False).atomic == 0
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        fsdpa.set_dq_mode(previous)
        fsdpa.set_fp32_mode(fp32)


# ----------------------------------------------------------------------------- fp32 modes


@pytest.mark.parametrize("masked", [False, True], ids=["plan", "masked"])
@pytest.mark.parametrize("modes", [("accurate", "tf32x3"), ("tf32x3", "accurate")],
                         ids=lambda m: "-then-".join(m))
def test_fp32_mode_change_between_forward_and_backward(modes, masked, gen):
    """The backward runs the path whose statistics the forward saved (natural units keep four
    rows, the log2-unit modes three), not the fp32 mode set since: read as the other layout, the
    rows give wrong gradients or a read past the saved tensor. Gradients match a backward run
    under the forward's own mode: bitwise where both backwards take the same dots (an "accurate"
    forward's statistics take the natural-unit path whatever the mode), else within 1e-5 of the
    largest gradient (a "tf32x3" forward's statistics, read with "accurate" set, take IEEE
    dots where its own backward takes 3xTF32 ones, on the GPU and in the interpreter alike)."""
    import attention_oracle.fast.sdpa as fast_sdpa
    q, k, v, dout = (randn(1, 2, 40, 32, dtype=torch.float32, gen=gen) for _ in range(4))
    mask = None
    if masked:
        mask = torch.zeros(40, 40, device=DEVICE)
        mask[:, 7] = float("-inf")

    def gradients(forward_mode, backward_mode):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fast_sdpa.set_fp32_mode(forward_mode)
        out = scaled_dot_product_attention(*leaves, attn_mask=mask)
        fast_sdpa.set_fp32_mode(backward_mode)
        return torch.autograd.grad(out, leaves, dout)

    previous = fast_sdpa.set_fp32_mode(modes[0])
    try:
        mixed = gradients(*modes)
        own = gradients(modes[0], modes[0])
    finally:
        fast_sdpa.set_fp32_mode(previous)
    for name, g, ref in zip(("dq", "dk", "dv"), mixed, own):
        tol = 0.0 if DEVICE == "cpu" and modes[0] == "accurate" else 1e-5 * ref.abs().max().item()
        err = (g - ref).abs().max().item()
        assert err <= tol, f"{name}: {err:.3g} from the forward mode's own backward (bound {tol:.3g})"


INTERPRETED = DEVICE == "cpu"


def _tf32x3_cases(gen):
    """(q, k, v, mask, is_causal, enable_gqa): a causal GQA case with ragged sizes, an additive
    mask with -inf and finfo.min rows, and a head dim that is not a power of two."""
    yield (randn(2, 4, 37, 32, dtype=torch.float32, gen=gen),
           randn(2, 2, 37, 32, dtype=torch.float32, gen=gen),
           randn(2, 2, 37, 32, dtype=torch.float32, gen=gen), None, True, True)
    q, k, v, mask = finfo_min_inputs(torch.float32, gen)
    yield q, k, v, mask, False, True
    yield (randn(1, 3, 20, 40, dtype=torch.float32, gen=gen),
           randn(1, 3, 33, 40, dtype=torch.float32, gen=gen),
           randn(1, 3, 33, 24, dtype=torch.float32, gen=gen), None, False, False)


def test_fp32_tf32x3_agrees(gen):
    """fp32 "tf32x3" mode (the flash kernels with 3xTF32 dots) against the oracle under the
    agreement rule, forward and gradients. The kernels split each fp32 tile into tf32 halves
    themselves (``sdpa_common.split_tf32``) and take three TF32 dots of exact tf32 values, which
    the interpreter computes as the GPU does up to the order of the sums, so CI checks the
    arithmetic too; on a GPU the tensor cores run it. (``emulated_tf32x3`` stays around the
    calls: the kernels no longer ask for Triton's own tf32x3 dots, which it emulates.)"""
    import attention_oracle.fast.sdpa as fast_sdpa
    previous = fast_sdpa.set_fp32_mode("tf32x3")
    try:
        with emulated_tf32x3() if INTERPRETED else contextlib.nullcontext():
            for q, k, v, mask, causal, gqa in _tf32x3_cases(gen):
                check_case(q, k, v, mask=mask, is_causal=causal, enable_gqa=gqa)
    finally:
        fast_sdpa.set_fp32_mode(previous)


def _tf32x3_tuned_cases(gen):
    """(q, k, v, mask, is_causal, enable_gqa) past validated_only's 128-row bucket at power-of-two
    head dims, so the tuned "tf32x3" tiles run: ragged lengths (300 rows, 260 keys: no tile
    divides them), causal GQA at head dim 128, a float mask with a fully masked row at 64."""
    yield (randn(1, 4, 300, 128, dtype=torch.float32, gen=gen),
           randn(1, 2, 260, 128, dtype=torch.float32, gen=gen),
           randn(1, 2, 260, 128, dtype=torch.float32, gen=gen), None, True, True)
    mask = torch.randn(300, 260, generator=gen)
    mask[7] = float("-inf")
    yield (randn(1, 2, 300, 64, dtype=torch.float32, gen=gen),
           randn(1, 2, 260, 64, dtype=torch.float32, gen=gen),
           randn(1, 2, 260, 64, dtype=torch.float32, gen=gen), mask.to(DEVICE), False, False)


@pytest.mark.skipif(not ON_GPU, reason="the tuned tiles run natively only (the interpreter runs "
                                       "validated_only's one config)")
@pytest.mark.parametrize("dq_mode", ["kernel", "atomic"])
def test_fp32_tf32x3_tuned_tiles_agree(dq_mode, gen):
    """fp32 "tf32x3" at shapes where the autotuner picks among the tuned tiles (every tile under
    test_every_tf32x3_tile_agrees, which forces each in turn), under both dQ modes (the atomic
    one has dK/dV tiles of its own)."""
    import attention_oracle.fast.sdpa as fsdpa
    fp32, previous = fsdpa.set_fp32_mode("tf32x3"), fsdpa.set_dq_mode(dq_mode)
    try:
        for q, k, v, mask, causal, gqa in _tf32x3_tuned_cases(gen):
            check_case(q, k, v, mask=mask, is_causal=causal, enable_gqa=gqa)
    finally:
        fsdpa.set_dq_mode(previous)
        fsdpa.set_fp32_mode(fp32)
    if os.environ.get("SDPA_FORCE_CONFIG") is not None:
        _assert_forced_tiles_ran(dq_mode)


def _assert_forced_tiles_ran(dq_mode):
    """The last call's tiles are the forced ones: a force that did not reach the autotuner would
    leave the test judging the tuner's own pick again."""
    from attention_oracle.fast.kernels import sdpa_bwd, sdpa_fwd
    index = int(os.environ["SDPA_FORCE_CONFIG"])
    dkdv = sdpa_bwd._DKDV_TF32X3_ATOMIC if dq_mode == "atomic" else sdpa_bwd._DKDV_TF32X3
    kernels = [("forward", sdpa_fwd.sdpa_fwd_kernel, sdpa_fwd._TF32X3_SHAPES),
               ("dK/dV", sdpa_bwd.sdpa_bwd_dkdv_kernel, dkdv)]
    if dq_mode == "kernel":
        kernels.append(("dQ", sdpa_bwd.sdpa_bwd_dq_kernel, sdpa_bwd._DQ_TF32X3))
    for name, autotuned, shapes in kernels:
        c = autotuned.best_config
        ran = (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
        assert ran == shapes[index % len(shapes)], f"{name} ran {ran}, not tile {index}"


def _tf32x3_tile_count():
    from attention_oracle.fast.kernels import sdpa_bwd, sdpa_fwd
    return max(len(sdpa_fwd._TF32X3_SHAPES), len(sdpa_bwd._DQ_TF32X3),
               len(sdpa_bwd._DKDV_TF32X3_ATOMIC))


def test_the_tuning_key_tells_a_few_heads_from_many():
    """A tile tuned on a grid of a few programs (a test's 2 x 3 heads at L 1000) is not kept for
    a call of 16 x 32 heads at L 1024 (docs/FINDINGS.md F95): the forward's and the backward's
    tuning keys, and the kernels' TUNE_H, carry a bucket of the query heads in all
    (``sdpa_common.tune_heads``), capped where the grid holds ~1024 blocks of 128 rows."""
    import attention_oracle.fast.sdpa as fsdpa
    from attention_oracle.fast.kernels.sdpa_common import tune_heads

    def fwd(z2, h, length):
        shape = (1, z2, h, length, 64)
        return fsdpa._fwd_plan(shape, shape, shape, torch.bfloat16, None, True, False, "tf32",
                               True, 0)

    def bwd(z2, h, length):
        shape = (1, z2, h, length, 64)
        return fsdpa._bwd_plan(shape, shape, shape, torch.bfloat16, None, torch.bfloat16, True,
                               False, "tf32", False, True, False, False, 0)

    for plan, tunes_at in ((fwd, 7), (bwd, 8)):
        few, many, more = plan(2, 3, 1000), plan(16, 32, 1024), plan(64, 32, 1024)
        assert few[1] != many[1] and few[tunes_at] != many[tunes_at], (few[1], many[1])
        assert many[1] == more[1], "past the cap the key must not split further"
        assert few[tunes_at] == (1024, 1024, 8) and many[tunes_at] == (1024, 1024, 128)
    assert [tune_heads(n, 1024) for n in (1, 6, 128, 512)] == [1, 8, 128, 128]
    assert tune_heads(512, 16384) == 8 and tune_heads(512, 128) == 512


@pytest.mark.skipif(not ON_GPU, reason="the tuned tiles run natively only")
@pytest.mark.parametrize("index", range(_tf32x3_tile_count()))
def test_every_tf32x3_tile_agrees(index):
    """test_fp32_tf32x3_tuned_tiles_agree with the autotuner's choice forced to the index-th
    "tf32x3" tile of each kernel (``sdpa_common.forced_choice``; shorter lists wrap), in a
    process of its own: a tile the tuner does not pick at these shapes may win at others."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # a fresh run of the suite's own tests: no xdist worker's variables, and no ORACLE_IMPL or
    # PYTEST_ADDOPTS naming implementations (under which the plugin deselects them all)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTEST_XDIST") and k not in ("ORACLE_IMPL", "PYTEST_ADDOPTS")}
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p",
                        "no:cacheprovider", __file__, "-k",
                        "test_fp32_tf32x3_tuned_tiles_agree"], cwd=root, capture_output=True,
                       text=True, timeout=600,
                       env=dict(env, PYTHONPATH=path, SDPA_FORCE_CONFIG=str(index)))
    assert r.returncode == 0, f"tile {index}: exit {r.returncode}: {r.stdout[-3000:]}"
    assert "2 passed" in r.stdout, f"tile {index}: the forced run judged nothing: {r.stdout[-1500:]}"


@triton.jit
def _dot_split_dropped(a, a_small, b, b_small, PREC: tl.constexpr):
    """``sdpa_common.dot_split`` without big_a.small_b (the planted bug below)."""
    part = tl.dot(a_small, b, input_precision="tf32")
    return tl.dot(a, b, part, input_precision="tf32")


@pytest.mark.skipif(not INTERPRETED, reason="plants the bug in the interpreter's kernels")
def test_fp32_tf32x3_dropped_term_is_caught(gen, monkeypatch):
    """Negative control of test_fp32_tf32x3_agrees: the same kernels with one of 3xTF32's cross
    terms dropped (big_a.small_b, an error of ~2^-11 relative per product, between TF32 and
    3xTF32) must fail the agreement rule. The kernels form their split dots in
    ``sdpa_common.dot_split`` (three TF32 dots of the halves of ``split_tf32``), which the
    interpreter looks up at each launch: the planted one replaces it there."""
    import attention_oracle.fast.sdpa as fast_sdpa
    from attention_oracle.fast.kernels import sdpa_bwd, sdpa_common, sdpa_fwd

    for module in (sdpa_common, sdpa_fwd, sdpa_bwd):
        monkeypatch.setattr(module, "dot_split", _dot_split_dropped)
    previous = fast_sdpa.set_fp32_mode("tf32x3")
    try:
        q, k, v, mask, causal, gqa = next(_tf32x3_cases(gen))
        with pytest.raises(AssertionError, match="ratio"):
            check_case(q, k, v, mask=mask, is_causal=causal, enable_gqa=gqa)
    finally:
        fast_sdpa.set_fp32_mode(previous)


@pytest.mark.parametrize("mode,row_stride", [("fp16", 2 ** 30 + 128), ("fp32acc", 715827904)])
def test_statistics_rows_past_int32(mode, row_stride):
    """Calls with 2**30 query rows in all put the saved lse row (row 2) past 2**31 elements, and
    with 715,827,883 the fp32 "accurate" path's fourth row: the kernels formed 2 * stride and
    3 * stride in int32 and wrote 8 GiB before the buffer (docs/FINDINGS.md F36). The forward
    kernel runs in a subprocess on a buffer with that row stride (tests/fast/stats_offsets_past_int32.py)."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "tests", "fast", "stats_offsets_past_int32.py")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    r = subprocess.run([sys.executable, script, device, mode, str(row_stride)], cwd=root,
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=root))
    if r.returncode == 3:
        pytest.skip(f"this machine refuses a 4.3 GB allocation: {r.stdout.strip()}")
    assert r.returncode == 0, f"exit {r.returncode}: {r.stdout[-1500:]} {r.stderr[-2000:]}"
