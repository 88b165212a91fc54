"""Hopper (sm_90) warp-specialised SDPA backward in Gluon for head dims up to 128 (multiples of
8, on the forward's tiles of 64 or 128 columns: ``sdpa_fwd_gluon.tile_dim``), 16-bit inputs,
no mask or the forward's (boolean, or additive of the inputs' dtype): dK and dV of a key
block, with dQ added to an fp32 buffer by TMA reductions or atomics (the order of the additions
varies between runs, as in ``fast.sdpa``'s "atomic" dQ mode).

The same function as the Triton backward's 16-bit path (:mod:`fast.kernels.sdpa_bwd`): with
the forward's row statistics m (log2 units) and log2 l, and Delta = rowsum(dO * O) from the
preprocess kernel, P = exp2((q.k * c - m) - log2 l) (c = scale * log2(e); m and log l apart,
docs/FINDINGS.md F11), dP = dO V^T, dS = P (dP - Delta); dV = P^T dO, dK = scale dS^T Q and
dQ = scale dS K. P and dS enter the products rounded to the input dtype.

Program (key block of BLOCK_N = 128 rows, one kv head of one batch element): it walks every
query head of the GQA group and every query block of 64 rows that can see the key block
(under causal masking, top-left: from the block holding the key block's first row), FA3's
roles:

* a producer warp loads K and V once and each step's Q and dO tiles into a ring of STAGES by
  TMA (5-d descriptors, zero-filled past L and S);
* two consumer warpgroups own key rows [64 w, 64 w + 64) of the block (w = 0: the default
  partition, 1: a worker): S^T = K_w Q^T and dP^T = V_w dO^T ([64 keys, 64 queries]), P^T and
  dS^T in registers, dV_w += P^T dO and dK_w += dS^T Q with P^T and dS^T as register operands
  (dK_w and dV_w [64, D] fp32 accumulate over the whole walk). dQ: each stores its dS^T
  (bf16) into one [128 keys, 64 queries] tile, and once both halves are there consumer w
  forms dQ's columns [w D / 2, (w + 1) D / 2) of the query block over all 128 keys (dS from
  that tile, K's columns from shared memory) and adds them, times the scale, to the fp32 dQ
  buffer (at D 64 the consumers take the steps' dQ in turn). Each [64, 64] tile goes there by
  one TMA reduction ("tma" and "tma_deferred", what "auto" takes) or by fp32 atomics
  ("serial"; and a head's partial last tile under any schedule). Under "tma" the consumer
  waits after each reduction until the TMA has read its tile; under "tma_deferred" the tile is
  a shared one of the consumer's own, and that wait moves to its next dQ product (the
  reduction had the step's products to finish in). Under "split_tma" each
  consumer stores its dS^T into a tile of its own and adds dQ over its own 64 keys, every
  column, without waiting for the other (twice the additions). SCHEDULES below; why the
  reduction matters: docs/FINDINGS.md F77.

Masked out: keys past S, queries past L (their statistics read as m = +inf: P = 0), when
causal keys after the query, and what a boolean mask excludes; an additive mask enters the
scores in natural units, against the forwards' m in the same units (:func:`_probabilities`).
Gluon does not run under Triton's CPU interpreter: this kernel is checked on the GPU by
``tests/fast/test_fast_sdpa_gluon.py``.
"""
import functools

import torch

from ..host import Choice
from ..launch import DirectLauncher, TmaBoundLaunch, on_device_of
from .sdpa_fwd_gluon import (
    _ELEMENT_SIZE,
    GLUON_AVAILABLE,
    _tma_strides,
    mask_arguments,
    tile_dim,
)

if GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .gluon_common import (
        ADD_MASK,
        BOOL_MASK,
        causal_program,
        mask_kind,
        opaque_zero,
        partition_barrier,
        tma_add,
        tma_add_shared,
    )
    from .sdpa_fwd_gluon import (
        _descriptor,
        _release,
        _tile_view,
        _unchecked,
        descriptor_fields,
        prepared_plan,
        recall,
        remember,
    )

# the head-dim tiles it takes (of sdpa_fwd_gluon.HEAD_DIMS: dK and dV of 256 columns would
# not fit a consumer's registers beside the step's tiles)
HEAD_DIMS = (64, 128)
BLOCK_M = 64    # query rows a step
BLOCK_N = 128   # key rows a program (64 per consumer)
STAGES = gl.constexpr(2) if GLUON_AVAILABLE else 2  # Q / dO tiles in flight
WORKER_REGS = gl.constexpr(232) if GLUON_AVAILABLE else 232
PRODUCER_REGS = gl.constexpr(40) if GLUON_AVAILABLE else 40
LOG2E = 1.4426950408889634
_INT32_MAX = 2**31 - 1
# the consumers' step schedule ($ATTENTION_ORACLE_FAST_SDPA_GLUON_BWD_SCHEDULE, set_schedule):
# name -> (split, dQ by TMA, the reduction's wait deferred). "serial", "tma" and
# "tma_deferred": the consumers meet each step (one [128 keys, 64 queries] dS tile, both
# halves, then each its share of dQ's columns over all 128 keys); "split_tma": each consumer
# adds dQ over its own 64 keys (its own dS tile, all of dQ's columns: twice the additions, no
# meeting). dQ's [64, 64] tiles go to the fp32 buffer by atomics ("serial") or as TMA
# reductions: of a register tile, waiting until it is read (gluon_common.tma_add), or of a
# shared tile per consumer, waited for before the next write to it ("tma_deferred",
# gluon_common.tma_add_shared). The kernel reads the split from the dS allocation's shape and
# the deferral from the dQ tiles'.
SCHEDULES = {"serial": (False, False, False), "tma": (False, True, False),
             "tma_deferred": (False, True, True), "split_tma": (True, True, False)}
# "auto" (the default): "tma_deferred" on either tile, ahead of "tma" and "serial" at every
# length and head dim timed (H100; docs/PERFORMANCE.md "Gluon backward: where dQ goes")
_SCHEDULE = Choice("ATTENTION_ORACLE_FAST_SDPA_GLUON_BWD_SCHEDULE", ("auto", *SCHEDULES), "auto")


def resolved_schedule(schedule, head_dim):
    """The schedule a launch at ``head_dim`` runs under ``schedule`` (a name, or "auto")."""
    if schedule == "auto":
        return "tma_deferred"
    return schedule


def set_schedule(name):
    """The consumers' schedule of later launches ("auto" or a name in SCHEDULES); returns the
    previous one."""
    return _SCHEDULE.set(name)

if GLUON_AVAILABLE:

    @gluon.jit
    def _walk(j, n_m, m0, hk, GROUP):
        """Step j of the walk: (query head, first query row)."""
        return hk * GROUP + j // n_m, (m0 + j % n_m) * 64

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_ring, do_ring, kv_bar,
                  q_full, do_full, qd_empty, z1, z2, hk, GROUP, start_n, m0, n_m, n_steps):
        """One warp: K and V once, then each step's Q and dO into the ring as both consumers
        free a stage (a fresh barrier passes phase 1 at once)."""
        NSTAGES: gl.constexpr = q_ring.shape[0]
        mbarrier.expect(kv_bar.index(0), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [z1, z2, hk, start_n, 0], kv_bar.index(0),
                                        k_smem.index(0))
        tma.async_copy_global_to_shared(v_desc, [z1, z2, hk, start_n, 0], kv_bar.index(0),
                                        v_smem.index(0))
        for j in range(n_steps):
            stage = j % NSTAGES
            mbarrier.wait(qd_empty.index(stage), ((j // NSTAGES) & 1) ^ 1)
            h, start_m = _walk(j, n_m, m0, hk, GROUP)
            mbarrier.expect(q_full.index(stage), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [z1, z2, h, start_m, 0],
                                            q_full.index(stage), q_ring.index(stage))
            mbarrier.expect(do_full.index(stage), do_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(do_desc, [z1, z2, h, start_m, 0],
                                            do_full.index(stage), do_ring.index(stage))

    @gluon.jit
    def _consumer(k_smem, v_smem, q_ring, do_ring, ds_smem, dq_smem, kv_bar, q_full, do_full,
                  qd_empty, ds_ready, ds_free, m_smem, l_smem, d_smem, Stats, s_stat, Delta, DQ, DK,
                  DV, Mask, s_mh, s_mm, s_mn, bh_q0, pid_bh, GROUP, L, S, HD, start_n, m0, n_m,
                  n_steps, qk_scale, scale, dq_desc, dq_tma, W: gl.constexpr, CAUSAL: gl.constexpr):
        """Consumer W: key rows [start_n + 64 W, + 64); dQ columns [W D / 2, + D / 2) of the
        head-dim tile D (the head dim HD or more: columns past HD are TMA's zeros, never
        written). ``bh_q0``: the row of the group's first query head in Stats / Delta (units
        of L rows); dK, dV, DQ rank-5 contiguous (row stride HD); dq_smem[W] its dQ tile
        ("tma_deferred")."""
        NSTAGES: gl.constexpr = q_ring.shape[0]
        D: gl.constexpr = k_smem.shape[5]
        # dQ columns per consumer: halves at D 128 (a 64-column slice is one 128-byte swizzle
        # atom); all 64 at D 64, alternate steps
        DQ_COLS: gl.constexpr = D // 2 if D == 128 else D
        SPLIT: gl.constexpr = ds_smem.shape[1] == 64  # a dS tile per consumer: "split"
        DEFER: gl.constexpr = dq_smem.shape[1] == 64  # a dQ tile per consumer: "tma_deferred"
        dq_tile = dq_smem.index(W)
        dtype: gl.constexpr = k_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DQ_COLS, 16])
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout,
                                                      k_width=2)
        keys_l: gl.constexpr = gl.SliceLayout(1, s_layout)
        queries_l: gl.constexpr = gl.SliceLayout(0, s_layout)
        offs_key = start_n + 64 * W + gl.arange(0, 64, layout=keys_l)
        ragged = start_n + 128 > S
        dk = gl.zeros([64, D], gl.float32, layout=acc_layout)
        dv = gl.zeros([64, D], gl.float32, layout=acc_layout)
        h, start_m = _walk(0, n_m, m0, 0, GROUP)
        m, log_l, delta = _row_stats(Stats, s_stat, Delta, (bh_q0 + h).to(gl.int64) * L, start_m,
                                     L, n_steps > 0)
        mbarrier.wait(kv_bar.index(0), 0)
        for j in range(n_steps):
            stage = j % NSTAGES
            phase = (j // NSTAGES) & 1
            h, start_m = _walk(j, n_m, m0, 0, GROUP)
            # shared-memory views through an opaque zero: descriptors computed where used, not
            # hoisted out of the loop (gluon_common.opaque_zero)
            zero = opaque_zero(j)
            k_all = _tile_view(k_smem, zero, 128, D)
            k_w = k_all.slice(64 * W, 64)
            v_w = _tile_view(v_smem, zero, 128, D).slice(64 * W, 64)
            k_cols = k_all.slice(DQ_COLS * W % D, DQ_COLS, dim=1)
            ds_all = ds_smem.index(zero + W * SPLIT).reshape([ds_smem.shape[1], 64])
            # this step's row statistics into shared memory (read back where used: held in
            # registers across the products, 48 of them spilled), one allocation each so that
            # the three stores need no barrier between them; the next step's loads issued
            m_smem.index(W).store(m)
            l_smem.index(W).store(log_l)
            d_smem.index(W).store(delta)
            partition_barrier()
            h1, start_m1 = _walk(j + 1, n_m, m0, 0, GROUP)
            m, log_l, delta = _row_stats(Stats, s_stat, Delta, (bh_q0 + h1).to(gl.int64) * L,
                                         start_m1, L, j + 1 < n_steps)
            q_t = _tile_view(q_ring, stage, 64, D)
            do_t = _tile_view(do_ring, stage, 64, D)
            mbarrier.wait(q_full.index(stage), phase)
            s = warpgroup_mma(k_w, q_t.permute((1, 0)),
                              gl.zeros([64, 64], gl.float32, layout=s_layout), use_acc=False,
                              is_async=True)
            mbarrier.wait(do_full.index(stage), phase)
            dp = warpgroup_mma(v_w, do_t.permute((1, 0)),
                               gl.zeros([64, 64], gl.float32, layout=s_layout), use_acc=False,
                               is_async=True)
            s, dp = warpgroup_mma_wait(0, deps=(s, dp))
            offs_q = start_m + gl.arange(0, 64, layout=queries_l)
            p = _probabilities(s, qk_scale, m_smem.index(W + zero).load(queries_l),
                               l_smem.index(W + zero).load(queries_l), Mask, h, s_mh,
                               s_mm, s_mn, offs_key, offs_q, L, S)
            # keys past S (a ragged last block) or, under causal, after a query: only a step
            # that has them selects (a key past S reads as zeros: its p is finite, not 0)
            edge = ragged
            if CAUSAL:
                edge = edge | (start_m < start_n + 128)
            if edge:
                keep = offs_key[:, None] < S
                if CAUSAL:
                    keep = keep & (offs_key[:, None] <= offs_q[None, :])
                p = gl.where(keep, p, 0.0)
            ds = p * (dp - d_smem.index(W + zero).load(queries_l)[None, :])
            p_op = gl.convert_layout(p.to(dtype), op_layout)
            ds_op = gl.convert_layout(ds.to(dtype), op_layout)
            dv = warpgroup_mma(p_op, do_t, dv, is_async=True)
            dk = warpgroup_mma(ds_op, q_t, dk, is_async=True)
            if SPLIT:  # dQ over this consumer's keys, all of its columns, 64 at a time
                ds_all.store(ds.to(dtype))
                fence_async_shared()
                partition_barrier()
                for c in gl.static_range(D // 64):
                    dq = warpgroup_mma(ds_all.permute((1, 0)), k_w.slice(64 * c, 64, dim=1),
                                       gl.zeros([64, 64], gl.float32, layout=dq_layout),
                                       use_acc=False, is_async=True)
                    if c == 0:
                        dv, dk, p_op, ds_op, dq = warpgroup_mma_wait(
                            0, deps=(dv, dk, p_op, ds_op, dq))
                        _release(qd_empty, stage)
                    else:
                        dq = warpgroup_mma_wait(0, deps=(dq, ))
                    _sink_dq(dq, DQ, dq_desc, dq_tma, dq_tile, bh_q0 + h, start_m, L, scale,
                             64 * c, HD, dq_layout)
            else:
                # this half of dS^T for the dQ product, once both halves of the last step are
                # read
                mbarrier.wait(ds_free.index(0), (j & 1) ^ 1)
                ds_all.slice(64 * W, 64).store(ds.to(dtype))
                fence_async_shared()
                _release(ds_ready, 0)
                dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op))
                _release(qd_empty, stage)
                mbarrier.wait(ds_ready.index(0), j & 1)
                if DQ_COLS < D:  # each consumer its half of dQ's columns
                    _add_dq(ds_all, k_cols, ds_free, DQ, dq_desc, dq_tma, dq_tile, bh_q0 + h,
                            start_m, L, scale, DQ_COLS * W, HD, dq_layout)
                elif j % 2 == W:  # D 64: the consumers take the steps' dQ in turn
                    _add_dq(ds_all, k_cols, ds_free, DQ, dq_desc, dq_tma, dq_tile, bh_q0 + h,
                            start_m, L, scale, 0, HD, dq_layout)
                else:
                    _release(ds_free, 0)
        if DEFER:  # the last reduction has read its tile before the program ends
            tma.store_wait(0)

        rows = start_n + 64 * W + gl.arange(0, 64, layout=gl.SliceLayout(1, acc_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, acc_layout))
        offs = (pid_bh.to(gl.int64) * S + rows[:, None]) * HD + cols[None, :]
        inside = (rows < S)[:, None] & (cols < HD)[None, :]
        gl.store(DK + offs, (dk * scale).to(dtype), mask=inside)
        gl.store(DV + offs, dv.to(dtype), mask=inside)

    @gluon.jit
    def _probabilities(s, qk_scale, m, log_l, Mask, h, s_mh, s_mm, s_mn, offs_key, offs_q, L,
                       S):
        """P^T [64 keys, 64 queries] from the raw scores S^T = K Q^T and the queries' m and log2
        l: exp2((s c - m) - log2 l) in log2 units (c = ``qk_scale``); under a mask, ``Mask``
        the group's first query head's [L, S] plane (the step's head ``h`` of the group at
        h * s_mh): what a boolean mask excludes is 0; an additive one is added to s times the
        scale in natural units, where the forwards keep m for it (c is the scale then).
        Without a mask ``Mask`` is an fp32 stand-in (gluon_common.mask_kind). Keys past S and
        the causal bound are the caller's."""
        KIND: gl.constexpr = mask_kind(Mask.dtype.element_ty)
        if KIND == BOOL_MASK or KIND == ADD_MASK:
            ptrs = (Mask + h.to(gl.int64) * s_mh + offs_q.to(gl.int64)[None, :] * s_mm
                    + offs_key.to(gl.int64)[:, None] * s_mn)
            inside = (offs_key[:, None] < S) & (offs_q[None, :] < L)
        if KIND == ADD_MASK:
            added = gl.load(ptrs, mask=inside, other=0.0).to(gl.float32)
            p = gl.exp2((s * qk_scale + added - m[None, :]) * 1.4426950408889634
                        - log_l[None, :])
        else:
            p = gl.exp2((s * qk_scale - m[None, :]) - log_l[None, :])
        if KIND == BOOL_MASK:
            p = gl.where(gl.load(ptrs, mask=inside, other=1) != 0, p, 0.0)
        return p

    @gluon.jit
    def _row_stats(Stats, s_stat, Delta, row, start_m, L, pred):
        """(m, log2 l, Delta) of query rows [start_m, + 64) of the head whose first row is
        ``row``, [64] in a compact layout (one value a thread); rows past L (or every row
        unless ``pred``) read as m = +inf, log l = 0, Delta = 0 (P = 0)."""
        flat: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        offs = start_m + gl.arange(0, 64, layout=flat)
        ok = (offs < L) & pred
        m = gl.load(Stats + row + offs, mask=ok, other=float("inf"))
        log_l = gl.load(Stats + s_stat + row + offs, mask=ok, other=0.0)
        delta = gl.load(Delta + row + offs, mask=ok, other=0.0)
        return m, log_l, delta

    @gluon.jit
    def _add_dq(ds_smem, k_cols, ds_free, DQ, dq_desc, dq_tma, dq_tile, head, start_m, L,
                scale, col0, D, dq_layout: gl.constexpr):
        """DQ[head * L + start_m + i, col0 + c] (row stride D) += scale * dS . K[:, cols] over the
        128 keys, dS the transposed view of ds_smem [128 keys, 64 queries], K[:, cols] =
        k_cols [128, N]; frees ds_smem once read."""
        N: gl.constexpr = k_cols.shape[1]
        dq = warpgroup_mma(ds_smem.permute((1, 0)), k_cols,
                           gl.zeros([64, N], gl.float32, layout=dq_layout), use_acc=False,
                           is_async=True)
        dq = warpgroup_mma_wait(0, deps=(dq, ))
        if dq_tile.shape[0] == 64:  # "tma_deferred": the last reduction has read dq_tile
            tma.store_wait(0)  # (issuing threads; _release's barrier tells the others)
        _release(ds_free, 0)
        _sink_dq(dq, DQ, dq_desc, dq_tma, dq_tile, head, start_m, L, scale, col0, D, dq_layout)

    @gluon.jit
    def _sink_dq(dq, DQ, dq_desc, dq_tma, dq_tile, head, start_m, L, scale, col0, D,
                 dq_layout: gl.constexpr):
        """DQ[head * L + start_m + i, col0 + c] (row stride D) += scale * dq[i, c] for the
        [64, 64] tile dq, rows past L and columns past D left alone: one TMA reduction through
        ``dq_desc`` (DQ as [rows, D]: a tile within the head's L rows) where ``dq_tma``, else
        (and for a head's last, partial, tile) fp32 atomics. The reduction's source: the
        shared ``dq_tile`` where it is [64, 64] ("tma_deferred": free, as the caller waited;
        not waited for here), else the register tile (waited for until read)."""
        if dq_tma and start_m + 64 <= L:
            if dq_tile.shape[0] == 64:
                dq_tile.store(dq * scale)
                fence_async_shared()
                partition_barrier()
                tma_add_shared(dq_desc, [head * L + start_m, col0], dq_tile)
            else:
                tma_add(dq_desc, [head * L + start_m, col0], dq * scale)
        else:
            row = head.to(gl.int64) * L
            rows = start_m + gl.arange(0, 64, layout=gl.SliceLayout(1, dq_layout))
            cols = col0 + gl.arange(0, 64, layout=gl.SliceLayout(0, dq_layout))
            gl.atomic_add(DQ + (row + rows[:, None]) * D + cols[None, :], dq * scale,
                          mask=(rows < L)[:, None] & (cols < D)[None, :], sem="relaxed")

    @gluon.jit
    def _consumer1(k_smem, v_smem, q_ring, do_ring, ds_smem, dq_smem, kv_bar, q_full, do_full,
                   qd_empty, ds_ready, ds_free, m_smem, l_smem, d_smem, Stats, s_stat, Delta, DQ,
                   DK, DV, Mask, s_mh, s_mm, s_mn, bh_q0, pid_bh, GROUP, L, S, HD, start_n, m0, n_m,
                   n_steps, qk_scale, scale, dq_desc, dq_tma):
        _consumer(k_smem, v_smem, q_ring, do_ring, ds_smem, dq_smem, kv_bar, q_full, do_full,
                  qd_empty, ds_ready, ds_free, m_smem, l_smem, d_smem, Stats, s_stat, Delta, DQ, DK,
                  DV, Mask, s_mh, s_mm, s_mn, bh_q0, pid_bh, GROUP, L, S, HD, start_n, m0, n_m,
                  n_steps, qk_scale, scale, dq_desc, dq_tma, 1, False)

    @gluon.jit
    def _consumer1_causal(k_smem, v_smem, q_ring, do_ring, ds_smem, dq_smem, kv_bar, q_full,
                          do_full, qd_empty, ds_ready, ds_free, m_smem, l_smem, d_smem, Stats,
                          s_stat, Delta, DQ, DK, DV, Mask, s_mh, s_mm, s_mn, bh_q0, pid_bh, GROUP,
                          L, S, HD, start_n, m0, n_m, n_steps, qk_scale, scale, dq_desc, dq_tma):
        _consumer(k_smem, v_smem, q_ring, do_ring, ds_smem, dq_smem, kv_bar, q_full, do_full,
                  qd_empty, ds_ready, ds_free, m_smem, l_smem, d_smem, Stats, s_stat, Delta, DQ, DK,
                  DV, Mask, s_mh, s_mm, s_mn, bh_q0, pid_bh, GROUP, L, S, HD, start_n, m0, n_m,
                  n_steps, qk_scale, scale, dq_desc, dq_tma, 1, True)

    @gluon.jit
    def sdpa_bwd_gluon_ws_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, Stats, s_stat,
                                 Delta, DQ, DK, DV, Z2, HQ, GROUP, L, S, HD, qk_scale, scale,
                                 CAUSAL: gl.constexpr, SPLIT: gl.constexpr,
                                 DQ_TMA: gl.constexpr, DQ_DEFER: gl.constexpr,
                                 SECTION: gl.constexpr, num_warps: gl.constexpr):
        """:func:`_program` with no mask: the launch carries no mask arguments. Stats stands in
        for the mask (fp32: none), s_stat for its strides, never read."""
        _program(q_desc, k_desc, v_desc, do_desc, dq_desc, Stats, s_stat, Delta, DQ, DK, DV,
                 Stats, s_stat, s_stat, s_stat, s_stat, s_stat, Z2, HQ, GROUP, L, S, HD,
                 qk_scale, scale, CAUSAL, SPLIT, DQ_TMA, DQ_DEFER, SECTION)

    @gluon.jit
    def sdpa_bwd_gluon_ws_masked_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, Stats,
                                        s_stat, Delta, DQ, DK, DV, Mask, s_mz1, s_mz2, s_mh,
                                        s_mm, s_mn, Z2, HQ, GROUP, L, S, HD, qk_scale, scale,
                                        CAUSAL: gl.constexpr, SPLIT: gl.constexpr,
                                        DQ_TMA: gl.constexpr, DQ_DEFER: gl.constexpr,
                                        SECTION: gl.constexpr, num_warps: gl.constexpr):
        """:func:`_program` under a mask."""
        _program(q_desc, k_desc, v_desc, do_desc, dq_desc, Stats, s_stat, Delta, DQ, DK, DV,
                 Mask, s_mz1, s_mz2, s_mh, s_mm, s_mn, Z2, HQ, GROUP, L, S, HD, qk_scale,
                 scale, CAUSAL, SPLIT, DQ_TMA, DQ_DEFER, SECTION)

    @gluon.jit
    def _program(q_desc, k_desc, v_desc, do_desc, dq_desc, Stats, s_stat, Delta, DQ, DK, DV,
                 Mask, s_mz1, s_mz2, s_mh, s_mm, s_mn, Z2, HQ, GROUP, L, S, HD, qk_scale, scale,
                 CAUSAL: gl.constexpr, SPLIT: gl.constexpr, DQ_TMA: gl.constexpr,
                 DQ_DEFER: gl.constexpr, SECTION: gl.constexpr):
        """Grid (cdiv(S, 128), Z1*Z2*HKV); descriptors over rank-5 q, dout (blocks [1, 1, 1, 64,
        D]) and k, v (blocks [1, 1, 1, 128, D]), D the head-dim tile of the head dim HD
        (sdpa_fwd_gluon.tile_dim); Stats rows m (log2 units) and log2 l (row stride s_stat),
        Delta [Z1*Z2*HQ, L] fp32; DQ rank-5 contiguous fp32 (added to), DK and DV rank-5
        contiguous in the input dtype; Mask a [Z1, Z2, HQ, L, S] mask's data (strides s_mz1 ..
        s_mn: boolean as uint8, or additive in the inputs' dtype with ``qk_scale`` the scale),
        or an fp32 stand-in where there is none; dq_desc over DQ as [Z1*Z2*HQ*L, HD] (block
        [64, 64]); SPLIT, DQ_TMA and DQ_DEFER the schedule's (SCHEDULES); SECTION, under
        CAUSAL, the bytes of a section of kv heads (gluon_common.causal_program: the key blocks
        most queries see first, across the section; 0: one kv head's blocks after another)."""
        dtype: gl.constexpr = q_desc.dtype
        if CAUSAL:  # a kv head re-reads its group's queries and output gradients
            ELSIZE: gl.constexpr = dtype.primitive_bitwidth // 8
            pid_n, pid_bh = causal_program(L, 2 * HD * ELSIZE * GROUP, 1, SECTION, False)
        else:
            pid_n = gl.program_id(0)
            pid_bh = gl.program_id(1)
        HKV = HQ // GROUP
        hk = pid_bh % HKV
        z2 = (pid_bh // HKV) % Z2
        z1 = pid_bh // (HKV * Z2)
        start_n = pid_n * 128
        n_mb = gl.cdiv(L, 64)
        m0 = 0
        if CAUSAL:  # top-left: a query sees the keys up to its own row
            m0 = gl.minimum(start_n // 64, n_mb)
        n_steps = GROUP * (n_mb - m0)
        # query blocks per head for the walk's division: at least 1, so that a program with no
        # step (causal keys past every query) divides by 1, not 0 (its walk results are unused)
        n_m = gl.maximum(n_mb - m0, 1)
        bh_q0 = (z1 * Z2 + z2) * HQ + hk * GROUP
        # the mask's [L, S] plane of the group's first query head (the consumers add a step's)
        Mask = Mask + (z1.to(gl.int64) * s_mz1 + z2.to(gl.int64) * s_mz2
                       + (hk * GROUP).to(gl.int64) * s_mh)

        # K and V as one-stage rings ([1] + block): views through an index (_consumer)
        k_smem = gl.allocate_shared_memory(dtype, [1] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [1] + v_desc.block_type.shape, v_desc.layout)
        q_ring = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape,
                                           q_desc.layout)
        do_ring = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape,
                                            do_desc.layout)
        ds_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([128, 64], dtype)
        if SPLIT:  # a [64 keys, 64 queries] tile per consumer
            ds_smem = gl.allocate_shared_memory(dtype, [2, 64, 64], ds_l)
        else:  # one [128 keys, 64 queries] tile, a half per consumer
            ds_smem = gl.allocate_shared_memory(dtype, [1, 128, 64], ds_l)
        if DQ_DEFER:  # a [64, 64] fp32 dQ tile per consumer, the TMA reductions' source
            dq_smem = gl.allocate_shared_memory(gl.float32, [2, 64, 64], dq_desc.layout)
        else:  # a stand-in of no use: its shape tells the consumers
            dq_smem = gl.allocate_shared_memory(gl.float32, [2, 1, 1],
                                                gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        kv_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        q_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        qd_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        ds_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        # per consumer W: [W] the step's m, log2 l, Delta (_consumer)
        stats_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        m_smem = gl.allocate_shared_memory(gl.float32, [2, 64], stats_l)
        l_smem = gl.allocate_shared_memory(gl.float32, [2, 64], stats_l)
        d_smem = gl.allocate_shared_memory(gl.float32, [2, 64], stats_l)
        mbarrier.init(kv_bar.index(0), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(q_full.index(i), count=1)
            mbarrier.init(do_full.index(i), count=1)
            mbarrier.init(qd_empty.index(i), count=2)
        mbarrier.init(ds_ready.index(0), count=2)
        mbarrier.init(ds_free.index(0), count=2)
        fence_async_shared()

        consumer_args = (k_smem, v_smem, q_ring, do_ring, ds_smem, dq_smem, kv_bar, q_full, do_full,
                         qd_empty, ds_ready, ds_free, m_smem, l_smem, d_smem, Stats, s_stat, Delta,
                         DQ, DK, DV, Mask, s_mh, s_mm, s_mn, bh_q0, pid_bh, GROUP, L, S, HD,
                         start_n, m0, n_m, n_steps, qk_scale, scale, dq_desc, DQ_TMA)
        producer_args = (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_ring, do_ring,
                         kv_bar, q_full, do_full, qd_empty, z1, z2, hk, GROUP, start_n, m0,
                         n_m, n_steps)
        if CAUSAL:
            gl.warp_specialize([
                (_consumer, consumer_args + (0, True)),
                (_consumer1_causal, consumer_args),
                (_producer, producer_args),
            ], [4, 1], [WORKER_REGS, PRODUCER_REGS])
        else:
            gl.warp_specialize([
                (_consumer, consumer_args + (0, False)),
                (_consumer1, consumer_args),
                (_producer, producer_args),
            ], [4, 1], [WORKER_REGS, PRODUCER_REGS])


def plan(gluon_fwd_plan, dout_stride, dtype, section=0):
    """The Gluon backward's plan, or None where it does not apply: where the Gluon forward's
    plan applies (``gluon_fwd_plan``, :func:`sdpa_fwd_gluon.plan`: sm_90, 16-bit, q, k and v
    of one head dim, TMA-ready strides) on a tile in ``HEAD_DIMS`` (up to 128) with a rank-5
    dout of q's shape as
    TMA-ready (no stride-0 broadcast). Data pointers are checked per call
    (:func:`sdpa_fwd_gluon.aligned`). ``section``: a causal launch's SECTION (the kernel's
    order of key blocks)."""
    if (gluon_fwd_plan is None or not GLUON_AVAILABLE
            or tile_dim(gluon_fwd_plan[0][0][-1]) not in HEAD_DIMS):
        return None
    if not _tma_strides(gluon_fwd_plan[0][0], dout_stride, _ELEMENT_SIZE[dtype]):
        return None
    return gluon_fwd_plan + (tuple(dout_stride), section)


def _prepare(dout, query, key, value, dq_sum, bwd_plan, schedule):
    """The descriptors' fields, the grid, the int arguments, the constexprs and the unmasked
    call's bound launch with its kept arguments, of one plan."""
    (qs, ks, vs), (qst, kst, vst), is_causal, scale, dst, section = bwd_plan
    Z1, Z2, HQ, L, D = qs
    HKV, S = ks[2], ks[3]
    descs = (_descriptor(query, qs, qst, BLOCK_M), _descriptor(key, ks, kst, BLOCK_N),
             _descriptor(value, vs, vst, BLOCK_N), _descriptor(dout, qs, dst, BLOCK_M))
    # rank 2, as Triton 3.6 lowers the TMA reduction of a rank-2 tile only into a rank-2 box
    dq_desc = TensorDescriptor(dq_sum, [Z1 * Z2 * HQ * L, D], [D, 1], [64, 64], _dq_layout())
    ints = (Z2, HQ, HQ // HKV, L, S, D)
    # q.k's factor: log2 units, or natural ones under an additive mask (_probabilities)
    scales = (scale * LOG2E, scale)  # [additive mask]
    split, dq_tma, dq_defer = SCHEDULES[resolved_schedule(schedule, D)]
    # the reduction's row coordinate (head * L + start_m) is an int32
    dq_tma = dq_tma and Z1 * Z2 * HQ * L <= _INT32_MAX
    meta = dict(CAUSAL=is_causal, SPLIT=split, DQ_TMA=dq_tma, DQ_DEFER=dq_tma and dq_defer,
                SECTION=section if is_causal else 0, num_warps=4)
    fields, grid = descriptor_fields(descs + (dq_desc, )), (-(-S // BLOCK_N), Z1 * Z2 * HKV)
    # an unmasked call's launch with its descriptors expanded here (fast.launch.TmaBoundLaunch):
    # Stats, Delta, DQ, DK and DV among the arguments after the descriptors, the rest kept as
    # one tuple per Stats row stride (the same object: the same values)
    bound = TmaBoundLaunch(_LAUNCH, grid, meta, fields, _unchecked, tensor_slots=(0, 2, 3, 4, 5),
                           typed=True)
    return fields, grid, (ints, scales, scale), meta, (bound, {})


_LAST = [None]  # launch's last unmasked launch (sdpa_fwd_gluon.recall)


@functools.cache
def _dq_layout():
    return gl.NVMMASharedLayout.get_default_for([64, 64], gl.float32)


def launch(dout, query, key, value, stats, delta, dq_sum, dk, dv, bwd_plan, mask=None):
    """Add dQ into ``dq_sum`` (fp32, zeroed by the caller) and fill dk and dv, all three
    contiguous as rank-5 [Z1, Z2, H, rows, D], from query, key, value and dout read as the
    plan's rank-5 shapes and strides; ``stats`` the forward's row statistics ([R, ...] float32,
    rows m and log2 l, in the units of the mask's kind), ``delta`` [Z1*Z2*HQ, L] float32 =
    rowsum(dO * O); ``mask`` None or one ``sdpa_fwd_gluon.takes_mask`` takes (rank 5, any
    strides)."""
    schedule = _SCHEDULE.value
    if mask is None:
        s_stat = stats.stride()[0]
        last = recall(_LAST, bwd_plan, query.dtype, schedule, s_stat)
        if last is None:
            # a 6-tuple plan: never a forward's key (4)
            prepared = prepared_plan((bwd_plan, query.dtype, schedule, query.device), _prepare,
                                     dout, query, key, value, dq_sum, bwd_plan, schedule)
            _, _, (ints, scales, scale), _, (bound, rests) = prepared
            rest = rests.get(s_stat) or rests.setdefault(s_stat,
                                                         (s_stat, *ints, scales[0], scale))
            last = remember(_LAST, bwd_plan, query.dtype, schedule, bound, s_stat, rest)
        last[4].fixed((query, key, value, dout, dq_sum), (stats, delta, dq_sum, dk, dv), last[6])
        return
    (fq, fk, fv, fd, fdq), grid, (ints, scales, scale), meta, _ = prepared_plan(
        (bwd_plan, query.dtype, schedule, query.device), _prepare, dout, query, key, value,
        dq_sum, bwd_plan, schedule)
    args = (_unchecked(fq, query), _unchecked(fk, key), _unchecked(fv, value),
            _unchecked(fd, dout), _unchecked(fdq, dq_sum), stats, stats.stride(0), delta, dq_sum,
            dk, dv)
    on_device_of(dk, _MASKED_LAUNCH, grid,
                 (*args, *mask_arguments(mask), *ints, scales[mask.dtype != torch.bool], scale),
                 meta)


if GLUON_AVAILABLE:
    _LAUNCH = DirectLauncher(sdpa_bwd_gluon_ws_kernel)
    _MASKED_LAUNCH = DirectLauncher(sdpa_bwd_gluon_ws_masked_kernel)
else:  # pragma: no cover - depends on the installed Triton
    _LAUNCH = _MASKED_LAUNCH = None
