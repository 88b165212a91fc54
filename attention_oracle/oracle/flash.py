"""The flash algorithm's numerics, shared by the SDPA and DSA oracles (``algorithm="flash"``).

This is the lp run of the fused kernels (FlashAttention-2 and kernels written like it): the
agreement rule measures the rounding it makes in the implementation's dtype beside the
naive math's (docs/CONTRACT.md "5. The agreement rule", docs/agreement-rule.md). In the accumulation dtype
(float32 for 16-bit inputs, else the dtype itself):

- scores ``r`` are the raw dot products q.k (float32 dot of the inputs' values), and the
  scale is folded into the exponent (FlashAttention-2, Triton's tutorial): keys are taken in
  tiles of ``TILE`` with an online row max ``m`` and sum ``l``, exponentials are
  ``exp2(fma(r, c, -fl(m * c)))`` with ``c = fl(scale * log2(e))``, and
  lse = fma(m, scale, log(l)) in natural units;
- with an additive float mask (or a scale <= 0) the scores are the scaled, masked scores in
  natural units, as kernels taking a bias add it, and they are taken to log2 units before the
  max is subtracted, as FlexAttention, xformers' memory-efficient kernel and FlashAttention-2's
  Triton bias path do: exponentials are ``exp2(fl(r * log2(e)) - fl(m * log2(e)))``, which
  rounds each score at its own magnitude (a bias of -100 costs ~100 u per score);
  lse = fl(m + log(l)). A score of ``finfo.min`` overflows to -inf in log2 units: on a row
  whose every finite score overflows (a whole row of ``finfo.min`` padding) that algorithm
  has no result, and the row is computed as kernels that get it right do, subtracting the max
  first (``exp2(fl(r - m) * log2(e))``);
- P (unnormalised, <= 1) is rounded to the dtype before the P.V product, which accumulates
  in float32; out = fl(o * fl(1 / l)), rounded once to the dtype; lse is stored as float32;
- backward: the scores are recomputed in another summation order than the forward's (the
  callers take the dot rounded once from float64: a backward GEMM is free to block the dot
  differently), and P from them and the stored lse the same way (``exp2(fma(r, c,
  -fl(lse * log2(e))))``, or ``exp2(fl(r * log2(e)) - fl(lse * log2(e)))``), so a row with one
  key has P = 1 only up to those roundings. Where the float32 lse has absorbed log(l) entirely
  (fl(m + log l) = m with l > 1: a whole row of bf16 / fp32 ``finfo.min`` biases, where P from
  the lse would be 1 per key) or the forward subtracted first, P is formed from m and log(l)
  kept apart, ``exp2(fl(fl(r - m) - log l) * log2(e))``, as a kernel that gets those rows right
  does (finding F11); Delta = rowsum(dO * O) from the rounded output,
  dS = P * (dP - Delta); dS and P are rounded to the dtype before the dq / dk / dv
  products, which accumulate in float32.

A fused multiply-add is one rounding: for float32 operands it is computed in float64 (the
product is exact there) and rounded once.

Shapes: ``r`` [..., rows, keys] with the key dim last; ``values`` [..., keys, Dv] with
leading dims broadcasting against ``r``'s (SDPA: [B, H, S, Ev]; DSA: [c, K, Dl] under
[c, H, K] scores).
"""
from __future__ import annotations

import math

import torch

ALGORITHMS = ("naive", "flash", "prescaled")   # the standard algorithms both oracles run
TILE = 64
LOG2E = math.log2(math.e)


def accumulation_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """The dtype a fused kernel accumulates in: float32 for 16-bit inputs, else the dtype."""
    return torch.float32 if compute_dtype in (torch.float16, torch.bfloat16) else compute_dtype


def lse_dtype(acc: torch.dtype) -> torch.dtype:
    """lse is stored as float32 (docs/CONTRACT.md "2. SDPA", "3. DSA sparse attention"); a float64 run keeps float64."""
    return torch.float64 if acc == torch.float64 else torch.float32


def _wide(acc: torch.dtype) -> torch.dtype:
    return torch.float64 if acc == torch.float32 else acc


def fma(a: torch.Tensor, b, c: torch.Tensor) -> torch.Tensor:
    """fl(a * b + c) with one rounding (a, c in the accumulation dtype, b a float)."""
    w = _wide(a.dtype)
    return (a.to(w) * b + c.to(w)).to(a.dtype)


def log2_scale(scale: float, acc: torch.dtype) -> float:
    """c = fl(scale * log2(e)) in the accumulation dtype, as a kernel stores it."""
    return float(torch.tensor(scale * LOG2E, dtype=acc))


def tf32_round(x: torch.Tensor) -> torch.Tensor:
    """float32 -> the nearest TF32 value (10 mantissa bits, ties away from zero: PTX
    ``cvt.rna.tf32.f32``), kept in float32; non-finite values unchanged."""
    r = ((x.view(torch.int32) + 0x1000) & -0x2000).view(torch.float32)
    return torch.where(torch.isfinite(x), r, x)


def tf32_truncate(x: torch.Tensor) -> torch.Tensor:
    """float32 -> TF32 by truncation (round toward zero), kept in float32: the top 19 bits."""
    return (x.view(torch.int32) & -0x2000).view(torch.float32)


def matmul_tf32x3(a: torch.Tensor, b: torch.Tensor, other_order: bool = False) -> torch.Tensor:
    """a @ b for float32 operands as 3xTF32 tensor cores compute it in PyTorch's fp32 EFFICIENT
    kernels (CUTLASS's ``OpMultiplyAddFastF32``: ``FastF32`` with the big part rounded toward
    zero and the small part to nearest): each operand split into big = trunc_tf32(x) and
    small = tf32(x - big), the product taken as small_a big_b + big_a small_b + big_a big_b with
    small_a small_b dropped. That errs by up to 2^-19 relative per product (the dropped term
    alone up to 2^-20, of the product's sign), where an fp32 FMA is exact. The products of TF32
    values are exact in float32; they are summed in float32 (``other_order``: the partial
    products grouped another way: another order of the same sums)."""
    a_big, b_big = tf32_truncate(a), tf32_truncate(b)
    a_small, b_small = tf32_round(a - a_big), tf32_round(b - b_big)
    # big + small is exact in float32 (at most 22 significant bits), so two matmuls hold the
    # three exact partial products (an FMA's product is exact), grouped two ways
    if other_order:
        return (a_big + a_small) @ b_big + a_big @ b_small
    return a_small @ b_big + a_big @ (b_big + b_small)


def _zero_where_neginf(t: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isneginf(t), torch.zeros_like(t), t)


class RowStats:
    """What a flash forward keeps per row for the backward besides lse (``[..., rows, 1]``, the
    accumulation dtype): the row max ``m`` (0 on empty rows), ``log_l`` and ``lost`` (rows
    computed by subtracting first, where log2 units overflow)."""

    def __init__(self, m, log_l, lost):
        self.m, self.log_l, self.lost = m, log_l, lost


def _exp2_shifted(r, shift, scale, lost=None):
    """exp(scale * (r - shift)) as the kernel computes it (``scale=None``: r is in natural
    units, taken to log2 units first; on ``lost`` rows the shift is subtracted first);
    ``shift`` is the row max or the lse, 0 where it is -inf."""
    if scale is None:
        p = torch.exp2(r * LOG2E - shift * LOG2E)
        return p if lost is None else torch.where(lost, torch.exp2((r - shift) * LOG2E), p)
    return torch.exp2(fma(r, log2_scale(scale, r.dtype), -(shift * log2_scale(scale, r.dtype))))


def forward(r: torch.Tensor, values: torch.Tensor, cd: torch.dtype, scale: float | None,
            matmul=torch.matmul):
    """Online softmax over key tiles: (out in ``cd``, lse, :class:`RowStats`). ``r`` in the
    accumulation dtype, -inf where a key takes no part: raw dots with ``scale`` the softmax
    scale, or scaled scores with ``scale=None``. A row with no key gives out = 0 and lse = -inf.
    ``matmul`` computes the P.V products (:func:`matmul_tf32x3` for the 3xTF32 member)."""
    acc = r.dtype
    lost = None
    if scale is None:  # rows whose finite scores all overflow in log2 units
        lost = (torch.isfinite(r.amax(dim=-1, keepdim=True))
                & torch.isneginf((r * LOG2E).amax(dim=-1, keepdim=True)))
    m = torch.full(r.shape[:-1] + (1,), float("-inf"), dtype=acc, device=r.device)
    l = torch.zeros_like(m)
    o = r.new_zeros(r.shape[:-1] + (values.shape[-1],))
    for j0 in range(0, r.shape[-1], TILE):
        rt = r[..., j0:j0 + TILE]
        m_new = torch.maximum(m, rt.amax(dim=-1, keepdim=True))
        m_ref = _zero_where_neginf(m_new)
        p = _exp2_shifted(rt, m_ref, scale, lost)                   # 0 where masked
        alpha = _exp2_shifted(m, m_ref, scale, lost)                # 0 before the first key
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        o = o * alpha + matmul(p.to(cd).to(acc), values[..., j0:j0 + TILE, :].to(acc))
        m = m_new
    empty = torch.isneginf(m)
    l_safe = torch.where(empty, torch.ones_like(l), l)
    out = (o * (1.0 / l_safe)).to(cd)
    lse = fma(_zero_where_neginf(m), 1.0 if scale is None else scale, torch.log(l_safe))
    lse = torch.where(empty, m, lse)
    stats = RowStats(_zero_where_neginf(m), torch.log(l_safe), lost)
    return out, lse.squeeze(-1).to(lse_dtype(acc)), stats


def probabilities(r: torch.Tensor, lse: torch.Tensor, scale: float | None,
                  stats: RowStats) -> torch.Tensor:
    """P recomputed from the stored lse (``[..., rows]``), as a flash backward does, or from m
    and log l kept apart on the rows where the lse absorbed log l (``stats`` from
    :func:`forward`); ``r`` and ``scale`` as for :func:`forward`. 0 where masked and on empty rows."""
    lse = _zero_where_neginf(lse.to(r.dtype).unsqueeze(-1))
    if scale is None:
        p = torch.exp2(r * LOG2E - lse * LOG2E)
    else:
        c = log2_scale(scale, r.dtype)
        p = torch.exp2(fma(r, c, -(lse * LOG2E)))
    apart = (lse == stats.m) & (stats.log_l > 0)
    if stats.lost is not None:
        apart = apart | stats.lost
    if not bool(apart.any()):
        return p
    if scale is None:
        exponent = ((r - stats.m) - stats.log_l) * LOG2E
    else:
        exponent = fma(r, c, -(stats.m * c)) - stats.log_l * LOG2E
    return torch.where(apart, torch.exp2(exponent), p)


def softmax_backward(p: torch.Tensor, dp: torch.Tensor, dout: torch.Tensor, out: torch.Tensor,
                     cd: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(dS, P), both rounded to ``cd`` and back to the accumulation dtype of ``p``:
    dS = P * (dP - Delta), Delta = rowsum(dO * O) with O the rounded output."""
    acc = p.dtype
    delta = (dout.to(acc) * out.to(acc)).sum(-1, keepdim=True)
    ds = p * (dp - delta)
    return ds.to(cd).to(acc), p.to(cd).to(acc)
