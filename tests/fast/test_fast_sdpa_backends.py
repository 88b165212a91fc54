"""Which kernels fast SDPA's backends choose (fast/sdpa.py ``set_forward_backend``,
``set_backward_backend``, fast/kernels/sdpa_fwd_gluon.py ``auto_takes``): shape logic and
dispatch (the Gluon kernels stubbed), so it runs on every machine;
the kernels themselves are checked by test_fast_sdpa_smoke.py and, on sm_90, by
test_fast_sdpa_gluon.py (``test_auto_takes_gluon_where_faster`` there runs the same rule).
"""
import contextlib
import itertools
import os
import subprocess
import sys

import pytest
import torch

from attention_oracle.fast import sdpa as fast_sdpa
from attention_oracle.fast.kernels import sdpa_bwd_fp32_gluon, sdpa_bwd_gluon, sdpa_fwd_gluon

MIN = sdpa_fwd_gluon.AUTO_MIN_SCORES


def shapes(heads, L, S, D=128):
    """Rank-5 q and k shapes of one batch."""
    return (1, 1, heads, L, D), (1, 1, heads, S, D)


@pytest.mark.parametrize("heads,L,S,D,causal,takes", [
    (16, 2048, 2048, 128, False, True),    # exactly AUTO_MIN_SCORES
    (16, 2047, 2048, 128, False, False),   # one query row fewer
    (16, 2048, 2048, 128, True, False),    # causal computes half the scores
    (32, 2048, 2048, 128, True, True),
    (16, 2048, 2048, 64, False, False),    # D 64: only where the persistent program runs
    (4 * 32, 1024, 1024, 128, False, True),  # the benchmarks' L 1k at B 4, H 32
])
def test_auto_takes(heads, L, S, D, causal, takes):
    q, k = shapes(heads, L, S, D)
    assert sdpa_fwd_gluon.auto_takes(q, k, causal) is takes, (heads, L, S, D, causal)


@pytest.mark.parametrize("heads,L,causal,masked,takes", [
    (16, 2048, False, False, True),   # 2**26 scores, 16 x 8 = 128 pairs of query blocks
    (32, 2048, True, False, True),    # causal: half the scores
    (16, 2047, False, False, False),  # too few scores
    (16, 2048, False, True, False),   # masked: untimed at D 64
    (4, 4096, False, False, False),   # 2**26 scores, 4 x 16 = 64 pairs: the one-block kernel
])
def test_auto_takes_d64_where_the_persistent_program_runs(heads, L, causal, masked, takes,
                                                          monkeypatch):
    """At head dim 64 "auto" takes unmasked calls of AUTO_MIN_SCORES scores that run the
    persistent program: at least as many pairs of query blocks as SMs (100 here)."""
    monkeypatch.setattr(sdpa_fwd_gluon, "_sm_count", lambda device: 100)
    q, k = shapes(heads, L, L, 64)
    got = sdpa_fwd_gluon.auto_takes(q, k, causal, masked, torch.device("cuda"))
    assert got is takes, (heads, L, causal, masked)
    assert not sdpa_fwd_gluon.auto_takes(q, k, causal, masked), "no device: no SM count"


def _mask5(shape, dtype, L=4096, S=4096):
    """A mask of ``shape`` (torch's broadcast rules) as the rank-5 [1, B, H, L, S] view fast's
    kernels read."""
    m = torch.zeros(shape, dtype=dtype)
    return m.expand(4, 32, L, S)[None]


@pytest.mark.parametrize("shape,dtype,padding", [
    ((4, 1, 1, 4096), torch.bool, True),
    ((1, 4096), torch.bool, True),  # one row for every batch and head
    ((4, 1, 4096, 4096), torch.bool, False),
    ((4096, 4096), torch.bool, False),
    ((4, 1, 1, 4096), torch.bfloat16, True),
    ((4, 1, 4096, 4096), torch.bfloat16, False),
])
def test_auto_takes_masks_measured_faster(shape, dtype, padding):
    """A masked call runs the Gluon forward under "auto" only for a key-padding mask (every
    query row reads one mask row) of a kind in ``AUTO_FWD_MASKS`` (boolean and additive:
    measured ahead of the Triton forward), else only when asked ("gluon"); a dense mask never
    under "auto"."""
    assert {torch.bool, torch.bfloat16} <= fast_sdpa.AUTO_FWD_MASKS
    q, k = (1, 4, 32, 4096, 128), (1, 4, 32, 4096, 128)
    backends = fast_sdpa._gluon_backends(q, k, False, _mask5(shape, dtype))
    expected = padding and dtype in fast_sdpa.AUTO_FWD_MASKS
    assert ("auto" in backends) is expected and "gluon" in backends, (shape, dtype, backends)
    assert "auto" in fast_sdpa._gluon_backends(q, k, False)


def test_auto_takes_no_small_masked_call():
    """Too few scores for "auto", with a key-padding mask as without one."""
    q = (1, 1, 1, 128, 128)
    mask = torch.ones(128, dtype=torch.bool).expand(1, 1, 1, 128, 128)
    assert fast_sdpa._gluon_backends(q, q, False, mask) == frozenset(("gluon",))


def test_auto_counts_every_batch_dim():
    """Scores over the two leading (broadcast) dims count as heads do."""
    assert sdpa_fwd_gluon.auto_takes((2, 8, 1, 2048, 128), (2, 8, 1, 2048, 128), False)
    assert not sdpa_fwd_gluon.auto_takes((2, 4, 1, 2048, 128), (2, 4, 1, 2048, 128), False)


def test_backends_per_call():
    """A call the Gluon kernel applies to runs it under "gluon", and under "auto" only where
    auto_takes; never under "triton"."""
    big, small = shapes(16, 2048, 2048), shapes(1, 128, 128)
    assert fast_sdpa._gluon_backends(*big, False) == {"gluon", "auto"}
    assert fast_sdpa._gluon_backends(*small, False) == {"gluon"}
    assert "triton" not in fast_sdpa._gluon_backends(*big, False)


def test_default_backend_and_bad_value():
    assert fast_sdpa.FWD_BACKENDS[0] == "auto"
    previous = fast_sdpa.set_forward_backend("triton")
    try:
        with pytest.raises(ValueError, match="mode must be one of"):
            fast_sdpa.set_forward_backend("cudnn")
    finally:
        fast_sdpa.set_forward_backend(previous)


def test_settings_name_the_options_later_calls_run_under():
    from attention_oracle.fast import dsa as fast_dsa
    previous = fast_sdpa.set_backward_backend("gluon"), fast_dsa.set_fp32_mode("acc64")
    try:
        assert fast_sdpa.settings()["backward_backend"] == "gluon"
        assert set(fast_sdpa.settings()) == {"forward_backend", "backward_backend",
                                             "auto_bwd_min_scores", "dq_mode", "fp32_mode",
                                             "gluon_bwd_schedule"}
        assert fast_dsa.settings()["fp32_mode"] == "acc64"
    finally:
        fast_sdpa.set_backward_backend(previous[0])
        fast_dsa.set_fp32_mode(previous[1])
    assert fast_sdpa.settings()["backward_backend"] == previous[0]


def stub_gluon_plans(monkeypatch):
    """Gluon plans for any call on any device (the kernels themselves stubbed by the test)."""
    monkeypatch.setattr(sdpa_fwd_gluon, "plan", lambda shapes, strides, dtype, device, causal,
                        scale: (tuple(map(tuple, shapes)), tuple(map(tuple, strides)), causal,
                                scale))
    monkeypatch.setattr(sdpa_fwd_gluon, "aligned", lambda *ptrs: True)
    monkeypatch.setattr(sdpa_bwd_gluon, "plan",
                        lambda fwd, dst, dtype, section=0: fwd + (tuple(dst), section))
    # the eager call plans made meanwhile hold the stubbed plans: kept apart, dropped after
    monkeypatch.setattr(fast_sdpa, "_CALL_PLANS", {})


def test_backward_backend_dispatch(monkeypatch):
    """Under "gluon" the backward of a call the Gluon plans take goes to the Gluon launch,
    through the eager call plan and the general path, and the calls are no longer
    deterministic; under "triton" it never does. The kernel is stubbed (its gradients are the
    stub's zeros)."""
    calls = []
    stub_gluon_plans(monkeypatch)
    monkeypatch.setattr(sdpa_bwd_gluon, "launch",
                        lambda *args, mask=None: calls.append(args[9][0][0]))  # args[9]: plan
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16, device=device, requires_grad=True)

    def steps():
        for call in (fast_sdpa.scaled_dot_product_attention,
                     fast_sdpa.scaled_dot_product_attention_with_lse):
            out = call(q, q, q)
            out = out[0] if isinstance(out, tuple) else out
            torch.autograd.grad(out.float().sum(), q)

    forward = fast_sdpa.set_forward_backend("triton")
    backward = fast_sdpa.set_backward_backend("gluon")
    dq = fast_sdpa.set_dq_mode("kernel")  # "auto" would not be deterministic without the flag
    try:
        assert not fast_sdpa.deterministic() and not fast_sdpa.deterministic_on_request()
        steps()
        assert calls == [(1, 1, 2, 16, 64)] * 2, calls
        fast_sdpa.set_backward_backend("triton")
        assert fast_sdpa.deterministic()
        steps()
        assert len(calls) == 2
    finally:
        fast_sdpa.set_forward_backend(forward)
        fast_sdpa.set_backward_backend(backward)
        fast_sdpa.set_dq_mode(dq)


def test_auto_backward_takes_the_gluon_kernel_where_measured_ahead(monkeypatch):
    """Under "auto" the Gluon backward serves head dims 64 and 128 unmasked from
    their AUTO_BWD_MIN_SCORES (eager call plan and general path), not another head dim, not a
    GQA call, not a masked call, not a smaller call, and not while torch.use_deterministic_algorithms is on,
    when the calls are deterministic again. The kernel is stubbed."""
    calls = []
    stub_gluon_plans(monkeypatch)
    monkeypatch.setattr(sdpa_bwd_gluon, "launch", lambda *args: calls.append(args[9][0][0][-1]))
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def step(D, **kw):
        q = torch.randn(1, 2, 16, D, dtype=torch.bfloat16, device=device, requires_grad=True)
        for call in (fast_sdpa.scaled_dot_product_attention,
                     fast_sdpa.scaled_dot_product_attention_with_lse):
            out = call(q, q, q, **kw)
            out = out[0] if isinstance(out, tuple) else out
            torch.autograd.grad(out.float().sum(), q)

    assert set(fast_sdpa.AUTO_BWD_MIN_SCORES) == {64, 128}
    def step_gqa(D):  # two query heads on one kv head: the same scores as step's calls
        q = torch.randn(1, 2, 16, D, dtype=torch.bfloat16, device=device, requires_grad=True)
        k = torch.randn(1, 1, 16, D, dtype=torch.bfloat16, device=device, requires_grad=True)
        out = fast_sdpa.scaled_dot_product_attention(q, k, k, enable_gqa=True)
        torch.autograd.grad(out.float().sum(), (q, k))

    these = {64: 2 * 16 * 16, 128: 2 * 16 * 16}  # these calls' scores
    monkeypatch.setattr(fast_sdpa, "AUTO_BWD_MIN_SCORES", these)
    forward = fast_sdpa.set_forward_backend("triton")
    backward = fast_sdpa.set_backward_backend("auto")
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        assert not fast_sdpa.deterministic() and fast_sdpa.deterministic_on_request()
        assert fast_sdpa.settings()["auto_bwd_min_scores"] == {"64": 512, "128": 512}
        step(128)
        step(64)
        step(96)
        step_gqa(128)
        step(128, attn_mask=torch.ones(16, 16, dtype=torch.bool, device=device))
        assert calls == [128, 128, 64, 64], calls
        monkeypatch.setattr(fast_sdpa, "AUTO_BWD_MIN_SCORES", {64: 513, 128: 512})
        step(64)  # below the size whose kernel time repays the Gluon backward's host time
        assert calls == [128, 128, 64, 64], calls
        monkeypatch.setattr(fast_sdpa, "AUTO_BWD_MIN_SCORES", these)
        torch.use_deterministic_algorithms(True, warn_only=True)
        assert fast_sdpa.deterministic()
        step(128)
        assert calls == [128, 128, 64, 64], calls
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        fast_sdpa.set_forward_backend(forward)
        fast_sdpa.set_backward_backend(backward)


def test_backward_backend_dispatch_of_masked_calls(monkeypatch):
    """Under "gluon" a masked call's backward goes to the Gluon launch with the call's mask as
    a rank-5 view (a boolean one, and an additive one of the inputs' dtype); an fp32 additive
    mask beside 16-bit inputs stays with the Triton backward. The kernel is stubbed."""
    seen = []
    stub_gluon_plans(monkeypatch)
    monkeypatch.setattr(sdpa_bwd_gluon, "launch", lambda *args: seen.append(args[10]))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    masks = (torch.rand(1, 1, 16, 16, device=device) > 0.5,
             torch.randn(1, 2, 16, 16, device=device).to(torch.bfloat16),
             torch.randn(1, 2, 16, 16, device=device))
    forward = fast_sdpa.set_forward_backend("triton")
    backward = fast_sdpa.set_backward_backend("gluon")
    try:
        for mask in masks:
            out = fast_sdpa.scaled_dot_product_attention(q, q, q, attn_mask=mask)
            torch.autograd.grad(out.float().sum(), q)
    finally:
        fast_sdpa.set_forward_backend(forward)
        fast_sdpa.set_backward_backend(backward)
    assert [(m.dim(), m.dtype) for m in seen] == [(5, torch.bool), (5, torch.bfloat16)], seen
    assert seen[0].shape[-2:] == (16, 16) and seen[0].stride()[2] == 0  # broadcast heads


def test_a_gluon_backward_that_does_not_build_falls_back(monkeypatch):
    """The stubbed Gluon backward fails as a build does: the call's gradients are the Triton
    backward's, with one warning; later calls do not try the Gluon kernel again."""
    from triton.runtime.errors import OutOfResources
    attempts = []

    def fails(*args):
        attempts.append(args)
        raise OutOfResources(300000, 232448, "shared memory")

    stub_gluon_plans(monkeypatch)
    monkeypatch.setattr(sdpa_bwd_gluon, "launch", fails)
    monkeypatch.setattr(fast_sdpa, "GLUON_BWD", fast_sdpa.BuildGuard("the stub"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 16, 64, generator=gen).to(device, torch.float16).requires_grad_(True)

    def grad():
        return torch.autograd.grad(fast_sdpa.scaled_dot_product_attention(q, q, q).float().sum(),
                                   q)[0]

    forward = fast_sdpa.set_forward_backend("triton")
    backward = fast_sdpa.set_backward_backend("triton")
    try:
        want = grad()
        fast_sdpa.set_backward_backend("gluon")
        with pytest.warns(RuntimeWarning, match="the stub failed to build"):
            got = grad()
        again = grad()
    finally:
        fast_sdpa.set_forward_backend(forward)
        fast_sdpa.set_backward_backend(backward)
    assert len(attempts) == 1
    assert torch.equal(got, want) and torch.equal(again, want)


def stub_fp32_dkdv(monkeypatch, launch):
    """The Gluon fp32 dK/dV applying to any call, ``launch`` in its place; the eager call plans
    made meanwhile (which hold the choice) kept apart and dropped after."""
    monkeypatch.setattr(sdpa_bwd_fp32_gluon, "applies", lambda *tensors: True)
    monkeypatch.setattr(sdpa_bwd_fp32_gluon, "launch", launch)
    monkeypatch.setattr(fast_sdpa, "_CALL_PLANS", {})


@contextlib.contextmanager
def fp32_triton_case(seed):
    """(q, k, v, dout) [1, 2, 16, 64] fp32 on the test's device, under fp32 "tf32x3", the
    "triton" backward backend and "kernel" dQ mode for the block (the settings restored
    after)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(seed)
    tensors = tuple(torch.randn(1, 2, 16, 64, generator=gen).to(device) for _ in range(4))
    previous = (fast_sdpa.set_backward_backend("triton"), fast_sdpa.set_dq_mode("kernel"),
                fast_sdpa.set_fp32_mode("tf32x3"))
    try:
        yield tensors
    finally:
        fast_sdpa.set_backward_backend(previous[0])
        fast_sdpa.set_dq_mode(previous[1])
        fast_sdpa.set_fp32_mode(previous[2])


def fp32_grads(q, k, v, dout, mask=None, dtype=torch.float32):
    """(dq, dk, dv) of fast's eager call plan, then of its general backward: head-major views
    of the same values whose saved tensors come back contiguous (a saved-tensor hook's copy),
    which the plan's strides do not describe (docs/FINDINGS.md F50)."""
    leaves = [t.to(dtype).detach().requires_grad_() for t in (q, k, v)]
    out = fast_sdpa.scaled_dot_product_attention(*leaves, attn_mask=mask)
    grads = [torch.autograd.grad(out, leaves, dout.to(dtype))]
    bases = [t.to(dtype).transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.contiguous().clone(),
                                                  lambda t: t):
        out = fast_sdpa.scaled_dot_product_attention(*(b.transpose(1, 2) for b in bases),
                                                     attn_mask=mask)
    relaid = torch.autograd.grad(out, bases, dout.to(dtype))
    grads.append(tuple(g.transpose(1, 2) for g in relaid))
    return grads


def test_gluon_fp32_dkdv_dispatch(monkeypatch):
    """Under the "gluon" backward backend an fp32 "tf32x3" call's dK and dV come from the Gluon
    fp32 kernel (stubbed: it records the call and zeroes dK and dV) on the call plan and the
    general backward (saved tensors relaid), dQ from the dQ kernel (bitwise the Triton backward's in "kernel" mode, not
    atomic dQ); never under "triton" or "auto", with atomic dQ asked for, with a mask, or in
    16-bit."""
    calls = []

    def stub(q, k, v, dout, stats, delta, dk, dv, shapes, strides, is_causal, scale, qk_scale):
        calls.append(shapes[0])
        dk.zero_()
        dv.zero_()
    stub_fp32_dkdv(monkeypatch, stub)
    with fp32_triton_case(seed=0) as (q, k, v, dout):
        device = q.device
        want = fp32_grads(q, k, v, dout)
        fast_sdpa.set_dq_mode("auto")
        for backend in ("triton", "auto"):
            fast_sdpa.set_backward_backend(backend)
            fp32_grads(q, k, v, dout)
            assert not calls, f"taken under {backend!r}"
        fast_sdpa.set_backward_backend("gluon")
        got = fp32_grads(q, k, v, dout)
        assert calls == [(1, 1, 2, 16, 64)] * 2, calls
        for (dq, dk, dv), (dq_want, _, _) in zip(got, want):
            assert torch.equal(dq, dq_want), "dQ is not the dQ kernel's"
            assert not dk.any() and not dv.any(), "the Triton dK/dV ran as well"
        fast_sdpa.set_dq_mode("atomic")
        fp32_grads(q, k, v, dout)
        fast_sdpa.set_dq_mode("auto")
        fp32_grads(q, k, v, dout, mask=torch.ones(16, 16, dtype=torch.bool, device=device))
        fp32_grads(q, k, v, dout, dtype=torch.float16)
        assert len(calls) == 2, calls


def test_a_gluon_fp32_dkdv_that_does_not_build_falls_back(monkeypatch):
    """The stubbed Gluon fp32 dK/dV fails as a build does: the call's gradients are the
    Triton backward's in "kernel" dQ mode, with one warning, on the call plan and the general
    backward; later calls do not try it again."""
    from triton.runtime.errors import OutOfResources
    attempts = []

    def fails(*args):
        attempts.append(args)
        raise OutOfResources(300000, 232448, "shared memory")

    stub_fp32_dkdv(monkeypatch, fails)
    monkeypatch.setattr(fast_sdpa, "GLUON_FP32_DKDV", fast_sdpa.BuildGuard("the stub"))
    with fp32_triton_case(seed=1) as (q, k, v, dout):
        want = fp32_grads(q, k, v, dout)
        fast_sdpa.set_backward_backend("gluon")
        with pytest.warns(RuntimeWarning, match="the stub failed to build"):
            got = fp32_grads(q, k, v, dout)
        again = fp32_grads(q, k, v, dout)
    assert len(attempts) == 1
    for g, w in zip(got + again, want + want):
        for a, b in zip(g, w):
            assert torch.equal(a, b)


@pytest.mark.parametrize("schedule,D,expect", [
    ("auto", 128, "tma_deferred"), ("auto", 64, "tma_deferred"), ("auto", 40, "tma_deferred"),
    ("serial", 128, "serial"), ("tma", 64, "tma"), ("split_tma", 128, "split_tma"),
    ("tma_deferred", 64, "tma_deferred"),
])
def test_gluon_backward_schedule_resolves_by_head_dim(schedule, D, expect):
    """"auto" adds dQ by TMA reductions waited for only before the next tile, at every head
    dim (ahead of the others where timed); a named schedule is taken as it is."""
    assert sdpa_bwd_gluon.resolved_schedule(schedule, D) == expect


@pytest.mark.parametrize("D,tile", [(8, 64), (40, 64), (64, 64), (72, 128), (96, 128),
                                    (128, 128), (136, 256), (192, 256), (256, 256), (4, None),
                                    (100, None), (264, None), (512, None)])
def test_gluon_head_dims_run_on_the_smallest_tile_that_holds_them(D, tile):
    """Multiples of 8 (16-byte rows, TMA's stride rule) up to 256 run on the 64-, 128- or
    256-column tile; others are not the Gluon kernels' (the Triton ones take them)."""
    assert sdpa_fwd_gluon.tile_dim(D) == tile


@pytest.mark.skipif(not sdpa_fwd_gluon.GLUON_AVAILABLE, reason="this Triton has no Gluon")
@pytest.mark.parametrize("D", [136, 256])
def test_the_256_column_tile_is_the_forwards_alone(D):
    """On the 256-column tile the forward runs its own config (64-key stages: 128-key ones
    overflow shared memory) and the Gluon backward does not apply (the Triton one runs)."""
    Z1, Z2, H, L = 1, 1, 2, 100
    q = torch.zeros(Z1, Z2, H, L, D, dtype=torch.bfloat16)
    st = tuple(q.stride())
    fwd_plan = (((Z1, Z2, H, L, D),) * 3, (st,) * 3, True, 0.1)
    fields, _, _, meta, _, _ = sdpa_fwd_gluon._prepare(q, q, q, q, torch.zeros(3, L * H), fwd_plan)
    assert (meta["HEAD_D"], meta["BLOCK_N"]) == (256, 64)
    assert [list(f["block_shape"])[-2:] for f in fields] == [[128, 256], [64, 256], [64, 256],
                                                            [64, 256]]
    assert sdpa_bwd_gluon.plan(fwd_plan, st, torch.bfloat16) is None
    assert sdpa_bwd_gluon.plan(((q.shape[:4] + (128,),) * 3,) + fwd_plan[1:], st,
                               torch.bfloat16) is not None


@pytest.mark.skipif(not sdpa_fwd_gluon.GLUON_AVAILABLE, reason="this Triton has no Gluon")
@pytest.mark.parametrize("D", [40, 96])
def test_gluon_descriptors_of_a_head_dim_between_tiles(D, monkeypatch):
    """A head dim between tiles: every descriptor's box is the tile's width over the tensor's
    own head dim (TMA reads zeros past it and clips the stores), the kernels' HEAD_D is the
    tile, and the backward is told the head dim (its dK, dV and atomic dQ row stride and
    column mask) beside a dQ descriptor over [rows, D]."""
    monkeypatch.setattr(sdpa_fwd_gluon, "_sm_count", lambda device: 132)  # the persistent grid
    tile = sdpa_fwd_gluon.tile_dim(D)
    Z1, Z2, H, L = 1, 2, 3, 200
    q = torch.zeros(Z1, Z2, H, L, D, dtype=torch.bfloat16)
    st = tuple(q.stride())
    fwd_plan = (((Z1, Z2, H, L, D),) * 3, (st,) * 3, False, 0.125)
    stats = torch.zeros(3, Z1 * Z2 * H * L)
    fields, _, _, meta, _, _ = sdpa_fwd_gluon._prepare(q, q, q, q, stats, fwd_plan)
    assert meta["HEAD_D"] == tile
    for f in fields:
        assert list(f["shape"])[-1] == D and list(f["block_shape"])[-1] == tile
    dq_sum = torch.zeros(Z1, Z2, H, L, D)
    fields, _, (ints, _, _), meta, _ = sdpa_bwd_gluon._prepare(q, q, q, q, dq_sum,
                                                            fwd_plan + (st, 0), "auto")
    assert [list(f["block_shape"])[-1] for f in fields] == [tile] * 4 + [64]
    assert list(fields[4]["shape"]) == [Z1 * Z2 * H * L, D]
    assert ints[5] == D  # HD, after Z2, HQ, GROUP, L, S
    assert meta["DQ_TMA"] is True and meta["DQ_DEFER"] is True  # "auto": tma_deferred


@pytest.mark.skipif(not sdpa_fwd_gluon.GLUON_AVAILABLE, reason="this Triton has no Gluon")
def test_the_persistent_forward_takes_one_program_an_sm_and_leaves_masks_to_the_ws_kernel(
        monkeypatch):
    """Under CONFIG's WS = PERSISTENT an unmasked call launches the persistent program on one
    program an SM where the pairs of query blocks are at least as many as the SMs, told the
    number of rows of blocks (Z1 Z2 HQ), and the one-block warp-specialized kernel where they
    are fewer (one program a block: more SMs busy); a masked call launches the
    warp-specialized kernel on the one-block grid; three consumers are refused with a
    ValueError."""
    # L 1000: 8 query blocks a row, 4 pairs
    cases = ((1000, 16, 48, True), (1000, 64, 132, True), (1000, 16, 132, False),
             (1100, 12, 60, True))
    for ws, (L, H, sms, persistent) in itertools.product(
            (sdpa_fwd_gluon.PERSISTENT, sdpa_fwd_gluon.PERSISTENT_HALF), cases):
        monkeypatch.setattr(sdpa_fwd_gluon, "CONFIG", (128, 128, 2, 4, ws))
        monkeypatch.setattr(sdpa_fwd_gluon, "_sm_count", lambda device, sms=sms: sms)
        q = torch.zeros(1, 1, H, L, 128, dtype=torch.bfloat16)
        st = tuple(q.stride())
        plan = ((q.shape,) * 3, (st,) * 3, False, 0.1)
        prepared = sdpa_fwd_gluon._prepare(q, q, q, q, torch.zeros(3, H * L), plan)
        (plain, pgrid, tail), (masked, mgrid, mtail, mmeta) = prepared[4]
        blocks = -(-L // 128)
        # the half diagonal is the persistent kernel's alone: the one-block kernels take no
        # HALF_DIAG (a launch naming it raised KeyError)
        half = persistent and ws == sdpa_fwd_gluon.PERSISTENT_HALF
        assert prepared[3].get("HALF_DIAG", False) == half
        if persistent:
            assert plain is sdpa_fwd_gluon._WS_PERSISTENT_LAUNCH and pgrid == (sms, )
            assert tail == (H, ) and prepared[1] == pgrid
        else:
            assert plain is sdpa_fwd_gluon._WS_LAUNCH and pgrid == (blocks, H) and tail == ()
        assert masked is sdpa_fwd_gluon._WS_MASKED_LAUNCH and mgrid == (blocks, H)
        assert mtail == () and "HALF_DIAG" not in mmeta
        args = sdpa_fwd_gluon.launch_args(prepared, q, q, q, q, q)
        assert args[-1 - len(tail):] == (0.1 * sdpa_fwd_gluon.LOG2E, *tail)  # qk_scale, tail
    monkeypatch.setattr(sdpa_fwd_gluon, "CONFIG", (192, 128, 2, 4, sdpa_fwd_gluon.PERSISTENT))
    with pytest.raises(ValueError, match="two consumers"):
        sdpa_fwd_gluon._prepare(q, q, q, q, torch.zeros(3, H * L), plan)


@pytest.mark.parametrize("form,ws", [("persistent", 3), ("pingpong_half", 6), ("", 5),
                                     ("bad", None)])
def test_the_persistent_form_is_read_from_the_environment(form, ws):
    """$ATTENTION_ORACLE_FAST_SDPA_FWD_FORM names the persistent program's form at the 64- and
    128-column tiles (read at import: a fresh process each); an unknown name is refused by
    name."""
    script = ("from attention_oracle.fast.kernels import sdpa_fwd_gluon as g; "
              "print(g.TILE_CONFIGS[64][4], g.TILE_CONFIGS[128][4], g.TILE_CONFIGS[256][4])")
    env = dict(os.environ, ATTENTION_ORACLE_FAST_SDPA_FWD_FORM=form)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=300)
    if ws is None:
        assert r.returncode != 0 and "ATTENTION_ORACLE_FAST_SDPA_FWD_FORM" in r.stderr, r.stderr
    else:
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.split() == [str(ws), str(ws), "True"], r.stdout


def test_gluon_backward_schedule_rejects_an_unknown_name():
    with pytest.raises(ValueError, match="must be one of"):
        sdpa_bwd_gluon.set_schedule("overlap")


@pytest.mark.skipif(not sdpa_fwd_gluon.GLUON_AVAILABLE, reason="this Triton has no Gluon")
@pytest.mark.parametrize("schedule", ["auto", *sdpa_bwd_gluon.SCHEDULES])
@pytest.mark.parametrize("D", [64, 128])
def test_gluon_backward_launch_constants_follow_the_schedule(schedule, D):
    """What a launch is given under each schedule: the split as a constexpr, the TMA
    reduction as DQ_TMA, its deferred wait as DQ_DEFER, and a dQ descriptor over dq as
    [rows, D] with [64, 64] tiles (a tile inside one head's rows: the kernel reduces only
    those by TMA)."""
    Z1, Z2, H, L = 2, 1, 3, 200
    q = torch.zeros(Z1, Z2, H, L, D, dtype=torch.bfloat16)
    st = tuple(q.stride())
    plan = (((Z1, Z2, H, L, D),) * 3, (st,) * 3, False, 0.125, st, 4096)
    dq_sum = torch.zeros(Z1, Z2, H, L, D)
    fields, grid, ints, meta, _ = sdpa_bwd_gluon._prepare(q, q, q, q, dq_sum, plan, schedule)
    split, dq_tma, dq_defer = sdpa_bwd_gluon.SCHEDULES[
        sdpa_bwd_gluon.resolved_schedule(schedule, D)]
    assert meta == dict(CAUSAL=False, SPLIT=split, DQ_TMA=dq_tma, DQ_DEFER=dq_defer,
                        SECTION=0, num_warps=4)  # a section only orders causal launches
    causal = plan[:2] + (True,) + plan[3:]
    assert sdpa_bwd_gluon._prepare(q, q, q, q, dq_sum, causal, schedule)[3]["SECTION"] == 4096
    dq_desc = fields[4]
    assert list(dq_desc["shape"]) == [Z1 * Z2 * H * L, D]
    assert list(dq_desc["strides"]) == [D, 1]
    assert list(dq_desc["block_shape"]) == [64, 64]
    assert grid == (-(-L // sdpa_bwd_gluon.BLOCK_N), Z1 * Z2 * H)


@pytest.mark.skipif(not sdpa_fwd_gluon.GLUON_AVAILABLE, reason="this Triton has no Gluon")
def test_gluon_backward_adds_dq_by_atomics_past_int32_rows(monkeypatch):
    """The TMA reduction's row coordinate is an int32: a dq of 2^31 rows or more (never
    allocated here: the plan's shapes alone) is added by atomics."""
    monkeypatch.setattr(sdpa_bwd_gluon, "TensorDescriptor", lambda *args: None)
    monkeypatch.setattr(sdpa_bwd_gluon, "_descriptor", lambda *args: None)
    monkeypatch.setattr(sdpa_bwd_gluon, "descriptor_fields", lambda descs: descs)
    big, small = (2**14, 1, 2**3, 2**14, 128), (2**14, 1, 2**3, 2**14 - 64, 128)
    for shape, tma in ((big, False), (small, True)):
        st = (1,) * 5
        plan = ((shape,) * 3, (st,) * 3, False, 0.125, st, 0)
        meta = sdpa_bwd_gluon._prepare(None, None, None, None, None, plan, "tma")[3]
        assert meta["DQ_TMA"] is tma, shape
        meta = sdpa_bwd_gluon._prepare(None, None, None, None, None, plan, "tma_deferred")[3]
        assert meta["DQ_TMA"] is tma and meta["DQ_DEFER"] is tma, shape


def test_gluon_launch_prepares_a_plan_per_device(monkeypatch):
    """Equal plans on two devices get a prepared plan each (a bound launch's compiled kernel is
    one device's), and a later call on the first device finds its own again; each call reaches
    the bound launch of its device. ``_prepare`` and the bound launch are stubbed (meta tensors
    stand in for a second device)."""
    made, fixed = [], []

    class Bound:
        def __init__(self, device):
            self.device = device

        def fixed(self, bases, tensors, rest):
            fixed.append((self.device, bases[0].device.type))

    def prepare(query, key, value, out, stats, plan):
        made.append(query.device.type)
        return (None, None, (stats.stride(0), (), (1.0, 1.0)), {}, ((None, None, ()), None),
                (Bound(query.device.type), {}))

    monkeypatch.setattr(sdpa_fwd_gluon, "_prepare", prepare)
    monkeypatch.setattr(sdpa_fwd_gluon, "_PREPARED", {})
    monkeypatch.setattr(sdpa_fwd_gluon, "_LAST", [None])
    for device in ("cpu", "meta", "cpu", "meta"):
        q = torch.empty(1, 1, 1, 16, 64, device=device)
        # equal plans, a new object each call (as the general path makes them: the launch's
        # recall of its last plan is by identity, a plan object serving one device)
        plan = ((tuple(q.shape),) * 3, (q.stride(),) * 3, False, 0.125)
        sdpa_fwd_gluon.launch(q, q, q, q, torch.empty(3, 16, device=device), plan)
    assert made == ["cpu", "meta"], made
    assert fixed == [("cpu", "cpu"), ("meta", "meta")] * 2, fixed
