"""The tensor cores' read of an fp32 operand in a tf32 product: the low 13 mantissa bits
dropped (truncation). fast's "tf32x3" dots pass each fp32 tile as its own big half on that
ground (``kernels.sdpa_common.split_tf32``); a GPU whose tf32 read rounded instead would count
part of each small half twice. Pinned here for both MMA forms Triton emits on sm_90 (``mma.sync``
for small tiles, ``wgmma`` from 64 rows a warpgroup), bit for bit; rounding to the nearest tf32
is the negative control, which must give other bits. Native only: the interpreter multiplies
fp32 values as they are."""
import pytest
import torch
import triton
import triton.language as tl

from attention_oracle.fast.kernels.sdpa_common import interpreting

pytestmark = pytest.mark.skipif(interpreting() or not torch.cuda.is_available(),
                                reason="the tensor cores' tf32 read: CUDA only")

# (M, N, K, warps): mma.sync (M 16, 32), then wgmma (64 rows a warpgroup)
SHAPES = [(16, 16, 16, 1), (32, 32, 32, 4), (64, 64, 32, 4), (128, 64, 32, 8)]


@triton.jit
def _tf32_dot(A, B, C, PREP: tl.constexpr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    """C = A @ B in tf32 with the operands as they are (PREP 0), truncated to tf32 (1) or
    rounded to the nearest tf32, ties away (2)."""
    a = tl.load(A + tl.arange(0, M)[:, None] * K + tl.arange(0, K)[None, :])
    b = tl.load(B + tl.arange(0, K)[:, None] * N + tl.arange(0, N)[None, :])
    if PREP == 1:
        a = (a.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
        b = (b.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
    elif PREP == 2:
        a = ((a.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True)
        b = ((b.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True)
    c = tl.dot(a, b, input_precision="tf32")
    tl.store(C + tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :], c)


def _product(a, b, prep, warps):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, device="cuda")
    compiled = _tf32_dot[(1,)](a, b, c, PREP=prep, M=M, N=N, K=K, num_warps=warps)
    return c, compiled.asm["ptx"]


@pytest.mark.parametrize("M,N,K,warps", SHAPES)
def test_tf32_product_reads_truncated_operands(M, N, K, warps):
    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda", generator=g)
    b = torch.randn(K, N, device="cuda", generator=g)
    raw, ptx = _product(a, b, 0, warps)
    truncated, _ = _product(a, b, 1, warps)
    rounded, _ = _product(a, b, 2, warps)
    form = "wgmma" if "wgmma" in ptx else "mma.sync" if "mma.sync" in ptx else None
    assert form is not None, f"{M}x{N}x{K}: no tensor-core product in the PTX"
    if M >= 64 and torch.cuda.get_device_capability()[0] == 9:
        assert form == "wgmma", f"{M}x{N}x{K} on sm_90 compiled to {form}, expected wgmma"
    assert torch.equal(raw, truncated), (
        f"{form} {M}x{N}x{K}: the raw fp32 product differs from the truncated one in "
        f"{(raw != truncated).sum().item()} of {raw.numel()} values (max "
        f"{(raw - truncated).abs().max().item():.3e}): the tf32 read is not truncation")
    assert not torch.equal(raw, rounded), (
        f"{form} {M}x{N}x{K}: rounding to tf32 gave the raw product's bits; the check could "
        f"not tell truncation from rounding")
