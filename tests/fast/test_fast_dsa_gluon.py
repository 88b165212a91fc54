"""The Gluon (Hopper) DSA forward and backward (fast/kernels/dsa_fwd_gluon.py,
dsa_bwd_gluon.py) against the float64 oracle.

GPU-only: Gluon does not run under Triton's CPU interpreter, so CI skips the kernel cases
(the launch rule, :func:`dsa_fwd_gluon.applies`, is checked everywhere). Every case goes
through the DSA smoke tests' ``check_case``: the suite's agreement rule on out, lse and
every gradient (through the Triton backward, or the Gluon one where a case names it). Each case
asserts the Gluon kernel really ran; the ``test_planted_wrong_scale_*`` tests are the negative
controls.
"""
import contextlib

import pytest
import torch

import attention_oracle.fast.dsa as fdsa
from attention_oracle.fast.kernels import dsa_bwd_gluon, dsa_fwd_gluon
from tests.fast.test_fast_dsa_smoke import assert_empty_rows_exact, check_case, make_case

ON_SM90 = (torch.cuda.is_available() and dsa_fwd_gluon.GLUON_AVAILABLE
           and torch.cuda.get_device_capability() == (9, 0))
gpu = pytest.mark.skipif(not ON_SM90, reason="the Gluon DSA forward needs an sm_90 GPU "
                         "(Gluon does not run under Triton's CPU interpreter)")


@contextlib.contextmanager
def gluon_forward(monkeypatch, scale_error=1.0, config=dsa_fwd_gluon.CONFIG):
    """The "gluon" backend for the block with tile ``config``, counting its launches;
    ``scale_error`` plants a wrong softmax scale in them (the negative control)."""
    calls = []
    launch = dsa_fwd_gluon.launch
    monkeypatch.setattr(dsa_fwd_gluon, "CONFIG", config)

    def counted(q, q_rope, kv, k_rope, indices, topk_length, scale, out, lse):
        calls.append(q.shape)
        launch(q, q_rope, kv, k_rope, indices, topk_length, scale * scale_error, out, lse)

    monkeypatch.setattr(dsa_fwd_gluon, "launch", counted)
    # this block's build judged alone: a failure latched by an earlier test would run the
    # Triton kernel here and fail this test on its account
    monkeypatch.setattr(fdsa.GLUON_FWD, "failure", None)
    previous = fdsa.set_forward_backend("gluon")
    try:
        yield calls
    finally:
        fdsa.set_forward_backend(previous)
    assert fdsa.GLUON_FWD.failure is None, fdsa.GLUON_FWD.failure


@contextlib.contextmanager
def gluon_backward(monkeypatch, scale_error=1.0):
    """The "gluon" backward backend for the block, counting its launches; ``scale_error``
    plants a wrong softmax scale in them (the negative control)."""
    calls = []
    launch = dsa_bwd_gluon.launch

    def counted(q, q_rope, kv, k_rope, indices, topk_length, out, lse, dout, scale, *grads):
        calls.append(q.shape)
        launch(q, q_rope, kv, k_rope, indices, topk_length, out, lse, dout, scale * scale_error,
               *grads)

    monkeypatch.setattr(dsa_bwd_gluon, "launch", counted)
    monkeypatch.setattr(fdsa.GLUON_BWD, "failure", None)  # judged alone, as above
    previous = fdsa.set_backward_backend("gluon")
    try:
        yield calls
    finally:
        fdsa.set_backward_backend(previous)
    assert fdsa.GLUON_BWD.failure is None, fdsa.GLUON_BWD.failure


CASES = {
    # name: (T, H, DR, S, K, hole rate, topk_length)
    "production": (24, 64, 64, 3000, 2048, 0.3, True),
    "two_head_blocks": (6, 128, 64, 700, 300, 0.2, True),
    "odd_block_count": (9, 64, 64, 500, 100, 0.1, False),
    "one_slot": (5, 64, 64, 50, 1, 0.0, False),
    "tile_edge_plus_one": (7, 64, 64, 400, 129, 0.25, True),
    "nope": (10, 64, 0, 900, 640, 0.3, True),
    "all_holes": (4, 64, 64, 80, 192, 1.0, False),
}


def trainer_layout(c, dtype):
    """The case's inputs in ``dtype`` as a trainer lays them out (benchmarks.dsa): key rows
    packed in one [S, 576] buffer, q_rope the 192:256 channel slice of a [T, H, 256] buffer;
    check_case keeps tensors already in its dtype as they are (strides included)."""
    c = dict(c)
    S, DL = c["kv"].shape
    keys = torch.empty(S, DL + 64, dtype=dtype, device="cuda")
    keys[:, :DL], keys[:, DL:] = c["kv"], c["kr"]
    qbuf = torch.empty(*c["qr"].shape[:2], 256, dtype=dtype, device="cuda")
    qbuf[:, :, 192:] = c["qr"]
    c.update(q=c["q"].to(dtype), qr=qbuf[:, :, 192:], kv=keys[:, :DL], kr=keys[:, DL:])
    return c


@gpu
@pytest.mark.parametrize("config", dsa_fwd_gluon.CONFIGS, ids=lambda c: f"{c[0]}x{c[1]}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(CASES))
def test_gluon_forward_agrees(name, dtype, config, monkeypatch):
    T, H, DR, S, K, holes, with_len = CASES[name]
    c = make_case(T=T, H=H, DL=512, DR=DR, S=S, K=K, dtype=dtype, seed=list(CASES).index(name),
                  hole_rate=holes, with_len=with_len)
    if DR:
        c = trainer_layout(c, dtype)
    with gluon_forward(monkeypatch, config=config) as calls:
        out, lse, grads = check_case(c, dout_layout="head_major")
    assert calls, "the Gluon forward did not run"
    assert_empty_rows_exact(c, out, lse, grads)


@gpu
def test_gluon_forward_int64_topk_length_past_int32(monkeypatch):
    """int64 lengths past int32 (docs/FINDINGS.md F30): clamped before they are narrowed."""
    from attention_oracle.checks.dsa.edges import wide_lengths
    c = make_case(T=8, H=64, DL=512, DR=64, S=400, K=200, dtype=torch.bfloat16, seed=9,
                  with_len=True)
    c = trainer_layout(c, torch.bfloat16)
    c["topk_length"] = wide_lengths(c["topk_length"], 8, 200)
    with gluon_forward(monkeypatch) as calls:
        out, lse, grads = check_case(c)
    assert calls, "the Gluon forward did not run"
    assert_empty_rows_exact(c, out, lse, grads)


@gpu
def test_misaligned_rows_fall_back_to_triton(monkeypatch):
    """check_case's packed layout (a [S, 581] key buffer, q_rope at channel 7): no 16-element
    strides, so the Triton forward runs, and agrees."""
    c = make_case(T=5, H=64, DL=512, DR=64, S=200, K=150, dtype=torch.bfloat16, seed=11,
                  with_len=True)
    with gluon_forward(monkeypatch) as calls:
        check_case(c, packed=True)
    assert not calls


@gpu
def test_gluon_forward_int64_indices_and_strided_q(monkeypatch):
    c = make_case(T=6, H=64, DL=512, DR=64, S=300, K=200, dtype=torch.bfloat16, seed=7,
                  hole_rate=0.2, with_len=True)
    wide = torch.zeros(c["q"].shape[0], 64, 640, dtype=torch.bfloat16, device="cuda")
    wide[:, :, 64:576] = c["q"]
    c["q"] = wide[:, :, 64:576]  # row stride 640, 16-byte aligned rows
    with gluon_forward(monkeypatch) as calls:
        check_case(c, idx=c["idx"].long())
    assert calls, "the Gluon forward did not run"


@gpu
@pytest.mark.parametrize("config", dsa_fwd_gluon.CONFIGS, ids=lambda c: f"{c[0]}x{c[1]}")
def test_planted_wrong_scale_is_caught(config, monkeypatch):
    """A kernel that forgets log2(e) in its score scale (exp2 of natural-unit scores)."""
    c = make_case(T=8, H=64, DL=512, DR=64, S=500, K=256, dtype=torch.bfloat16, seed=3)
    with gluon_forward(monkeypatch, scale_error=1 / dsa_fwd_gluon.LOG2E,
                       config=config) as calls:
        with pytest.raises(AssertionError):
            check_case(c)
    assert calls, "the Gluon forward did not run"


@gpu
@pytest.mark.parametrize("dout_layout", [None, "head_major"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(CASES))
def test_gluon_backward_agrees(name, dtype, dout_layout, monkeypatch):
    """Both Gluon kernels, as production runs them: every gradient under the rule."""
    T, H, DR, S, K, holes, with_len = CASES[name]
    c = make_case(T=T, H=H, DL=512, DR=DR, S=S, K=K, dtype=dtype, seed=list(CASES).index(name),
                  hole_rate=holes, with_len=with_len)
    if DR:
        c = trainer_layout(c, dtype)
    with gluon_forward(monkeypatch), gluon_backward(monkeypatch) as calls:
        out, lse, grads = check_case(c, dout_layout=dout_layout)
    assert calls, "the Gluon backward did not run"
    assert_empty_rows_exact(c, out, lse, grads)


@gpu
@pytest.mark.parametrize("order", ["on", "backward"])
@pytest.mark.parametrize("name", ["production", "two_head_blocks", "nope", "all_holes"])
def test_gluon_kernels_on_ordered_slots(name, order, monkeypatch):
    """Both Gluon kernels on rows in the slot order (fast.dsa.slot_order; every call ordered
    here: the size floors at 0, 5 programs a rotation), every gradient under the rule."""
    monkeypatch.setattr(fdsa, "ORDER_MIN_SLOTS", 0)
    monkeypatch.setattr(fdsa, "ORDER_MIN_KEY_BYTES", 0)
    monkeypatch.setattr(fdsa, "ORDER_CONCURRENCY", 5)
    T, H, DR, S, K, holes, with_len = CASES[name]
    c = make_case(T=T, H=H, DL=512, DR=DR, S=S, K=K, dtype=torch.bfloat16,
                  seed=list(CASES).index(name), hole_rate=holes, with_len=with_len)
    if DR:
        c = trainer_layout(c, torch.bfloat16)
    previous = fdsa.set_slot_order(order)
    try:
        with gluon_forward(monkeypatch) as fwd_calls, gluon_backward(monkeypatch) as calls:
            out, lse, grads = check_case(c, dout_layout="head_major")
    finally:
        fdsa.set_slot_order(previous)
    assert fwd_calls and calls, "a Gluon kernel did not run"
    assert_empty_rows_exact(c, out, lse, grads)


@gpu
def test_gluon_backward_duplicates_int64_indices_and_broadcast_dout(monkeypatch):
    """Every slot of a row naming one key (its gradient the sum of all of them), int64
    indices and lengths past int32, a stride-0 dout."""
    from attention_oracle.checks.dsa.edges import wide_lengths
    c = make_case(T=6, H=64, DL=512, DR=64, S=300, K=200, dtype=torch.bfloat16, seed=5,
                  with_len=True)
    c = trainer_layout(c, torch.bfloat16)
    c["idx"][2] = 17
    c["topk_length"] = wide_lengths(c["topk_length"], 6, 200)
    with gluon_backward(monkeypatch) as calls:
        check_case(c, idx=c["idx"].long(), dout_layout="stride0")
    assert calls, "the Gluon backward did not run"


@gpu
def test_planted_wrong_scale_in_the_backward_is_caught(monkeypatch):
    """A backward that forgets log2(e) in its score scale."""
    c = make_case(T=8, H=64, DL=512, DR=64, S=500, K=256, dtype=torch.bfloat16, seed=3)
    with gluon_backward(monkeypatch, scale_error=1 / dsa_bwd_gluon.LOG2E) as calls:
        with pytest.raises(AssertionError):
            check_case(c)
    assert calls, "the Gluon backward did not run"


@gpu
@pytest.mark.parametrize("ahead", [1, 2])
@pytest.mark.parametrize("name", ["production", "tile_edge_plus_one", "nope", "all_holes"])
def test_l2_prefetch_changes_no_value(name, ahead, monkeypatch):
    """Asking the L2 for key rows ahead of their gather (PREFETCH, blocks or pairs ahead) moves
    no value: out, lse and dq are bitwise those without it (the key gradients are atomics, in
    any order, so only the rule judges them), and every output passes the rule."""
    T, H, DR, S, K, holes, with_len = CASES[name]
    c = make_case(T=T, H=H, DL=512, DR=DR, S=S, K=K, dtype=torch.bfloat16,
                  seed=list(CASES).index(name), hole_rate=holes, with_len=with_len)
    if DR:
        c = trainer_layout(c, torch.bfloat16)
    results = []
    for prefetch in (0, ahead):
        monkeypatch.setattr(dsa_fwd_gluon, "PREFETCH", prefetch)
        monkeypatch.setattr(dsa_bwd_gluon, "PREFETCH", prefetch)
        with gluon_forward(monkeypatch) as fwd_calls, gluon_backward(monkeypatch) as bwd_calls:
            results.append(check_case(c))
        assert fwd_calls and bwd_calls, "a Gluon kernel did not run"
    (out0, lse0, grads0), (out1, lse1, grads1) = results
    assert torch.equal(out1, out0) and torch.equal(lse1, lse0), "out or lse moved"
    assert torch.equal(grads1[0], grads0[0]), "dq moved"


def _tensors(T=3, H=64, DL=512, DR=64, S=10, K=8, dtype=torch.bfloat16, device="cpu"):
    q = torch.zeros(T, H, DL, dtype=dtype, device=device)
    qr = torch.zeros(T, H, DR, dtype=dtype, device=device) if DR else None
    kv = torch.zeros(S, DL, dtype=dtype, device=device)
    kr = torch.zeros(S, DR, dtype=dtype, device=device) if DR else None
    return q, qr, kv, kr, torch.zeros(T, K, dtype=torch.int32, device=device)


def test_applies_only_where_the_kernel_can():
    """The launch rule on every machine: never off sm_90 (the CPU here), never fp32, other
    head counts, latents or rope widths, or rows cp.async cannot move in 16-byte pieces."""
    assert not dsa_fwd_gluon.applies(*_tensors())  # a CPU tensor
    if not ON_SM90:
        return
    assert dsa_fwd_gluon.applies(*_tensors(device="cuda"))
    assert dsa_fwd_gluon.applies(*_tensors(DR=0, device="cuda"))
    assert not dsa_fwd_gluon.applies(*_tensors(dtype=torch.float32, device="cuda"))
    assert not dsa_fwd_gluon.applies(*_tensors(H=32, device="cuda"))
    assert not dsa_fwd_gluon.applies(*_tensors(DL=256, device="cuda"))
    assert not dsa_fwd_gluon.applies(*_tensors(DR=32, device="cuda"))
    q, qr, kv, kr, idx = _tensors(device="cuda")
    unaligned = torch.zeros(3 * 64 * 512 + 4, dtype=torch.bfloat16, device="cuda")[4:]
    assert not dsa_fwd_gluon.applies(unaligned.view(3, 64, 512), qr, kv, kr, idx)
    wide_rows = torch.zeros(10, 528, dtype=torch.bfloat16, device="cuda")[:, :512]
    assert dsa_fwd_gluon.applies(q, qr, wide_rows, kr, idx)  # row stride 528 = 16 x 33
    for stride in (520, 515):  # 16-byte rows, but not a multiple of 16 elements; unaligned
        odd_rows = torch.zeros(10, stride, dtype=torch.bfloat16, device="cuda")[:, :512]
        assert not dsa_fwd_gluon.applies(q, qr, odd_rows, kr, idx)


def test_dispatch_keeps_triton_for_an_asked_tile(monkeypatch):
    """On every machine (the kernel stubbed): the "gluon" backend takes a call where the kernel
    applies, "triton" never, and a Triton tile put first by ``set_configs`` keeps the Triton
    forward (so tile sweeps time the tile they name)."""
    calls = []
    monkeypatch.setattr(dsa_fwd_gluon, "applies", lambda *args: True)
    monkeypatch.setattr(dsa_fwd_gluon, "launch", lambda *args: calls.append(args[0].shape))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, qr, kv, kr, idx = _tensors(T=2, H=2, DL=16, DR=8, S=5, K=4, dtype=torch.float16,
                                  device=device)
    previous = fdsa.set_forward_backend("gluon")
    try:
        fdsa.dsa_sparse_attention(q, qr, kv, kr, idx)
        assert len(calls) == 1
        fdsa.set_configs(forward=fdsa.candidate_configs(2, 16, backward=False,
                                                        device_type=device)[0])
        fdsa.dsa_sparse_attention(q, qr, kv, kr, idx)
        fdsa.set_configs()
        fdsa.set_forward_backend("triton")
        fdsa.dsa_sparse_attention(q, qr, kv, kr, idx)
        assert len(calls) == 1
    finally:
        fdsa.set_configs()
        fdsa.set_forward_backend(previous)


def test_backward_dispatch(monkeypatch):
    """On every machine (the kernel stubbed): the "gluon" backward backend takes a call where
    the kernel applies, "triton" never, and a Triton tile put first by ``set_configs`` keeps
    the Triton backward."""
    calls = []
    monkeypatch.setattr(dsa_bwd_gluon, "applies", lambda *args: True)
    monkeypatch.setattr(dsa_bwd_gluon, "launch", lambda *args: calls.append(args[0].shape))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, qr, kv, kr, idx = _tensors(T=2, H=2, DL=16, DR=8, S=5, K=4, dtype=torch.float16,
                                  device=device)
    leaves = [x.requires_grad_(True) for x in (q, qr, kv, kr)]

    def step():
        out = fdsa.dsa_sparse_attention(*leaves, idx)
        torch.autograd.grad(out.float().sum(), leaves)

    previous = fdsa.set_backward_backend("gluon")
    try:
        step()
        assert len(calls) == 1
        fdsa.set_configs(backward=fdsa.candidate_configs(2, 16, backward=True,
                                                         device_type=device)[0])
        step()
        fdsa.set_configs()
        fdsa.set_backward_backend("triton")
        step()
        assert len(calls) == 1
    finally:
        fdsa.set_configs()
        fdsa.set_backward_backend(previous)


def test_backward_applies_off_sm90_never():
    q, qr, kv, kr, idx = _tensors()
    assert not dsa_bwd_gluon.applies(q, qr, kv, kr, idx, q, q)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_a_gluon_kernel_that_does_not_build_falls_back(direction, monkeypatch):
    """On every machine (the kernel stubbed to fail as a build does): the call returns the
    Triton kernel's result (the output, or the gradients: the default backward is Gluon's),
    with one warning, and later calls skip the Gluon kernel; the stub really was called."""
    from triton.runtime.errors import OutOfResources
    attempts = []

    def fails(*args):
        attempts.append(args[0].shape)
        raise OutOfResources(300000, 232448, "shared memory")

    kernel, guard, set_backend = {
        "forward": (dsa_fwd_gluon, "GLUON_FWD", fdsa.set_forward_backend),
        "backward": (dsa_bwd_gluon, "GLUON_BWD", fdsa.set_backward_backend)}[direction]
    monkeypatch.setattr(kernel, "applies", lambda *args: True)
    monkeypatch.setattr(kernel, "launch", fails)
    monkeypatch.setattr(fdsa, guard, fdsa.BuildGuard("the stub"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, qr, kv, kr, idx = _tensors(T=2, H=2, DL=16, DR=8, S=5, K=4, dtype=torch.float16,
                                  device=device)
    q.normal_()
    kv.normal_()
    leaves = [x.requires_grad_(direction == "backward") for x in (q, qr, kv, kr)]

    def result():
        out = fdsa.dsa_sparse_attention(*leaves, idx)
        if direction == "forward":
            return (out,)
        return torch.autograd.grad(out.float().sum(), leaves)

    previous = set_backend("triton")
    try:
        want = result()
        set_backend("gluon")
        with pytest.warns(RuntimeWarning, match="the stub failed to build"):
            got = result()
        again = result()
    finally:
        set_backend(previous)
    assert len(attempts) == 1
    # the same bits forward; the backward's key gradients add atomically, in any order
    tolerance = {"rtol": 0, "atol": 0} if direction == "forward" else {}
    for w, g, a in zip(want, got, again):
        torch.testing.assert_close(g, w, **tolerance)
        torch.testing.assert_close(a, w, **tolerance)


def test_the_gluon_backward_is_the_default():
    """Where no environment variable chooses, the 16-bit backward backend is "gluon"."""
    import os
    if os.environ.get("ATTENTION_ORACLE_FAST_DSA_BWD"):
        pytest.skip("ATTENTION_ORACLE_FAST_DSA_BWD chooses the backend in this process")
    assert fdsa.settings()["backward_backend"] == "gluon"


@pytest.mark.parametrize("value, expected", [("", 0), ("0", 0), ("1", 1), ("2", 2), ("4", 4),
                                             ("5", 0), ("-1", 0), ("two", 0)])
def test_prefetch_count_from_the_environment(value, expected, monkeypatch):
    """$ATTENTION_ORACLE_FAST_DSA_PREFETCH: a small count of blocks ahead, else none (a
    mistyped value leaves the kernels as they are rather than failing the import)."""
    monkeypatch.setenv("ATTENTION_ORACLE_FAST_DSA_PREFETCH", value)
    assert dsa_fwd_gluon.blocks_ahead() == expected
