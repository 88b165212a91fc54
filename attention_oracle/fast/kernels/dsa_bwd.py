"""DSA sparse-attention backward kernel (gather semantics, docs/CONTRACT.md "3. DSA sparse attention").

Program (t, head block, latent chunk): one query token, BLOCK_H of its heads, and the
latent channels [c0, c0 + BLOCK_DC) whose gradients it owns. Per slot block it recomputes
P = exp(scale * s - lse) from the saved lse (natural units and an accurate exponential
for fp32 inputs, base 2 with tl.exp2 for 16-bit inputs, as in the forward),
dP = dO . V^T and dS = P * (dP - Delta) * scale, with Delta = rowsum(dO * O) computed
here (dout is read in place through its strides, never copied). Then

- dq chunk += dS . K (registers, fp32; one program owns a dq row chunk, so dq is
  bitwise deterministic),
- dkv rows  += dS^T . Q + P^T . dO  (atomics into an [S, DL] buffer: fp32, or fp64 for fp32
  inputs; a duplicate slot adds twice, an invalid slot adds nothing),
- with RoPE, chunk 0 also owns dq_rope and dk_rope.

fp32 with ACC64 (``fast.dsa.KernelConfig.acc64``): P and dS stay fp64 and every product above
is an fp64 dot (the fp64 tensor cores); dq is summed in fp64 and rounded once at the store.

fp32 with FP32_TC (``fast.dsa.set_fp32_mode``): scores, dP and every product as tensor-core
dots of PRECISION ("tf32x3"), each slot block's dS.K added to dq apart
(dsa_common.add_block_dot); 1 ("tf32x3") keeps the fp32 path's natural units, accurate
exponential and fp64 dS, 2 ("tf32x3_exp2") runs the 16-bit algorithm on fp32 operands with
Delta summed in fp64.

ONE_TILE: the chunk is the whole latent width, so one gathered tile serves scores, dP,
dq and dkv (the production path). Otherwise scores and dP are accumulated over BLOCK_D
chunks and the owned chunk is gathered again.
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
    row_slot_count,
    slot_block,
    split3,
)


@triton.jit
def _row_delta(out_ptr, o_off, stride_oh, stride_od, do_ptr, do_off, stride_doh, stride_dod,
               offs_h, H, DL, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, ACC: tl.constexpr):
    """Delta[h] = sum_d dO[h, d] * O[h, d], accumulated in ACC (fp32 for 16-bit inputs; fp64
    on the fp32 path, where the products are exact)."""
    delta = tl.zeros([BLOCK_H], dtype=ACC)
    for d0 in range(0, DL, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        o = load_heads(out_ptr, o_off, offs_h, stride_oh, H, offs_d, stride_od, DL)
        do = load_heads(do_ptr, do_off, offs_h, stride_doh, H, offs_d, stride_dod, DL)
        delta += tl.sum(o.to(ACC) * do.to(ACC), axis=1)
    return delta


@triton.jit
def _chunked_scores_and_dp(q_ptr, q_off, stride_qh, stride_qd, do_ptr, do_off, stride_doh,
                           stride_dod, offs_h, H, kv_ptr, rows, stride_kvs, stride_kvd, valid, DL,
                           BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                           PRECISION: tl.constexpr, EVEN_D: tl.constexpr = False):
    """(q . k, dO . v) over the latent width in BLOCK_D chunks (values are the latent rows)."""
    s = tl.zeros([BLOCK_H, BLOCK_K], dtype=tl.float32)
    dp = tl.zeros([BLOCK_H, BLOCK_K], dtype=tl.float32)
    for d0 in range(0, DL, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        kc = tl.trans(gather_rows(kv_ptr, rows, stride_kvs, stride_kvd, offs_d, DL, valid, EVEN_D))
        qc = load_heads(q_ptr, q_off, offs_h, stride_qh, H, offs_d, stride_qd, DL)
        s = tl.dot(qc, kc, s, input_precision=PRECISION)
        doc = load_heads(do_ptr, do_off, offs_h, stride_doh, H, offs_d, stride_dod, DL)
        dp = tl.dot(doc.to(kc.dtype), kc, dp, input_precision=PRECISION)
    return s, dp


@triton.jit
def _rope_grads(dqr, ds, kr, qr, dkr_ptr, rows, valid, offs_r, r_mask, DR, ACC_KV: tl.constexpr,
                BLOCK_SUM: tl.constexpr, DKV_T: tl.constexpr, PRECISION: tl.constexpr):
    """dq_rope += dS . K_rope (each block's product its own dot with BLOCK_SUM) and the
    dk_rope atomics dS^T . q_rope (rows where r_mask holds, chunk 0's); returns dq_rope."""
    if BLOCK_SUM:
        dqr = add_block_dot(dqr, 1.0, ds, kr, PRECISION)
    else:
        dqr = tl.dot(ds, kr, dqr, input_precision=PRECISION)
    if DKV_T:
        dkr_t = tl.dot(tl.trans(qr), ds, input_precision=PRECISION)
        tl.atomic_add(dkr_ptr + rows[None, :] * DR + offs_r[:, None], dkr_t.to(ACC_KV),
                      mask=valid[None, :] & (tl.trans(r_mask)), sem="relaxed")
    else:
        dkr = tl.dot(tl.trans(ds), qr, input_precision=PRECISION)
        tl.atomic_add(dkr_ptr + rows[:, None] * DR + offs_r[None, :], dkr.to(ACC_KV),
                      mask=valid[:, None] & r_mask, sem="relaxed")
    return dqr


@triton.jit
def dsa_bwd_kernel(
    q_ptr, qr_ptr, kv_ptr, kr_ptr, idx_ptr, len_ptr, out_ptr, do_ptr, lse_ptr,
    dq_ptr, dqr_ptr, dkv_ptr, dkr_ptr,
    H, S, K, DL, DR,
    stride_qt, stride_qh, stride_qd, stride_qrt, stride_qrh, stride_qrd,
    stride_kvs, stride_kvd, stride_krs, stride_krd, stride_it, stride_ik,
    stride_ot, stride_oh, stride_od, stride_dot, stride_doh, stride_dod,
    scale, scale_log2,
    HAS_ROPE: tl.constexpr, HAS_LEN: tl.constexpr, ONE_TILE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DC: tl.constexpr, BLOCK_DR: tl.constexpr, PRECISION: tl.constexpr,
    DKV_T: tl.constexpr = False, SPLIT_S: tl.constexpr = False, HALVES: tl.constexpr = False,
    ACC64: tl.constexpr = False, FP32_TC: tl.constexpr = 0, I32: tl.constexpr = False,
    TOKEN_MAJOR: tl.constexpr = False, ROPE_OWNER: tl.constexpr = False,
    EVEN_D: tl.constexpr = False,
):
    if TOKEN_MAJOR:  # a 1-D grid with the programs of one token adjacent (they gather the same rows)
        pid = tl.program_id(0)
        n_cb = tl.cdiv(DL, BLOCK_DC)
        n_hb = tl.cdiv(H, BLOCK_H)
        cb = pid % n_cb
        hb = (pid // n_cb) % n_hb
        t = (pid // (n_cb * n_hb)).to(tl.int64)
    else:
        t = tl.program_id(0).to(tl.int64)
        hb = tl.program_id(1)
        cb = tl.program_id(2)
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_c = cb * BLOCK_DC + tl.arange(0, BLOCK_DC)
    offs_r = tl.arange(0, BLOCK_DR)
    n_slots = row_slot_count(len_ptr, t, K, HAS_LEN, I32)
    # fp32: natural-unit scores, unless FP32_TC == 2 (the 16-bit algorithm on fp32 operands)
    NATURAL: tl.constexpr = q_ptr.dtype.element_ty == tl.float32 and FP32_TC != 2
    ACC_KV: tl.constexpr = dkv_ptr.dtype.element_ty  # fp64 for fp32 inputs, else fp32
    q_off = t * stride_qt
    do_off = t * stride_dot

    lse = tl.load(lse_ptr + t * H + offs_h, mask=offs_h < H, other=float("inf"))
    # an empty row (lse = -inf) and padding heads get P = exp(s - inf) = 0
    if NATURAL:
        lse_sub = tl.where(lse == float("-inf"), float("inf"), lse)
        delta64 = _row_delta(out_ptr, t * stride_ot, stride_oh, stride_od, do_ptr, do_off,
                             stride_doh, stride_dod, offs_h, H, DL, BLOCK_H, BLOCK_D, tl.float64)
    else:
        lse_sub = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        if FP32_TC:  # Delta's exact fp32 products summed in fp64, rounded once
            delta = _row_delta(out_ptr, t * stride_ot, stride_oh, stride_od, do_ptr, do_off,
                               stride_doh, stride_dod, offs_h, H, DL, BLOCK_H, BLOCK_D,
                               tl.float64).to(tl.float32)
        else:
            delta = _row_delta(out_ptr, t * stride_ot, stride_oh, stride_od, do_ptr, do_off,
                               stride_doh, stride_dod, offs_h, H, DL, BLOCK_H, BLOCK_D, tl.float32)

    q = load_heads(q_ptr, q_off, offs_h, stride_qh, H, offs_c, stride_qd, DL)
    do = load_heads(do_ptr, do_off, offs_h, stride_doh, H, offs_c, stride_dod, DL).to(q.dtype)
    if HALVES:  # the latent half this program does not own, for the scores and dP only
        offs_b = (1 - cb) * BLOCK_DC + tl.arange(0, BLOCK_DC)
        qb = load_heads(q_ptr, q_off, offs_h, stride_qh, H, offs_b, stride_qd, DL)
        dob = load_heads(do_ptr, do_off, offs_h, stride_doh, H, offs_b, stride_dod, DL).to(q.dtype)
    if HAS_ROPE:
        qr = load_heads(qr_ptr, t * stride_qrt, offs_h, stride_qrh, H, offs_r, stride_qrd, DR)
    if ACC64:  # fp32 inputs: every product of the slot loop as an fp64 dot, dq summed in fp64
        q = q.to(tl.float64)
        do = do.to(tl.float64)
        if HAS_ROPE:
            qr = qr.to(tl.float64)
        dq = tl.zeros([BLOCK_H, BLOCK_DC], dtype=tl.float64)
        dqr = tl.zeros([BLOCK_H, BLOCK_DR], dtype=tl.float64)
    else:
        dq = tl.zeros([BLOCK_H, BLOCK_DC], dtype=tl.float32)
        dqr = tl.zeros([BLOCK_H, BLOCK_DR], dtype=tl.float32)
    c_mask = offs_c[None, :] < DL
    r_mask = (offs_r[None, :] < DR) & ((offs_r[None, :] * 0 + cb) == 0)  # chunk 0 owns rope
    for start in range(0, n_slots, BLOCK_K):
        offs_k = start + tl.arange(0, BLOCK_K)
        valid, rows = slot_block(idx_ptr, t * stride_it, stride_ik, offs_k, n_slots, S, I32)
        kc = gather_rows(kv_ptr, rows, stride_kvs, stride_kvd, offs_c, DL, valid, EVEN_D)
        if NATURAL and not FP32_TC:
            # fp32 (dsa_common, "reduction order"): score and dP from fp64-accumulated dots,
            # the score rounded once as in the forward
            s64 = tl.zeros([BLOCK_H, BLOCK_K], dtype=tl.float64)
            s64 = dot_gather_f64(s64, q_ptr, q_off, offs_h, stride_qh, stride_qd, H, kv_ptr, rows,
                                 stride_kvs, stride_kvd, valid, DL, BLOCK_D)
            dp64 = tl.zeros([BLOCK_H, BLOCK_K], dtype=tl.float64)
            dp64 = dot_gather_f64(dp64, do_ptr, do_off, offs_h, stride_doh, stride_dod, H, kv_ptr,
                                  rows, stride_kvs, stride_kvd, valid, DL, BLOCK_D)
            if HAS_ROPE:
                kr = gather_rows(kr_ptr, rows, stride_krs, stride_krd, offs_r, DR, valid, EVEN_D)
                s64 = dot_gather_f64(s64, qr_ptr, t * stride_qrt, offs_h, stride_qrh, stride_qrd,
                                     H, kr_ptr, rows, stride_krs, stride_krd, valid, DR,
                                     FP32_CHUNK)
            s = tl.where(valid[None, :], (s64 * scale).to(tl.float32), float("-inf"))
        else:  # scores and dP as dots of PRECISION (16-bit inputs, fp32 with FP32_TC)
            if ONE_TILE or HALVES:
                s = tl.dot(q, tl.trans(kc), input_precision=PRECISION)
                dp = tl.dot(do, tl.trans(kc), input_precision=PRECISION)
                if HALVES:
                    kb = gather_rows(kv_ptr, rows, stride_kvs, stride_kvd, offs_b, DL, valid,
                                     EVEN_D)
                    if SPLIT_S:
                        s, dp = chain_break2(s, dp, start < n_slots)
                    s = tl.dot(qb, tl.trans(kb), s, input_precision=PRECISION)
                    dp = tl.dot(dob, tl.trans(kb), dp, input_precision=PRECISION)
                if SPLIT_S:  # unchained score dots: each warpgroup takes its own slot columns
                    s, dp = chain_break2(s, dp, start < n_slots)
            else:
                s, dp = _chunked_scores_and_dp(q_ptr, q_off, stride_qh, stride_qd, do_ptr,
                                               do_off, stride_doh, stride_dod, offs_h, H, kv_ptr,
                                               rows, stride_kvs, stride_kvd, valid, DL, BLOCK_H,
                                               BLOCK_K, BLOCK_D, PRECISION, EVEN_D)
            if HAS_ROPE:
                kr = gather_rows(kr_ptr, rows, stride_krs, stride_krd, offs_r, DR, valid, EVEN_D)
                s = tl.dot(qr, tl.trans(kr), s, input_precision=PRECISION)
                if SPLIT_S:
                    s = chain_break(s, start < n_slots)
            if NATURAL:  # FP32_TC 1: natural units, the score times scale rounded once
                s = tl.where(valid[None, :], s * scale, float("-inf"))
                dp64 = dp.to(tl.float64)
        if NATURAL:
            # fp32: P = exp(s - lse) in fp64, dS = P (dP - Delta) scale in fp64 rounded once;
            # per-block dS.K added to dq
            p64 = exp_accurate(s.to(tl.float64) - lse_sub.to(tl.float64)[:, None])
            if ACC64:  # P and dS stay fp64; the fp64 chain through dq is far below fp32 rounding
                p = p64
                ds = p64 * (dp64 - delta64[:, None]) * scale
                kc = kc.to(tl.float64)
                dq = tl.dot(ds, kc, dq, input_precision="ieee", out_dtype=tl.float64)
            else:
                p = p64.to(tl.float32)
                ds = (p64 * (dp64 - delta64[:, None]) * scale).to(tl.float32)
                dq = add_block_dot(dq, 1.0, ds, kc, PRECISION)  # no chain over slots
        else:
            p = tl.exp2(tl.where(valid[None, :], s * scale_log2, float("-inf")) - lse_sub[:, None])
            ds = (p * (dp - delta[:, None]) * scale).to(kc.dtype)
            if FP32_TC:  # fp32 operands: each block's dS.K its own dot, not one chain over slots
                dq = add_block_dot(dq, 1.0, ds, kc, PRECISION)
            else:
                dq = tl.dot(ds, kc, dq, input_precision=PRECISION)
        if ACC64:
            dkv = tl.dot(tl.trans(ds), q, input_precision="ieee", out_dtype=tl.float64)
            dkv = tl.dot(tl.trans(p), do, dkv, input_precision="ieee", out_dtype=tl.float64)
            tl.atomic_add(dkv_ptr + rows[:, None] * DL + offs_c[None, :], dkv,
                          mask=valid[:, None] & c_mask, sem="relaxed")
        elif DKV_T:
            # dkv^T = q^T . dS + dO^T . P: the wide latent is the M side of the products,
            # and q / dO serve both products from one shared-memory copy each
            dkv_t = tl.dot(tl.trans(q), ds, input_precision=PRECISION)
            dkv_t = tl.dot(tl.trans(do), p.to(kc.dtype), dkv_t, input_precision=PRECISION)
            tl.atomic_add(dkv_ptr + rows[None, :] * DL + offs_c[:, None], dkv_t.to(ACC_KV),
                          mask=valid[None, :] & (offs_c[:, None] < DL), sem="relaxed")
        else:
            dkv = tl.dot(tl.trans(ds), q, input_precision=PRECISION)
            dkv = tl.dot(tl.trans(p.to(kc.dtype)), do, dkv, input_precision=PRECISION)
            tl.atomic_add(dkv_ptr + rows[:, None] * DL + offs_c[None, :], dkv.to(ACC_KV),
                          mask=valid[:, None] & c_mask, sem="relaxed")
        if HAS_ROPE and ACC64:
            kr = kr.to(tl.float64)
            dqr = tl.dot(ds, kr, dqr, input_precision="ieee", out_dtype=tl.float64)
            dkr = tl.dot(tl.trans(ds), qr, input_precision="ieee", out_dtype=tl.float64)
            tl.atomic_add(dkr_ptr + rows[:, None] * DR + offs_r[None, :], dkr,
                          mask=valid[:, None] & r_mask, sem="relaxed")
        elif HAS_ROPE:
            if ROPE_OWNER:  # only chunk 0 stores dq_rope and adds dk_rope: the others skip the work
                if cb == 0:
                    dqr = _rope_grads(dqr, ds, kr, qr, dkr_ptr, rows, valid, offs_r, r_mask, DR,
                                      ACC_KV, NATURAL or FP32_TC, DKV_T, PRECISION)
            else:
                dqr = _rope_grads(dqr, ds, kr, qr, dkr_ptr, rows, valid, offs_r, r_mask, DR,
                                  ACC_KV, NATURAL or FP32_TC, DKV_T, PRECISION)

    h_mask = offs_h[:, None] < H
    tl.store(dq_ptr + t * H * DL + offs_h[:, None] * DL + offs_c[None, :],
             dq.to(dq_ptr.dtype.element_ty), mask=h_mask & c_mask)
    if HAS_ROPE:
        tl.store(dqr_ptr + t * H * DR + offs_h[:, None] * DR + offs_r[None, :],
                 dqr.to(dqr_ptr.dtype.element_ty), mask=h_mask & r_mask)


# ----------------------------------------------------------------------------- fp32 "bf16x6"
# fast.dsa's fp32 "bf16x6" backward in three launches (every product split-bf16 on the bf16
# tensor cores, dsa_common.split3 / dot6; the key rows as the host's [3, S, Dl + Dr] parts
# buffer): dsa_fp32_delta_kernel forms Delta = rowsum(dO * O) in fp64;
# dsa_fp32_bwd_scores_kernel recomputes, per (token, slot block), the scores as the forward
# does and dP = dO . V^T, takes P = exp(s - lse) and dS = P (dP - Delta) scale in fp64, writes
# dS (rounded to fp32) to a scratch buffer and adds dS^T . Q + P^T . dO (and dS^T . q_rope) to
# the fp64 key-gradient rows; dsa_fp32_bwd_dq_kernel sums dq = dS . K per (token, column
# chunk) over the row's slot blocks in order (dq deterministic), each block's product its own
# dot added to the fp32 accumulator.


@triton.jit
def dsa_fp32_delta_kernel(out_ptr, do_ptr, delta_ptr, H, DL,
                          stride_ot, stride_oh, stride_od, stride_dot, stride_doh, stride_dod,
                          BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """delta [T, H] fp64 = sum_d dO * O (exact fp32 products summed in fp64)."""
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    delta = _row_delta(out_ptr, t * stride_ot, stride_oh, stride_od, do_ptr, t * stride_dot,
                       stride_doh, stride_dod, offs_h, H, DL, BLOCK_H, BLOCK_D, tl.float64)
    tl.store(delta_ptr + t * H + offs_h, delta, mask=offs_h < H)


@triton.jit
def dsa_fp32_bwd_scores_kernel(
    q_ptr, qr_ptr, kvp_ptr, krp_ptr, idx_ptr, len_ptr, do_ptr, lse_ptr, delta_ptr, ds_ptr,
    dkv_ptr, dkr_ptr,
    H, S, K, DL, DR,
    stride_qt, stride_qh, stride_qd, stride_qrt, stride_qrh, stride_qrd,
    stride_ps, stride_it, stride_ik, stride_dot, stride_doh, stride_dod,
    scale,
    HAS_ROPE: tl.constexpr, HAS_LEN: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DR: tl.constexpr,
    BF16: tl.constexpr, I32: tl.constexpr = False,
):
    """Program (t, head block, slot block of BLOCK_N): dS of the block into ds_ptr [T, H, K]
    (0 where invalid) and the block's key-gradient rows added to dkv_ptr [S, DL] / dkr_ptr
    [S, DR] (fp64 atomics; a duplicate slot adds twice). Blocks at or past the row's slot count
    do nothing (the dq launch reads no further)."""
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    nb = tl.program_id(2)
    n_slots = row_slot_count(len_ptr, t, K, HAS_LEN, I32)
    start = nb * BLOCK_N
    if start < n_slots:
        h_ok = offs_h < H
        offs_k = start + tl.arange(0, BLOCK_N)
        valid, rows = slot_block(idx_ptr, t * stride_it, stride_ik, offs_k, n_slots, S, I32)
        part = (t * 0 + S) * stride_ps  # int64 (S and the stride may be specialised ints)
        q_off = t * stride_qt
        do_off = t * stride_dot
        # each product from a zero accumulator, added in fp32 (dsa_common.dot6)
        zero = tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32)
        s = zero
        dp = zero
        for d0 in range(0, DL, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            k0, k1, k2 = gather_parts(kvp_ptr, part, rows, stride_ps, 1, offs_d, DL, valid,
                                      False, BF16)
            k0 = tl.trans(k0)
            k1 = tl.trans(k1)
            k2 = tl.trans(k2)
            qc = load_heads(q_ptr, q_off, offs_h, stride_qh, H, offs_d, stride_qd, DL)
            a0, a1, a2 = split3(qc, BF16)
            s += dot6(a0, a1, a2, k0, k1, k2, zero, BF16)
            doc = load_heads(do_ptr, do_off, offs_h, stride_doh, H, offs_d, stride_dod, DL)
            a0, a1, a2 = split3(doc, BF16)
            dp += dot6(a0, a1, a2, k0, k1, k2, zero, BF16)
        if HAS_ROPE:
            s, r0, r1, r2 = add_rope_part_scores(s, qr_ptr, t * stride_qrt, offs_h, stride_qrh,
                                                 stride_qrd, H, DR, krp_ptr, part, rows,
                                                 stride_ps, valid, zero, BLOCK_DR, BF16)
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        # an empty row (lse = -inf) and padding heads get P = exp(s - inf) = 0
        lse = tl.load(lse_ptr + t * H + offs_h, mask=h_ok, other=float("inf"))
        lse = tl.where(lse == float("-inf"), float("inf"), lse).to(tl.float64)
        delta = tl.load(delta_ptr + t * H + offs_h, mask=h_ok, other=0.0)
        p64 = exp_accurate(s.to(tl.float64) - lse[:, None])
        ds = (p64 * (dp.to(tl.float64) - delta[:, None]) * scale).to(tl.float32)
        p = p64.to(tl.float32)
        tl.store(ds_ptr + (t * H + offs_h[:, None]) * K + offs_k[None, :], ds,
                 mask=h_ok[:, None] & (offs_k[None, :] < K))
        g0, g1, g2 = split3(tl.trans(ds), BF16)
        p0, p1, p2 = split3(tl.trans(p), BF16)
        for d0 in range(0, DL, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            qc = load_heads(q_ptr, q_off, offs_h, stride_qh, H, offs_d, stride_qd, DL)
            a0, a1, a2 = split3(qc, BF16)
            zero_kv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
            dkv = dot6(g0, g1, g2, a0, a1, a2, zero_kv, BF16)
            doc = load_heads(do_ptr, do_off, offs_h, stride_doh, H, offs_d, stride_dod, DL)
            a0, a1, a2 = split3(doc, BF16)
            dkv += dot6(p0, p1, p2, a0, a1, a2, zero_kv, BF16)
            tl.atomic_add(dkv_ptr + rows[:, None] * DL + offs_d[None, :], dkv.to(tl.float64),
                          mask=valid[:, None] & (offs_d[None, :] < DL), sem="relaxed")
        if HAS_ROPE:
            offs_r = tl.arange(0, BLOCK_DR)
            dkr = dot6(g0, g1, g2, r0, r1, r2, tl.zeros([BLOCK_N, BLOCK_DR], dtype=tl.float32),
                       BF16)
            tl.atomic_add(dkr_ptr + rows[:, None] * DR + offs_r[None, :], dkr.to(tl.float64),
                          mask=valid[:, None] & (offs_r[None, :] < DR), sem="relaxed")


@triton.jit
def _dq_columns(out_ptr, parts_ptr, offs_c, W, ds_ptr, idx_ptr, part, t, offs_h, h_ok, H, S, K,
                n_slots, stride_ps, stride_it, stride_ik, BLOCK_H: tl.constexpr,
                BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr, BF16: tl.constexpr,
                I32: tl.constexpr):
    """out[t, heads, offs_c] (row stride W) = sum over the row's slot blocks, in order, of
    dS . K[:, offs_c], K the key rows' split-bf16 parts at ``parts_ptr`` (width W)."""
    acc = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
    for start in range(0, n_slots, BLOCK_K):
        offs_k = start + tl.arange(0, BLOCK_K)
        valid, rows = slot_block(idx_ptr, t * stride_it, stride_ik, offs_k, n_slots, S, I32)
        ds = tl.load(ds_ptr + (t * H + offs_h[:, None]) * K + offs_k[None, :],
                     mask=h_ok[:, None] & (offs_k[None, :] < n_slots), other=0.0)
        g0, g1, g2 = split3(ds, BF16)
        k0, k1, k2 = gather_parts(parts_ptr, part, rows, stride_ps, 1, offs_c, W, valid, False,
                                  BF16)
        acc += dot6(g0, g1, g2, k0, k1, k2, tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32), BF16)
    tl.store(out_ptr + (t * H + offs_h[:, None]) * W + offs_c[None, :], acc,
             mask=h_ok[:, None] & (offs_c[None, :] < W))


@triton.jit
def dsa_fp32_bwd_dq_kernel(
    kvp_ptr, krp_ptr, idx_ptr, len_ptr, ds_ptr, dq_ptr, dqr_ptr,
    H, S, K, DL, DR,
    stride_ps, stride_it, stride_ik,
    HAS_ROPE: tl.constexpr, HAS_LEN: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_DC: tl.constexpr, BLOCK_DR: tl.constexpr,
    BF16: tl.constexpr, I32: tl.constexpr = False,
):
    """Program (t, head block, column chunk): dq [T, H, DL] chunk (or, for the chunk past the
    latent ones, dq_rope [T, H, DR]) = sum over the row's slot blocks, in order, of dS . K."""
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cb = tl.program_id(2)
    h_ok = offs_h < H
    n_slots = row_slot_count(len_ptr, t, K, HAS_LEN, I32)
    part = (t * 0 + S) * stride_ps  # int64 (S and the stride may be specialised ints)
    n_lat = tl.cdiv(DL, BLOCK_DC)
    if cb < n_lat:
        _dq_columns(dq_ptr, kvp_ptr, cb * BLOCK_DC + tl.arange(0, BLOCK_DC), DL, ds_ptr, idx_ptr,
                    part, t, offs_h, h_ok, H, S, K, n_slots, stride_ps, stride_it, stride_ik,
                    BLOCK_H, BLOCK_K, BLOCK_DC, BF16, I32)
    elif HAS_ROPE:
        _dq_columns(dqr_ptr, krp_ptr, tl.arange(0, BLOCK_DR), DR, ds_ptr, idx_ptr, part, t,
                    offs_h, h_ok, H, S, K, n_slots, stride_ps, stride_it, stride_ik, BLOCK_H,
                    BLOCK_K, BLOCK_DR, BF16, I32)
