"""Hopper (sm_90) warp-specialized DSA backward in Gluon: 16-bit inputs, 64-head blocks, a
512-wide latent and a 64-wide rope part (or none).

The same function as :func:`fast.kernels.dsa_bwd.dsa_bwd_kernel` on its 16-bit path: per slot
block, P = exp2(q.k * c - lse * log2(e)) with ``c = scale * log2(e)`` (0 at an invalid slot
and on an empty row, whose lse is -inf), dP = dO . V^T, dS = P (dP - Delta) scale with
Delta = rowsum(dO * O) in fp32; dq += dS . K in fp32 registers (one program owns a dq row, so
dq is deterministic); dkv rows += dS^T . Q + P^T . dO and dk_rope rows += dS^T . q_rope as
fp32 atomics (a duplicate slot adds twice, an invalid slot adds nothing). P and dS enter the
products rounded to the input dtype, as in the Triton kernel.

Program (token t, block of 64 heads); slot blocks of 64; three partitions:

* the producer (4 warps) loads Q, q_rope and dO once and gathers each slot block's key rows
  with ``cp.async`` (zero-filled at invalid slots) into one shared-memory buffer as the
  consumers free it;
* consumer ME (0: the default partition, 1: a worker; one warpgroup each) owns heads
  [32 ME, 32 ME + 32) of the block for the transposed scores S^T = K . Q^T and dP^T = V . dO^T
  ([64 slots, 32 heads]: the slot block is the wgmma's M side), P^T, dS^T and its rows of dq
  (dq^T += K^T . dS^T, [576, 32] in three accumulators), and owns the key-gradient columns
  [256 ME, 256 ME + 256) (consumer 0 also the rope part): it sums dS^T . Q + P^T . dO over both
  consumers' heads (their dS^T and P^T meet in shared memory) in 64-column chunks, each
  added to the rows with atomics as soon as it is computed.

The key buffer is released once both consumers' dq products have read it, so the next
block's rows are gathered while the key gradients of this one are computed.

Gluon does not run under Triton's CPU interpreter: CI checks the Triton backward; this one is
checked on the GPU by ``tests/fast/test_fast_dsa_gluon.py``.
"""

from ..launch import DirectLauncher, on_device_of
from . import dsa_fwd_gluon
from .dsa_fwd_gluon import GLUON_AVAILABLE, _unit_rows, blocks_ahead

if GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from .dsa_fwd_gluon import _gather_part, _signal, load_head_rows, prefetch_block
    from .gluon_common import opaque_zero, partition_barrier

HEADS = 64        # heads per program (two consumers of 32)
LATENT = 512      # the latent (value) width the kernel takes
BLOCK = 64        # slots per block (the M side of the transposed products)
# key-gradient columns per product and atomic pass (the accumulator [64, CHUNK] fp32)
CHUNK = gl.constexpr(64) if GLUON_AVAILABLE else 64
# registers per thread of the worker partitions (consumer 1, producer); the default partition
# (consumer 0, with the rope part's key gradients) gets the rest, 256. Offline sm_90a spills:
# 232 / 40 92 bytes (in both consumers' loops), 224 / 40 40, 216 / 32 20 (outside the loops
# but one producer reload a block)
CONSUMER_REGS = gl.constexpr(216) if GLUON_AVAILABLE else 216
PRODUCER_REGS = gl.constexpr(32) if GLUON_AVAILABLE else 32
# slot blocks whose key rows the producer asks the L2 for ahead of their gather (0: none;
# docs/FINDINGS.md F75)
PREFETCH = blocks_ahead()
LOG2E = 1.4426950408889634


if GLUON_AVAILABLE:

    @gluon.jit
    def _producer(q_ptr, qr_ptr, do_ptr, kv_ptr, kr_ptr, idx_ptr, q_off, qr_off, do_off,
                  stride_qh, stride_qrh, stride_doh, idx_off, stride_ik, stride_kvs, stride_krs,
                  n_slots, n_blocks, S, q_smem, qr_smem, do_smem, kl_buf, kr_buf, q_bar, k_full,
                  k_free, HAS_ROPE: gl.constexpr, PREFETCH):
        """4 warps: Q, q_rope and dO once, then every slot block's key rows into the buffer as
        both consumers free it (a fresh barrier passes phase 1 at once); with PREFETCH, once a
        block's copies are issued, the rows of the block PREFETCH on are asked of the L2 (an
        int32 folded by the compiler, as in the forward's producer)."""
        load_head_rows(q_smem, q_ptr, q_off, stride_qh)
        load_head_rows(do_smem, do_ptr, do_off, stride_doh)
        if HAS_ROPE:
            load_head_rows(qr_smem.index(0), qr_ptr, qr_off, stride_qrh)
        async_copy.mbarrier_arrive(q_bar.index(0), increment_count=False)
        if PREFETCH > 1:
            for j in range(1, PREFETCH):
                prefetch_block(kv_ptr, kr_ptr, idx_ptr, idx_off, stride_ik, n_slots, S,
                               stride_kvs, stride_krs, j, 64, HAS_ROPE)
        for i in range(n_blocks):
            mbarrier.wait(k_free.index(0), (i & 1) ^ 1)
            _gather_part(kv_ptr, kr_ptr, idx_ptr, idx_off, stride_ik, n_slots, S, stride_kvs,
                         stride_krs, kl_buf.index(0), 0, kr_buf.index(0), i, False)
            _gather_part(kv_ptr, kr_ptr, idx_ptr, idx_off, stride_ik, n_slots, S, stride_kvs,
                         stride_krs, kl_buf.index(1), 256, kr_buf.index(0), i, HAS_ROPE)
            async_copy.mbarrier_arrive(k_full.index(0), increment_count=False)
            if PREFETCH > 0:
                prefetch_block(kv_ptr, kr_ptr, idx_ptr, idx_off, stride_ik, n_slots, S,
                               stride_kvs, stride_krs, i + PREFETCH, 64, HAS_ROPE)

    @gluon.jit
    def _producer_rope(q_ptr, qr_ptr, do_ptr, kv_ptr, kr_ptr, idx_ptr, q_off, qr_off, do_off,
                       stride_qh, stride_qrh, stride_doh, idx_off, stride_ik, stride_kvs,
                       stride_krs, n_slots, n_blocks, S, q_smem, qr_smem, do_smem, kl_buf,
                       kr_buf, q_bar, k_full, k_free, PREFETCH):
        _producer(q_ptr, qr_ptr, do_ptr, kv_ptr, kr_ptr, idx_ptr, q_off, qr_off, do_off,
                  stride_qh, stride_qrh, stride_doh, idx_off, stride_ik, stride_kvs, stride_krs,
                  n_slots, n_blocks, S, q_smem, qr_smem, do_smem, kl_buf, kr_buf, q_bar, k_full,
                  k_free, True, PREFETCH)

    @gluon.jit
    def _producer_nope(q_ptr, qr_ptr, do_ptr, kv_ptr, kr_ptr, idx_ptr, q_off, qr_off, do_off,
                       stride_qh, stride_qrh, stride_doh, idx_off, stride_ik, stride_kvs,
                       stride_krs, n_slots, n_blocks, S, q_smem, qr_smem, do_smem, kl_buf,
                       kr_buf, q_bar, k_full, k_free, PREFETCH):
        _producer(q_ptr, qr_ptr, do_ptr, kv_ptr, kr_ptr, idx_ptr, q_off, qr_off, do_off,
                  stride_qh, stride_qrh, stride_doh, idx_off, stride_ik, stride_kvs, stride_krs,
                  n_slots, n_blocks, S, q_smem, qr_smem, do_smem, kl_buf, kr_buf, q_bar, k_full,
                  k_free, False, PREFETCH)

    @gluon.jit
    def _head_delta(out_ptr, out_off, stride_oh, do_ptr, do_off, stride_doh, first,
                    layout: gl.constexpr):
        """Delta [32] = rowsum(dO * O) over the 512 latent columns of heads [first, first + 32)
        (offsets from the block's first head), in fp32."""
        lay: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        heads = (first + gl.arange(0, 32, layout=gl.SliceLayout(1, lay))).to(gl.int64)[:, None]
        cols = gl.arange(0, 64, layout=gl.SliceLayout(0, lay))[None, :]
        delta = gl.zeros([32], gl.float32, layout=gl.SliceLayout(1, lay))
        for c0 in gl.static_range(0, 512, 64):
            o = gl.load(out_ptr + out_off + heads * stride_oh + (c0 + cols))
            do = gl.load(do_ptr + do_off + heads * stride_doh + (c0 + cols))
            delta += gl.sum(o.to(gl.float32) * do.to(gl.float32), 1)
        return gl.convert_layout(delta, layout)

    @gluon.jit
    def _block_rows(idx_ptr, idx_off, stride_ik, n_slots, S, block, layout: gl.constexpr):
        """(valid, key row) of the 64 slots of block `block` in `layout` (a slot vector)."""
        offs_k = block * 64 + gl.arange(0, 64, layout=layout)
        in_range = offs_k < n_slots
        idx = gl.load(idx_ptr + idx_off + offs_k * stride_ik, mask=in_range, other=-1)
        valid = in_range & (idx >= 0) & (idx < S)
        return valid, gl.where(valid, idx, 0).to(gl.int64)

    @gluon.jit
    def _kv_chunk(ds_t, p_t, q_smem, do_smem, half: gl.constexpr, col: gl.constexpr, zero,
                  layout: gl.constexpr):
        """The key-gradient columns [256 half + col, + 64) of the block over all 64 heads:
        sum over both consumers' heads of dS^T . Q + P^T . dO ([64 slots, 64] fp32)."""
        acc = gl.zeros([64, CHUNK], gl.float32, layout=layout)
        for j in gl.static_range(2):
            qj = q_smem.index(half + zero).slice(32 * j, 32, dim=0).slice(col, CHUNK, dim=1)
            doj = do_smem.index(half + zero).slice(32 * j, 32, dim=0).slice(col, CHUNK, dim=1)
            acc = warpgroup_mma(ds_t.index(j + zero), qj, acc, is_async=True)
            acc = warpgroup_mma(p_t.index(j + zero), doj, acc, is_async=True)
        return warpgroup_mma_wait(0, deps=(acc, ))

    @gluon.jit
    def _rope_chunk(ds_t, qr_smem, col: gl.constexpr, zero, layout: gl.constexpr):
        """The dk_rope columns [col, col + CHUNK) of the block over all 64 heads: dS^T .
        q_rope ([64 slots, CHUNK] fp32)."""
        acc = gl.zeros([64, CHUNK], gl.float32, layout=layout)
        for j in gl.static_range(2):
            qr_j = qr_smem.index(zero).slice(32 * j, 32, dim=0).slice(col, CHUNK, dim=1)
            acc = warpgroup_mma(ds_t.index(j + zero), qr_j, acc, is_async=True)
        return warpgroup_mma_wait(0, deps=(acc, ))

    @gluon.jit
    def _scores_and_dp_t(q_smem, qr_smem, do_smem, kl_buf, kr_buf, h_own: gl.constexpr, zero,
                         s_layout: gl.constexpr, HAS_ROPE: gl.constexpr):
        """S^T = K . Q^T (latent and rope) and dP^T = V . dO^T of heads [h_own, + 32) over the
        buffer's slot block, [64 slots, 32 heads] fp32 each, waited for."""
        k_lo = kl_buf.index(0 + zero)
        k_hi = kl_buf.index(1 + zero)
        q_lo = q_smem.index(0 + zero).slice(h_own, 32, dim=0).permute((1, 0))
        q_hi = q_smem.index(1 + zero).slice(h_own, 32, dim=0).permute((1, 0))
        s = warpgroup_mma(k_lo, q_lo, gl.zeros([64, 32], gl.float32, layout=s_layout),
                          use_acc=False, is_async=True)
        s = warpgroup_mma(k_hi, q_hi, s, is_async=True)
        if HAS_ROPE:
            qr_own = qr_smem.index(zero).slice(h_own, 32, dim=0).permute((1, 0))
            s = warpgroup_mma(kr_buf.index(zero), qr_own, s, is_async=True)
        do_lo = do_smem.index(0 + zero).slice(h_own, 32, dim=0).permute((1, 0))
        do_hi = do_smem.index(1 + zero).slice(h_own, 32, dim=0).permute((1, 0))
        dp = warpgroup_mma(k_lo, do_lo, gl.zeros([64, 32], gl.float32, layout=s_layout),
                           use_acc=False, is_async=True)
        dp = warpgroup_mma(k_hi, do_hi, dp, is_async=True)
        return warpgroup_mma_wait(0, deps=(s, dp))

    @gluon.jit
    def _dq_t_products(kl_buf, kr_buf, ds_own, zero, dq_lo, dq_hi, dq_r,
                       HAS_ROPE: gl.constexpr):
        """dq^T += K^T . dS^T over the own heads (ds_own [64 slots, 32 heads]): the latent
        halves and the rope part, waited for (the key buffer is free after it)."""
        dq_lo = warpgroup_mma(kl_buf.index(0 + zero).permute((1, 0)), ds_own, dq_lo,
                              is_async=True)
        dq_hi = warpgroup_mma(kl_buf.index(1 + zero).permute((1, 0)), ds_own, dq_hi,
                              is_async=True)
        if HAS_ROPE:
            dq_r = warpgroup_mma(kr_buf.index(zero).permute((1, 0)), ds_own, dq_r,
                                 is_async=True)
        return warpgroup_mma_wait(0, deps=(dq_lo, dq_hi, dq_r))

    @gluon.jit
    def _key_gradients(ds_t, p_t, q_smem, qr_smem, do_smem, x_free, dkv_ptr, dkr_ptr, rows,
                       valid, zero, ME: gl.constexpr, kv_layout: gl.constexpr,
                       HAS_ROPE: gl.constexpr):
        """The block's key-gradient columns [256 ME, + 256) (and with ME 0 the rope part) over
        all 64 heads, chunk by chunk, each added to the rows (valid [64, 1]); x_free arrives
        once the last product has read dS^T and P^T."""
        kv_cols = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, kv_layout))[None, :]
        N_LAT: gl.constexpr = 256 // CHUNK
        for j in gl.static_range(N_LAT):
            acc = _kv_chunk(ds_t, p_t, q_smem, do_smem, ME, CHUNK * j, zero, kv_layout)
            if j == N_LAT - 1 and (ME == 1 or not HAS_ROPE):
                _signal(x_free.index(0))
            gl.atomic_add(dkv_ptr + rows[:, None] * 512 + (ME * 256 + CHUNK * j + kv_cols),
                          acc, mask=valid, sem="relaxed")
        if ME == 0 and HAS_ROPE:
            N_ROPE: gl.constexpr = 64 // CHUNK
            for j in gl.static_range(N_ROPE):
                acc = _rope_chunk(ds_t, qr_smem, CHUNK * j, zero, kv_layout)
                if j == N_ROPE - 1:
                    _signal(x_free.index(0))
                gl.atomic_add(dkr_ptr + rows[:, None] * 64 + (CHUNK * j + kv_cols), acc,
                              mask=valid, sem="relaxed")

    @gluon.jit
    def _consumer(q_smem, qr_smem, do_smem, kl_buf, kr_buf, ds_t, p_t, q_bar, k_full, k_free,
                  ds_ready, x_free, head_smem, idx_ptr, idx_off, stride_ik, n_slots, n_blocks,
                  S, c, scale, out_ptr, out_off, stride_oh, do_ptr, do_off, stride_doh, lse_ptr,
                  lse_off, dq_ptr, dq_off, dqr_ptr, dqr_off, dkv_ptr, dkr_ptr, ME: gl.constexpr,
                  HAS_ROPE: gl.constexpr):
        """Consumer ME: heads [32 ME, + 32) of the scores, dS and dq; key-gradient columns
        [256 ME, + 256) (and with ME 0 the rope part).

        Barriers (count 2 but k_full): k_full the key rows landed; k_free both consumers'
        dq products read them; ds_ready both consumers' dS^T and P^T stored (ds_t, p_t
        [2, 64 slots, 32 heads], index = consumer); x_free both consumers' key-gradient
        products read them (the next block's stores wait for it)."""
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 32, 16])
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, CHUNK, 16])
        heads_l: gl.constexpr = gl.SliceLayout(0, s_layout)
        h_own: gl.constexpr = ME * 32
        delta = _head_delta(out_ptr, out_off, stride_oh, do_ptr, do_off, stride_doh, h_own,
                            heads_l)
        lse = gl.load(lse_ptr + lse_off + h_own + gl.arange(0, 32, layout=heads_l))
        # an empty row (lse = -inf) gets P = exp2(s - inf) = 0
        lse2 = gl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        # both per-head vectors wait in shared memory, read where used: held in registers
        # across the loop they spilled
        head_smem.index(2 * ME).store(lse2)
        head_smem.index(2 * ME + 1).store(delta)
        partition_barrier()
        dq_lo = gl.zeros([256, 32], gl.float32, layout=s_layout)
        dq_hi = gl.zeros([256, 32], gl.float32, layout=s_layout)
        dq_r = gl.zeros([64, 32], gl.float32, layout=s_layout)
        mbarrier.wait(q_bar.index(0), 0)
        for i in range(n_blocks):
            zero = opaque_zero(i)
            phase = i & 1
            valid, _ = _block_rows(idx_ptr, idx_off, stride_ik, n_slots, S, i,
                                   gl.SliceLayout(1, s_layout))
            mbarrier.wait(k_full.index(0), phase)
            s, dp = _scores_and_dp_t(q_smem, qr_smem, do_smem, kl_buf, kr_buf, h_own, zero,
                                     s_layout, HAS_ROPE)
            s = gl.where(valid[:, None], s * c, float("-inf"))
            p = gl.exp2(s - head_smem.index(2 * ME + zero).load(heads_l)[None, :])
            ds = p * (dp - head_smem.index(2 * ME + 1 + zero).load(heads_l)[None, :]) * scale
            mbarrier.wait(x_free.index(0), phase ^ 1)
            ds_t.index(ME).store(ds.to(dtype))
            p_t.index(ME).store(p.to(dtype))
            fence_async_shared()
            _signal(ds_ready.index(0))
            dq_lo, dq_hi, dq_r = _dq_t_products(kl_buf, kr_buf, ds_t.index(ME + zero), zero,
                                                dq_lo, dq_hi, dq_r, HAS_ROPE)
            _signal(k_free.index(0))
            kv_valid, rows = _block_rows(idx_ptr, idx_off, stride_ik, n_slots, S, i,
                                         gl.SliceLayout(1, kv_layout))
            mbarrier.wait(ds_ready.index(0), phase)
            _key_gradients(ds_t, p_t, q_smem, qr_smem, do_smem, x_free, dkv_ptr, dkr_ptr, rows,
                           kv_valid[:, None], zero, ME, kv_layout, HAS_ROPE)

        # dq [t, heads, c] from dq^T [c, own heads]
        cols = gl.arange(0, 256, layout=gl.SliceLayout(1, s_layout))[:, None]
        heads = (h_own + gl.arange(0, 32, layout=heads_l))[None, :]
        gl.store(dq_ptr + dq_off + heads * 512 + cols, dq_lo.to(dtype))
        gl.store(dq_ptr + dq_off + heads * 512 + (256 + cols), dq_hi.to(dtype))
        if HAS_ROPE:
            cols_r = gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))[:, None]
            gl.store(dqr_ptr + dqr_off + heads * 64 + cols_r, dq_r.to(dtype))

    @gluon.jit
    def _consumer1_rope(q_smem, qr_smem, do_smem, kl_buf, kr_buf, ds_t, p_t, q_bar, k_full,
                        k_free, ds_ready, x_free, head_smem, idx_ptr, idx_off, stride_ik, n_slots,
                        n_blocks, S, c, scale, out_ptr, out_off, stride_oh, do_ptr, do_off,
                        stride_doh, lse_ptr, lse_off, dq_ptr, dq_off, dqr_ptr, dqr_off, dkv_ptr,
                        dkr_ptr):
        _consumer(q_smem, qr_smem, do_smem, kl_buf, kr_buf, ds_t, p_t, q_bar, k_full, k_free,
                  ds_ready, x_free, head_smem, idx_ptr, idx_off, stride_ik, n_slots, n_blocks,
                  S, c, scale, out_ptr, out_off, stride_oh, do_ptr, do_off, stride_doh, lse_ptr,
                  lse_off, dq_ptr, dq_off, dqr_ptr, dqr_off, dkv_ptr, dkr_ptr, 1, True)

    @gluon.jit
    def _consumer1_nope(q_smem, qr_smem, do_smem, kl_buf, kr_buf, ds_t, p_t, q_bar, k_full,
                        k_free, ds_ready, x_free, head_smem, idx_ptr, idx_off, stride_ik, n_slots,
                        n_blocks, S, c, scale, out_ptr, out_off, stride_oh, do_ptr, do_off,
                        stride_doh, lse_ptr, lse_off, dq_ptr, dq_off, dqr_ptr, dqr_off, dkv_ptr,
                        dkr_ptr):
        _consumer(q_smem, qr_smem, do_smem, kl_buf, kr_buf, ds_t, p_t, q_bar, k_full, k_free,
                  ds_ready, x_free, head_smem, idx_ptr, idx_off, stride_ik, n_slots, n_blocks,
                  S, c, scale, out_ptr, out_off, stride_oh, do_ptr, do_off, stride_doh, lse_ptr,
                  lse_off, dq_ptr, dq_off, dqr_ptr, dqr_off, dkv_ptr, dkr_ptr, 1, False)

    @gluon.jit
    def dsa_bwd_gluon_kernel(q_ptr, qr_ptr, kv_ptr, kr_ptr, idx_ptr, len_ptr, out_ptr, do_ptr,
                             lse_ptr, dq_ptr, dqr_ptr, dkv_ptr, dkr_ptr, H, S, K, stride_qt,
                             stride_qh, stride_qrt, stride_qrh, stride_kvs, stride_krs,
                             stride_it, stride_ik, stride_ot, stride_oh, stride_dot, stride_doh,
                             c, scale, HAS_ROPE: gl.constexpr, HAS_LEN: gl.constexpr,
                             PREFETCH: gl.constexpr, num_warps: gl.constexpr):
        """Grid (T * H / 64,): program p is token p // (H / 64), heads 64 (p % (H / 64)) on.
        Unit channel strides (q, q_rope, kv, k_rope, out, dout); dq [T, H, 512] and dq_rope
        [T, H, 64] contiguous in the input dtype, lse [T, H] fp32 contiguous, dkv [S, 512] and
        dk_rope [S, 64] fp32 contiguous (added to)."""
        n_hb = H // 64
        pid = gl.program_id(0)
        t = (pid // n_hb).to(gl.int64)
        h0 = ((pid % n_hb) * 64).to(gl.int64)  # head offsets past 2**31 (FINDINGS F35)
        n_slots = K + pid * 0
        if HAS_LEN:
            # clamped in the length's own dtype, then narrowed (docs/FINDINGS.md F30)
            n_slots = gl.minimum(gl.maximum(gl.load(len_ptr + t), 0), n_slots).to(gl.int32)
        n_blocks = gl.cdiv(n_slots, 64)
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        wide_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 256], dtype)
        sq_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], dtype)
        ds_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 32], dtype)
        q_smem = gl.allocate_shared_memory(dtype, [2, 64, 256], wide_l)
        qr_smem = gl.allocate_shared_memory(dtype, [1, 64, 64], sq_l)
        do_smem = gl.allocate_shared_memory(dtype, [2, 64, 256], wide_l)
        kl_buf = gl.allocate_shared_memory(dtype, [2, 64, 256], wide_l)
        kr_buf = gl.allocate_shared_memory(dtype, [1, 64, 64], sq_l)
        ds_t = gl.allocate_shared_memory(dtype, [2, 64, 32], ds_l)
        p_t = gl.allocate_shared_memory(dtype, [2, 64, 32], ds_l)
        q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        k_full = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        k_free = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        ds_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        x_free = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        # per consumer ME: [2 ME] its heads' lse * log2(e) (inf on an empty row), [2 ME + 1] Delta
        head_smem = gl.allocate_shared_memory(gl.float32, [4, 32],
                                              gl.SwizzledSharedLayout(1, 1, 1, [0]))
        mbarrier.init(q_bar.index(0), count=128)
        mbarrier.init(k_full.index(0), count=128)
        mbarrier.init(k_free.index(0), count=2)
        mbarrier.init(ds_ready.index(0), count=2)
        mbarrier.init(x_free.index(0), count=2)
        fence_async_shared()

        q_off = t * stride_qt + h0 * stride_qh
        qr_off = t * stride_qrt + h0 * stride_qrh
        do_off = t * stride_dot + h0 * stride_doh
        idx_off = t * stride_it
        out_off = t * stride_ot + h0 * stride_oh
        lse_off = t * H + h0
        dq_off = (t * H + h0) * 512
        dqr_off = (t * H + h0) * 64
        consumer_args = (q_smem, qr_smem, do_smem, kl_buf, kr_buf, ds_t, p_t, q_bar, k_full,
                         k_free, ds_ready, x_free, head_smem, idx_ptr, idx_off, stride_ik, n_slots,
                         n_blocks, S, c, scale, out_ptr, out_off, stride_oh, do_ptr, do_off,
                         stride_doh, lse_ptr, lse_off, dq_ptr, dq_off, dqr_ptr, dqr_off,
                         dkv_ptr, dkr_ptr)
        producer_args = (q_ptr, qr_ptr, do_ptr, kv_ptr, kr_ptr, idx_ptr, q_off, qr_off, do_off,
                         stride_qh, stride_qrh, stride_doh, idx_off, stride_ik, stride_kvs,
                         stride_krs, n_slots, n_blocks, S, q_smem, qr_smem, do_smem, kl_buf,
                         kr_buf, q_bar, k_full, k_free, PREFETCH)
        if HAS_ROPE:
            gl.warp_specialize([
                (_consumer, consumer_args + (0, True)),
                (_consumer1_rope, consumer_args),
                (_producer_rope, producer_args),
            ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])
        else:
            gl.warp_specialize([
                (_consumer, consumer_args + (0, False)),
                (_consumer1_nope, consumer_args),
                (_producer_nope, producer_args),
            ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])


def applies(q, q_rope, kv, k_rope, indices, out, dout):
    """Whether this kernel takes the call: where the Gluon forward would
    (:func:`dsa_fwd_gluon.applies`: sm_90, fp16/bf16, H a multiple of 64, the 512-wide latent
    and 64-wide rope part or none with unit channel strides, other strides multiples of 16,
    16-byte aligned), with out and dout [T, H, 512] of q's dtype laid out as q may be."""
    return (dsa_fwd_gluon.applies(q, q_rope, kv, k_rope, indices) and dout.dtype == q.dtype
            and out.dtype == q.dtype
            and all(_unit_rows(x, LATENT) and x.data_ptr() % 16 == 0 for x in (out, dout)))


def launch(q, q_rope, kv, k_rope, indices, topk_length, out, lse, dout, scale, dq, dqr, dkv,
           dkr):
    """Fill dq [T, H, 512] (and dq_rope [T, H, 64]), contiguous, and add to the fp32 key
    gradients dkv [S, 512] and dk_rope [S, 64] (contiguous) where :func:`applies`."""
    T, H, _ = q.shape
    rope = q_rope is not None
    qr, kr = (q_rope, k_rope) if rope else (q, kv)
    grid = (T * (H // HEADS),)
    args = (q, qr, kv, kr, indices, topk_length if topk_length is not None else indices, out,
            dout, lse.contiguous(), dq, dqr, dkv, dkr, H, kv.shape[0], indices.shape[1],
            q.stride(0), q.stride(1), qr.stride(0), qr.stride(1), kv.stride(0), kr.stride(0),
            indices.stride(0), indices.stride(1), out.stride(0), out.stride(1), dout.stride(0),
            dout.stride(1), scale * LOG2E, scale)
    meta = dict(HAS_ROPE=rope, HAS_LEN=topk_length is not None, PREFETCH=PREFETCH, num_warps=4)
    on_device_of(dq, _LAUNCH, grid, args, meta)


if GLUON_AVAILABLE:
    _LAUNCH = DirectLauncher(dsa_bwd_gluon_kernel)
