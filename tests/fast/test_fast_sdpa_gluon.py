"""The Gluon (Hopper) SDPA forward and backward (fast/kernels/sdpa_fwd_gluon.py,
sdpa_bwd_gluon.py) against the float64 oracle.

GPU-only: Gluon does not run under Triton's CPU interpreter, so CI skips this file and checks
the Triton forward instead. Every check goes through the smoke tests' ``check_case``: the
suite's agreement rule on out, lse and (through the Triton backward, which reads the Gluon
forward's saved row statistics, or the Gluon backward where a case names it) dq, dk, dv. Each
case asserts the Gluon kernel really ran; the ``test_planted_wrong_scale*`` tests are the
negative controls.
"""
import contextlib
import os

import pytest
import torch

from attention_oracle.fast import sdpa as fast_sdpa
from attention_oracle.fast.kernels import sdpa_bwd_fp32_gluon, sdpa_bwd_gluon, sdpa_fwd_gluon

ON_SM90 = (torch.cuda.is_available() and sdpa_fwd_gluon.GLUON_AVAILABLE
           and torch.cuda.get_device_capability() == (9, 0))
pytestmark = pytest.mark.skipif(not ON_SM90, reason="the Gluon forward needs an sm_90 GPU "
                                "(Gluon does not run under Triton's CPU interpreter)")

# imported on every machine, so that CI on the CPU catches a stale path
from tests.fast.test_fast_sdpa_smoke import check_case  # noqa: E402


@contextlib.contextmanager
def gluon_forward(monkeypatch, scale_error=1.0, backend="gluon", drop_mask=False):
    """``backend`` ("gluon") for the block, counting the Gluon launches; ``scale_error`` plants
    a wrong softmax scale in them and ``drop_mask`` launches them without the call's mask
    (the negative controls)."""
    calls = []
    launch = sdpa_fwd_gluon.launch

    def counted(query, key, value, out, stats, plan, mask=None, s_stat=None):
        shapes, strides, causal, scale = plan
        launched = launch(query, key, value, out, stats,
                          (shapes, strides, causal, scale * scale_error),
                          None if drop_mask else mask, s_stat)
        if launched:
            calls.append(plan[0][0])
        return launched

    monkeypatch.setattr(sdpa_fwd_gluon, "launch", counted)
    # this block's build judged alone: a failure latched by an earlier test (a config that
    # cannot fit, say) would run the Triton kernel here and fail this test on its account
    monkeypatch.setattr(fast_sdpa.GLUON_FWD, "failure", None)
    previous = fast_sdpa.set_forward_backend(backend)
    try:
        yield calls
    finally:
        fast_sdpa.set_forward_backend(previous)
    assert fast_sdpa.GLUON_FWD.failure is None, fast_sdpa.GLUON_FWD.failure


@contextlib.contextmanager
def gluon_backward(monkeypatch, scale_error=1.0, schedule="auto", drop_mask=False):
    """The "gluon" backward backend for the block under ``schedule``
    (``sdpa_bwd_gluon.SCHEDULES``), counting its launches; ``scale_error`` plants a wrong
    softmax scale in them and ``drop_mask`` launches them without the call's mask (the
    negative controls)."""
    calls = []
    launch = sdpa_bwd_gluon.launch

    def counted(dout, query, key, value, stats, delta, dq_sum, dk, dv, plan, mask=None):
        calls.append(plan[0][0])
        shapes, strides, causal, scale, dout_strides, section = plan
        launch(dout, query, key, value, stats, delta, dq_sum, dk, dv,
               (shapes, strides, causal, scale * scale_error, dout_strides, section),
               None if drop_mask else mask)

    monkeypatch.setattr(sdpa_bwd_gluon, "launch", counted)
    monkeypatch.setattr(fast_sdpa.GLUON_BWD, "failure", None)  # judged alone, as above
    previous = fast_sdpa.set_backward_backend("gluon")
    previous_schedule = sdpa_bwd_gluon.set_schedule(schedule)
    try:
        yield calls
    finally:
        fast_sdpa.set_backward_backend(previous)
        sdpa_bwd_gluon.set_schedule(previous_schedule)
    assert fast_sdpa.GLUON_BWD.failure is None, fast_sdpa.GLUON_BWD.failure


@contextlib.contextmanager
def gluon_fp32_dkdv(monkeypatch, scale_error=1.0):
    """fp32 "tf32x3" under the "gluon" backward backend for the block, counting the Gluon fp32
    dK/dV launches; ``scale_error`` plants a wrong softmax scale in them (the negative
    control)."""
    calls = []
    launch = sdpa_bwd_fp32_gluon.launch

    def counted(q, k, v, dout, stats, delta, dk, dv, shapes, strides, is_causal, scale,
                qk_scale):
        calls.append(shapes[0])
        return launch(q, k, v, dout, stats, delta, dk, dv, shapes, strides, is_causal, scale,
                      qk_scale * scale_error)

    monkeypatch.setattr(sdpa_bwd_fp32_gluon, "launch", counted)
    monkeypatch.setattr(fast_sdpa.GLUON_FP32_DKDV, "failure", None)  # judged alone, as above
    previous = (fast_sdpa.set_backward_backend("gluon"), fast_sdpa.set_fp32_mode("tf32x3"))
    try:
        yield calls
    finally:
        fast_sdpa.set_backward_backend(previous[0])
        fast_sdpa.set_fp32_mode(previous[1])
    assert fast_sdpa.GLUON_FP32_DKDV.failure is None, fast_sdpa.GLUON_FP32_DKDV.failure


def randn(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to("cuda", dtype)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(2026)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("L,S", [(128, 128), (1000, 1000), (300, 777), (777, 300), (1, 129)])
@pytest.mark.parametrize("D", sdpa_fwd_gluon.HEAD_DIMS)
def test_gluon_forward_agrees(dtype, is_causal, L, S, D, gen, monkeypatch):
    """Rank 4, B 2, H 3, each head dim of the kernel; ragged lengths (not multiples of the
    128-row tiles), L != S both ways, a single query."""
    q = randn(2, 3, L, D, dtype=dtype, gen=gen)
    k = randn(2, 3, S, D, dtype=dtype, gen=gen)
    v = randn(2, 3, S, D, dtype=dtype, gen=gen)
    with gluon_forward(monkeypatch) as calls:
        check_case(q, k, v, is_causal=is_causal, backward=L * S <= 300 * 777)
    assert calls, "the Gluon forward did not run"


@pytest.mark.parametrize("schedule", ["auto", "serial", "tma_deferred"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("D", [8, 40, 72, 96, 120])
def test_gluon_forward_and_backward_at_head_dims_between_tiles(D, is_causal, schedule, gen,
                                                               monkeypatch):
    """Head dims other than the tiles' (sdpa_fwd_gluon.tile_dim: 8 and 40 on the 64-column
    tile, the rest on the 128-column one), forward and backward: the columns past D are TMA's
    zeros and must never be written (a write past D lands in the next row, which the rule
    catches)."""
    q = randn(2, 3, 300, D, dtype=torch.bfloat16, gen=gen)
    k = randn(2, 3, 777, D, dtype=torch.bfloat16, gen=gen)
    v = randn(2, 3, 777, D, dtype=torch.bfloat16, gen=gen)
    with gluon_forward(monkeypatch) as fwd_calls, \
            gluon_backward(monkeypatch, schedule=schedule) as bwd_calls:
        check_case(q, k, v, is_causal=is_causal)
    assert fwd_calls and bwd_calls, (fwd_calls, bwd_calls)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("D", [136, 192, 256])
def test_gluon_forward_on_the_256_column_tile_agrees(D, is_causal, gen, monkeypatch):
    """Head dims past 128 (sdpa_fwd_gluon.TILE_CONFIGS: 64-key stages), ragged both ways; the
    Triton backward on its statistics, also when the Gluon backward is asked for (it does
    not take this tile)."""
    for L, S in ((300, 777), (777, 300)):
        q = randn(2, 3, L, D, dtype=torch.bfloat16, gen=gen)
        k = randn(2, 3, S, D, dtype=torch.bfloat16, gen=gen)
        v = randn(2, 3, S, D, dtype=torch.bfloat16, gen=gen)
        with gluon_forward(monkeypatch) as fwd_calls, \
                gluon_backward(monkeypatch) as bwd_calls:
            check_case(q, k, v, is_causal=is_causal)
        assert fwd_calls and not bwd_calls, (fwd_calls, bwd_calls)


def masks(kind, B, H, L, S, dtype, gen):
    """A mask of ``kind`` for [B, H, L, S] scores: "bool" (random, a fully masked query row
    and a fully masked key column), "add" (random additive values of ``dtype``, a row of
    -inf and a row of finfo.min), "padding" (bool [B, 1, 1, S], each batch element its own
    valid key count) or "add_rows" (additive [1, 1, L, S] of ``dtype``, shared by every
    head and batch element)."""
    if kind == "bool":
        mask = torch.rand(B, H, L, S, generator=gen) > 0.3
        mask[:, :, 5 % L] = False
        mask[..., 7 % S] = False
    elif kind == "add":
        mask = torch.randn(B, H, L, S, generator=gen).to(dtype)
        mask[:, :, 3 % L] = float("-inf")
        mask[:, :, 4 % L] = torch.finfo(dtype).min
    elif kind == "padding":
        lengths = torch.tensor([S - 1, S // 3])[:B]
        mask = (torch.arange(S)[None, :] < lengths[:, None])[:, None, None, :]
    else:
        mask = torch.randn(1, 1, L, S, generator=gen).to(dtype)
    return mask.to("cuda")


@pytest.mark.parametrize("kind", ["bool", "add", "padding", "add_rows"])
@pytest.mark.parametrize("L,S,D", [(300, 777, 128), (129, 200, 64), (777, 300, 96), (1, 129, 128)])
def test_gluon_forward_with_a_mask_agrees(kind, L, S, D, gen, monkeypatch):
    """Boolean and additive masks (fully masked rows: out 0, lse -inf; finfo.min rows; masks
    broadcast over heads, batch or queries; a mask excludes is_causal, as in PyTorch); the
    Triton backward on the Gluon forward's statistics, in the units of the mask's kind."""
    q = randn(2, 3, L, D, dtype=torch.bfloat16, gen=gen)
    k = randn(2, 3, S, D, dtype=torch.bfloat16, gen=gen)
    v = randn(2, 3, S, D, dtype=torch.bfloat16, gen=gen)
    mask = masks(kind, 2, 3, L, S, torch.bfloat16, gen)
    with gluon_forward(monkeypatch) as calls:
        check_case(q, k, v, mask=mask)
    assert calls, "the Gluon forward did not run"


@pytest.mark.parametrize("gluon_fwd", [False, True], ids=["triton_fwd", "gluon_fwd"])
@pytest.mark.parametrize("kind", ["bool", "add", "padding", "add_rows"])
@pytest.mark.parametrize("L,S,D", [(300, 777, 128), (129, 200, 64), (777, 300, 96)])
def test_gluon_backward_with_a_mask_agrees(kind, L, S, D, gluon_fwd, gen, monkeypatch):
    """The Gluon backward under boolean and additive masks (as in the forward's test), on
    either forward's statistics (the same units for a mask's kind)."""
    q = randn(2, 3, L, D, dtype=torch.bfloat16, gen=gen)
    k = randn(2, 3, S, D, dtype=torch.bfloat16, gen=gen)
    v = randn(2, 3, S, D, dtype=torch.bfloat16, gen=gen)
    mask = masks(kind, 2, 3, L, S, torch.bfloat16, gen)
    with gluon_forward(monkeypatch, backend="gluon" if gluon_fwd else "triton") as fwd_calls, \
            gluon_backward(monkeypatch) as bwd_calls:
        check_case(q, k, v, mask=mask)
    assert bwd_calls and bool(fwd_calls) == gluon_fwd, (fwd_calls, bwd_calls)


@pytest.mark.parametrize("kind", ["bool", "add"])
def test_planted_ignored_mask_in_the_backward_is_caught(kind, gen, monkeypatch):
    """Negative control: the Gluon backward launched without the call's mask fails the rule
    on the gradients."""
    q = randn(2, 3, 300, 128, dtype=torch.bfloat16, gen=gen)
    mask = masks(kind, 2, 3, 300, 300, torch.bfloat16, gen)
    with gluon_backward(monkeypatch, drop_mask=True) as calls:
        with pytest.raises(AssertionError):
            check_case(q, q.flip(2), q.flip(0), mask=mask)
    assert calls


@pytest.mark.parametrize("kind", ["bool", "add"])
def test_planted_ignored_mask_is_caught(kind, gen, monkeypatch):
    """Negative control: the Gluon forward launched without the call's mask fails the rule."""
    q = randn(2, 3, 300, 128, dtype=torch.bfloat16, gen=gen)
    mask = masks(kind, 2, 3, 300, 300, torch.bfloat16, gen)
    with gluon_forward(monkeypatch, drop_mask=True) as calls:
        with pytest.raises(AssertionError):
            check_case(q, q.flip(2), q.flip(0), mask=mask, backward=False)
    assert calls


def test_gluon_forward_leaves_other_masks_to_triton(gen, monkeypatch):
    """An additive float32 mask beside 16-bit inputs is the Triton forward's."""
    q = randn(1, 2, 200, 64, dtype=torch.bfloat16, gen=gen)
    mask = torch.randn(1, 2, 200, 200, generator=gen).to("cuda")
    with gluon_forward(monkeypatch) as calls:
        check_case(q, q, q, mask=mask, backward=False)
    assert not calls, calls


@pytest.mark.parametrize("is_causal", [False, True])
def test_gluon_gqa_layouts_and_scale(is_causal, gen, monkeypatch):
    """GQA (8 query heads on 2 kv heads), [B, L, H, D] storage seen as [B, H, L, D], an
    explicit scale, the general path (a rank-3 call) and the call plan."""
    q = randn(2, 700, 8, 128, dtype=torch.bfloat16, gen=gen).transpose(1, 2)
    k = randn(2, 513, 2, 128, dtype=torch.bfloat16, gen=gen).transpose(1, 2)
    v = randn(2, 513, 2, 128, dtype=torch.bfloat16, gen=gen).transpose(1, 2)
    with gluon_forward(monkeypatch) as calls:
        check_case(q, k, v, is_causal=is_causal, scale=0.05, enable_gqa=True)
        check_case(q[0], k[0].repeat_interleave(4, 0), v[0].repeat_interleave(4, 0),
                   is_causal=is_causal, backward=False)
    assert len(calls) == 2, calls


def test_falls_back_outside_its_domain(gen, monkeypatch):
    """A head dim without a tile (not a multiple of 8), q and v of different head dims, an
    additive mask of another dtype than the inputs' (fp32 beside bf16), fp32 inputs and a
    broadcast batch take the Triton forward."""
    q100 = randn(1, 2, 200, 100, dtype=torch.bfloat16, gen=gen)
    q128 = randn(1, 2, 200, 128, dtype=torch.bfloat16, gen=gen)
    v64 = randn(1, 2, 200, 64, dtype=torch.bfloat16, gen=gen)
    mask = torch.zeros(200, 200, dtype=torch.float32, device="cuda")
    with gluon_forward(monkeypatch) as calls:
        check_case(q100, q100, q100, backward=False)
        check_case(q128, q128, v64, backward=False)
        check_case(q128, q128, q128, mask=mask, backward=False)
        check_case(q128.float(), q128.float(), q128.float(), backward=False)
        check_case(q128.expand(3, 2, 200, 128), q128, q128, backward=False)
    assert not calls, calls


@pytest.mark.parametrize("with_lse", [False, True], ids=["call_plan", "general"])
def test_misaligned_inputs_take_the_triton_forward(with_lse, gen, monkeypatch):
    """A query 2 bytes past a 16-byte boundary (TMA cannot take it) runs the Triton forward,
    before the call site's launch is bound and after (three aligned calls first, then the
    misaligned one at a new address), through the eager call plan and the general path; the
    aligned calls around it still run the Gluon kernel and the guard stays on. Without the
    launch's alignment check the descriptor of the misaligned query fails to build (or, bound,
    reads 2 bytes off)."""
    call = (fast_sdpa.scaled_dot_product_attention_with_lse if with_lse
            else fast_sdpa.scaled_dot_product_attention)
    x = randn(1, 2, 256, 64, dtype=torch.bfloat16, gen=gen)
    flat = torch.empty(x.numel() + 8, dtype=x.dtype, device="cuda")
    shifted = flat[1:1 + x.numel()].view(x.shape)
    shifted.copy_(x)
    assert shifted.data_ptr() % 16 == 2
    with gluon_forward(monkeypatch) as calls:
        first = call(shifted, x, x)
        assert not calls, "the misaligned query ran the Gluon kernel"
        aligned = [call(x, x, x) for _ in range(3)]
        assert len(calls) == 3
        again = call(shifted, x, x)
        assert len(calls) == 3, "the misaligned query ran the bound Gluon launch"
        call(x, x, x)
        assert len(calls) == 4
    previous = fast_sdpa.set_forward_backend("triton")
    try:
        want = call(x, x, x)
    finally:
        fast_sdpa.set_forward_backend(previous)
    got = [first, again] if not with_lse else [first[0], again[0]]
    want = want if not with_lse else want[0]
    for out in got:
        assert torch.equal(out, want), "the misaligned call is not the Triton forward's"
    assert aligned[0] is not None


@pytest.mark.parametrize("with_lse", [False, True], ids=["call_plan", "general"])
def test_auto_takes_gluon_where_faster(with_lse, gen, monkeypatch):
    """The default backend ("auto") runs the Gluon kernel for head dim 128 from
    AUTO_MIN_SCORES scores on (16 heads x 2048 x 2048 = 2**26), and the Triton kernel for
    fewer scores and a causal call of half as many scores; at head dim 64 only where the
    persistent program runs (128 pairs of query blocks: fewer than the H100's and H200's 132
    SMs; 256 pairs: more); through the eager call plan and the general path. A Triton-only
    "auto" would fail the first assertion."""
    call = (fast_sdpa.scaled_dot_product_attention_with_lse if with_lse
            else fast_sdpa.scaled_dot_product_attention)
    big = randn(1, 16, 2048, 128, dtype=torch.bfloat16, gen=gen)
    wide = randn(2, 16, 2048, 64, dtype=torch.bfloat16, gen=gen)
    with gluon_forward(monkeypatch, backend="auto") as calls:
        call(big, big, big)
        assert len(calls) == 1, "auto did not take the Gluon kernel at 2**26 scores of D 128"
        call(big[:, :, :2047], big, big)
        call(big[..., :64], big[..., :64], big[..., :64])
        call(big, big, big, is_causal=True)
        assert len(calls) == 1, calls
        call(wide, wide, wide)
    assert len(calls) == 2, "auto did not take the persistent program at D 64"
    assert sdpa_fwd_gluon._sm_count(big.device) in range(129, 257), "the pair counts assume ~132 SMs"
    torch.cuda.synchronize()


def test_auto_takes_gluon_for_key_padding_masks(gen, monkeypatch):
    """Under "auto" a boolean key-padding mask ([B, 1, 1, S]) at 2**26 scores of D 128 runs the
    Gluon kernel, a dense boolean mask the Triton one; the padded call's output and gradients
    (the backward on the Gluon forward's statistics) match the Triton forward's call within
    16-bit rounding."""
    big = randn(1, 16, 2048, 128, dtype=torch.bfloat16, gen=gen)
    dout = randn(1, 16, 2048, 128, dtype=torch.bfloat16, gen=gen)
    padding = (torch.arange(2048, device="cuda") < 1900)[None, None, None, :]
    dense = (torch.rand(2048, 2048, generator=gen) > 0.2).cuda()

    def padded_call():
        leaves = [big.detach().requires_grad_() for _ in range(3)]
        out = fast_sdpa.scaled_dot_product_attention(*leaves, attn_mask=padding)
        out.backward(dout)
        return [out.detach()] + [t.grad for t in leaves]

    with gluon_forward(monkeypatch, backend="auto") as calls:
        got = padded_call()
        assert len(calls) == 1, "auto did not take the Gluon kernel under a key-padding mask"
        fast_sdpa.scaled_dot_product_attention(big, big, big, attn_mask=dense)
    assert len(calls) == 1, calls
    previous = fast_sdpa.set_forward_backend("triton")
    try:
        want = padded_call()
    finally:
        fast_sdpa.set_forward_backend(previous)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        scale = b.abs().max().item()
        assert (a.float() - b.float()).abs().max().item() <= 2 ** -6 * scale, name


def test_repeat_calls_launch_directly(gen, monkeypatch):
    """After a shape's first call, the Gluon kernel is launched through its compiled launcher
    (fast.launch.DirectLauncher), not Triton's per-call binder; the result is unchanged."""
    q = randn(1, 2, 256, 64, dtype=torch.bfloat16, gen=gen)
    # whichever unmasked kernel the config and the call's size pick (a call of fewer pairs of
    # query blocks than SMs runs the one-block kernel under the persistent config)
    launchers = (sdpa_fwd_gluon._LAUNCH, sdpa_fwd_gluon._WS_LAUNCH,
                 sdpa_fwd_gluon._WS_PERSISTENT_LAUNCH)

    def direct_launches():
        return sum(launcher.direct_launches for launcher in launchers)
    with gluon_forward(monkeypatch):
        first = fast_sdpa.scaled_dot_product_attention(q, q, q)
        before = direct_launches()
        again = [fast_sdpa.scaled_dot_product_attention(q, q, q) for _ in range(3)]
    assert direct_launches() - before >= 2, "the Gluon launches did not go direct"
    for out in again:
        assert torch.equal(out, first)


def test_repeat_calls_expand_their_descriptors_here(gen, monkeypatch):
    """From a shape's third call on, the Gluon forward and backward launch through
    fast.launch.TmaBoundLaunch (the tensor maps encoded here, Triton's expansion bypassed),
    bound after their expansion matched Triton's byte for byte; with new tensors every call
    (new addresses in the maps) the results equal those of Triton's own launch path: out, dk
    and dv bitwise, dq (added by TMA reductions, in no fixed order) within a few ulps."""
    from attention_oracle.fast.launch import TmaBoundLaunch, set_launch_mode

    def step(q, k, v, dout):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = fast_sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(dout)
        return out, q.grad, k.grad, v.grad

    cases = [tuple(randn(2, 4, 300, 128, dtype=torch.bfloat16, gen=gen) for _ in range(4))
             for _ in range(4)]
    with gluon_forward(monkeypatch) as fwd_calls, gluon_backward(monkeypatch) as bwd_calls:
        got = [step(*c) for c in cases]
        bounds = [p[-1][0] for p in sdpa_fwd_gluon._PREPARED.values()
                  if isinstance(p[-1][0], TmaBoundLaunch)]
        previous = set_launch_mode("triton")
        try:
            want = [step(*c) for c in cases]
        finally:
            set_launch_mode(previous)
    assert len(fwd_calls) == len(bwd_calls) == 8
    bound = [b for b in bounds if b.bound is not None]
    assert len(bound) >= 2, [b.failure for b in bounds]
    for g, w in zip(got, want):
        for name, a, b in zip(("out", "dq", "dk", "dv"), g, w):
            if name == "dq":
                scale = b.abs().max().item()
                assert (a.float() - b.float()).abs().max().item() <= 2 ** -7 * scale, name
            else:
                assert torch.equal(a, b), name


def test_planted_wrong_scale_is_caught(gen, monkeypatch):
    """Negative control: the Gluon forward with the log2(e) factor of its exp2 scale left out
    (scores in natural units fed to exp2, a softmax temperature 1/ln 2 off) fails the rule.
    A 1% scale error is inside the bf16 bound at this shape (ratio 0.47 on out; 5%: 2.3)."""
    q = randn(2, 3, 300, 128, dtype=torch.bfloat16, gen=gen)
    k = randn(2, 3, 300, 128, dtype=torch.bfloat16, gen=gen)
    v = randn(2, 3, 300, 128, dtype=torch.bfloat16, gen=gen)
    with gluon_forward(monkeypatch, scale_error=1 / sdpa_fwd_gluon.LOG2E) as calls:
        with pytest.raises(AssertionError):
            check_case(q, k, v, backward=False)
    assert calls


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("L,S", [(128, 128), (1000, 1000), (300, 777), (777, 300), (1, 129)])
@pytest.mark.parametrize("D", sdpa_bwd_gluon.HEAD_DIMS)
@pytest.mark.parametrize("schedule", list(sdpa_bwd_gluon.SCHEDULES))
def test_gluon_backward_agrees(schedule, dtype, is_causal, L, S, D, gen, monkeypatch):
    """The Gluon backward on the default forward's statistics, under each consumer schedule:
    rank 4, B 2, H 3, ragged lengths (key blocks of 128, query blocks of 64), L != S both
    ways, a single query."""
    q = randn(2, 3, L, D, dtype=dtype, gen=gen)
    k = randn(2, 3, S, D, dtype=dtype, gen=gen)
    v = randn(2, 3, S, D, dtype=dtype, gen=gen)
    with gluon_backward(monkeypatch, schedule=schedule) as calls:
        check_case(q, k, v, is_causal=is_causal)
    assert calls, "the Gluon backward did not run"


@pytest.mark.parametrize("section", [0, 360000, 720000],
                         ids=["rows", "short_last", "two_heads"])
def test_gluon_backward_causal_sections_agree(section, gen, monkeypatch):
    """The causal Gluon backward with its kv heads dealt in small sections
    (set_kernel_options(causal_section=...)), L 700 (six key blocks, the last one short), D 64.
    A kv head re-reads its group's q and dout: 358400 bytes under GQA 2 (B 5, 10 kv heads),
    179200 without (3 heads). 360000 bytes hold one GQA head a section, and two heads then one
    (a short last section) without; 720000 two GQA heads (five sections), all three without.
    Every launch's plan carries the SECTION set."""
    sections = []
    previous = fast_sdpa.set_kernel_options(causal_section=section)
    try:
        with gluon_backward(monkeypatch) as calls:
            counted = sdpa_bwd_gluon.launch

            def seen(*args, **kw):
                sections.append(args[9][5])
                return counted(*args, **kw)

            monkeypatch.setattr(sdpa_bwd_gluon, "launch", seen)
            q = randn(5, 4, 700, 64, dtype=torch.bfloat16, gen=gen)
            k = randn(5, 2, 700, 64, dtype=torch.bfloat16, gen=gen)
            v = randn(5, 2, 700, 64, dtype=torch.bfloat16, gen=gen)
            check_case(q, k, v, is_causal=True, enable_gqa=True)
            q3 = randn(3, 700, 64, dtype=torch.bfloat16, gen=gen)
            check_case(q3, q3.flip(1), q3.flip(0), is_causal=True)
    finally:
        fast_sdpa.set_kernel_options(**previous)
    assert len(calls) == 2 and sections == [section, section], (calls, sections)


@pytest.mark.parametrize("is_causal", [False, True])
def test_gluon_backward_gqa_layouts_and_dout(is_causal, gen, monkeypatch):
    """GQA (8 query heads on 2 kv heads: each program walks its group's heads), [B, L, H, D]
    storage, an explicit scale, a head-major dout, both forwards' statistics; the general
    path (a rank-3 call) too."""
    q = randn(2, 700, 8, 128, dtype=torch.bfloat16, gen=gen).transpose(1, 2)
    k = randn(2, 513, 2, 128, dtype=torch.bfloat16, gen=gen).transpose(1, 2)
    v = randn(2, 513, 2, 128, dtype=torch.bfloat16, gen=gen).transpose(1, 2)
    dout = randn(8, 2, 700, 128, dtype=torch.bfloat16, gen=gen).transpose(0, 1)
    with gluon_backward(monkeypatch) as calls:
        check_case(q, k, v, is_causal=is_causal, scale=0.05, enable_gqa=True, dout=dout)
        with gluon_forward(monkeypatch):
            check_case(q, k, v, is_causal=is_causal, enable_gqa=True)
        check_case(q[0], k[0].repeat_interleave(4, 0), v[0].repeat_interleave(4, 0),
                   is_causal=is_causal)
    assert len(calls) == 3, calls


def test_gluon_backward_falls_back_for_a_broadcast_dout(gen, monkeypatch):
    """A stride-0 dout is no TMA source: the Triton backward runs, and agrees."""
    q = randn(1, 2, 200, 64, dtype=torch.bfloat16, gen=gen)
    dout = randn(1, 1, 1, 64, dtype=torch.bfloat16, gen=gen).expand(1, 2, 200, 64)
    with gluon_backward(monkeypatch) as calls:
        check_case(q, q, q, dout=dout)
    assert not calls, calls


@pytest.mark.parametrize("schedule", list(sdpa_bwd_gluon.SCHEDULES))
def test_planted_wrong_scale_in_the_backward_is_caught(schedule, gen, monkeypatch):
    """Negative control: the Gluon backward with the log2(e) factor of its exp2 scale left
    out (P recomputed from natural-unit scores) fails the rule on the gradients."""
    q = randn(2, 3, 300, 128, dtype=torch.bfloat16, gen=gen)
    with gluon_backward(monkeypatch, scale_error=1 / sdpa_fwd_gluon.LOG2E,
                        schedule=schedule) as calls:
        with pytest.raises(AssertionError):
            check_case(q, q.flip(2), q.flip(0))
    assert calls


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("L,S", [(1000, 997), (1100, 1000)])
def test_persistent_program_takes_several_query_blocks(is_causal, L, S, gen, monkeypatch):
    """The persistent program (the default CONFIG) on more pairs of query blocks than
    SMs (64 rows of 8 or 9 blocks, the ninth a pair of its own; ragged L and S): a program
    takes several, each block's Q in the buffer of its parity and the K/V ring's stages
    counted on across them; a masked call beside it runs the warp-specialized kernel; the
    Triton backward on its statistics."""
    monkeypatch.setattr(sdpa_fwd_gluon, "CONFIG", (128, 128, 2, 4, sdpa_fwd_gluon.FORM))
    assert 4 * 16 * 4 > torch.cuda.get_device_properties(0).multi_processor_count
    q = randn(4, 16, L, 128, dtype=torch.bfloat16, gen=gen)
    k = randn(4, 16, S, 128, dtype=torch.bfloat16, gen=gen)
    v = randn(4, 16, S, 128, dtype=torch.bfloat16, gen=gen)
    with gluon_forward(monkeypatch) as calls:
        check_case(q, k, v, is_causal=is_causal)
        if not is_causal:
            check_case(q[:1, :2], k[:1, :2], v[:1, :2],
                       mask=masks("bool", 1, 2, L, S, torch.bfloat16, gen), backward=False)
    assert len(calls) == 1 + (not is_causal), calls


@pytest.fixture
def persistent_everywhere(monkeypatch):
    """The persistent program on every unmasked Gluon call however few its pairs of query
    blocks (a call with fewer pairs than SMs otherwise runs the one-block kernel): an SM count
    of 4, and no plan prepared before under the real one."""
    monkeypatch.setattr(sdpa_fwd_gluon, "CONFIG", (128, 128, 2, 4, sdpa_fwd_gluon.FORM))
    monkeypatch.setattr(sdpa_fwd_gluon, "_sm_count", lambda device: 4)
    monkeypatch.setattr(sdpa_fwd_gluon, "_PREPARED", {})


@pytest.mark.parametrize("case", ["gqa_causal", "d96", "fp16_ragged_causal", "single_query",
                                  "d64_causal"])
def test_persistent_program_on_small_calls(case, persistent_everywhere, gen, monkeypatch):
    """The persistent program (4 programs, several pairs each) where the default now runs the
    one-block kernel: GQA in a [B, L, H, D] layout, head dims 96 and 64, fp16 with L > S and
    the causal mask, a single query; gradients through the backward on its statistics. Each
    prepared plan launched the persistent program."""
    dtype = torch.float16 if case.startswith("fp16") else torch.bfloat16
    kwargs = dict(is_causal=case.endswith("causal"))
    if case == "gqa_causal":
        q = randn(2, 700, 8, 128, dtype=dtype, gen=gen).transpose(1, 2)
        k, v = (randn(2, 513, 2, 128, dtype=dtype, gen=gen).transpose(1, 2) for _ in range(2))
        kwargs["enable_gqa"] = True
    else:
        L, S, D = {"d96": (300, 300, 96), "fp16_ragged_causal": (777, 300, 128),
                   "single_query": (1, 129, 128), "d64_causal": (1000, 1000, 64)}[case]
        q = randn(2, 3, L, D, dtype=dtype, gen=gen)
        k, v = (randn(2, 3, S, D, dtype=dtype, gen=gen) for _ in range(2))
    with gluon_forward(monkeypatch) as calls:
        check_case(q, k, v, **kwargs)
    assert calls
    plains = [p[4][0][0] for p in sdpa_fwd_gluon._PREPARED.values() if len(p) == 6]
    assert plains and all(p is sdpa_fwd_gluon._WS_PERSISTENT_LAUNCH for p in plains), plains


@pytest.mark.skipif(os.environ.get("ATTENTION_ORACLE_GLUON_VARIANTS", "0") in ("", "0"),
                    reason="set ATTENTION_ORACLE_GLUON_VARIANTS=1 to check the other Gluon configs")
@pytest.mark.parametrize("L,S,D", [(1000, 997, 64), (777, 300, 40), (300, 777, 64), (1, 129, 64),
                                   (1000, 997, 128)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("config", [(128, 128, 3, 4, 3), (128, 128, 2, 4, 4), (128, 128, 3, 4, 4),
                                    (128, 128, 2, 4, 3), (128, 128, 2, 4, 6)],
                         ids=["three_stages", "pingpong", "three_stages_pingpong", "full_diagonal",
                              "pingpong_half_diagonal"])
def test_persistent_program_variants(config, L, S, D, is_causal, gen, monkeypatch):
    """The persistent program's configs other than the default (PERSISTENT_HALF, the first
    consumer's causal diagonal tile on its first half of keys; the default's tests run it): a
    three-stage key ring; the consumers taking turns to issue their products
    (PERSISTENT_PINGPONG: the turns counted on across a program's blocks, a block of n tiles
    n + 1 rounds; 7 blocks a row at L 777, whose middle one pairs with none); the full diagonal
    tile (PERSISTENT, the default before); ping-pong with the half diagonal (after full tiles,
    alone where a block has one key tile (L 1), and not at all where the block's last tile ends
    before its rows (S 300 < L 777)). 4 programs, several pairs of query blocks each, ragged
    lengths both ways, a head dim below the tile's."""
    assert config[4] in sdpa_fwd_gluon.PERSISTENT_FORMS
    if config[2] == 3 and D > 64:
        pytest.skip("three stages of 128-key tiles past head dim 64 need 262 KB of shared memory "
                    "(the H100 / H200 allow 227 KB): a form of D 64 alone")
    monkeypatch.setattr(sdpa_fwd_gluon, "CONFIG", config)
    monkeypatch.setattr(sdpa_fwd_gluon, "_sm_count", lambda device: 4)
    monkeypatch.setattr(sdpa_fwd_gluon, "_PREPARED", {})
    q = randn(2, 3, L, D, dtype=torch.bfloat16, gen=gen)
    k, v = (randn(2, 3, S, D, dtype=torch.bfloat16, gen=gen) for _ in range(2))
    with gluon_forward(monkeypatch) as calls:
        check_case(q, k, v, is_causal=is_causal)
    assert calls
    plains = [p[4][0][0] for p in sdpa_fwd_gluon._PREPARED.values() if len(p) == 6]
    assert plains and all(p is sdpa_fwd_gluon._WS_PERSISTENT_LAUNCH for p in plains), plains


# the other configs are not the default and cost a compile each: they run when asked
# (`bash benchmarks/h200.sh check` and `optin` ask); the one-block WS tile (128, 128, 2, 4,
# True) runs every masked call of the default tests, and unmasked calls here
@pytest.mark.skipif(os.environ.get("ATTENTION_ORACLE_GLUON_VARIANTS", "0") in ("", "0"),
                    reason="set ATTENTION_ORACLE_GLUON_VARIANTS=1 to check the other Gluon configs")
# (config, head dim): the 128 x 256 tile fits shared memory at head dim 64 only
@pytest.mark.parametrize("config,D", [((64, 64, 2, 4, False), 128), ((128, 128, 2, 8, False), 128),
                                      ((128, 64, 3, 4, True), 128), ((128, 256, 2, 4, True), 64),
                                      ((128, 128, 2, 4, sdpa_fwd_gluon.PINGPONG), 128),
                                      ((128, 128, 2, 4, sdpa_fwd_gluon.PINGPONG), 64),
                                      ((192, 128, 2, 4, True), 64),
                                      ((192, 128, 2, 4, sdpa_fwd_gluon.PINGPONG), 64),
                                      ((128, 128, 2, 4, True), 128),
                                      ((128, 128, 2, 4, True), 64)],
                         ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
def test_other_configs_agree(config, D, is_causal, gen, monkeypatch):
    """The warp-specialized kernel and the two-CTAs-per-SM tile (sdpa_fwd_gluon.CONFIG):
    ragged L != S both ways, gradients through the Triton backward on their statistics. Key
    tiles wider than the query block (128 x 256) straddle a causal block's first row, which
    the unmasked-tile bound once missed (docs/FINDINGS.md F25). Last
    in the file: a hang here (the warp-specialized kernel's barriers) leaves the others run."""
    monkeypatch.setattr(sdpa_fwd_gluon, "CONFIG", config)
    for L, S in ((300, 777), (777, 300), (1, 129)):
        q = randn(2, 3, L, D, dtype=torch.bfloat16, gen=gen)
        k = randn(2, 3, S, D, dtype=torch.bfloat16, gen=gen)
        v = randn(2, 3, S, D, dtype=torch.bfloat16, gen=gen)
        with gluon_forward(monkeypatch) as calls:
            check_case(q, k, v, is_causal=is_causal)
        assert calls, "the Gluon forward did not run"


FP32_CASES = [  # (HQ, HKV, L, S, D, causal, head-major dout)
    (2, 2, 300, 300, 128, False, False), (2, 2, 300, 300, 128, True, False),
    (4, 2, 129, 257, 64, False, False), (4, 1, 200, 200, 80, True, True),
    (3, 3, 1000, 700, 96, False, False), (2, 2, 64, 64, 128, True, True),
]


@pytest.mark.parametrize("case", FP32_CASES,
                         ids=["_".join(map(str, c[:5])) + ("_causal" if c[5] else "")
                              + ("_head_major" if c[6] else "") for c in FP32_CASES])
def test_gluon_fp32_dkdv_agrees(case, gen, monkeypatch):
    """The fp32 "tf32x3" backward with dK and dV from the Gluon kernel passes the rule: GQA,
    causal, L != S and lengths off the 16-query and 64-key tiles, head dims on and between the
    64- and 128-column tiles, a head-major dout; the call with lse (judged) and the plain call
    give the same gradients, bitwise (both launch the same kernels). The general backward's
    dispatch to it is checked on the CPU with a stub (test_fast_sdpa_backends)."""
    HQ, HKV, L, S, D, causal, head_major = case
    q = randn(1, HQ, L, D, dtype=torch.float32, gen=gen)
    k = randn(1, HKV, S, D, dtype=torch.float32, gen=gen)
    v = randn(1, HKV, S, D, dtype=torch.float32, gen=gen)
    dout = (randn(1, L, HQ, D, dtype=torch.float32, gen=gen).transpose(1, 2) if head_major
            else randn(1, HQ, L, D, dtype=torch.float32, gen=gen))
    with gluon_fp32_dkdv(monkeypatch) as calls:
        check_case(q, k, v, is_causal=causal, enable_gqa=HQ != HKV, dout=dout)
        assert len(calls) == 1, "the Gluon fp32 dK/dV did not run"

        def grads(call):
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = call(*leaves, is_causal=causal, enable_gqa=HQ != HKV)
            out = out[0] if isinstance(out, tuple) else out
            out.backward(dout)
            return [t.grad for t in leaves]
        with_lse = grads(fast_sdpa.scaled_dot_product_attention_with_lse)
        plain = grads(fast_sdpa.scaled_dot_product_attention)
        assert len(calls) == 3, "a repeated call did not run the Gluon fp32 dK/dV"
    for name, a, b in zip(("dq", "dk", "dv"), with_lse, plain):
        assert torch.equal(a, b), name


def test_planted_wrong_scale_in_the_fp32_dkdv_is_caught(gen, monkeypatch):
    """Negative control: the Gluon fp32 dK/dV with its softmax scale 1% off fails the rule
    on dK and dV (fp32's bound is far below 1%)."""
    q = randn(1, 2, 300, 128, dtype=torch.float32, gen=gen)
    with gluon_fp32_dkdv(monkeypatch, scale_error=1.01) as calls:
        with pytest.raises(AssertionError):
            check_case(q, q.flip(2), q.flip(1))
    assert calls
