"""DSA sparse-attention forward kernel (gather semantics, docs/CONTRACT.md "3. DSA sparse attention").

Program (t, head block, value block): one query token, BLOCK_H of its heads, BLOCK_DV
value channels. With ONE_TILE (the whole latent width in one tile, the production path)
each gathered key row is loaded once and serves as K for the scores and as V for the
output, for all heads of the block. Otherwise the scores are accumulated over BLOCK_D
chunks of the latent width and the value chunk is gathered separately (any head dim).

Online softmax on fp32 scores: in natural units with an accurate exponential for fp32
inputs, in base 2 (scale folded with log2e, tl.exp2) for 16-bit inputs (dsa_common, "Score
units"); out = acc / l, lse = ln(sum exp) (natural log), an empty row gives out 0 and
lse -inf. fp32 with FP32_TC (``fast.dsa.set_fp32_mode``, tensor-core dots of PRECISION =
"tf32x3", each slot block's P.V summed apart and added to acc, dsa_common.add_block_dot): 1
("tf32x3") keeps the natural units, accurate exponential and fp64 l of the fp32 path with the
scores from those dots (fl(dot * scale)); 2 ("tf32x3_exp2") runs the 16-bit algorithm on fp32
operands, with IEEE division for out. fp32 with ACC64 (``fast.dsa.KernelConfig.acc64``): P.V is an fp64 dot of the fp64 P
and the gathered rows, chained through an fp64 accumulator (the fp64 tensor cores). The slot loop stops at the row's slot count, so rows compacted with ``topk_length``
skip their tail of holes.
"""
import triton
import triton.language as tl

from .dsa_common import (
    FP32_CHUNK,
    add_block_dot,
    add_rope_part_scores,
    chain_break,
    chain_break2,
    dot6,
    dot_gather_f64,
    exp_accurate,
    gather_parts,
    gather_rows,
    load_heads,
    log_accurate,
    row_slot_count,
    slot_block,
    split3,
)
from .pdl import gdc_wait


@triton.jit
def _chunked_scores(q_ptr, q_off, offs_h, stride_qh, stride_qd, H, kv_ptr, rows, stride_kvs,
                    stride_kvd, valid, DL, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, EVEN_D: tl.constexpr = False):
    """q . k over the latent width in BLOCK_D chunks: [BLOCK_H, BLOCK_K] fp32."""
    s = tl.zeros([BLOCK_H, BLOCK_K], dtype=tl.float32)
    for d0 in range(0, DL, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        qc = load_heads(q_ptr, q_off, offs_h, stride_qh, H, offs_d, stride_qd, DL)
        kc = gather_rows(kv_ptr, rows, stride_kvs, stride_kvd, offs_d, DL, valid, EVEN_D)
        s = tl.dot(qc, tl.trans(kc), s, input_precision=PRECISION)
    return s


@triton.jit
def dsa_fwd_kernel(
    q_ptr, qr_ptr, kv_ptr, kr_ptr, idx_ptr, len_ptr, out_ptr, lse_ptr,
    H, S, K, DL, DR,
    stride_qt, stride_qh, stride_qd, stride_qrt, stride_qrh, stride_qrd,
    stride_kvs, stride_kvd, stride_krs, stride_krd, stride_it, stride_ik,
    stride_ot, stride_oh, stride_od,
    scale, scale_log2,
    HAS_ROPE: tl.constexpr, HAS_LEN: tl.constexpr, ONE_TILE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr = False, SPLIT_S: tl.constexpr = 0, ACC64: tl.constexpr = False,
    FP32_TC: tl.constexpr = 0, I32: tl.constexpr = False, NO_ZERO_TRIP: tl.constexpr = False,
    EVEN_D: tl.constexpr = False,
):
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    vb = tl.program_id(2)
    offs_v = vb * BLOCK_DV + tl.arange(0, BLOCK_DV)
    offs_r = tl.arange(0, BLOCK_DR)
    # fp32: natural-unit scores, unless FP32_TC == 2 (the 16-bit algorithm on fp32 operands)
    NATURAL: tl.constexpr = q_ptr.dtype.element_ty == tl.float32 and FP32_TC != 2

    if ONE_TILE:
        q = load_heads(q_ptr, t * stride_qt, offs_h, stride_qh, H, offs_v, stride_qd, DL)
    if HAS_ROPE:
        qr = load_heads(qr_ptr, t * stride_qrt, offs_h, stride_qrh, H, offs_r, stride_qrd, DR)
    if PDL:  # launched as a programmatic dependent: indices and lengths come from the grid before
        gdc_wait()
    n_slots = row_slot_count(len_ptr, t, K, HAS_LEN, I32)
    n_end = n_slots
    if NO_ZERO_TRIP:
        # at least one (all-invalid, contributing nothing) block for an empty row: a loop that
        # may run zero times leaves the accumulator defined by moves on the bypass path, and
        # ptxas then serialises every wgmma of the kernel (warning C7515) once the P.V dot is
        # left in flight across iterations (2+ stages) and the body has a branch (split scores)
        n_end = tl.maximum(n_slots, 1)

    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_H], dtype=tl.float32)
    if NATURAL:
        l64 = tl.zeros([BLOCK_H], dtype=tl.float64)
    if ACC64:  # fp32 inputs: P.V as fp64 dots chained through an fp64 accumulator
        acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float64)
    else:
        acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    for start in range(0, n_end, BLOCK_K):
        offs_k = start + tl.arange(0, BLOCK_K)
        valid, rows = slot_block(idx_ptr, t * stride_it, stride_ik, offs_k, n_slots, S, I32)
        if NATURAL and FP32_TC:
            # fp32, tensor cores: the score from fp32 dots of PRECISION, times scale rounded once
            if ONE_TILE:
                v = gather_rows(kv_ptr, rows, stride_kvs, stride_kvd, offs_v, DL, valid, EVEN_D)
                s32 = tl.dot(q, tl.trans(v), input_precision=PRECISION)
            else:
                s32 = _chunked_scores(q_ptr, t * stride_qt, offs_h, stride_qh, stride_qd, H,
                                      kv_ptr, rows, stride_kvs, stride_kvd, valid, DL, BLOCK_H,
                                      BLOCK_K, BLOCK_D, PRECISION, EVEN_D)
                v = gather_rows(kv_ptr, rows, stride_kvs, stride_kvd, offs_v, DL, valid, EVEN_D)
            if HAS_ROPE:
                kr = gather_rows(kr_ptr, rows, stride_krs, stride_krd, offs_r, DR, valid, EVEN_D)
                s32 = tl.dot(qr, tl.trans(kr), s32, input_precision=PRECISION)
            s = tl.where(valid[None, :], s32 * scale, float("-inf"))
        elif NATURAL:
            # fp32 (dsa_common, "reduction order"): the score from an fp64-accumulated dot,
            # rounded once
            s64 = tl.zeros([BLOCK_H, BLOCK_K], dtype=tl.float64)
            s64 = dot_gather_f64(s64, q_ptr, t * stride_qt, offs_h, stride_qh, stride_qd, H,
                                 kv_ptr, rows, stride_kvs, stride_kvd, valid, DL, BLOCK_D)
            if HAS_ROPE:
                s64 = dot_gather_f64(s64, qr_ptr, t * stride_qrt, offs_h, stride_qrh, stride_qrd,
                                     H, kr_ptr, rows, stride_krs, stride_krd, valid, DR,
                                     FP32_CHUNK)
            v = gather_rows(kv_ptr, rows, stride_kvs, stride_kvd, offs_v, DL, valid, EVEN_D)
            s = tl.where(valid[None, :], (s64 * scale).to(tl.float32), float("-inf"))
        if NATURAL:
            # exp and l in fp64; this block's P.V added to acc as its own dot
            m_new = tl.maximum(m, tl.max(s, axis=1))
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            p64 = exp_accurate(s.to(tl.float64) - m_shift.to(tl.float64)[:, None])
            alpha64 = exp_accurate(m.to(tl.float64) - m_shift.to(tl.float64))
            p = p64.to(tl.float32)
            l64 = l64 * alpha64 + tl.sum(p64, axis=1)
            if ACC64:  # fp64 sums: the chain through acc costs nothing at fp32 precision
                acc = tl.dot(p64, v.to(tl.float64), acc * alpha64[:, None],
                             input_precision="ieee", out_dtype=tl.float64)
            else:
                acc = add_block_dot(acc, alpha64.to(tl.float32)[:, None], p, v, PRECISION)
            m = m_new
        else:  # 16-bit inputs (and FP32_TC 2): base-2 scores, tl.exp2, P.V chained through acc
            if ONE_TILE:
                v = gather_rows(kv_ptr, rows, stride_kvs, stride_kvd, offs_v, DL, valid, EVEN_D)
                s = tl.dot(q, tl.trans(v), input_precision=PRECISION)
            else:
                s = _chunked_scores(q_ptr, t * stride_qt, offs_h, stride_qh, stride_qd, H,
                                    kv_ptr, rows, stride_kvs, stride_kvd, valid, DL, BLOCK_H,
                                    BLOCK_K, BLOCK_D, PRECISION, EVEN_D)
                v = gather_rows(kv_ptr, rows, stride_kvs, stride_kvd, offs_v, DL, valid, EVEN_D)
            # SPLIT_S: the score dots unchained (dsa_common.chain_break), each warpgroup takes
            # its own slot columns; 1: a branch after each dot, 2: both dots, then one branch
            if SPLIT_S == 1:
                s = chain_break(s, start < n_end)
            if HAS_ROPE:
                kr = gather_rows(kr_ptr, rows, stride_krs, stride_krd, offs_r, DR, valid, EVEN_D)
                if SPLIT_S == 2:
                    s_rope = tl.dot(qr, tl.trans(kr), input_precision=PRECISION)
                    s, s_rope = chain_break2(s, s_rope, start < n_end)
                    s = s + s_rope
                else:
                    s = tl.dot(qr, tl.trans(kr), s, input_precision=PRECISION)
            elif SPLIT_S == 2:
                s = chain_break(s, start < n_end)
            s = tl.where(valid[None, :], s * scale_log2, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            # a row with no valid slot yet keeps m = -inf; shift by 0 so exp gives 0, not NaN
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_shift[:, None])
            alpha = tl.exp2(m - m_shift)
            l = l * alpha + tl.sum(p, axis=1)
            if SPLIT_S:
                p = chain_break(p, start < n_end)
                alpha = chain_break(alpha, start < n_end)
            if FP32_TC:  # fp32 operands: each block's P.V its own dot, not one chain over slots
                acc = add_block_dot(acc, alpha[:, None], p, v, PRECISION)
            else:
                acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
            m = m_new

    if NATURAL:  # out = acc / l and lse = m + log(l) in fp64, rounded once
        nonempty = l64 > 0
        l64_safe = tl.where(nonempty, l64, 1.0)
        out = (acc.to(tl.float64) / l64_safe[:, None]).to(tl.float32)
    else:
        nonempty = l > 0
        l_safe = tl.where(nonempty, l, 1.0)
        if FP32_TC:  # IEEE division (a plain fp32 `/` compiles to div.full.f32, ~2 ulp)
            out = tl.math.div_rn(acc, l_safe[:, None])
        else:
            out = acc / l_safe[:, None]
    o_ptrs = out_ptr + t * stride_ot + offs_h[:, None] * stride_oh + offs_v[None, :] * stride_od
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty),
             mask=(offs_h[:, None] < H) & (offs_v[None, :] < DL))
    if NATURAL:
        lse = tl.where(nonempty, (m.to(tl.float64) + log_accurate(l64_safe)).to(tl.float32),
                       float("-inf"))
    else:
        lse = tl.where(nonempty, (m + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    tl.store(lse_ptr + t * H + offs_h, lse, mask=(offs_h < H) & ((offs_h * 0 + vb) == 0))


# ----------------------------------------------------------------------------- fp32 "bf16x6"
# fast.dsa's fp32 "bf16x6" mode runs the naive algorithm in two launches instead of the fused
# kernel above: dsa_fp32_scores_kernel writes the scores of each (token, slot block) to a
# scratch buffer with the block's max and sum of exponentials, dsa_fp32_pv_kernel combines the
# blocks' statistics into each row's max and sum and adds P.V over the row's slots. Every
# product is split-bf16 on the bf16 tensor cores (dsa_common.split3 / dot6, the key rows as
# the host's [3, S, Dl + Dr] parts buffer); the score is fl(dot * scale) in natural units,
# P = fl(exp(s - m) / l) with the exponential, the sums and 1 / l in fp64 (the "acc64" path's
# softmax), lse = m + log(l). The scores travel through memory (4 bytes per score, written
# once, read once per value chunk), so that neither launch keeps the 64 x 512 output tile and
# the score tile of a slot block live together (docs/DESIGN.md "11. fast DSA (Triton)").


@triton.jit
def dsa_fp32_scores_kernel(
    q_ptr, qr_ptr, kvp_ptr, krp_ptr, idx_ptr, len_ptr, s_ptr, bm_ptr, bl_ptr,
    H, S, K, DL, DR, NB,
    stride_qt, stride_qh, stride_qd, stride_qrt, stride_qrh, stride_qrd,
    stride_ps, stride_it, stride_ik,
    scale,
    HAS_ROPE: tl.constexpr, HAS_LEN: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DR: tl.constexpr,
    BF16: tl.constexpr, I32: tl.constexpr = False,
):
    """Program (t, head block, slot block of BLOCK_N): s = fl(q . k * scale) of the block's
    slots (-inf where invalid) into s_ptr [T, H, K], the block's max over its slots into bm_ptr
    [T, NB, H] (fp32) and sum of exp(s - max) into bl_ptr (fp64). Blocks at or past the row's
    slot count write nothing (the P.V launch reads no further)."""
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    nb = tl.program_id(2)
    n_slots = row_slot_count(len_ptr, t, K, HAS_LEN, I32)
    start = nb * BLOCK_N
    if start < n_slots:
        offs_k = start + tl.arange(0, BLOCK_N)
        valid, rows = slot_block(idx_ptr, t * stride_it, stride_ik, offs_k, n_slots, S, I32)
        # each latent piece's product from a zero accumulator, added to s (dsa_common.dot6)
        zero = tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32)
        s = zero
        part = (t * 0 + S) * stride_ps  # int64 (S and the stride may be specialised ints)
        for d0 in range(0, DL, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            qc = load_heads(q_ptr, t * stride_qt, offs_h, stride_qh, H, offs_d, stride_qd, DL)
            q0, q1, q2 = split3(qc, BF16)
            k0, k1, k2 = gather_parts(kvp_ptr, part, rows, stride_ps, 1, offs_d, DL, valid,
                                      False, BF16)
            s += dot6(q0, q1, q2, tl.trans(k0), tl.trans(k1), tl.trans(k2), zero, BF16)
        if HAS_ROPE:
            s, r0, r1, r2 = add_rope_part_scores(s, qr_ptr, t * stride_qrt, offs_h, stride_qrh,
                                                 stride_qrd, H, DR, krp_ptr, part, rows,
                                                 stride_ps, valid, zero, BLOCK_DR, BF16)
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        h_ok = offs_h < H
        tl.store(s_ptr + (t * H + offs_h[:, None]) * K + offs_k[None, :], s,
                 mask=h_ok[:, None] & (offs_k[None, :] < K))
        m_b = tl.max(s, axis=1)
        m_sh = tl.where(m_b == float("-inf"), 0.0, m_b)
        l_b = tl.sum(exp_accurate(s.to(tl.float64) - m_sh.to(tl.float64)[:, None]), axis=1)
        stat = (t * NB + nb) * H + offs_h
        tl.store(bm_ptr + stat, m_b, mask=h_ok)
        tl.store(bl_ptr + stat, l_b, mask=h_ok)


@triton.jit
def dsa_fp32_pv_kernel(
    kvp_ptr, idx_ptr, len_ptr, s_ptr, bm_ptr, bl_ptr, out_ptr, lse_ptr,
    H, S, K, DL, NB,
    stride_ps, stride_it, stride_ik, stride_ot, stride_oh, stride_od,
    HAS_LEN: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr, BF16: tl.constexpr,
    I32: tl.constexpr = False,
):
    """Program (t, head block, value chunk): the row's max m and sum l from the scores launch's
    block statistics, then out = sum over slot blocks of P . V with P = fl(exp(s - m) / l)
    (fp64 exponential), each block's product its own split-bf16 dot added to the fp32
    accumulator; lse = m + log(l) in fp64 (-inf and out 0 for an empty row)."""
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    vb = tl.program_id(2)
    offs_v = vb * BLOCK_DV + tl.arange(0, BLOCK_DV)
    h_ok = offs_h < H
    n_slots = row_slot_count(len_ptr, t, K, HAS_LEN, I32)
    n_blocks = tl.cdiv(n_slots, BLOCK_N)
    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    for b in range(0, n_blocks):
        m = tl.maximum(m, tl.load(bm_ptr + (t * NB + b) * H + offs_h, mask=h_ok,
                                  other=float("-inf")))
    m_sh = tl.where(m == float("-inf"), 0.0, m).to(tl.float64)
    l = tl.zeros([BLOCK_H], dtype=tl.float64)
    for b in range(0, n_blocks):
        stat = (t * NB + b) * H + offs_h
        m_b = tl.load(bm_ptr + stat, mask=h_ok, other=float("-inf")).to(tl.float64)
        l_b = tl.load(bl_ptr + stat, mask=h_ok, other=0.0)
        l += l_b * exp_accurate(m_b - m_sh)
    nonempty = l > 0
    inv_l = tl.where(nonempty, 1.0 / tl.where(nonempty, l, 1.0), 0.0)
    part = (t * 0 + S) * stride_ps  # int64 (S and the stride may be specialised ints)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    for start in range(0, n_slots, BLOCK_K):
        offs_k = start + tl.arange(0, BLOCK_K)
        valid, rows = slot_block(idx_ptr, t * stride_it, stride_ik, offs_k, n_slots, S, I32)
        s = tl.load(s_ptr + (t * H + offs_h[:, None]) * K + offs_k[None, :],
                    mask=h_ok[:, None] & (offs_k[None, :] < n_slots), other=float("-inf"))
        p = (exp_accurate(s.to(tl.float64) - m_sh[:, None]) * inv_l[:, None]).to(tl.float32)
        p0, p1, p2 = split3(p, BF16)
        v0, v1, v2 = gather_parts(kvp_ptr, part, rows, stride_ps, 1, offs_v, DL, valid, False,
                                  BF16)
        acc += dot6(p0, p1, p2, v0, v1, v2, tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32),
                    BF16)
    o_ptrs = out_ptr + t * stride_ot + offs_h[:, None] * stride_oh + offs_v[None, :] * stride_od
    tl.store(o_ptrs, acc, mask=h_ok[:, None] & (offs_v[None, :] < DL))
    lse = tl.where(nonempty, (m_sh + log_accurate(tl.where(nonempty, l, 1.0))).to(tl.float32),
                   float("-inf"))
    tl.store(lse_ptr + t * H + offs_h, lse, mask=h_ok & ((offs_h * 0 + vb) == 0))
