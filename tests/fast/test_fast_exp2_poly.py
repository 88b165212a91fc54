"""The forward's exp2 with a share on the FMA units (fast/kernels/exp2_poly.py): its error
against fp64 2**x over the domain a folded tile feeds it, and (natively) that the chosen share
of elements really takes the polynomial. The bound is the polynomial's own error in fp32
Horner; a polynomial of Taylor coefficients (ten times that error) is the negative control."""
import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from attention_oracle.fast.kernels import exp2_poly
from attention_oracle.fast.kernels.sdpa_common import interpreting

# fp32 Horner of the degree-3 minimax: 7.49e-5 measured on a 2e5-point grid of [-1/2, 1/2]
POLY_BOUND = 7.6e-5
# ex2.approx.ftz: 2 ulp (PTX ISA), well inside the polynomial's bound
DEVICE = "cpu" if interpreting() else "cuda"
needs_native = pytest.mark.skipif(interpreting() or not torch.cuda.is_available(),
                                  reason="the inline-asm mixing runs natively only (CUDA)")


@triton.jit
def _exp2_kernel(X, Y, N, EVERY: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < N, other=0.0)
    tl.store(Y + offs, exp2_poly.exp2_mixed(x, EVERY), mask=offs < N)


def _domain():
    """The inputs a folded tile gives: row max 0 down to past the fp32 normal range, every
    fractional part, and the integers and half-integers where the rounding changes j."""
    x = np.concatenate([np.linspace(-30.0, 2.0 ** -20, 1 << 16),
                        np.linspace(-140.0, -100.0, 4096),
                        np.arange(-126, 1, dtype=np.float64),
                        np.arange(-126, 0, dtype=np.float64) + 0.5])
    return torch.tensor(x, dtype=torch.float32)


def _run(x, every):
    y = torch.empty_like(x)
    n = x.numel()
    _exp2_kernel[(triton.cdiv(n, 1024),)](x, y, n, EVERY=every, BLOCK=1024)
    return y


def _relative_errors(x, y):
    """|y / 2**x - 1| where 2**x is a normal fp32 (fp64 reference); below, y must be tiny."""
    ref = np.exp2(x.double().cpu().numpy())
    got = y.double().cpu().numpy()
    normal = ref >= 2.0 ** -125
    tiny_ok = bool(np.all((got[~normal] >= 0) & (got[~normal] < 2.0 ** -124)))
    return np.abs(got[normal] / ref[normal] - 1), tiny_ok


def _horner(f, coefficients):
    p = np.float32(coefficients[-1])
    for c in coefficients[-2::-1]:
        p = (p.astype(np.float64) * f + np.float64(c)).astype(np.float32)
    return p


def test_polynomial_bound_holds_and_catches_taylor():
    """The bound is the minimax's fp32 error (measured here, not assumed); Taylor's
    coefficients break it, so the bound can fail a wrong polynomial."""
    f = np.linspace(-0.5, 0.5, 200001).astype(np.float32).astype(np.float64)
    minimax = [c.value for c in (exp2_poly.C0, exp2_poly.C1, exp2_poly.C2, exp2_poly.C3)]
    taylor = [math.log(2) ** k / math.factorial(k) for k in range(4)]
    err = np.abs(_horner(f, minimax) / np.exp2(f) - 1).max()
    assert err <= POLY_BOUND, f"minimax degree 3: {err:.3e} > {POLY_BOUND:.1e}"
    bad = np.abs(_horner(f, taylor) / np.exp2(f) - 1).max()
    assert bad > 5 * POLY_BOUND, f"Taylor degree 3 should miss the bound: {bad:.3e}"


@pytest.mark.parametrize("every", [0, 2, 4, 8])
def test_exp2_mixed_within_bound(every):
    """Every element within the polynomial's bound of 2**x; below the normal range a
    non-negative value too small for any row sum to see (never a sign-wrapped exponent)."""
    x = _domain().to(DEVICE)
    err, tiny_ok = _relative_errors(x, _run(x, every))
    assert err.max() <= POLY_BOUND, f"EVERY={every}: max relative error {err.max():.3e}"
    assert tiny_ok, f"EVERY={every}: a result below 2**-125 is negative or not tiny"


@needs_native
@pytest.mark.parametrize("every", [2, 4, 8])
def test_share_takes_polynomial(every):
    """Natively, 1/EVERY of the elements (not none, not all) differ from ex2's result."""
    x = torch.linspace(-20.0, 0.0, 1 << 16, device="cuda")
    differs = (_run(x, every) != _run(x, 0)).float().mean().item()
    assert 0.5 / every < differs <= 1.0 / every, (
        f"EVERY={every}: {differs:.3f} of the elements took the polynomial")
