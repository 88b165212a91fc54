"""Hopper (sm_90) warp-specialized DSA forward in Gluon: 16-bit inputs, 64-head blocks, a
512-wide latent and a 64-wide rope part (or none).

The same function as :func:`fast.kernels.dsa_fwd.dsa_fwd_kernel` on its 16-bit path (base-2
scores ``q.k * c`` with ``c = scale * log2(e)``, ``exp2``, out = acc / l, lse = (m + log2 l) *
ln 2, an empty row giving out 0 and lse -inf), with the work split the way the tensor cores
want it fed. Program (token t, block of 64 heads); slot blocks of BLOCK (64 by default),
taken two at a time (a *pair*: blocks 2i and 2i + 1), three partitions:

* the producer (4 warps) gathers each slot block's key rows with ``cp.async`` (16-byte
  pieces; an invalid slot reads nothing and fills zeros) into shared memory: per pair in
  flight (STAGES, 1 by default) two buffers (block 2i into the first, 2i + 1 into the
  second: latent [2, BLOCK, 256] as two 256-wide halves, rope [BLOCK, 64]), each in two parts
  with mbarriers of their own (``_producer``), refilled as the consumers free the parts;
* consumer 0 (the default partition, one warpgroup) computes the scores of block 2i and owns
  the output's value columns [0, 256); consumer 1 (a worker warpgroup) the scores of block
  2i + 1 and columns [256, 512). Each issues P.V of its own block from registers, hands its
  P over (bf16; at 64 slots in the rope part of its buffer, which its scores no longer
  need) and takes the other's P from shared memory for its half of the other block's values.

Both consumers keep one running row max. Per pair: consumer 0's max after its block (m0)
goes to consumer 1, which takes max(m0, its block's) = m1 as the pair's max and sends it
back; consumer 0 rescales its P by exp2(m0 - m1) before handing it over and its accumulator
and row sum after its own P.V. Each consumer sums exp over its own blocks; the two sums,
at the same final max, are added at the end. A row with no valid slot yet keeps m = -inf and
shifts by 0 (``exp2(-inf - 0) = 0``, never inf - inf). An odd last block is paired with an
all-invalid one.

The schedule keeps the tensor cores fed across pairs (FlashMLA's sparse prefill kernel does
the same): consumer 0 issues the next pair's scores right behind its last P.V of a pair (the
latent half they start on was refilled once its own P.V freed it), so they run while the
other half and the rope part still land; consumer 1 hands its P over while its own P.V runs
and waits for both P.Vs only at the end of the pair. The slot indices that mask the scores
are loaded before the scores are issued. Buffer indices go through an opaque zero so that
the wgmma descriptors are not hoisted out of the loop into registers (``gluon_common.opaque_zero``).

Gluon does not run under Triton's CPU interpreter: CI checks the Triton forward; this one is
checked on the GPU by ``tests/fast/test_fast_dsa_gluon.py``.
"""
import os

import torch

try:  # Gluon is experimental: a Triton without it (or with another API) leaves the path off
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from .gluon_common import opaque_zero, partition_barrier
    GLUON_AVAILABLE = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    GLUON_AVAILABLE = False

from ..launch import DirectLauncher, is_sm90, on_device_of

HEADS = 64        # heads per program (one wgmma M tile per consumer)
LATENT = 512      # the latent (value) width the kernel takes
ROPE = 64         # the rope width it takes (or none)
# (slots per block, pairs of blocks in shared memory at once): (64, 1) two 64-slot buffers,
# (32, 2) four 32-slot ones (the next pair's rows load during the whole pair)
CONFIGS = ((64, 1), (32, 2))
_CONFIG_NAMES = {f"{b}x{st}": (b, st) for b, st in CONFIGS}
# the tile of later launches: $ATTENTION_ORACLE_FAST_DSA_GLUON_TILE ("64x1" or "32x2") or 64x1
CONFIG = _CONFIG_NAMES.get(os.environ.get("ATTENTION_ORACLE_FAST_DSA_GLUON_TILE", ""), CONFIGS[0])
# registers per thread of the worker partitions (consumer 1, producer); the default partition
# (consumer 0) gets the rest of the 64K-register file
CONSUMER_REGS = gl.constexpr(232) if GLUON_AVAILABLE else 232
PRODUCER_REGS = gl.constexpr(40) if GLUON_AVAILABLE else 40


def blocks_ahead(default=0):
    """$ATTENTION_ORACLE_FAST_DSA_PREFETCH as a count of slot blocks (pairs in the forward)
    whose key rows the producers ask the L2 for ahead of their gather (prefetch_block), or
    `default` where unset or not a small count."""
    value = os.environ.get("ATTENTION_ORACLE_FAST_DSA_PREFETCH", "")
    return int(value) if value.isdigit() and int(value) <= 4 else default


# the rows of packed problems miss the L2 (docs/FINDINGS.md F75)
PREFETCH = blocks_ahead()
LOG2E = 1.4426950408889634
_DTYPES = (torch.bfloat16, torch.float16)


def l2_prefetch_asm(nbytes):
    """PTX of one bulk L2 prefetch (the TMA unit; no registers or shared memory held, nothing
    returned) of `nbytes` at address $1 where $2 is not 0; $0 a dummy result."""
    return ("{ .reg .pred p; setp.ne.b32 p, $2, 0; "
            f"@p cp.async.bulk.prefetch.L2.global [$1], {nbytes}; mov.u32 $0, 0; }}")


if GLUON_AVAILABLE:
    # a 16-bit row: the 512-wide latent, the 64-wide rope part
    PREFETCH_LATENT = gl.constexpr(l2_prefetch_asm(2 * LATENT))
    PREFETCH_ROPE = gl.constexpr(l2_prefetch_asm(2 * ROPE))


if GLUON_AVAILABLE:

    @gluon.jit
    def _gather_part(kv_ptr, kr_ptr, idx_ptr, idx_off, stride_ik, n_slots, S, stride_kvs,
                     stride_krs, dst, col0, kr_buf, block, WITH_ROPE: gl.constexpr):
        """cp.async of one part of a slot block's key rows: latent columns [col0, col0 + 256)
        into dst [BLOCK, 256], with WITH_ROPE the rope part into kr_buf [BLOCK, 64]; invalid
        slots (past n_slots, index outside [0, S)) read nothing (zero fill). 8 threads a row,
        128 contiguous bytes of it per copy instruction (4 threads and 64 bytes ran 0-4%
        slower)."""
        BLOCK: gl.constexpr = dst.shape[0]
        lay: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        offs_k = block * BLOCK + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, lay))
        in_range = offs_k < n_slots
        idx = gl.load(idx_ptr + idx_off + offs_k * stride_ik, mask=in_range, other=-1)
        idx = idx.to(gl.int64)
        valid = (in_range & (idx >= 0) & (idx < S))[:, None]
        rows = gl.where(valid, idx[:, None], 0)
        cols = gl.arange(0, 256, layout=gl.SliceLayout(0, lay))[None, :]
        async_copy.async_copy_global_to_shared(dst, kv_ptr + rows * stride_kvs + (col0 + cols),
                                               mask=valid)
        if WITH_ROPE:
            cols_r = gl.arange(0, 64, layout=gl.SliceLayout(0, lay))[None, :]
            async_copy.async_copy_global_to_shared(kr_buf, kr_ptr + rows * stride_krs + cols_r,
                                                   mask=valid)

    @gluon.jit
    def prefetch_rows(ptr, rows, stride, valid, ASM: gl.constexpr):
        """Ask the L2 for rows `rows` (int64) of `stride` elements at `ptr` where `valid` (int32,
        the same layout) is not 0: ASM (:func:`l2_prefetch_asm`) says how many bytes a row."""
        gl.inline_asm_elementwise(ASM, "=r,l,r", [ptr + rows * stride, valid], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def prefetch_block(kv_ptr, kr_ptr, idx_ptr, idx_off, stride_ik, n_slots, S, stride_kvs,
                       stride_krs, block, BLOCK: gl.constexpr, WITH_ROPE: gl.constexpr):
        """Ask the L2 for the key rows of slot block `block` (its latent and, WITH_ROPE, its
        rope part) ahead of their gather, so that the gather's copies find them there; invalid
        slots ask for nothing (_slot_indices reads -1 past n_slots)."""
        idx = _slot_indices(idx_ptr, idx_off, stride_ik, n_slots, block, BLOCK)
        valid = (idx >= 0) & (idx < S)
        rows = gl.where(valid, idx, 0).to(gl.int64)
        ask = valid.to(gl.int32)
        prefetch_rows(kv_ptr, rows, stride_kvs, ask, PREFETCH_LATENT)
        if WITH_ROPE:
            prefetch_rows(kr_ptr, rows, stride_krs, ask, PREFETCH_ROPE)

    @gluon.jit
    def load_head_rows(dst, ptr, off, stride_h):
        """cp.async of 64 heads' contiguous channels at ``ptr + off`` (head stride
        ``stride_h``): into dst [2, 64, 256] (channels [0, 512) in two halves) or dst [64, W]."""
        lay: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
        W: gl.constexpr = dst.shape[dst.rank - 1]
        heads = gl.arange(0, 64, layout=gl.SliceLayout(1, lay)).to(gl.int64)[:, None]
        rows = ptr + off + heads * stride_h + gl.arange(0, W, layout=gl.SliceLayout(0, lay))[None, :]
        if dst.rank == 3:
            async_copy.async_copy_global_to_shared(dst.index(0), rows)
            async_copy.async_copy_global_to_shared(dst.index(1), rows + W)
        else:
            async_copy.async_copy_global_to_shared(dst, rows)

    @gluon.jit
    def _producer(q_ptr, qr_ptr, kv_ptr, kr_ptr, idx_ptr, q_off, qr_off, stride_qh, stride_qrh,
                  idx_off, stride_ik, stride_kvs, stride_krs, n_slots, n_pairs, S,
                  q_smem, qr_smem, kl_ring, kr_ring, q_bar, full, free,
                  HAS_ROPE: gl.constexpr, PREFETCH):
        """4 warps: Q once, then every pair's two slot blocks into the pair's stage as the
        consumers free it (a fresh barrier passes phase 1 at once); with PREFETCH, once a
        pair's copies are issued, the rows of the pair PREFETCH on are asked of the L2
        (PREFETCH arrives as an int32: a worker partition takes no constexpr argument; the
        compiler folds the launch's constant, so PREFETCH 0 leaves no prefetch code).

        Buffer (stage st, block b of the pair) in two parts with barriers of their own (index
        (2 st + b) * 2 + part): part 0 the latent half that consumer b's own P.V reads (freed
        by it alone, mid-pair), part 1 the other half and the rope part (freed at the end of
        the pair), so that the next pair's rows are in flight while this pair finishes."""
        STAGES: gl.constexpr = kl_ring.shape[0] // 4
        load_head_rows(q_smem, q_ptr, q_off, stride_qh)
        if HAS_ROPE:
            load_head_rows(qr_smem, qr_ptr, qr_off, stride_qrh)
        async_copy.mbarrier_arrive(q_bar.index(0), increment_count=False)
        BLOCK: gl.constexpr = kl_ring.shape[1]
        if PREFETCH > 1:
            for j in range(2, 2 * PREFETCH):
                prefetch_block(kv_ptr, kr_ptr, idx_ptr, idx_off, stride_ik, n_slots, S,
                               stride_kvs, stride_krs, j, BLOCK, HAS_ROPE)
        for i in range(n_pairs):
            st = i % STAGES
            phase = ((i // STAGES) & 1) ^ 1
            for part in gl.static_range(2):
                for b in gl.static_range(2):
                    buf = 2 * st + b
                    mbarrier.wait(free.index(2 * buf + part), phase)
                    half = b ^ part  # latent half: part 0 of block b's buffer is half b
                    _gather_part(kv_ptr, kr_ptr, idx_ptr, idx_off, stride_ik, n_slots, S,
                                 stride_kvs, stride_krs, kl_ring.index(2 * buf + half),
                                 half * 256, kr_ring.index(buf), 2 * i + b,
                                 HAS_ROPE and part == 1)
                    async_copy.mbarrier_arrive(full.index(2 * buf + part),
                                               increment_count=False)
            if PREFETCH > 0:
                for b in gl.static_range(2):
                    prefetch_block(kv_ptr, kr_ptr, idx_ptr, idx_off, stride_ik, n_slots, S,
                                   stride_kvs, stride_krs, 2 * (i + PREFETCH) + b, BLOCK,
                                   HAS_ROPE)

    @gluon.jit
    def _producer_rope(q_ptr, qr_ptr, kv_ptr, kr_ptr, idx_ptr, q_off, qr_off, stride_qh,
                       stride_qrh, idx_off, stride_ik, stride_kvs, stride_krs, n_slots,
                       n_pairs, S, q_smem, qr_smem, kl_ring, kr_ring, q_bar, full, free,
                       PREFETCH):
        _producer(q_ptr, qr_ptr, kv_ptr, kr_ptr, idx_ptr, q_off, qr_off, stride_qh, stride_qrh,
                  idx_off, stride_ik, stride_kvs, stride_krs, n_slots, n_pairs, S, q_smem,
                  qr_smem, kl_ring, kr_ring, q_bar, full, free, True, PREFETCH)

    @gluon.jit
    def _producer_nope(q_ptr, qr_ptr, kv_ptr, kr_ptr, idx_ptr, q_off, qr_off, stride_qh,
                       stride_qrh, idx_off, stride_ik, stride_kvs, stride_krs, n_slots,
                       n_pairs, S, q_smem, qr_smem, kl_ring, kr_ring, q_bar, full, free,
                       PREFETCH):
        _producer(q_ptr, qr_ptr, kv_ptr, kr_ptr, idx_ptr, q_off, qr_off, stride_qh, stride_qrh,
                  idx_off, stride_ik, stride_kvs, stride_krs, n_slots, n_pairs, S, q_smem,
                  qr_smem, kl_ring, kr_ring, q_bar, full, free, False, PREFETCH)

    @gluon.jit
    def _slot_indices(idx_ptr, idx_off, stride_ik, n_slots, block, BLOCK: gl.constexpr):
        """The top-k entries of slot block `block` (-1 past n_slots), one load per slot in a
        [BLOCK] blocked tensor: issued before the block's scores, used after them."""
        flat: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        offs_k = block * BLOCK + gl.arange(0, BLOCK, layout=flat)
        return gl.load(idx_ptr + idx_off + offs_k * stride_ik, mask=offs_k < n_slots, other=-1)

    @gluon.jit
    def _scores_first(q_smem, kl_ring, full, buf, phase, ME: gl.constexpr, zero,
                      s_layout: gl.constexpr):
        """Issue consumer ME's scores over the part-0 half of buffer `buf` as soon as it lands
        (asynchronous; [64 heads, BLOCK slots] fp32)."""
        BLOCK: gl.constexpr = kl_ring.shape[1]
        mbarrier.wait(full.index(2 * buf), phase)
        k_own = kl_ring.index(2 * buf + ME).permute((1, 0))
        return warpgroup_mma(q_smem.index(ME + zero), k_own,
                             gl.zeros([64, BLOCK], gl.float32, layout=s_layout), use_acc=False,
                             is_async=True)

    @gluon.jit
    def _scores_rest(s, q_smem, qr_smem, kl_ring, kr_buf, full, buf, phase, ME: gl.constexpr,
                     zero, HAS_ROPE: gl.constexpr):
        """Issue the rest of the scores once part 1 lands: the other latent half, the rope."""
        OTHER: gl.constexpr = 1 - ME
        mbarrier.wait(full.index(2 * buf + 1), phase)
        k_other = kl_ring.index(2 * buf + OTHER).permute((1, 0))
        s = warpgroup_mma(q_smem.index(OTHER + zero), k_other, s, is_async=True)
        if HAS_ROPE:
            s = warpgroup_mma(qr_smem, kr_buf.permute((1, 0)), s, is_async=True)
        return s

    @gluon.jit
    def _masked(s, idx, n_slots, S, c, block, s_layout: gl.constexpr):
        """Base-2 scores s * c, -inf at invalid slots (past n_slots, index outside [0, S)). The
        validity moves to the score columns: indices loaded in the score layout would keep
        each thread's column addresses live."""
        BLOCK: gl.constexpr = idx.shape[0]
        offs_k = block * BLOCK + gl.arange(0, BLOCK, layout=idx.type.layout)
        valid = gl.convert_layout((offs_k < n_slots) & (idx >= 0) & (idx < S),
                                  gl.SliceLayout(0, s_layout))
        return gl.where(valid[None, :], s * c, float("-inf"))

    @gluon.jit
    def _block_scores(q_smem, qr_smem, kl_ring, kr_ring, full, buf, phase, ME: gl.constexpr,
                      zero, idx_ptr, idx_off, stride_ik, n_slots, S, c, block,
                      s_layout: gl.constexpr, HAS_ROPE: gl.constexpr):
        """Consumer ME's masked base-2 scores of slot block `block` in buffer `buf`, waited
        for (the pieces above in order, nothing else on the tensor cores in between)."""
        idx = _slot_indices(idx_ptr, idx_off, stride_ik, n_slots, block, kl_ring.shape[1])
        s = _scores_first(q_smem, kl_ring, full, buf, phase, ME, zero, s_layout)
        s = _scores_rest(s, q_smem, qr_smem, kl_ring, kr_ring.index(buf), full, buf, phase, ME,
                         zero, HAS_ROPE)
        s = warpgroup_mma_wait(0, deps=(s, ))
        return _masked(s, idx, n_slots, S, c, block, s_layout)

    @gluon.jit
    def _signal(bar):
        """Every warp of this partition is past what came before; thread 0 arrives."""
        partition_barrier()
        mbarrier.arrive(bar, count=1)

    @gluon.jit
    def _consumer(q_smem, qr_smem, kl_ring, kr_ring, p_smem, q_bar, full, free, m_smem, l_smem,
                  sync, idx_ptr, idx_off, stride_ik, n_slots, n_pairs, S, c, out_ptr, out_off,
                  stride_oh, lse_ptr, lse_off, ME: gl.constexpr, HAS_ROPE: gl.constexpr):
        """Consumer ME (0 or 1): the scores of block 2i + ME of each pair, value columns
        [256 ME, + 256).

        P goes over in the rope part of the own buffer where a block has 64 slots (the same
        [64, 64] tile), else in p_smem [2, 64, BLOCK] (its reuse is ordered by the max
        exchange: each consumer writes its next P only after the other's next max, which the
        other sends after its last read of the previous P). sync holds six count-1 barriers:
        0 m0 ready, 1 m1 ready, 2 P of consumer 0 ready, 3 P of consumer 1 ready, 4 l0
        ready, 5 l1 ready (m_smem [2, 64] and l_smem [2, 64] carry the values)."""
        OTHER: gl.constexpr = 1 - ME
        BLOCK: gl.constexpr = kl_ring.shape[1]
        STAGES: gl.constexpr = kl_ring.shape[0] // 4
        P_IN_ROPE: gl.constexpr = BLOCK == 64
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                     k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        acc = gl.zeros([64, 256], gl.float32, layout=o_layout)
        m_i = gl.full([64], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([64], gl.float32, layout=row_s)
        mbarrier.wait(q_bar.index(0), 0)
        if ME == 0:  # consumer 0 computes a pair's scores at the end of the pair before
            z0 = opaque_zero(n_pairs)
            s = _block_scores(q_smem, qr_smem, kl_ring, kr_ring, full, z0, 0, 0, z0, idx_ptr,
                              idx_off, stride_ik, n_slots, S, c, 0, s_layout, HAS_ROPE)
        else:
            s = gl.zeros([64, BLOCK], gl.float32, layout=s_layout)
        for i in range(n_pairs):
            zero = opaque_zero(i)
            st = i % STAGES + zero
            phase = (i // STAGES) & 1
            own = 2 * st + ME
            other = 2 * st + OTHER
            if ME == 1:
                s = _block_scores(q_smem, qr_smem, kl_ring, kr_ring, full, own, phase, ME, zero,
                                  idx_ptr, idx_off, stride_ik, n_slots, S, c, 2 * i + 1,
                                  s_layout, HAS_ROPE)
            _signal(free.index(2 * own + 1))  # own part 1: the scores are done with it
            if ME == 1:  # the pair's max so far is consumer 0's
                mbarrier.wait(sync.index(0), i & 1)
                m_in = m_smem.index(0).load(row_s)
                m_new = gl.maximum(m_in, gl.max(s, 1))
            else:
                m_new = gl.maximum(m_i, gl.max(s, 1))
            m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
            p = gl.exp2(s - m_shift[:, None])
            alpha = gl.exp2(m_i - m_shift)
            l_i = l_i * alpha + gl.sum(p, 1)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            m_smem.index(ME).store(m_new)
            _signal(sync.index(ME))
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            # own block's values, own columns (part 0 of the own buffer)
            acc = warpgroup_mma(p_op, kl_ring.index(2 * own + ME), acc, is_async=True)
            if P_IN_ROPE:  # the rope part of the own buffer, which the scores no longer read
                p_mine = kr_ring.index(own)
                p_other = kr_ring.index(other)
            else:
                p_mine = p_smem.index(ME)
                p_other = p_smem.index(OTHER)
            if ME == 0:
                # rescale to the pair's max (m1) before handing P over
                mbarrier.wait(sync.index(1), i & 1)
                m_pair = m_smem.index(1).load(row_s)
                f = gl.exp2(m_new - gl.where(m_pair == float("-inf"), 0.0, m_pair))
                p_mine.store((p * f[:, None]).to(dtype))
                l_i = l_i * f
                m_i = m_pair
                acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
                _signal(free.index(2 * own))  # own part 0: the own P.V is done with it
                fence_async_shared()
                _signal(sync.index(2))
                acc = acc * gl.convert_layout(f, row_o)[:, None]
                mbarrier.wait(sync.index(3), i & 1)
                o_tok = warpgroup_mma(p_other, kl_ring.index(2 * other), acc, is_async=True)
                if i + 1 < n_pairs:
                    # the next pair's scores: part 0 of the own buffer was refilled once the
                    # own P.V freed it, so its half runs behind this P.V on the tensor cores
                    n_st = (i + 1) % STAGES + zero
                    n_phase = ((i + 1) // STAGES) & 1
                    idx = _slot_indices(idx_ptr, idx_off, stride_ik, n_slots, 2 * i + 2, BLOCK)
                    s = _scores_first(q_smem, kl_ring, full, 2 * n_st, n_phase, 0, zero,
                                      s_layout)
                    acc = warpgroup_mma_wait(1, deps=(o_tok, ))
                    _signal(free.index(2 * other + 1))  # the other's part 1
                    s = _scores_rest(s, q_smem, qr_smem, kl_ring, kr_ring.index(2 * n_st), full,
                                     2 * n_st, n_phase, 0, zero, HAS_ROPE)
                    s = warpgroup_mma_wait(0, deps=(s, ))
                    s = _masked(s, idx, n_slots, S, c, 2 * i + 2, s_layout)
                else:
                    acc = warpgroup_mma_wait(0, deps=(o_tok, ))
                    _signal(free.index(2 * other + 1))  # the other's part 1
            else:
                m_i = m_new
                # P goes over while the own P.V runs (it reads neither P's place nor P)
                p_mine.store(p.to(dtype))
                fence_async_shared()
                _signal(sync.index(3))
                mbarrier.wait(sync.index(2), i & 1)
                acc = warpgroup_mma(p_other, kl_ring.index(2 * other + 1), acc, is_async=True)
                p_op = warpgroup_mma_wait(1, deps=(p_op, ))
                _signal(free.index(2 * own))  # own part 0: the own P.V is done with it
                acc = warpgroup_mma_wait(0, deps=(acc, ))
                _signal(free.index(2 * other + 1))  # the other's part 1 (its P and values half)

        # the row sum over both consumers' blocks, at the same final max
        l_smem.index(ME).store(l_i)
        _signal(sync.index(4 + ME))
        mbarrier.wait(sync.index(4 + OTHER), 0)
        l_tot = l_i + l_smem.index(OTHER).load(row_s)
        nonempty = l_tot > 0
        l_safe = gl.where(nonempty, l_tot, 1.0)
        out = acc / gl.convert_layout(l_safe, row_o)[:, None]
        # both consumers are past their last wgmma (the l exchange): the own half of Q's buffer
        # takes the output tile, read back 16 bytes a thread for coalesced stores
        q_own = q_smem.index(ME)
        q_own.store(out.to(dtype))
        partition_barrier()
        lay: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
        heads = gl.arange(0, 64, layout=gl.SliceLayout(1, lay))
        cols = ME * 256 + gl.arange(0, 256, layout=gl.SliceLayout(0, lay))
        gl.store(out_ptr + out_off + (heads[:, None] * stride_oh + cols[None, :]),
                 q_own.load(lay))
        if ME == 1:
            lse = gl.where(nonempty, (m_i + gl.log2(l_safe)) * 0.6931471805599453,
                           float("-inf"))
            gl.store(lse_ptr + lse_off + gl.arange(0, 64, layout=row_s), lse)

    @gluon.jit
    def _consumer1_rope(q_smem, qr_smem, kl_ring, kr_ring, p_smem, q_bar, full, free, m_smem,
                        l_smem, sync, idx_ptr, idx_off, stride_ik, n_slots, n_pairs, S, c,
                        out_ptr, out_off, stride_oh, lse_ptr, lse_off):
        _consumer(q_smem, qr_smem, kl_ring, kr_ring, p_smem, q_bar, full, free, m_smem, l_smem,
                  sync, idx_ptr, idx_off, stride_ik, n_slots, n_pairs, S, c, out_ptr, out_off,
                  stride_oh, lse_ptr, lse_off, 1, True)

    @gluon.jit
    def _consumer1_nope(q_smem, qr_smem, kl_ring, kr_ring, p_smem, q_bar, full, free, m_smem,
                        l_smem, sync, idx_ptr, idx_off, stride_ik, n_slots, n_pairs, S, c,
                        out_ptr, out_off, stride_oh, lse_ptr, lse_off):
        _consumer(q_smem, qr_smem, kl_ring, kr_ring, p_smem, q_bar, full, free, m_smem, l_smem,
                  sync, idx_ptr, idx_off, stride_ik, n_slots, n_pairs, S, c, out_ptr, out_off,
                  stride_oh, lse_ptr, lse_off, 1, False)

    @gluon.jit
    def dsa_fwd_gluon_kernel(q_ptr, qr_ptr, kv_ptr, kr_ptr, idx_ptr, len_ptr, out_ptr, lse_ptr,
                             H, S, K, stride_qt, stride_qh, stride_qrt, stride_qrh, stride_kvs,
                             stride_krs, stride_it, stride_ik, stride_ot, stride_oh, c,
                             HAS_ROPE: gl.constexpr, HAS_LEN: gl.constexpr,
                             BLOCK: gl.constexpr, STAGES: gl.constexpr,
                             PREFETCH: gl.constexpr, num_warps: gl.constexpr):
        """Grid (T * H / 64,): program p is token p // (H / 64), heads 64 (p % (H / 64)) on;
        slot blocks of BLOCK, STAGES pairs of blocks in shared memory at once, PREFETCH pairs'
        key rows asked of the L2 ahead. Unit channel strides throughout (q, q_rope, kv,
        k_rope, out); out [T, H, 512], lse [T, H] fp32 contiguous."""
        n_hb = H // 64
        pid = gl.program_id(0)
        t = (pid // n_hb).to(gl.int64)
        h0 = ((pid % n_hb) * 64).to(gl.int64)  # head offsets past 2**31 (FINDINGS F35)
        n_slots = K + pid * 0
        if HAS_LEN:
            # clamped in the length's own dtype, then narrowed (docs/FINDINGS.md F30)
            n_slots = gl.minimum(gl.maximum(gl.load(len_ptr + t), 0), n_slots).to(gl.int32)
        n_pairs = gl.maximum(gl.cdiv(n_slots, 2 * BLOCK), 1)
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        q_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 256], dtype)
        qr_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], dtype)
        kl_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK, 256], dtype)
        kr_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK, 64], dtype)
        # P travels in the rope parts at 64 slots (_consumer); a token [2, 64, 16] stands in
        P_W: gl.constexpr = 16 if BLOCK == 64 else BLOCK
        p_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, P_W], dtype)
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        q_smem = gl.allocate_shared_memory(dtype, [2, 64, 256], q_l)
        qr_smem = gl.allocate_shared_memory(dtype, [64, 64], qr_l)
        # [(2 stage + block) * 2 + latent half] and [2 stage + block]
        kl_ring = gl.allocate_shared_memory(dtype, [4 * STAGES, BLOCK, 256], kl_l)
        kr_ring = gl.allocate_shared_memory(dtype, [2 * STAGES, BLOCK, 64], kr_l)
        p_smem = gl.allocate_shared_memory(dtype, [2, 64, P_W], p_l)
        m_smem = gl.allocate_shared_memory(gl.float32, [2, 64], flat)
        l_smem = gl.allocate_shared_memory(gl.float32, [2, 64], flat)
        q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        full = gl.allocate_shared_memory(gl.int64, [4 * STAGES, 1], mbarrier.MBarrierLayout())
        free = gl.allocate_shared_memory(gl.int64, [4 * STAGES, 1], mbarrier.MBarrierLayout())
        sync = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar.index(0), count=128)
        for b in gl.static_range(2 * STAGES):  # index 2 buffer + part (_producer)
            mbarrier.init(full.index(2 * b), count=128)
            mbarrier.init(full.index(2 * b + 1), count=128)
            mbarrier.init(free.index(2 * b), count=1)
            mbarrier.init(free.index(2 * b + 1), count=2)
        for b in gl.static_range(6):
            mbarrier.init(sync.index(b), count=1)
        fence_async_shared()

        q_off = t * stride_qt + h0 * stride_qh
        qr_off = t * stride_qrt + h0 * stride_qrh
        idx_off = t * stride_it
        out_off = t * stride_ot + h0 * stride_oh
        lse_off = t * H + h0
        consumer_args = (q_smem, qr_smem, kl_ring, kr_ring, p_smem, q_bar, full, free, m_smem,
                         l_smem, sync, idx_ptr, idx_off, stride_ik, n_slots, n_pairs, S, c,
                         out_ptr, out_off, stride_oh, lse_ptr, lse_off)
        producer_args = (q_ptr, qr_ptr, kv_ptr, kr_ptr, idx_ptr, q_off, qr_off, stride_qh,
                         stride_qrh, idx_off, stride_ik, stride_kvs, stride_krs, n_slots,
                         n_pairs, S, q_smem, qr_smem, kl_ring, kr_ring, q_bar, full, free,
                         PREFETCH)
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


def _unit_rows(x, width):
    """x [N, ..., width] read as rows of `width` contiguous elements whose other strides are
    multiples of 16 elements: cp.async moves 16-byte pieces, and the compiler can prove a row
    start 16-byte aligned only from Triton's divisibility-by-16 specialisation of the strides
    (a multiple of 8 alone does not compile: 2-byte copies)."""
    return (x.shape[-1] == width and x.stride(-1) == 1
            and all(st % 16 == 0 for st in x.stride()[:-1]))


def applies(q, q_rope, kv, k_rope, indices):
    """Whether this kernel takes the call: CUDA sm_90 with Gluon, fp16/bf16, H a multiple of
    64, a 512-wide latent with unit channel stride and other strides multiples of 16 (q, kv),
    a 64-wide rope part likewise (or none), 16-byte aligned base pointers, S and the slot
    count within int32. (kv and k_rope are the [S, D] views.)"""
    if not GLUON_AVAILABLE or q.device.type != "cuda" or q.dtype not in _DTYPES:
        return False
    T, H, DL = q.shape
    if DL != LATENT or H % HEADS or H == 0 or T == 0 or not is_sm90(q.device):
        return False
    if kv.shape[0] >= 2 ** 31 or indices.shape[1] >= 2 ** 31 - 128:
        return False
    tensors = [(q, LATENT), (kv, LATENT)]
    if q_rope is not None:
        if q_rope.shape[2] != ROPE:
            return False
        tensors += [(q_rope, ROPE), (k_rope, ROPE)]
    return all(_unit_rows(x, w) and x.data_ptr() % 16 == 0 for x, w in tensors)


def launch(q, q_rope, kv, k_rope, indices, topk_length, scale, out, lse):
    """Fill out [T, H, 512] (contiguous) and lse [T, H] (fp32, contiguous) where
    :func:`applies`."""
    T, H, _ = q.shape
    rope = q_rope is not None
    qr, kr = (q_rope, k_rope) if rope else (q, kv)
    grid = (T * (H // HEADS),)
    args = (q, qr, kv, kr, indices, topk_length if topk_length is not None else indices,
            out, lse, H, kv.shape[0], indices.shape[1], q.stride(0), q.stride(1), qr.stride(0),
            qr.stride(1), kv.stride(0), kr.stride(0), indices.stride(0), indices.stride(1),
            out.stride(0), out.stride(1), scale * LOG2E)
    block, stages = CONFIG
    meta = dict(HAS_ROPE=rope, HAS_LEN=topk_length is not None, BLOCK=block, STAGES=stages,
                PREFETCH=PREFETCH, num_warps=4)
    on_device_of(out, _LAUNCH, grid, args, meta)


if GLUON_AVAILABLE:
    _LAUNCH = DirectLauncher(dsa_fwd_gluon_kernel)
