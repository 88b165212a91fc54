"""2**x with a share of the elements on the FMA units instead of the MUFU (special function)
unit: the Triton forward's EXP2_POLY constexpr, 0 (off) in every launch fast makes
(``benchmarks.sdpa_fwd_tune`` times the others).

At head dim 64 an H100 SM's MUFU makes 16 ``ex2`` a clock and its tensor cores the two products
of 16 scores (4096 FLOP / 4 D), so the exponentials could take as long as the matmuls.
:func:`exp2_mixed` sends one element of every ``EVERY`` to a polynomial on the FMA pipe
(Cody-Waite: x = j + f with j = rint(x), f in [-1/2, 1/2]; 2**f by a degree-3 polynomial;
2**j added to the exponent bits), as FlashAttention 4 does on Blackwell. On an H100 it made the
D 64 Triton forward slower, the more the larger the share (docs/FINDINGS.md F83): that kernel
is bound by issuing instructions, not by the MUFU.

Domain: finite x <= 2**-20 (a folded score minus its row max); x below -126 gives a positive
value below 2**-125 instead of ex2's 0, which no row sum can see. The polynomial's relative
error is at most 7.5e-5 (fp32 Horner, measured over [-1/2, 1/2] in ``tests``), a fifth of an
fp16 P's rounding (2**-11 = 4.9e-4) and under a twentieth of bf16's. ``-inf`` (a masked score)
is outside the domain: only tiles with nothing masked call this.

Natively the mixing is one inline-asm block per ``EVERY`` consecutive elements of a thread.
Triton's CPU interpreter runs no inline asm; there every element takes the polynomial (the
worst case for accuracy), written in plain ``tl`` operations.
"""
import struct

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# the degree-3 coefficients of 2**f on [-1/2, 1/2] (relative-error minimax, fp32)
C0 = tl.constexpr(0.9999281167984009)
C1 = tl.constexpr(0.6932609677314758)
C2 = tl.constexpr(0.24261054396629333)
C3 = tl.constexpr(0.05517132207751274)
# 1.5 * 2**23: x + ROUNDER rounds x to an integer kept in the low mantissa bits
ROUNDER = tl.constexpr(12582912.0)
LOWEST = tl.constexpr(-126.0)


def _ptx_float(x: float) -> str:
    """An fp32 constant as PTX writes it (0f and the 8 hex digits of its bits)."""
    return "0f" + struct.pack(">f", x).hex().upper()


def _asm(every: int) -> str:
    """PTX for ``every`` elements: ex2 on the first ``every - 1``, the polynomial on the last."""
    lines = ["{", ".reg .f32 px, pt, pj, pf, pp;", ".reg .b32 pi, pe;"]
    lines += [f"ex2.approx.ftz.f32 ${i}, ${every + i};" for i in range(every - 1)]
    c0, c1, c2, c3 = (_ptx_float(c.value) for c in (C0, C1, C2, C3))
    lowest, rounder = _ptx_float(LOWEST.value), _ptx_float(ROUNDER.value)
    lines += [f"max.f32 px, ${2 * every - 1}, {lowest};",
              f"add.rn.f32 pt, px, {rounder};",
              f"sub.rn.f32 pj, pt, {rounder};",
              "sub.rn.f32 pf, px, pj;",
              f"fma.rn.f32 pp, pf, {c3}, {c2};",
              f"fma.rn.f32 pp, pp, pf, {c1};",
              f"fma.rn.f32 pp, pp, pf, {c0};",
              "mov.b32 pi, pt;",
              "shl.b32 pi, pi, 23;",
              "mov.b32 pe, pp;",
              "add.s32 pe, pe, pi;",
              f"mov.b32 ${every - 1}, pe;",
              "}"]
    return "\n".join(lines)


def _constraints(every: int) -> str:
    return ",".join(["=r"] * every + ["r"] * every)


ASM2, ASM4, ASM8 = (tl.constexpr(_asm(e)) for e in (2, 4, 8))
ARGS2, ARGS4, ARGS8 = (tl.constexpr(_constraints(e)) for e in (2, 4, 8))


@triton.jit
def exp2_poly(x):
    """2**x by the polynomial alone, in plain ``tl`` operations (the interpreter's form)."""
    x = tl.maximum(x, LOWEST)
    t = x + ROUNDER
    f = x - (t - ROUNDER)
    p = tl.fma(tl.fma(tl.fma(f, C3, C2), f, C1), f, C0)
    return (p.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)).to(
        tl.float32, bitcast=True)


@triton.jit
def _exp2_mixed_native(x, EVERY: tl.constexpr):
    if EVERY == 2:
        return tl.inline_asm_elementwise(ASM2, ARGS2, [x], dtype=tl.float32, is_pure=True, pack=2)
    elif EVERY == 4:
        return tl.inline_asm_elementwise(ASM4, ARGS4, [x], dtype=tl.float32, is_pure=True, pack=4)
    elif EVERY == 8:
        return tl.inline_asm_elementwise(ASM8, ARGS8, [x], dtype=tl.float32, is_pure=True, pack=8)
    else:
        return tl.math.exp2(x)


@triton.jit
def _exp2_mixed_interpreted(x, EVERY: tl.constexpr):
    if EVERY == 0:
        return tl.math.exp2(x)
    else:
        return exp2_poly(x)


# 2**x of fp32 x (the module docstring's domain), one element of every EVERY (0: none; 2, 4 or 8)
# by the polynomial
exp2_mixed = (_exp2_mixed_interpreted if isinstance(_exp2_mixed_native, InterpretedFunction)
              else _exp2_mixed_native)
