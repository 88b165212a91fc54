"""Flash-attention backward kernels: Delta preprocess, dK/dV (loop over queries), dQ (loop over keys).

With P = softmax(S) recomputed from the forward's row statistics, dP = dO V^T,
Delta = rowsum(dO * O) and dS = P * (dP - Delta):
dV = P^T dO, dK = scale * dS^T Q, dQ = scale * dS K. A row with no key has m = +inf saved, so
its P, dS and every contribution are exactly 0.

P is recomputed in the forward's units as ``exp((s - m) - log l)`` (``recompute_p``; m and
log l apart, never their rounded sum: docs/FINDINGS.md F11; see :mod:`fast.kernels.sdpa_common`):
fp32 in fp64 with log l = hi + lo; 16-bit with the fast exp2.

``dO`` is read through its own strides (head-major, sliced or stride-0 views work in place).
The dK/dV program owns one key block of one kv head and loops over every query head of its
GQA group, so dK and dV need no atomics; dQ does only in the opt-in atomic mode
(``ATOMIC_DQ``), which adds each key block's share in the dK/dV kernel instead of running the dQ
kernel.
"""
import triton
import triton.language as tl

from .sdpa_common import (
    BOUNDS_HEURISTICS,
    TUNE_KW,
    apply_attn_mask,
    autotune_enabled,
    batch_offset,
    block_dot,
    dot_nt_f64,
    dot_split,
    dot_split_acc,
    load_row_stats,
    load_tile,
    make_prune,
    program_tile,
    recompute_p,
    split_tf32,
)


@triton.jit(do_not_specialize=["Z2", "HQ"])
def sdpa_bwd_preprocess_kernel(O, DO, Delta,
                               s_oz1, s_oz2, s_oh, s_om, s_oe,
                               s_dz1, s_dz2, s_dh, s_dm, s_de,
                               Z2, HQ, L, EV,
                               BLOCK_M: tl.constexpr, BLOCK_EV: tl.constexpr):
    """Delta[bh, i] = sum_e dO[i, e] * O[i, e] in fp32."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_ev = tl.arange(0, BLOCK_EV)
    o_base = O + batch_offset(pid_bh, HQ, 1, Z2, s_oz1, s_oz2, s_oh, False)
    do_base = DO + batch_offset(pid_bh, HQ, 1, Z2, s_dz1, s_dz2, s_dh, False)
    o = load_tile(o_base, offs_m, offs_ev, s_om, s_oe, L, EV, True, True).to(tl.float32)
    do = load_tile(do_base, offs_m, offs_ev, s_dm, s_de, L, EV, True, True).to(tl.float32)
    tl.store(Delta + pid_bh.to(tl.int64) * L + offs_m, tl.sum(o * do, 1), mask=offs_m < L)


_DKDV_SAFE = triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4, num_stages=2)
_DQ_SAFE = triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2)


# tiles tuned only with ATOMIC_DQ: its dQ tile (BLOCK_M x BLOCK_E fp32) in registers beside dK
# and dV spilled the 64 x 128, 8-warp tile (255 registers at head dim 128 on the H200)
_DKDV_ATOMIC_ONLY = ((64, 64, 8, 2), (64, 64, 8, 3), (128, 64, 8, 2), (32, 128, 8, 2))


def _shape(config):
    return (config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps,
            config.num_stages)


def _dkdv_configs():
    if not autotune_enabled():
        return [_DKDV_SAFE]
    shapes = [(64, 128, 8, 3), (64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 3), (32, 64, 4, 2)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in shapes + list(_DKDV_ATOMIC_ONLY)]


# the smallest BLOCK_N of any dK/dV config (_DKDV_SAFE, _dkdv_configs and the fp32 shapes of
# its prune): a key count up to this is one key block for every config, which FUSE_DQ needs
FUSE_DQ_MAX_S = 64
assert all(c.kwargs["BLOCK_N"] >= FUSE_DQ_MAX_S for c in _dkdv_configs() + [_DKDV_SAFE])


def _dq_configs():
    if not autotune_enabled():
        return [_DQ_SAFE]
    shapes = [(128, 64, 8, 3), (128, 64, 8, 2), (128, 32, 4, 3), (64, 64, 4, 3), (64, 32, 4, 2)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in shapes]


# fp32 "tf32x3" (sdpa_common.make_prune): tiles whose split operands fit shared memory at head
# dim 128, fastest first on the H200 at B 2 H 16 L 2048 D 128 (benchmarks.sdpa's fp32 rows);
# the safe ones ran there at head dim 128 (dK/dV 16 x 64 in the tuning). 16-key tiles (32 x 16,
# two or three stages; no spills offline) were the tuner's pick with atomic dQ at D 128 not
# causal on an H100; 32 x 32 in three stages (spills), 16 x 32 in three and 32 x 32 x 8 warps in
# three never won
_DKDV_TF32X3 = ((32, 32, 4, 2), (16, 32, 4, 2), (32, 32, 8, 2), (32, 16, 4, 2), (32, 16, 4, 3))
_DKDV_TF32X3_SAFE = triton.Config({"BLOCK_M": 16, "BLOCK_N": 64}, num_warps=4, num_stages=2)
# with ATOMIC_DQ: dS^T K reads k as a dot's B operand as well, a second pair of k tiles in shared
# memory, so 64-key blocks overflow it at head dim 128 (the 16 x 64 safe tile with a float mask
# asked the H200 for 274624 B); its tiles are the list above and 64 x 32 x 8 warps, which the
# tuner picked causal (32 x 32, then 32 x 16 not causal)
_DKDV_TF32X3_ATOMIC = _DKDV_TF32X3 + ((64, 32, 8, 2),)
_DKDV_TF32X3_ATOMIC_SAFE = triton.Config({"BLOCK_M": 16, "BLOCK_N": 32}, num_warps=4,
                                         num_stages=2)
_DQ_TF32X3 = ((32, 32, 4, 2), (64, 32, 4, 1), (32, 32, 8, 2))
# fp32 with IEEE dots ("accurate"): the dK/dV shapes of _make_prune's fp32_shapes
_DKDV_FP32 = ((32, 64, 4, 2), (32, 64, 8, 2))
_DQ_TF32X3_SAFE = triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2)


def _make_prune(pipelined, resident, fp32_shapes, safe, tf32x3_shapes, tf32x3_safe):
    """Pruning for the backward kernels: two fp32 accumulators (E + EV wide) per program; fp32
    with IEEE dots takes ``fp32_shapes`` (4 or 8 warps: with 4, the fp64 pieces spill, 1.6 KB
    per thread for dK/dV at D 128 in an offline sm_90 compile, 76 B with 8)."""
    return make_prune(pipelined, resident, safe=safe, fp32_shapes=fp32_shapes,
                      accumulator_cols=lambda be, bev: be + bev,
                      resident_cols=lambda be, bev: be + bev, register_limit=160,
                      min_16bit_tile=64 * 64, tf32x3_shapes=tf32x3_shapes,
                      tf32x3_safe=tf32x3_safe)


def _dkdv_prune(base, atomic):
    """The dK/dV pruning: ``base`` (:func:`_make_prune`) without the ``_DKDV_ATOMIC_ONLY``
    tiles, or with ATOMIC_DQ ``atomic`` (the same, with fp32 "tf32x3"'s atomic-mode shapes and
    safe tile)."""
    def prune(configs, named_args, **kwargs):
        if {**named_args, **kwargs}.get("ATOMIC_DQ"):
            return atomic(configs, named_args, **kwargs)
        configs = [c for c in configs if _shape(c) not in _DKDV_ATOMIC_ONLY] or configs
        return base(configs, named_args, **kwargs)
    return prune


@triton.jit
def _dkdv_query_loop(dk, dv, k, v, k_small, v_small, k_base, v_base, q_base, do_base, mask_base, stats_row, s_stat,
                     delta_ptr, o_base, dq_base, scale, offs_n, lo, hi, L, S, E, EV,
                     s_kn, s_ke, s_vn, s_ve, s_qm, s_qe, s_dm, s_de, s_mm, s_mn, qk_scale,
                     MASK_KIND: tl.constexpr, DIAG: tl.constexpr, CHECK_M: tl.constexpr,
                     CHECK_N: tl.constexpr, CHECK_E: tl.constexpr, CHECK_EV: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                     BLOCK_EV: tl.constexpr, CHUNK_E: tl.constexpr, CHUNK_EV: tl.constexpr,
                     PREC: tl.constexpr, NATURAL: tl.constexpr, FOLD: tl.constexpr,
                     FUSE_DQ: tl.constexpr, ATOMIC_DQ: tl.constexpr):
    """Accumulate dK (unscaled) and dV of one key block over query blocks [lo, hi).

    FUSE_DQ (the key block holds every key, 16-bit or fp32 "plain"/"tf32x3"): each query
    block's Delta = rowsum(dO * O) is formed here from O (contiguous, at ``o_base``) and its dQ
    block, complete from this one key block, is stored at ``dq_base`` (contiguous): the whole
    backward in one launch, no Delta buffer. ATOMIC_DQ (16-bit or fp32 "plain"/"tf32x3", any
    key count): each query block's dQ product of this key block is added to the fp32 buffer at
    ``dq_base`` (contiguous, zeroed) with float atomics, in place of the dQ kernel's recompute
    of S and dP: relaxed per-element atomics (1) or a TMA reduce of the tile (2: E a multiple
    of 4, sm_90); the sum's order varies between runs, so dQ is not bitwise repeatable.

    fp32 (NATURAL): scores and dP from chunked dots (k, v re-read), P in fp64 from the saved
    m and log l = hi + lo, and each query block's product added to dK/dV as an fp64 dot
    rounded once (``block_dot``), not chained. FOLD (16-bit,
    no mask to apply): P = exp2(qk * qk_scale - (m + log l)), one FMA per score."""
    FOLDED: tl.constexpr = FOLD and MASK_KIND == 0 and not NATURAL
    offs_e = tl.arange(0, BLOCK_E)
    offs_ev = tl.arange(0, BLOCK_EV)
    if ATOMIC_DQ == 2:  # rows past L and columns past E are clipped by the TMA unit
        dq_desc = tl.make_tensor_descriptor(dq_base, shape=[L, E], strides=[E, 1],
                                            block_shape=[BLOCK_M, BLOCK_E])
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        # rows past L load as q = dO = 0 and m = +inf, so their P is exactly 0
        q = load_tile(q_base, offs_m, offs_e, s_qm, s_qe, L, E, CHECK_M, CHECK_E)
        q, q_small = split_tf32(q, PREC)  # "tf32x3": once for both of q's dots
        m, log_l, log_l_lo = load_row_stats(stats_row, s_stat, offs_m, L, CHECK_M, NATURAL)
        if NATURAL:
            sT = dot_nt_f64(k_base, offs_n, s_kn, s_ke, S, q_base, offs_m, s_qm, s_qe, L, E,
                                CHECK_N, CHECK_M, CHECK_E, BLOCK_N, BLOCK_M, BLOCK_E,
                            CHUNK_E)
            sT = (sT * qk_scale).to(tl.float32)
        elif FOLDED:
            sT = dot_split(k, k_small, tl.trans(q), tl.trans(q_small), PREC)
        else:
            sT = dot_split(k, k_small, tl.trans(q), tl.trans(q_small), PREC) * qk_scale
        if MASK_KIND != 0:
            sT = apply_attn_mask(sT, mask_base, offs_m, offs_n, s_mm, s_mn, L, S, MASK_KIND, True)
        if FOLDED:  # m = +inf (no key, or a row past L) gives P = 0
            pT = tl.math.exp2(sT * qk_scale - (m + log_l)[None, :])
        else:
            pT = recompute_p(sT, m[None, :], log_l[None, :], log_l_lo[None, :], NATURAL,
                             MASK_KIND)
        if DIAG:
            pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        if CHECK_N:  # rows past S are never stored, but keep them finite (no inf * 0 = nan)
            pT = tl.where(offs_n[:, None] < S, pT, 0.0)
        do = load_tile(do_base, offs_m, offs_ev, s_dm, s_de, L, EV, CHECK_M, CHECK_EV)
        if FUSE_DQ:  # as sdpa_bwd_preprocess_kernel computes it
            o = load_tile(o_base, offs_m, offs_ev, EV, 1, L, EV, CHECK_M, CHECK_EV)
            delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        elif CHECK_M:
            delta = tl.load(delta_ptr + offs_m, mask=offs_m < L, other=0.0)
        else:
            delta = tl.load(delta_ptr + offs_m)
        if NATURAL:
            dv = dv + block_dot(pT, do, MASK_KIND != 1, PREC)
            dpT = dot_nt_f64(v_base, offs_n, s_vn, s_ve, S, do_base, offs_m, s_dm, s_de, L, EV,
                                 CHECK_N, CHECK_M, CHECK_EV, BLOCK_N, BLOCK_M,
                             BLOCK_EV, CHUNK_EV)
            dsT = pT * (dpT - delta[None, :]).to(tl.float32)  # dP - Delta rounded once
            dk = dk + block_dot(dsT, q, MASK_KIND != 1, PREC)
        else:
            do_big, do_small = split_tf32(do, PREC)  # once for both of dO's dots
            pT_big, pT_small = split_tf32(pT.to(do.dtype), PREC)
            dv = dot_split_acc(pT_big, pT_small, do_big, do_small, dv, PREC)
            dpT = dot_split(v, v_small, tl.trans(do_big), tl.trans(do_small), PREC)
            dsT = pT * (dpT - delta[None, :])
            dsT_big, dsT_small = split_tf32(dsT.to(q.dtype), PREC)
            dk = dot_split_acc(dsT_big, dsT_small, q, q_small, dk, PREC)
            if ATOMIC_DQ:  # this key block's share of dQ, added in fp32
                dq = dot_split(tl.trans(dsT_big), tl.trans(dsT_small), k, k_small, PREC) * scale
                if ATOMIC_DQ == 2:
                    dq_desc.atomic_add([start_m, 0], dq)
                else:
                    dq_ptrs = dq_base + offs_m[:, None] * E + offs_e[None, :]
                    if CHECK_M or CHECK_E:
                        tl.atomic_add(dq_ptrs, dq,
                                      mask=(offs_m[:, None] < L) & (offs_e[None, :] < E),
                                      sem="relaxed")
                    else:
                        tl.atomic_add(dq_ptrs, dq, sem="relaxed")
            if FUSE_DQ:  # as sdpa_bwd_dq_kernel computes it, over its one key block
                ds_big, ds_small = split_tf32(tl.trans(dsT).to(k.dtype), PREC)
                dq = dot_split(ds_big, ds_small, k, k_small, PREC) * scale
                dq_ptrs = dq_base + offs_m[:, None] * E + offs_e[None, :]
                if CHECK_M or CHECK_E:
                    tl.store(dq_ptrs, dq.to(dq_base.dtype.element_ty),
                             mask=(offs_m[:, None] < L) & (offs_e[None, :] < E))
                else:
                    tl.store(dq_ptrs, dq.to(dq_base.dtype.element_ty))
    return dk, dv


@triton.autotune(configs=_dkdv_configs(), key=["TUNE_L", "TUNE_S", "TUNE_H", "E", "EV", "BLOCK_E", "BLOCK_EV", "CAUSAL",
                                                "MASK_KIND", "GROUP", "PREC", "FUSE_DQ", "ATOMIC_DQ"],
                 prune_configs_by={"early_config_prune": _dkdv_prune(
                     _make_prune("BLOCK_M", "BLOCK_N", _DKDV_FP32, _DKDV_SAFE, _DKDV_TF32X3,
                                 _DKDV_TF32X3_SAFE),
                     _make_prune("BLOCK_M", "BLOCK_N", _DKDV_FP32, _DKDV_SAFE,
                                 _DKDV_TF32X3_ATOMIC, _DKDV_TF32X3_ATOMIC_SAFE))},
                 reset_to_zero=["DQ"], **TUNE_KW)
@triton.heuristics(BOUNDS_HEURISTICS)
@triton.jit(do_not_specialize=["Z2", "HQ", "TUNE_H"])
def sdpa_bwd_dkdv_kernel(Q, K, V, Mask, DO, Stats, Delta, DK, DV, O, DQ,
                         s_qz1, s_qz2, s_qh, s_qm, s_qe,
                         s_kz1, s_kz2, s_kh, s_kn, s_ke,
                         s_vz1, s_vz2, s_vh, s_vn, s_ve,
                         s_mz1, s_mz2, s_mh, s_mm, s_mn,
                         s_dz1, s_dz2, s_dh, s_dm, s_de,
                         s_gkz1, s_gkz2, s_gkh, s_gkn, s_gke,
                         s_gvz1, s_gvz2, s_gvh, s_gvn, s_gve,
                         s_stat, Z2, HQ, GROUP, L, S, E, EV, qk_scale, scale,
                         TUNE_L, TUNE_S, TUNE_H,
                         CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, PREC: tl.constexpr,
                         NATURAL: tl.constexpr, CHUNK_E: tl.constexpr, CHUNK_EV: tl.constexpr,
                         BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         CHECK_M: tl.constexpr, CHECK_N: tl.constexpr,
                         CHECK_E: tl.constexpr, CHECK_EV: tl.constexpr, FOLD: tl.constexpr,
                         FUSE_DQ: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                         SECTION: tl.constexpr = 0):
    """dK and dV of one key block; with FUSE_DQ (``S <= BLOCK_N``: one key block per kv head)
    also Delta and dQ (:func:`_dkdv_query_loop`), O and DQ contiguous; with ATOMIC_DQ also this
    key block's share of dQ, added to DQ (fp32 [Z1 * Z2 * Hq, L, E], zeroed); otherwise O is
    not read and DQ (dQ's buffer, zeroed before each config the autotuner times) not written.
    Delta comes from :func:`sdpa_bwd_preprocess_kernel` unless FUSE_DQ."""
    tl.static_assert(not (FUSE_DQ and NATURAL), "FUSE_DQ takes the log2-unit kernels only")
    tl.static_assert(not (ATOMIC_DQ and (NATURAL or FUSE_DQ)),
                     "ATOMIC_DQ takes the log2-unit kernels, unfused")
    # over [Z1, Z2, HKV]; causal: the key blocks most queries see first (causal_program)
    pid_n, pid_bkv = program_tile(Q, L, (E + EV) * GROUP, 1, CAUSAL, SECTION, False)
    HKV = HQ // GROUP
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_e = tl.arange(0, BLOCK_E)
    offs_ev = tl.arange(0, BLOCK_EV)
    k_base = K + batch_offset(pid_bkv, HKV, 1, Z2, s_kz1, s_kz2, s_kh, False)
    v_base = V + batch_offset(pid_bkv, HKV, 1, Z2, s_vz1, s_vz2, s_vh, False)
    k = load_tile(k_base, offs_n, offs_e, s_kn, s_ke, S, E, CHECK_N, CHECK_E)
    v = load_tile(v_base, offs_n, offs_ev, s_vn, s_ve, S, EV, CHECK_N, CHECK_EV)
    k, k_small = split_tf32(k, PREC)  # "tf32x3": once per program (k, k for other paths)
    v, v_small = split_tf32(v, PREC)
    dk = tl.zeros([BLOCK_N, BLOCK_E], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_EV], dtype=tl.float32)

    # query blocks that can see this key block under the causal (top-left) mask
    diag_lo = (start_n // BLOCK_M) * BLOCK_M
    diag_hi = tl.minimum(tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M, L)
    for g in range(GROUP):
        pid_bh = (pid_bkv // HKV) * HQ + (pid_bkv % HKV) * GROUP + g
        q_base = Q + batch_offset(pid_bh, HQ, 1, Z2, s_qz1, s_qz2, s_qh, False)
        do_base = DO + batch_offset(pid_bh, HQ, 1, Z2, s_dz1, s_dz2, s_dh, False)
        mask_base = Mask
        if MASK_KIND != 0:
            mask_base = Mask + batch_offset(pid_bh, HQ, 1, Z2, s_mz1, s_mz2, s_mh, False)
        stats_row = Stats + pid_bh.to(tl.int64) * L
        delta_ptr = Delta + pid_bh.to(tl.int64) * L
        o_base = O
        dq_base = DQ
        if FUSE_DQ:
            o_base = O + pid_bh.to(tl.int64) * L * EV
        if FUSE_DQ or ATOMIC_DQ:
            dq_base = DQ + pid_bh.to(tl.int64) * L * E
        if CAUSAL:
            dk, dv = _dkdv_query_loop(dk, dv, k, v, k_small, v_small, k_base, v_base, q_base, do_base, mask_base,
                                      stats_row, s_stat, delta_ptr, o_base, dq_base, scale, offs_n, diag_lo, diag_hi, L, S, E, EV,
                                      s_kn, s_ke, s_vn, s_ve, s_qm, s_qe, s_dm, s_de, s_mm, s_mn,
                                      qk_scale,
                                      MASK_KIND, True, CHECK_M, CHECK_N, CHECK_E, CHECK_EV,
                                      BLOCK_M, BLOCK_N, BLOCK_E, BLOCK_EV, CHUNK_E, CHUNK_EV, PREC,
                                      NATURAL, FOLD, FUSE_DQ, ATOMIC_DQ)
            dk, dv = _dkdv_query_loop(dk, dv, k, v, k_small, v_small, k_base, v_base, q_base, do_base, mask_base,
                                      stats_row, s_stat, delta_ptr, o_base, dq_base, scale, offs_n, diag_hi, L, L, S, E, EV,
                                      s_kn, s_ke, s_vn, s_ve, s_qm, s_qe, s_dm, s_de, s_mm, s_mn,
                                      qk_scale,
                                      MASK_KIND, False, CHECK_M, CHECK_N, CHECK_E, CHECK_EV,
                                      BLOCK_M, BLOCK_N, BLOCK_E, BLOCK_EV, CHUNK_E, CHUNK_EV, PREC,
                                      NATURAL, FOLD, FUSE_DQ, ATOMIC_DQ)
        else:
            dk, dv = _dkdv_query_loop(dk, dv, k, v, k_small, v_small, k_base, v_base, q_base, do_base, mask_base,
                                      stats_row, s_stat, delta_ptr, o_base, dq_base, scale, offs_n, 0, L, L, S, E, EV,
                                      s_kn, s_ke, s_vn, s_ve, s_qm, s_qe, s_dm, s_de, s_mm, s_mn,
                                      qk_scale,
                                      MASK_KIND, False, CHECK_M, CHECK_N, CHECK_E, CHECK_EV,
                                      BLOCK_M, BLOCK_N, BLOCK_E, BLOCK_EV, CHUNK_E, CHUNK_EV, PREC,
                                      NATURAL, FOLD, FUSE_DQ, ATOMIC_DQ)

    dk = dk * scale
    gk_base = DK + batch_offset(pid_bkv, HKV, 1, Z2, s_gkz1, s_gkz2, s_gkh, False)
    gv_base = DV + batch_offset(pid_bkv, HKV, 1, Z2, s_gvz1, s_gvz2, s_gvh, False)
    gk_ptrs = gk_base + offs_n[:, None] * s_gkn + offs_e[None, :] * s_gke
    gv_ptrs = gv_base + offs_n[:, None] * s_gvn + offs_ev[None, :] * s_gve
    if CHECK_N or CHECK_E:
        tl.store(gk_ptrs, dk.to(DK.dtype.element_ty), mask=(offs_n[:, None] < S) & (offs_e[None, :] < E))
    else:
        tl.store(gk_ptrs, dk.to(DK.dtype.element_ty))
    if CHECK_N or CHECK_EV:
        tl.store(gv_ptrs, dv.to(DV.dtype.element_ty),
                 mask=(offs_n[:, None] < S) & (offs_ev[None, :] < EV))
    else:
        tl.store(gv_ptrs, dv.to(DV.dtype.element_ty))


@triton.jit
def _dq_key_loop(dq, q, q_small, do, do_small, m, log_l, log_l_lo, delta, q_base, do_base, k_base, v_base, mask_base,
                 offs_m, lo, hi, L, S, E, EV,
                 s_qm, s_qe, s_dm, s_de, s_kn, s_ke, s_vn, s_ve, s_mm, s_mn, qk_scale,
                 MASK_KIND: tl.constexpr, DIAG: tl.constexpr, CHECK_M: tl.constexpr,
                 CHECK_N: tl.constexpr, CHECK_E: tl.constexpr, CHECK_EV: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                 BLOCK_EV: tl.constexpr, CHUNK_E: tl.constexpr, CHUNK_EV: tl.constexpr,
                 PREC: tl.constexpr, NATURAL: tl.constexpr, FOLD: tl.constexpr):
    """Accumulate dQ (unscaled) of one query block over key blocks [lo, hi).

    Keys past S load as k = v = 0 and get P = 0. fp32 and FOLD as in ``_dkdv_query_loop``."""
    FOLDED: tl.constexpr = FOLD and MASK_KIND == 0 and not NATURAL
    lse2 = m + log_l
    offs_e = tl.arange(0, BLOCK_E)
    offs_ev = tl.arange(0, BLOCK_EV)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = load_tile(k_base, offs_n, offs_e, s_kn, s_ke, S, E, CHECK_N, CHECK_E)
        v = load_tile(v_base, offs_n, offs_ev, s_vn, s_ve, S, EV, CHECK_N, CHECK_EV)
        k, k_small = split_tf32(k, PREC)  # "tf32x3": once for both of k's dots
        v, v_small = split_tf32(v, PREC)
        if NATURAL:
            s2 = dot_nt_f64(q_base, offs_m, s_qm, s_qe, L, k_base, offs_n, s_kn, s_ke, S, E,
                                CHECK_M, CHECK_N, CHECK_E, BLOCK_M, BLOCK_N, BLOCK_E,
                            CHUNK_E)
            s2 = (s2 * qk_scale).to(tl.float32)  # one rounding of the (near-exact) score
        elif FOLDED:
            s2 = dot_split(q, q_small, tl.trans(k), tl.trans(k_small), PREC)
        else:
            s2 = dot_split(q, q_small, tl.trans(k), tl.trans(k_small), PREC) * qk_scale
        if MASK_KIND != 0:
            s2 = apply_attn_mask(s2, mask_base, offs_m, offs_n, s_mm, s_mn, L, S, MASK_KIND, False)
        if FOLDED:
            p = tl.math.exp2(s2 * qk_scale - lse2[:, None])
        else:
            p = recompute_p(s2, m[:, None], log_l[:, None], log_l_lo[:, None], NATURAL,
                            MASK_KIND)
        if DIAG:
            p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        if CHECK_N:  # an out-of-range key's P could overflow (inf * 0 = nan in the dot)
            p = tl.where(offs_n[None, :] < S, p, 0.0)
        if NATURAL:
            dp = dot_nt_f64(do_base, offs_m, s_dm, s_de, L, v_base, offs_n, s_vn, s_ve, S, EV,
                                CHECK_M, CHECK_N, CHECK_EV, BLOCK_M, BLOCK_N,
                            BLOCK_EV, CHUNK_EV)
            ds = p * (dp - delta[:, None]).to(tl.float32)  # dP - Delta rounded once
            dq = dq + block_dot(ds, k, MASK_KIND != 1, PREC)
        else:
            dp = dot_split(do, do_small, tl.trans(v), tl.trans(v_small), PREC)
            ds = p * (dp - delta[:, None])
            ds_big, ds_small = split_tf32(ds.to(k.dtype), PREC)
            dq = dot_split_acc(ds_big, ds_small, k, k_small, dq, PREC)
    return dq


@triton.autotune(configs=_dq_configs(), key=["TUNE_L", "TUNE_S", "TUNE_H", "E", "EV", "BLOCK_E", "BLOCK_EV", "CAUSAL",
                                              "MASK_KIND", "PREC"],
                 prune_configs_by={"early_config_prune": _make_prune("BLOCK_N", "BLOCK_M", ((64, 32, 4, 2), (64, 32, 8, 2)), _DQ_SAFE, _DQ_TF32X3, _DQ_TF32X3_SAFE)},
                 **TUNE_KW)
@triton.heuristics(BOUNDS_HEURISTICS)
@triton.jit(do_not_specialize=["Z2", "HQ", "TUNE_H"])
def sdpa_bwd_dq_kernel(Q, K, V, Mask, DO, Stats, Delta, DQ,
                       s_qz1, s_qz2, s_qh, s_qm, s_qe,
                       s_kz1, s_kz2, s_kh, s_kn, s_ke,
                       s_vz1, s_vz2, s_vh, s_vn, s_ve,
                       s_mz1, s_mz2, s_mh, s_mm, s_mn,
                       s_dz1, s_dz2, s_dh, s_dm, s_de,
                       s_gqz1, s_gqz2, s_gqh, s_gqm, s_gqe,
                       s_stat, Z2, HQ, GROUP, L, S, E, EV, qk_scale, scale,
                       TUNE_L, TUNE_S, TUNE_H,
                       CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, PREC: tl.constexpr,
                       NATURAL: tl.constexpr, CHUNK_E: tl.constexpr, CHUNK_EV: tl.constexpr,
                       BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       CHECK_M: tl.constexpr, CHECK_N: tl.constexpr,
                       CHECK_E: tl.constexpr, CHECK_EV: tl.constexpr, FOLD: tl.constexpr,
                       SECTION: tl.constexpr = 0):
    # causal: the heaviest query blocks first (sdpa_common.causal_program)
    pid_m, pid_bh = program_tile(Q, S, E + EV, GROUP, CAUSAL, SECTION, True)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_e = tl.arange(0, BLOCK_E)
    offs_ev = tl.arange(0, BLOCK_EV)
    q_base = Q + batch_offset(pid_bh, HQ, GROUP, Z2, s_qz1, s_qz2, s_qh, False)
    k_base = K + batch_offset(pid_bh, HQ, GROUP, Z2, s_kz1, s_kz2, s_kh, True)
    v_base = V + batch_offset(pid_bh, HQ, GROUP, Z2, s_vz1, s_vz2, s_vh, True)
    do_base = DO + batch_offset(pid_bh, HQ, GROUP, Z2, s_dz1, s_dz2, s_dh, False)
    mask_base = Mask
    if MASK_KIND != 0:
        mask_base = Mask + batch_offset(pid_bh, HQ, GROUP, Z2, s_mz1, s_mz2, s_mh, False)
    q = load_tile(q_base, offs_m, offs_e, s_qm, s_qe, L, E, CHECK_M, CHECK_E)
    do = load_tile(do_base, offs_m, offs_ev, s_dm, s_de, L, EV, CHECK_M, CHECK_EV)
    q, q_small = split_tf32(q, PREC)  # "tf32x3": once per program (q, q for other paths)
    do, do_small = split_tf32(do, PREC)
    m, log_l, log_l_lo = load_row_stats(Stats + pid_bh.to(tl.int64) * L, s_stat, offs_m, L, True,
                                        NATURAL)
    delta = tl.load(Delta + pid_bh.to(tl.int64) * L + offs_m, mask=offs_m < L, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_E], dtype=tl.float32)
    if CAUSAL:
        free_hi = tl.minimum(start_m, S)
        dq = _dq_key_loop(dq, q, q_small, do, do_small, m, log_l, log_l_lo, delta, q_base, do_base, k_base, v_base, mask_base,
                          offs_m, 0, free_hi,
                          L, S, E, EV, s_qm, s_qe, s_dm, s_de, s_kn, s_ke, s_vn, s_ve, s_mm, s_mn, qk_scale,
                          MASK_KIND, False, CHECK_M, CHECK_N, CHECK_E, CHECK_EV,
                          BLOCK_M, BLOCK_N, BLOCK_E, BLOCK_EV, CHUNK_E, CHUNK_EV, PREC, NATURAL, FOLD)
        diag_hi = tl.minimum(start_m + BLOCK_M, S)
        dq = _dq_key_loop(dq, q, q_small, do, do_small, m, log_l, log_l_lo, delta, q_base, do_base, k_base, v_base, mask_base,
                          offs_m, free_hi,
                          diag_hi, L, S, E, EV, s_qm, s_qe, s_dm, s_de, s_kn, s_ke, s_vn, s_ve, s_mm, s_mn, qk_scale,
                          MASK_KIND, True, CHECK_M, CHECK_N, CHECK_E, CHECK_EV,
                          BLOCK_M, BLOCK_N, BLOCK_E, BLOCK_EV, CHUNK_E, CHUNK_EV, PREC, NATURAL, FOLD)
    else:
        dq = _dq_key_loop(dq, q, q_small, do, do_small, m, log_l, log_l_lo, delta, q_base, do_base, k_base, v_base, mask_base,
                          offs_m, 0, S,
                          L, S, E, EV, s_qm, s_qe, s_dm, s_de, s_kn, s_ke, s_vn, s_ve, s_mm, s_mn, qk_scale,
                          MASK_KIND, False, CHECK_M, CHECK_N, CHECK_E, CHECK_EV,
                          BLOCK_M, BLOCK_N, BLOCK_E, BLOCK_EV, CHUNK_E, CHUNK_EV, PREC, NATURAL, FOLD)
    dq = dq * scale
    gq_base = DQ + batch_offset(pid_bh, HQ, GROUP, Z2, s_gqz1, s_gqz2, s_gqh, False)
    gq_ptrs = gq_base + offs_m[:, None] * s_gqm + offs_e[None, :] * s_gqe
    if CHECK_M or CHECK_E:
        tl.store(gq_ptrs, dq.to(DQ.dtype.element_ty), mask=(offs_m[:, None] < L) & (offs_e[None, :] < E))
    else:
        tl.store(gq_ptrs, dq.to(DQ.dtype.element_ty))
