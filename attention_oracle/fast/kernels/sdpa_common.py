"""Shared pieces of the SDPA Triton kernels: batch decomposition, masks, autotune helpers.

Every SDPA kernel sees its tensors as rank-5 views ``[Z1, Z2, H, rows, cols]`` described by
five strides each; any stride may be 0 (broadcast) and none needs to be 1.

Score units (constexpr ``NATURAL``, chosen from the dtype by the launcher):

* fp32 (``NATURAL=True``): scores in natural units, ``s = fl(q.k * scale) + additive_mask``,
  one rounding (from an fp64-accumulated dot, see ``dot_nt_f64``); the softmax subtracts the
  running row max of ``s`` and exponentiates in fp64 (``softmax_exp``), ``log(l)`` in fp64 is
  kept as fp32 hi + lo, and the output is divided with IEEE round-to-nearest (``div_rn``).
* fp16/bf16 and fp32 "plain" (``NATURAL=False``): the hardware ``ex2.approx``. Without an
  additive mask the scores are in log2 units (``s2 = fl(scale * log2(e)) * q.k``); with one
  (``MASK_KIND == MASK_ADD``) they stay natural, ``s = fl(scale) * q.k + mask``, and the
  exponent is ``(s - m) * log2(e)``: ``log2(e) * finfo.min`` overflows fp32 to -inf, which
  would turn a row whose every key carries a ``finfo.min`` bias into an empty one. Their
  rule's bound is ~2^13 times looser, and this path is the fast one.

Saved row statistics (``STATS_*`` rows of one float32 buffer ``[R, Z1*Z2*HQ*L]``, row stride
``s_stat``): the row max ``m`` (in the scores' units; +inf for a row with no key, so the
backward's P is exactly 0), ``log l`` (natural for fp32, log2 otherwise; 0 for a row with no
key), the public natural-log lse (-inf for a row with no key) and, for fp32, the rounding
error of ``log l`` (R = 4; else R = 3). m and log l are kept apart because on a row whose every
key carries a ``finfo.min`` bias, ``m + log l`` rounds to m (even in fp64) and a P recomputed
as ``exp(s - lse)`` would be 1 per key instead of 1 / l (docs/FINDINGS.md F11); the backward forms
``P = exp((s - m) - log l)``.

Why (docs/FINDINGS.md F5): in fp32 the rule allows about two of the naive math's roundings.
The log2 path multiplies by ``fl(scale*log2e)`` (a rounding the naive math does not make when
the scale is exact), returns ``lse2 * ln2`` (another one), and on the GPU ``ex2.approx.f32``
(~2 ulp) and the ``x * log2e`` product inside ``tl.exp`` (a relative error of |x| ulps in
exp(x)) add more; together they exceeded the bound on single-key rows and small head dims.
"""
import os

import triton
import triton.language as tl
import triton.testing

from ..host import next_pow2
from ..launch import BoundLaunch, DirectLauncher, on_device_of
from .accurate_math import exp_accurate, log_accurate

LOG2E = 1.4426950408889634
# the least scale * log2(e) the log2-unit (folded) kernels take: float32's least normal number,
# since a masked tile multiplies a -inf by it (docs/FINDINGS.md F93)
MIN_QK_SCALE = 2.0 ** -126
LN2 = 0.6931471805599453

MASK_NONE = 0
MASK_BOOL = 1
MASK_ADD = 2

# rows of the saved row statistics (module docstring)
STATS_M = 0
STATS_LOG_L = 1
STATS_LSE = 2
STATS_LOG_L_LO = 3


def stats_rows(natural: bool) -> int:
    """Rows of the saved statistics: m, log l, lse, and log l's rounding error for fp32."""
    return 4 if natural else 3


def score_count(q_shape, k_shape, is_causal) -> int:
    """Score elements a call of these rank-5 shapes (broadcast dims included) computes, half
    under causal: the size the "auto" backends' rules are stated in."""
    n = q_shape[-2] * k_shape[-2]
    for d in q_shape[:-2]:
        n *= d
    return n >> 1 if is_causal else n


def interpreting() -> bool:
    """True under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def autotune_enabled() -> bool:
    """Autotune on GPU unless SDPA_AUTOTUNE=0; the interpreter always uses one config."""
    return not interpreting() and os.environ.get("SDPA_AUTOTUNE", "1") != "0"


def tune_bucket(n: int) -> int:
    """Sequence-length bucket used as autotune key (powers of two, capped), so that
    every distinct length does not trigger a fresh tuning run."""
    return min(next_pow2(max(int(n), 1)), 16384)


def tune_heads(n: int, tune_l: int) -> int:
    """The autotune key's bucket of a call's query heads in all (Z1 * Z2 * HQ, powers of two),
    capped where the grid holds ~1024 blocks of 128 query rows (about eight waves on 132 SMs),
    past which the tiles rank alike: a tile tuned on a grid of a few programs (a test's two
    sequences of three heads) is not kept for a call of many waves (docs/FINDINGS.md F95)."""
    return min(next_pow2(max(int(n), 1)), max(1, (1 << 17) // tune_l))


def smem_bytes(block_rows_pipelined, block_rows_resident, block_e, block_ev, elsize, stages):
    """Rough shared-memory need of a flash-attention tile loop (for config pruning)."""
    streamed = block_rows_pipelined * (block_e + block_ev) * elsize * stages
    resident = block_rows_resident * max(block_e, block_ev) * elsize
    return streamed + resident


def smem_bytes_tf32x3(block_rows_pipelined, block_rows_resident, resident_cols, block_e,
                      block_ev, stages):
    """Shared memory of an fp32 tile loop with tf32x3 dots: the streamed tiles per stage plus
    the resident operands twice (their big and small halves). Matches offline sm_90 compiles
    within 0.2% (``python -m attention_oracle.fast.kernels.sdpa_probe``, docs/DESIGN.md "10. fast SDPA (Triton)"),
    and the device's 393984 B for dK/dV at D 128, 64 x 128 x 2 stages."""
    streamed = block_rows_pipelined * (block_e + block_ev) * 4 * stages
    return streamed + 2 * block_rows_resident * resident_cols * 4


SMEM_LIMIT = 220 * 1024


# The fp32 path evaluates exp and log in fp64 and rounds once to fp32 (within about half an
# fp32 ulp): fp32 libraries are not that close (numpy's SIMD float32 exp / log under the
# interpreter, CUDA's expf, fp32 tl.exp's ex2.approx natively). See accurate_math.
exp64 = exp_accurate
log64 = log_accurate


@triton.jit
def softmax_exp(a, b, NATURAL: tl.constexpr, MASK_KIND: tl.constexpr):
    """exp(a - b) of scores in the kernel's units (module docstring): fp32 difference and exp
    in fp64, one rounding to fp32 (NATURAL); natural-unit scores with the fast exp2 (16-bit with
    an additive mask); 2**(a - b) of log2-unit scores (16-bit otherwise)."""
    if NATURAL:
        return exp64(a.to(tl.float64) - b.to(tl.float64)).to(tl.float32)
    elif MASK_KIND == 2:
        return tl.math.exp2((a - b) * 1.4426950408889634)
    else:
        return tl.math.exp2(a - b)


@triton.jit
def recompute_p(s, m, log_l, log_l_lo, NATURAL: tl.constexpr, MASK_KIND: tl.constexpr):
    """The backward's P = exp((s - m) - log l) from the saved statistics, broadcast by the
    caller (``m`` = +inf on rows with no key gives P = 0). fp32: in fp64 with log l = hi + lo;
    16-bit: log l in log2 units, s - m in the scores' units."""
    if NATURAL:
        d = s.to(tl.float64) - m.to(tl.float64)
        return exp64(d - (log_l.to(tl.float64) + log_l_lo.to(tl.float64))).to(tl.float32)
    elif MASK_KIND == 2:
        return tl.math.exp2((s - m) * 1.4426950408889634 - log_l)
    else:
        return tl.math.exp2((s - m) - log_l)


@triton.jit
def store_row_stat(ptrs, x, inb, CHECK: tl.constexpr):
    """Store one row statistic per query row (masked by ``inb`` when CHECK)."""
    if CHECK:
        tl.store(ptrs, x, mask=inb)
    else:
        tl.store(ptrs, x)


@triton.jit
def load_row_stats(stats_row, s_stat, offs, n, CHECK: tl.constexpr, NATURAL: tl.constexpr):
    """(m, log l, log l's rounding error) of rows ``offs`` from the saved statistics at
    ``stats_row`` (this head's first row); rows >= n (when CHECK) read as m = +inf, log l = 0,
    so their P is exactly 0. The error is 0 (not loaded) on the 16-bit path."""
    if CHECK:
        inb = offs < n
        m = tl.load(stats_row + offs, mask=inb, other=float("inf"))
        log_l = tl.load(stats_row + s_stat + offs, mask=inb, other=0.0)
    else:
        m = tl.load(stats_row + offs)
        log_l = tl.load(stats_row + s_stat + offs)
    log_l_lo = tl.zeros_like(log_l)
    if NATURAL:
        if CHECK:
            log_l_lo = tl.load(stats_row + s_stat + s_stat + s_stat + offs, mask=offs < n, other=0.0)
        else:
            log_l_lo = tl.load(stats_row + s_stat + s_stat + s_stat + offs)
    return m, log_l, log_l_lo


@triton.jit
def batch_offset(pid_bh, HQ, GROUP, Z2, s_z1, s_z2, s_h, KV_HEAD: tl.constexpr):
    """Element offset (int64) of head ``pid_bh`` of the flattened ``[Z1, Z2, HQ]`` grid in a
    tensor with batch strides (s_z1, s_z2, s_h); KV_HEAD maps a query head to its GQA kv head."""
    h = pid_bh % HQ
    z = pid_bh // HQ
    z2 = z % Z2
    z1 = z // Z2
    if KV_HEAD:
        h = h // GROUP
    return z1.to(tl.int64) * s_z1 + z2.to(tl.int64) * s_z2 + h.to(tl.int64) * s_h


# the default SECTION of causal launches (causal_program): 0, one head's blocks after another.
# Sections of 32 and 128 MiB (FA3's LPT scheduler sizes its sections by the L2) ran no faster
# on an H200 and slowed the Triton dK/dV kernel at L 1k (docs/FINDINGS.md F90)
CAUSAL_SECTION_BYTES = 0
# the sections the probes and benchmarks try
TRIED_SECTION_BYTES = (32 << 20, 128 << 20)


@triton.jit
def causal_program(rows, row_bytes, group, SECTION: tl.constexpr, HEAVY_LAST: tl.constexpr):
    """(block, head) of this program of a causal launch on the grid (blocks, heads).

    The work of a block grows along the grid's first axis (HEAVY_LAST: the last block is the
    heaviest, a query block that sees the most keys; else the first, a key block seen by the
    most queries). SECTION 0: program_id order, one head's blocks after another, the heaviest
    first. Else the heads are dealt in sections, as many as share SECTION bytes of the operands
    their blocks re-read (a head's ``rows`` x ``row_bytes``, shared by ``group`` consecutive
    heads), so that they stay in the L2 together; within a section the blocks go heaviest
    first, level by level across its heads (longest processing time first: the lightest blocks
    of the section run last and fill the tail)."""
    blk = tl.program_id(0)
    head = tl.program_id(1)
    n_blk = tl.num_programs(0)
    if SECTION > 0:
        n_head = tl.num_programs(1)
        # sets of group heads a section (blk * 0: a tensor where every size is a constexpr)
        shared = tl.maximum(SECTION // row_bytes // rows + blk * 0, 1)
        # group * shared < n_head + group where it is taken: no int32 overflow
        per = tl.where(shared >= tl.cdiv(n_head, group), n_head, shared * group).to(tl.int64)
        lin = head.to(tl.int64) * n_blk + blk
        first = lin // (per * n_blk) * per
        here = tl.minimum(per, n_head - first)  # the last section may be short
        r = lin - first * n_blk
        blk = (r // here).to(tl.int32)
        head = (first + r % here).to(tl.int32)
    if HEAVY_LAST:
        blk = n_blk - 1 - blk
    return blk, head


@triton.jit
def program_tile(Q, rows, cols, group, CAUSAL: tl.constexpr, SECTION: tl.constexpr,
                 HEAVY_LAST: tl.constexpr):
    """(block, head) of this program on the grid (blocks, heads): its program ids, or under
    CAUSAL :func:`causal_program`'s order, a head's re-read operands ``rows`` x ``cols``
    elements of Q's type."""
    if CAUSAL:
        ELSIZE: tl.constexpr = Q.dtype.element_ty.primitive_bitwidth // 8
        return causal_program(rows, cols * ELSIZE, group, SECTION, HEAVY_LAST)
    return tl.program_id(0), tl.program_id(1)


@triton.jit
def load_tile(ptr, offs_r, offs_c, s_r, s_c, n_r, n_c,
              CHECK_R: tl.constexpr, CHECK_C: tl.constexpr):
    """Load a [len(offs_r), len(offs_c)] tile through strides, zero-filled out of bounds."""
    ptrs = ptr + offs_r[:, None] * s_r + offs_c[None, :] * s_c
    if CHECK_R and CHECK_C:
        return tl.load(ptrs, mask=(offs_r[:, None] < n_r) & (offs_c[None, :] < n_c), other=0.0)
    elif CHECK_R:
        return tl.load(ptrs, mask=offs_r[:, None] < n_r, other=0.0)
    elif CHECK_C:
        return tl.load(ptrs, mask=offs_c[None, :] < n_c, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def dot_nt_f64(a_base, offs_a, s_ar, s_ac, n_a, b_base, offs_b, s_br, s_bc, n_b, K,
               CHECK_A: tl.constexpr, CHECK_B: tl.constexpr, CHECK_K: tl.constexpr,
               BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr,
               CHUNK: tl.constexpr):
    """``a @ b^T`` of the fp32 tiles at rows ``offs_a`` / ``offs_b`` over K columns, accumulated
    in fp64 (returned as fp64), loaded through strides in CHUNK-wide pieces (zero past K).

    Why: an fp32 ``tl.dot`` (input_precision="ieee": FMA on the GPU; numpy's sgemm under the
    interpreter) sums each element as one sequential fp32 chain over K, whose error grows like
    sqrt(K) ulps of the partial sums: the same size as the naive fp32 math's own matmul error,
    so the rule (2x that error) failed by chance on rows with few keys (E = 256, one key:
    lse ratio 1.58, docs/FINDINGS.md F5; a 2-key row with scale 2: out ratio 2.1). Products of fp32
    values are exact in fp64 and K <= 256 terms sum with ~2^-45 relative error, so the caller's
    single rounding to fp32 leaves a score within about half an fp32 ulp of the exact one.
    CHUNK bounds the fp64 operand tiles (shared memory). Used on the fp32 path only."""
    acc = tl.zeros([BLOCK_A, BLOCK_B], dtype=tl.float64)
    # a dynamic loop (not static_range): unrolled, the loop-invariant chunks (k and v in the
    # dK/dV kernel, q in the others) were hoisted out of the caller's loop as fp64 copies that
    # stayed in shared memory (303 KB at E = 128, sm_90 offline compile): one chunk at a time
    for c in range(0, BLOCK_K, CHUNK):
        offs_c = c + tl.arange(0, CHUNK)
        a = load_tile(a_base, offs_a, offs_c, s_ar, s_ac, n_a, K, CHECK_A, CHECK_K)
        b = load_tile(b_base, offs_b, offs_c, s_br, s_bc, n_b, K, CHECK_B, CHECK_K)
        acc = tl.dot(a.to(tl.float64), tl.trans(b.to(tl.float64)), acc, input_precision="ieee",
                     out_dtype=tl.float64)
    return acc


@triton.jit
def block_dot(a, b, F64: tl.constexpr, PREC: tl.constexpr):
    """``a @ b`` of one block of the fp32 backward (P^T.dO, dS^T.Q, dS.K), for the caller to add
    to its fp32 accumulator: as one fp64 dot rounded once to fp32 when F64 (products of fp32
    values are exact in fp64; the H200 runs fp64 dots on tensor cores, about 1.7x (4x causal)
    faster end to end than fp32 FMA dots: docs/DESIGN.md "10. fast SDPA (Triton)"), else an fp32 dot of precision
    PREC. The kernels pass F64 = False with a boolean mask: Triton 3.6 failed to compile an
    fp64 dot of a boolean-masked P in the forward ("fp64 don't support largeK MMA"), and the
    forward's P.V keeps its fp32 dot for that reason (as fp64 it was no faster)."""
    if F64:
        return tl.dot(a.to(tl.float64), b.to(tl.float64), input_precision="ieee",
                      out_dtype=tl.float64).to(tl.float32)
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def split_tf32(a, PREC: tl.constexpr):
    """``(big, small)`` of an fp32 tile for "tf32x3" dots (:func:`dot_split`), else ``(a, a)``.

    CUTLASS's split (PyTorch's fp32 EFFICIENT kernels, the agreement rule's 3xTF32 member):
    big = a truncated to tf32 (toward zero: the low 13 mantissa bits cleared), small = a - big
    (exact) rounded to the nearest tf32 (ties away from zero), so a - big - small is within
    2^-11 of small's leading bit. Both halves are exact tf32 values, so the tensor cores' tf32
    operand read changes neither. Made once per tile by the caller and reused by every dot
    that reads the tile, where Triton's own ``input_precision="tf32x3"`` splits both operands
    inside each dot."""
    if PREC == "tf32x3":
        big = (a.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
        small = a - big
        small = ((small.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True)
        return big, small
    else:
        return a, a


@triton.jit
def dot_split(a, a_small, b, b_small, PREC: tl.constexpr):
    """``a @ b`` of precision PREC; "tf32x3" takes the halves of :func:`split_tf32` (``a``,
    ``b`` the big ones): small.big, then big.small, then big.big chained on one fresh
    accumulator (small x small dropped, as CUTLASS does); other precisions ignore the small
    halves."""
    if PREC == "tf32x3":
        part = tl.dot(a_small, b, input_precision="tf32")
        part = tl.dot(a, b_small, part, input_precision="tf32")
        return tl.dot(a, b, part, input_precision="tf32")
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def dot_split_acc(a, a_small, b, b_small, acc, PREC: tl.constexpr):
    """``acc + a @ b``: "tf32x3" adds :func:`dot_split`'s product to ``acc`` in fp32 registers,
    never chaining the running accumulator into the tensor cores' sums (chained, the H200's
    relative errors against float64 at B 2 H 16 L 2048 D 128 were 8e-6 on out and 2-3e-5 on dk
    and dv, against torch's 3xTF32 kernels' 2e-6); other precisions chain it, ``tl.dot(a, b,
    acc)``, as the 16-bit kernels always did."""
    if PREC == "tf32x3":
        return acc + dot_split(a, a_small, b, b_small, PREC)
    else:
        return tl.dot(a, b, acc, input_precision=PREC)


FP32_CHUNK = 32


def chunk_of(block: int) -> int:
    """Width of the pieces ``dot_nt_f64`` loads (at least 16, as tl.dot needs)."""
    return min(block, FP32_CHUNK)


@triton.jit
def apply_attn_mask(s2, mask_ptr, offs_m, offs_n, s_mm, s_mn, L, S,
                    MASK_KIND: tl.constexpr, TRANSPOSED: tl.constexpr):
    """Apply an attention mask tile to scores ``s2``.

    ``s2`` is [M, N] (query rows, key cols) or, when TRANSPOSED, [N, M]. Boolean masks set
    excluded scores to -inf; additive masks add ``mask`` (the scores are in natural units
    whenever the mask is additive: module docstring).
    Out-of-range entries load as "keep" / 0 and are handled by the callers' bounds logic."""
    if TRANSPOSED:
        ptrs = mask_ptr + offs_n[:, None] * s_mn + offs_m[None, :] * s_mm
        inb = (offs_n[:, None] < S) & (offs_m[None, :] < L)
    else:
        ptrs = mask_ptr + offs_m[:, None] * s_mm + offs_n[None, :] * s_mn
        inb = (offs_m[:, None] < L) & (offs_n[None, :] < S)
    if MASK_KIND == 1:
        keep = tl.load(ptrs, mask=inb, other=1)
        s2 = tl.where(keep != 0, s2, float("-inf"))
    elif MASK_KIND == 2:
        s2 = s2 + tl.load(ptrs, mask=inb, other=0.0).to(tl.float32)
    return s2


def _quick_bench(fn, quantiles=None):
    """Short timing for autotuning (the default 25+100 ms per config is too slow here)."""
    return triton.testing.do_bench(fn, warmup=5, rep=25, quantiles=quantiles)


# cache_results: tuning results land in Triton's cache dir and survive the process
TUNE_KW = dict(do_bench=_quick_bench, cache_results=True) if autotune_enabled() else {}


def validated_only(named_args) -> bool:
    """Shapes the tuned (large-tile, 3-stage) configs were not validated on natively: a head
    dim that is not a power of two >= 16 (masked channel loads) or a sequence of at most 128
    (decided on the autotune key's length buckets, so every shape sharing a key agrees). Natively (H200, Triton 3.6) autotuning once hit illegal memory
    accesses while autotuning 16-bit E = 40 cases (docs/DESIGN.md "10. fast SDPA (Triton)"); such
    shapes run the single config validated natively for every shape (the smoke suite)."""
    return (named_args["E"] != named_args["BLOCK_E"] or named_args["EV"] != named_args["BLOCK_EV"]
            or named_args["TUNE_L"] <= 128 or named_args["TUNE_S"] <= 128)


def make_prune(pipelined, resident, *, safe, fp32_shapes, accumulator_cols, resident_cols,
               register_limit, min_16bit_tile, tf32x3_shapes, tf32x3_safe):
    """Autotune config pruning on shared memory and registers, for the forward and both
    backward kernels. ``pipelined`` names the streamed block dim, ``resident`` the block dim
    held across the loop; ``accumulator_cols(BLOCK_E, BLOCK_EV)`` is the width of the fp32
    accumulators a program keeps per resident row (forward: EV; dK/dV and dQ: E + EV), whose
    per-thread share must stay within ``register_limit``; ``resident_cols(BLOCK_E, BLOCK_EV)``
    the width of the operand tiles held per resident row (forward: E, q; backward: E + EV).
    fp32 with IEEE dots (no tensor cores) tunes over ``fp32_shapes`` ((BLOCK_M, BLOCK_N, warps,
    stages) each) instead of the list; the tensor-core paths (16-bit, fp32 with PREC "tf32x3")
    keep tiles of at least ``min_16bit_tile`` elements when any fits. Shapes not validated
    natively run ``safe`` (``validated_only``). fp32 with PREC "tf32x3" (the split operands of
    :func:`split_tf32` twice in shared memory: most 16-bit tiles do not fit at head dim 128)
    tunes over ``tf32x3_shapes`` and runs ``tf32x3_safe`` where others run ``safe`` (its
    backward is never fused: ``fast.sdpa._fuse_bwd``)."""
    def prune(configs, named_args, **kwargs):
        if len(configs) == 1:
            return configs
        named_args = {**named_args, **kwargs}
        if named_args.get("PREC") == "tf32x3":
            if validated_only(named_args):
                return [tf32x3_safe]
            return forced_choice([triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w,
                                                num_stages=st) for bm, bn, w, st in tf32x3_shapes])
        if validated_only(named_args):
            return [safe]
        be, bev = named_args["BLOCK_E"], named_args["BLOCK_EV"]
        elsize = named_args["Q"].element_size()
        tensor_cores = elsize < 4 or named_args.get("PREC") == "tf32x3"
        if not tensor_cores:
            return forced_choice([triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w,
                                                num_stages=st) for bm, bn, w, st in fp32_shapes])
        kept = []
        for c in configs:
            rows_p, rows_r = c.kwargs[pipelined], c.kwargs[resident]
            if elsize == 4:
                smem = smem_bytes_tf32x3(rows_p, rows_r, resident_cols(be, bev), be, bev,
                                         c.num_stages)
            else:
                smem = smem_bytes(rows_p, rows_r, be, bev, elsize, c.num_stages)
            if smem > SMEM_LIMIT:
                continue
            if rows_r * accumulator_cols(be, bev) / (c.num_warps * 32) > register_limit:
                continue
            kept.append(c)
        # small tiles only when nothing larger fits
        kept = [c for c in kept
                if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] >= min_16bit_tile] or kept
        kept = kept or [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]
        return forced_choice(kept)
    return prune


def forced_choice(configs):
    """SDPA_FORCE_CONFIG=i keeps only the i-th surviving config (used to pre-compile every
    config in parallel processes before the benchmark tunes)."""
    force = os.environ.get("SDPA_FORCE_CONFIG")
    if force is None or len(configs) <= 1:
        return configs
    return [configs[int(force) % len(configs)]]


def bounds_checks(a):
    """The kernels' CHECK_* heuristics: which tile dims need masked loads (``a`` holds L, S, E,
    EV and the block sizes). One definition for triton.heuristics and :class:`CachedLauncher`."""
    return {"CHECK_M": a["L"] % a["BLOCK_M"] != 0, "CHECK_N": a["S"] % a["BLOCK_N"] != 0,
            "CHECK_E": a["E"] != a["BLOCK_E"], "CHECK_EV": a["EV"] != a["BLOCK_EV"]}


BOUNDS_HEURISTICS = {name: (lambda a, name=name: bounds_checks(a)[name])
                     for name in ("CHECK_M", "CHECK_N", "CHECK_E", "CHECK_EV")}


class CachedLauncher:
    """Launches an ``@autotune @heuristics @jit`` kernel, skipping the autotuner's and the
    heuristics' Python layers once the launch key has a tuned config.

    The first launch of a key goes through the autotuner (it tunes or reads its disk cache) and
    its ``best_config`` is remembered under the key; later launches run the JIT function with
    that config and :func:`bounds_checks`, as the autotuner would, through a
    :class:`~attention_oracle.fast.launch.DirectLauncher` (the compiled kernel's own launcher
    once Triton has launched that specialization). The key must hold everything the autotuner
    keys on: its ``key`` arguments and the dtypes of the tensors."""

    def __init__(self, autotuned, n_tensors=None):
        self.autotuned = autotuned
        self.jit = autotuned.fn.fn  # Autotuner -> Heuristics -> JITFunction
        self.direct = DirectLauncher(self.jit, n_tensors)
        self.configs = {}
        self.plans = {}

    def __call__(self, key, grid, args, sizes, meta):
        """``grid = (block name, rows, programs)``: ``cdiv(rows, config[block name])`` programs
        on axis 0, ``programs`` on axis 1; ``sizes = (L, S, E, EV)``; ``meta`` the constexprs,
        a function of ``key`` (the merged launch arguments are memoised on key, grid, sizes)."""
        plan = self.plans.get((key, grid, sizes))
        if plan is None:
            kwargs = self.configs.get(key)
            if kwargs is None:
                # the autotuner launches on the current device: make it the tensors'
                on_device_of(args[0], self.autotuned[self._grid_fn(grid)], *args, **meta)
                config = getattr(self.autotuned, "best_config", None)
                if config is not None:
                    self.configs[key] = config.all_kwargs()
                return
            plan = self._plan(kwargs, grid, sizes, meta)
            if len(self.plans) >= 4096:
                self.plans.clear()
            self.plans[(key, grid, sizes)] = plan
        self.direct(plan[0], args, plan[1])

    def bind(self, key, grid, sizes, meta):
        """A :class:`~attention_oracle.fast.launch.BoundLaunch` of this launch (its tuned config
        fixed) once the key has been tuned, else None (launch through ``__call__`` first)."""
        kwargs = self.configs.get(key)
        if kwargs is None:
            return None
        launch_grid, launch_kwargs = self._plan(kwargs, grid, sizes, meta)
        return BoundLaunch(self.direct, launch_grid, launch_kwargs)

    @staticmethod
    def _grid_fn(grid):
        name, rows, programs = grid
        return lambda m: (-(-rows // m[name]), programs)

    @staticmethod
    def _plan(kwargs, grid, sizes, meta):
        """(launch grid, every keyword argument of the JIT function) for a tuned config."""
        L, S, E, EV = sizes
        names = {"L": L, "S": S, "E": E, "EV": EV, "BLOCK_M": kwargs["BLOCK_M"],
                 "BLOCK_N": kwargs["BLOCK_N"], "BLOCK_E": meta["BLOCK_E"],
                 "BLOCK_EV": meta["BLOCK_EV"]}
        name, rows, programs = grid
        return (-(-rows // kwargs[name]), programs), {**meta, **kwargs, **bounds_checks(names)}
