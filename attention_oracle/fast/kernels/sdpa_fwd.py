"""Flash-attention forward kernel (online softmax, one program per query block and head).

Writes ``out [Z1, Z2, HQ, L, EV]`` in the input dtype (0 for a row with no key left) and the
row statistics ``Stats`` (rows ``STATS_*`` of :mod:`fast.kernels.sdpa_common`, row stride
``s_stat``): the row max m and log l apart for the backward, and the public lse, the natural
log of the row sum of exp(scaled, masked scores), float32, -inf for a row with no key. See
:mod:`fast.kernels.sdpa_common` for the layout conventions and the choice of units.
"""
import triton
import triton.language as tl

from .exp2_poly import exp2_mixed
from .sdpa_common import (
    BOUNDS_HEURISTICS,
    TUNE_KW,
    apply_attn_mask,
    autotune_enabled,
    batch_offset,
    dot_nt_f64,
    dot_split,
    dot_split_acc,
    load_tile,
    log64,
    make_prune,
    program_tile,
    softmax_exp,
    split_tf32,
    store_row_stat,
)

_FWD_SAFE = triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2)


def _fwd_configs():
    if not autotune_enabled():
        return [_FWD_SAFE]
    shapes = [(128, 64, 4, 3), (128, 128, 8, 2), (128, 64, 8, 3), (128, 128, 8, 3),
              (64, 64, 4, 3), (64, 32, 4, 2), (64, 32, 4, 3)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in shapes]


# fp32 with IEEE dots: 4 or 8 warps (8 halve each thread's share of the fp64 score pieces)
_FP32_SHAPES = ((64, 32, 4, 2), (64, 32, 8, 2))
# fp32 "tf32x3" (sdpa_common.make_prune): tiles whose split q and k / v fit shared memory at
# head dim 128. 128 x 64 in one stage (196608 B, 140 B spilled offline) was the tuner's pick at
# every benchmarked point on an H100 (D 64 and 128, L 1k-4k, causal or not), 1.10-1.16x the
# TFLOP/s of the earlier list's picks; 128 x 16 and 128 x 32 in one stage never won
_TF32X3_SHAPES = ((128, 64, 8, 1), (128, 32, 8, 2), (64, 64, 4, 2), (64, 32, 4, 3))
# registers: the BM x BEV fp32 accumulator spread over the warps
_prune_fwd = make_prune("BLOCK_N", "BLOCK_M", safe=_FWD_SAFE, fp32_shapes=_FP32_SHAPES,
                        accumulator_cols=lambda be, bev: bev,
                        resident_cols=lambda be, bev: be, register_limit=128,
                        min_16bit_tile=128 * 64, tf32x3_shapes=_TF32X3_SHAPES,
                        tf32x3_safe=_FWD_SAFE)


@triton.jit
def _fwd_tile_loop(acc, l_i, m_i, q, q_small, q_base, k_base, v_base, mask_base,
                   offs_m, lo, hi, L, S, E, EV,
                   s_qm, s_qe, s_kn, s_ke, s_vn, s_ve, s_mm, s_mn, qk_scale,
                   MASK_KIND: tl.constexpr, DIAG: tl.constexpr, CHECK_M: tl.constexpr,
                   CHECK_N: tl.constexpr, CHECK_E: tl.constexpr, CHECK_EV: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                   BLOCK_EV: tl.constexpr, CHUNK_E: tl.constexpr, PREC: tl.constexpr,
                   NATURAL: tl.constexpr, FOLD: tl.constexpr, EXP2_POLY: tl.constexpr):
    """Online-softmax accumulation over key blocks [lo, hi). DIAG applies the causal mask.

    ``qk_scale`` is ``scale`` (fp32, or an additive mask) or ``scale * log2(e)``; the scores,
    row max ``m_i`` and exponentials are in the matching units. fp32 forms the scores from
    CHUNK_E-wide partial dots (q re-read per key block) and adds each block's P.V to the
    rescaled accumulator instead of chaining it into one FMA sequence over every key.

    FOLD (log2 units, ``qk_scale > 0``): a tile with nothing to mask takes its row max from the
    raw dots and forms ``exp2(qk * qk_scale - m)`` as one FMA per score, not a product then a
    difference (m is the same: rounding is monotone); a tile with only the bound and causal
    masks does the same on its kept scores (a masked one -inf, which ``qk_scale > 0`` keeps
    -inf), one compare a score against the row's last visible key (docs/FINDINGS.md F93).
    EXP2_POLY (0, 2, 4, 8) takes one of every EXP2_POLY of a free tile's exponentials on the
    FMA units (:mod:`.exp2_poly`)."""
    offs_e = tl.arange(0, BLOCK_E)
    offs_ev = tl.arange(0, BLOCK_EV)
    FOLDED: tl.constexpr = FOLD and MASK_KIND == 0 and not DIAG and not CHECK_N and not NATURAL
    FOLDED_MASKED: tl.constexpr = FOLD and MASK_KIND == 0 and (DIAG or CHECK_N) and not NATURAL
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if NATURAL:
            s2 = dot_nt_f64(q_base, offs_m, s_qm, s_qe, L, k_base, offs_n, s_kn, s_ke, S, E,
                                CHECK_M, CHECK_N, CHECK_E, BLOCK_M, BLOCK_N, BLOCK_E,
                            CHUNK_E)
            s2 = (s2 * qk_scale).to(tl.float32)  # one rounding of the (near-exact) score
        else:
            k, k_small = split_tf32(
                load_tile(k_base, offs_n, offs_e, s_kn, s_ke, S, E, CHECK_N, CHECK_E), PREC)
            s2 = dot_split(q, q_small, tl.trans(k), tl.trans(k_small), PREC)
            if not FOLDED and not FOLDED_MASKED:
                s2 = s2 * qk_scale
        if FOLDED:
            m_new = tl.maximum(m_i, tl.max(s2, 1) * qk_scale)  # finite: nothing masked here
            p = exp2_mixed(s2 * qk_scale - m_new[:, None], EXP2_POLY)
            alpha = tl.math.exp2(m_i - m_new)
        elif FOLDED_MASKED:
            if DIAG and CHECK_N:
                last = tl.minimum(offs_m, S - 1)
            elif DIAG:
                last = offs_m
            else:
                last = tl.zeros_like(offs_m) + (S - 1)
            s2 = tl.where(offs_n[None, :] <= last[:, None], s2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s2, 1) * qk_scale)
            # a row that has seen only -inf so far keeps m = -inf; shift by 0 (no inf - inf)
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s2 * qk_scale - m_shift[:, None])
            alpha = tl.math.exp2(m_i - m_shift)
        else:
            if MASK_KIND != 0:
                s2 = apply_attn_mask(s2, mask_base, offs_m, offs_n, s_mm, s_mn, L, S,
                                     MASK_KIND, False)
            if DIAG:
                s2 = tl.where(offs_m[:, None] >= offs_n[None, :], s2, float("-inf"))
            if CHECK_N:
                s2 = tl.where(offs_n[None, :] < S, s2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s2, 1))
            # a row that has seen only -inf so far keeps m = -inf; shift by 0 (no inf - inf)
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = softmax_exp(s2, m_shift[:, None], NATURAL, MASK_KIND)
            alpha = softmax_exp(m_i, m_shift, NATURAL, MASK_KIND)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_tile(v_base, offs_n, offs_ev, s_vn, s_ve, S, EV, CHECK_N, CHECK_EV)
        acc = acc * alpha[:, None]
        if NATURAL:
            acc = acc + tl.dot(p, v, input_precision=PREC)
        else:
            p_big, p_small = split_tf32(p.to(v.dtype), PREC)
            v, v_small = split_tf32(v, PREC)
            acc = dot_split_acc(p_big, p_small, v, v_small, acc, PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(configs=_fwd_configs(), key=["TUNE_L", "TUNE_S", "TUNE_H", "E", "EV", "BLOCK_E", "BLOCK_EV", "CAUSAL",
                                               "MASK_KIND", "PREC"],
                 prune_configs_by={"early_config_prune": _prune_fwd}, **TUNE_KW)
@triton.heuristics(BOUNDS_HEURISTICS)
@triton.jit(do_not_specialize=["Z2", "HQ", "TUNE_H"])
def sdpa_fwd_kernel(Q, K, V, Mask, Out, Stats,
                    s_qz1, s_qz2, s_qh, s_qm, s_qe,
                    s_kz1, s_kz2, s_kh, s_kn, s_ke,
                    s_vz1, s_vz2, s_vh, s_vn, s_ve,
                    s_mz1, s_mz2, s_mh, s_mm, s_mn,
                    s_oz1, s_oz2, s_oh, s_om, s_oe,
                    s_stat, Z2, HQ, GROUP, L, S, E, EV, qk_scale,
                    TUNE_L, TUNE_S, TUNE_H,
                    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, PREC: tl.constexpr,
                    NATURAL: tl.constexpr, CHUNK_E: tl.constexpr,
                    BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    CHECK_M: tl.constexpr, CHECK_N: tl.constexpr,
                    CHECK_E: tl.constexpr, CHECK_EV: tl.constexpr,
                    FOLD: tl.constexpr, EXP2_POLY: tl.constexpr = 0,
                    SECTION: tl.constexpr = 0):
    # causal: the heaviest query blocks first (sdpa_common.causal_program)
    pid_m, pid_bh = program_tile(Q, S, E + EV, GROUP, CAUSAL, SECTION, True)
    start_m = pid_m * BLOCK_M
    q_base = Q + batch_offset(pid_bh, HQ, GROUP, Z2, s_qz1, s_qz2, s_qh, False)
    k_base = K + batch_offset(pid_bh, HQ, GROUP, Z2, s_kz1, s_kz2, s_kh, True)
    v_base = V + batch_offset(pid_bh, HQ, GROUP, Z2, s_vz1, s_vz2, s_vh, True)
    o_base = Out + batch_offset(pid_bh, HQ, GROUP, Z2, s_oz1, s_oz2, s_oh, False)
    mask_base = Mask
    if MASK_KIND != 0:
        mask_base = Mask + batch_offset(pid_bh, HQ, GROUP, Z2, s_mz1, s_mz2, s_mh, False)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_e = tl.arange(0, BLOCK_E)
    offs_ev = tl.arange(0, BLOCK_EV)
    q = load_tile(q_base, offs_m, offs_e, s_qm, s_qe, L, E, CHECK_M, CHECK_E)
    q, q_small = split_tf32(q, PREC)  # "tf32x3": once per program (q, q for other paths)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_EV], dtype=tl.float32)

    if CAUSAL:
        # keys below the block's first query need no causal mask; the diagonal band does
        free_hi = tl.minimum(start_m, S)
        acc, l_i, m_i = _fwd_tile_loop(acc, l_i, m_i, q, q_small, q_base, k_base, v_base, mask_base,
                                       offs_m,
                                       0, free_hi, L, S, E, EV, s_qm, s_qe, s_kn, s_ke, s_vn, s_ve,
                                       s_mm, s_mn, qk_scale, MASK_KIND, False, CHECK_M, CHECK_N,
                                       CHECK_E, CHECK_EV, BLOCK_M, BLOCK_N, BLOCK_E, BLOCK_EV, CHUNK_E, PREC,
                                       NATURAL, FOLD, EXP2_POLY)
        diag_hi = tl.minimum(start_m + BLOCK_M, S)
        acc, l_i, m_i = _fwd_tile_loop(acc, l_i, m_i, q, q_small, q_base, k_base, v_base, mask_base,
                                       offs_m,
                                       free_hi, diag_hi, L, S, E, EV, s_qm, s_qe, s_kn, s_ke, s_vn,
                                       s_ve, s_mm, s_mn, qk_scale, MASK_KIND, True, CHECK_M, CHECK_N,
                                       CHECK_E, CHECK_EV, BLOCK_M, BLOCK_N, BLOCK_E, BLOCK_EV, CHUNK_E, PREC,
                                       NATURAL, FOLD, EXP2_POLY)
    else:
        acc, l_i, m_i = _fwd_tile_loop(acc, l_i, m_i, q, q_small, q_base, k_base, v_base, mask_base,
                                       offs_m,
                                       0, S, L, S, E, EV, s_qm, s_qe, s_kn, s_ke, s_vn, s_ve,
                                       s_mm, s_mn, qk_scale, MASK_KIND, False, CHECK_M, CHECK_N,
                                       CHECK_E, CHECK_EV, BLOCK_M, BLOCK_N, BLOCK_E, BLOCK_EV, CHUNK_E, PREC,
                                       NATURAL, FOLD, EXP2_POLY)

    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    if NATURAL:  # fp32: IEEE division (a plain fp32 `/` compiles to div.full.f32, ~2 ulp)
        out = tl.math.div_rn(acc, l_safe[:, None])
        # log l in fp64, kept as hi + lo (fp32 each): the backward forms
        # P = exp((s - m) - (hi + lo)) in fp64, so the rounding of hi is not in P
        log_l64 = log64(l_safe.to(tl.float64))
        log_l = log_l64.to(tl.float32)
        log_l_lo = (log_l64 - log_l.to(tl.float64)).to(tl.float32)
        lse = (tl.where(empty, 0.0, m_i).to(tl.float64) + log_l64).to(tl.float32)
    else:
        out = acc / l_safe[:, None]
        log_l = tl.math.log2(l_safe)
        if MASK_KIND == 2:  # natural-unit scores
            lse = m_i + log_l * 0.6931471805599453
        else:
            lse = (m_i + log_l) * 0.6931471805599453
    o_ptrs = o_base + offs_m[:, None] * s_om + offs_ev[None, :] * s_oe
    if CHECK_M or CHECK_EV:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty),
                 mask=(offs_m[:, None] < L) & (offs_ev[None, :] < EV))
    else:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty))
    # a row with no key: m = +inf and log l = 0 make the backward's P exactly 0
    stats_ptrs = Stats + pid_bh.to(tl.int64) * L + offs_m
    store_row_stat(stats_ptrs, tl.where(empty, float("inf"), m_i), offs_m < L, CHECK_M)
    store_row_stat(stats_ptrs + s_stat, log_l, offs_m < L, CHECK_M)
    store_row_stat(stats_ptrs + s_stat + s_stat, tl.where(empty, float("-inf"), lse), offs_m < L,
                   CHECK_M)
    if NATURAL:
        store_row_stat(stats_ptrs + s_stat + s_stat + s_stat, log_l_lo, offs_m < L, CHECK_M)

