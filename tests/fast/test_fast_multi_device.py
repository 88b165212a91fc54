"""fast on tensors of a GPU that is not the current device (needs two CUDA devices; skipped
otherwise, as on CI).

Triton launches on the current device and its current stream. Every fast launch first makes
its tensors' device current (``fast.host.other_device``), so a call on ``cuda:1`` while
``cuda:0`` is current must give what the same call gives with ``cuda:1`` current: bitwise for
SDPA (deterministic), the DSA forward and index preparation; within the atomics' reordering for
the DSA backward. Without the guard the kernels would run on device 0 with device-1 pointers
(an illegal address, or a peer read of the wrong data)."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                reason="needs two CUDA devices")

OTHER = "cuda:1"


def _both_ways(fn):
    """(fn() with cuda:0 current, fn() with cuda:1 current); fn builds its inputs on cuda:1."""
    with torch.cuda.device(0):
        away = fn()
        torch.cuda.synchronize(OTHER)
    with torch.cuda.device(1):
        home = fn()
        torch.cuda.synchronize(OTHER)
    return away, home


def _sdpa_run(masked):
    from attention_oracle.fast import scaled_dot_product_attention
    gen = torch.Generator(device=OTHER).manual_seed(5)
    q, k, v, dout = (torch.randn(2, 4, 200, 64, device=OTHER, generator=gen,
                                 dtype=torch.bfloat16) for _ in range(4))
    mask = None
    if masked:
        mask = torch.zeros(200, 200, device=OTHER, dtype=torch.bfloat16)
        mask[:, 3] = float("-inf")
    leaves = [t.requires_grad_() for t in (q, k, v)]
    out = scaled_dot_product_attention(*leaves, attn_mask=mask, is_causal=not masked)
    return (out, *torch.autograd.grad(out, leaves, dout))


@pytest.mark.parametrize("masked", [False, True], ids=["plan", "masked"])
def test_sdpa_on_another_device(masked):
    away, home = _both_ways(lambda: _sdpa_run(masked))
    for name, a, h in zip(("out", "dq", "dk", "dv"), away, home):
        assert a.device == torch.device(OTHER)
        assert torch.equal(a, h), f"{name} differs when cuda:0 is current"


def _dsa_run():
    from attention_oracle.fast import dsa_sparse_attention_nope
    gen = torch.Generator(device=OTHER).manual_seed(6)
    T, H, D, S, K = 96, 16, 128, 160, 64
    q = torch.randn(T, H, D, device=OTHER, generator=gen, dtype=torch.bfloat16)
    kv = torch.randn(S, D, device=OTHER, generator=gen, dtype=torch.bfloat16)
    idx = torch.randint(-1, S, (T, K), device=OTHER, generator=gen, dtype=torch.int32)
    dout = torch.randn(T, H, D, device=OTHER, generator=gen, dtype=torch.bfloat16)
    leaves = [t.requires_grad_() for t in (q, kv)]
    out = dsa_sparse_attention_nope(*leaves, idx)
    return (out, *torch.autograd.grad(out, leaves, dout))


def test_dsa_on_another_device():
    (out_a, dq_a, dkv_a), (out_h, dq_h, dkv_h) = _both_ways(_dsa_run)
    assert torch.equal(out_a, out_h), "out differs when cuda:0 is current"
    assert torch.equal(dq_a, dq_h), "dq differs when cuda:0 is current"
    # dkv sums slots with fp32 atomics: their order may differ between two runs
    torch.testing.assert_close(dkv_a.float(), dkv_h.float(), rtol=2e-2, atol=2e-2)


def _index_run():
    from attention_oracle.fast import offset_gather_kv_indices
    gen = torch.Generator(device=OTHER).manual_seed(7)
    cu = torch.tensor([0, 100, 250, 256], device=OTHER, dtype=torch.int32)
    local = torch.randint(-1, 6, (256, 32), device=OTHER, generator=gen, dtype=torch.int32)
    return offset_gather_kv_indices(local, cu, cu, causal=True)


def test_index_preparation_on_another_device():
    away, home = _both_ways(_index_run)
    for a, h in zip(away if isinstance(away, tuple) else (away,),
                    home if isinstance(home, tuple) else (home,)):
        assert torch.equal(a, h), "index preparation differs when cuda:0 is current"
