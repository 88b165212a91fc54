"""Hopper (sm_90) dK/dV of the fp32 "tf32x3" SDPA backward in Gluon: wgmma products with the
key block's tf32 halves held in shared memory.

The same function as :func:`fast.kernels.sdpa_bwd.sdpa_bwd_dkdv_kernel` on its fp32 "tf32x3"
path, unmasked, without atomic dQ (the dQ kernel runs after it): with the forward's row
statistics m (log2 units) and log2 l and Delta = rowsum(dO * O) from the preprocess kernel,
P^T = exp2((s^T c - m) - log2 l) (c = scale * log2(e); m and log l apart, docs/FINDINGS.md
F11), dP^T = V dO^T, dS^T = P^T (dP^T - Delta); dV = sum P^T dO and dK = scale sum dS^T Q. Every
product is CUTLASS's 3xTF32 of :func:`fast.kernels.sdpa_common.split_tf32`'s halves (small.big,
then big.small, then big.big on a fresh accumulator), added to its fp32 accumulator in
registers (never chained into the tensor cores' sums: the rule of ``dot_split_acc``).

Why Gluon: Triton gives a product wgmma only where its result has 64 rows or more, and its
64-key tiles keep the halves as register operands and spill (docs/FINDINGS.md F88); its tuned
32 x 32 tiles run on mma.sync. Here one warpgroup owns a key block of BLOCK_N = 64 rows: the
halves of K and V are made once and stored in shared memory, where every S^T = K Q^T and
dP^T = V dO^T reads them as wgmma descriptors; each step's BLOCK_M = 16 query rows of Q and dO
are loaded (the next step's while this one's products run), split and stored twice, row-major
(the B operand of S^T and dP^T: K-dim D contiguous) and transposed (of dV and dK: K-dim the
queries contiguous), since tf32 wgmma reads only K-major operands. P^T and dS^T enter dV and dK
as register operands. dK and dV accumulate in two column halves each ([64, D / 2]), which keeps
a product's fresh accumulator at half the width.

Program (key block, kv head of one batch element); it walks every query head of the GQA group
and every query block that can see the key block (causal, top-left: from the block holding the
key block's first row). Keys past S and queries past L load as zeros; a query past L has
m = +inf (P = 0), a key past S is masked, and their rows are never stored. A head dim E up to
the tile D (64 or 128) reads its columns past E as zeros and stores none of them.

Gluon does not run under Triton's CPU interpreter: CI compiles it offline
(``gluon_probe sdpa_bwd_fp32_d128``); it is checked on the GPU by
``tests/fast/test_fast_sdpa_gluon.py``.
"""
import torch

from ..launch import DirectLauncher, is_sm90
from .gluon_common import GLUON_AVAILABLE

if GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from .gluon_common import opaque_zero, partition_barrier

HEAD_DIMS = (64, 128)  # the tiles D (a head dim E up to D runs on the smallest)
BLOCK_M = 16   # query rows a step (the shared memory: 192 KiB at D 128)
BLOCK_N = 64   # key rows a program (one wgmma M tile)
NUM_WARPS = 4  # one warpgroup


if GLUON_AVAILABLE:

    @gluon.jit
    def _split(x):
        """(big, small): CUTLASS's tf32 halves (``sdpa_common.split_tf32``)."""
        big = (x.to(gl.int32, bitcast=True) & -8192).to(gl.float32, bitcast=True)
        small = x - big
        small = ((small.to(gl.int32, bitcast=True) + 4096) & -8192).to(gl.float32,
                                                                         bitcast=True)
        return big, small

    @gluon.jit
    def _three(a_big, a_small, b_big, b_small, layout: gl.constexpr, M: gl.constexpr,
               N: gl.constexpr):
        """The 3xTF32 product a @ b on a fresh accumulator (issued, not waited for). fp32
        operands take the builder's default input precision, tf32 (Triton 3.6's
        ``warpgroup_mma`` fails on an explicit ``precision``: it lowers the constexpr)."""
        part = warpgroup_mma(a_small, b_big, gl.zeros([M, N], gl.float32, layout=layout),
                             use_acc=False, is_async=True)
        part = warpgroup_mma(a_big, b_small, part, is_async=True)
        return warpgroup_mma(a_big, b_big, part, is_async=True)

    @gluon.jit
    def _add_half(acc, a_big, a_small, t_smem, idx, col: gl.constexpr, layout: gl.constexpr,
                  M: gl.constexpr, N: gl.constexpr):
        """acc + a @ B[:, col:col + N] in fp32 registers, B the transposed pair of tiles
        ``t_smem[idx]`` (big), ``t_smem[idx + 1]`` (small) read K-major."""
        b_big = t_smem.index(idx).slice(col, N).permute((1, 0))
        b_small = t_smem.index(idx + 1).slice(col, N).permute((1, 0))
        part = _three(a_big, a_small, b_big, b_small, layout, M, N)
        part = warpgroup_mma_wait(0, deps=(part, ))
        return acc + part

    @gluon.jit
    def _head_offset(pid, H, Z2, s_z1, s_z2, s_h):
        """Element offset (int64) of head ``pid`` of the flattened [Z1, Z2, H] grid."""
        h = pid % H
        z = pid // H
        return ((z // Z2).to(gl.int64) * s_z1 + (z % Z2).to(gl.int64) * s_z2
                + h.to(gl.int64) * s_h)

    @gluon.jit
    def _load_rows(ptr, start, rows, cols, s_row, n_rows, E, FULL_E: gl.constexpr):
        """Rows [start, start + len(rows)) of a row-strided tile, zero past n_rows (and past
        E unless FULL_E). The offsets within the tile are int32 (the host keeps 16 row strides
        below 2**31: ``launch``), the tile's start an int64 scalar."""
        base = ptr + start.to(gl.int64) * s_row
        inb = (start + rows) < n_rows
        if not FULL_E:
            inb = inb & (cols < E)
        return gl.load(base + (rows * s_row + cols), mask=inb, other=0.0)

    @gluon.jit
    def sdpa_bwd_fp32_dkdv_kernel(Q, K, V, DO, Stats, Delta, DK, DV,
                                  s_qz1, s_qz2, s_qh, s_qm, s_kz1, s_kz2, s_kh, s_kn,
                                  s_vz1, s_vz2, s_vh, s_vn, s_dz1, s_dz2, s_dh, s_dm,
                                  s_gkz1, s_gkz2, s_gkh, s_gkn, s_gvz1, s_gvz2, s_gvh, s_gvn,
                                  Z2, HQ, GROUP, L, S, E, s_stat, qk_scale, scale,
                                  D: gl.constexpr, BLOCK_M: gl.constexpr,
                                  BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                                  FULL_E: gl.constexpr, num_warps: gl.constexpr):
        """Grid (cdiv(S, BLOCK_N), Z1 * Z2 * HKV). Q, K, V, dO, dK, dV rank-5 ([Z1, Z2, H, rows,
        E]) by their strides, unit channel stride; Stats rows m, log2 l at row stride
        ``s_stat``; Delta [Z1 * Z2 * HQ, L] contiguous. FULL_E: E == D (no column masks)."""
        pid_n = gl.program_id(0)
        pid_bkv = gl.program_id(1)
        HKV = HQ // GROUP
        start_n = pid_n * BLOCK_N
        HALF: gl.constexpr = D // 2
        ld: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [num_warps, 1], [1, 0])
        s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_M, 8])
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HALF, 8])
        op_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=1)
        kv_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], gl.float32)
        q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], gl.float32)
        t_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([D, BLOCK_M], gl.float32)
        # [K big, K small, V big, V small]; a step's [Q big, Q small, dO big, dO small], rows
        # and transposed
        kv_smem = gl.allocate_shared_memory(gl.float32, [4, BLOCK_N, D], kv_sl)
        r_smem = gl.allocate_shared_memory(gl.float32, [4, BLOCK_M, D], q_sl)
        t_smem = gl.allocate_shared_memory(gl.float32, [4, D, BLOCK_M], t_sl)

        cols = gl.arange(0, D, layout=gl.SliceLayout(0, ld))[None, :]
        rows16 = gl.arange(0, 16, layout=gl.SliceLayout(1, ld))[:, None]
        k_base = K + _head_offset(pid_bkv, HKV, Z2, s_kz1, s_kz2, s_kh)
        v_base = V + _head_offset(pid_bkv, HKV, Z2, s_vz1, s_vz2, s_vh)
        for r in gl.static_range(0, BLOCK_N, 16):  # 16 rows at a time: the prologue's registers
            kb, ks = _split(_load_rows(k_base, start_n + r, rows16, cols, s_kn, S, E, FULL_E))
            kv_smem.index(0).slice(r, 16).store(kb)
            kv_smem.index(1).slice(r, 16).store(ks)
            vb, vs = _split(_load_rows(v_base, start_n + r, rows16, cols, s_vn, S, E, FULL_E))
            kv_smem.index(2).slice(r, 16).store(vb)
            kv_smem.index(3).slice(r, 16).store(vs)

        keys_l: gl.constexpr = gl.SliceLayout(1, s_l)
        queries_l: gl.constexpr = gl.SliceLayout(0, s_l)
        offs_key = start_n + gl.arange(0, BLOCK_N, layout=keys_l)
        tile_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ld))[:, None]
        dk0 = gl.zeros([BLOCK_N, HALF], gl.float32, layout=acc_l)
        dk1 = gl.zeros([BLOCK_N, HALF], gl.float32, layout=acc_l)
        dv0 = gl.zeros([BLOCK_N, HALF], gl.float32, layout=acc_l)
        dv1 = gl.zeros([BLOCK_N, HALF], gl.float32, layout=acc_l)
        lo = 0
        if CAUSAL:
            lo = (start_n // BLOCK_M) * BLOCK_M
        for g in range(GROUP):
            pid_bh = (pid_bkv // HKV) * HQ + (pid_bkv % HKV) * GROUP + g
            q_base = Q + _head_offset(pid_bh, HQ, Z2, s_qz1, s_qz2, s_qh)
            do_base = DO + _head_offset(pid_bh, HQ, Z2, s_dz1, s_dz2, s_dh)
            stats_row = Stats + pid_bh.to(gl.int64) * L
            delta_row = Delta + pid_bh.to(gl.int64) * L
            q = _load_rows(q_base, lo, tile_rows, cols, s_qm, L, E, FULL_E)
            do = _load_rows(do_base, lo, tile_rows, cols, s_dm, L, E, FULL_E)
            for start_m in range(lo, L, BLOCK_M):
                qb, qs = _split(q)
                dob, dos = _split(do)
                partition_barrier()  # the last step's products have read the tiles
                r_smem.index(0).store(qb)
                r_smem.index(1).store(qs)
                r_smem.index(2).store(dob)
                r_smem.index(3).store(dos)
                t_smem.index(0).store(gl.permute(qb, (1, 0)))
                t_smem.index(1).store(gl.permute(qs, (1, 0)))
                t_smem.index(2).store(gl.permute(dob, (1, 0)))
                t_smem.index(3).store(gl.permute(dos, (1, 0)))
                fence_async_shared()
                partition_barrier()
                # the next step's rows load while this one's products run
                q = _load_rows(q_base, start_m + BLOCK_M, tile_rows, cols, s_qm, L, E, FULL_E)
                do = _load_rows(do_base, start_m + BLOCK_M, tile_rows, cols, s_dm, L, E, FULL_E)
                # indices through an opaque zero: the wgmma descriptors are made where used,
                # not hoisted out of the loop into registers (gluon_common.opaque_zero)
                zero = opaque_zero(start_m)
                s = _three(kv_smem.index(0 + zero), kv_smem.index(1 + zero),
                           r_smem.index(0 + zero).permute((1, 0)),
                           r_smem.index(1 + zero).permute((1, 0)), s_l, BLOCK_N, BLOCK_M)
                dp = _three(kv_smem.index(2 + zero), kv_smem.index(3 + zero),
                            r_smem.index(2 + zero).permute((1, 0)),
                            r_smem.index(3 + zero).permute((1, 0)), s_l, BLOCK_N, BLOCK_M)
                offs_q = start_m + gl.arange(0, BLOCK_M, layout=queries_l)
                in_l = offs_q < L
                m = gl.load(stats_row + offs_q, mask=in_l, other=float("inf"))
                log_l = gl.load(stats_row + s_stat + offs_q, mask=in_l, other=0.0)
                delta = gl.load(delta_row + offs_q, mask=in_l, other=0.0)
                s, dp = warpgroup_mma_wait(0, deps=(s, dp))
                p = gl.exp2((s * qk_scale - m[None, :]) - log_l[None, :])
                keep = offs_key[:, None] < S
                if CAUSAL:
                    keep = keep & (offs_key[:, None] <= offs_q[None, :])
                p = gl.where(keep, p, 0.0)
                ds = p * (dp - delta[None, :])
                pb, ps = _split(p)
                pb = gl.convert_layout(pb, op_l)
                ps = gl.convert_layout(ps, op_l)
                dv0 = _add_half(dv0, pb, ps, t_smem, 2 + zero, 0, acc_l, BLOCK_N, HALF)
                dv1 = _add_half(dv1, pb, ps, t_smem, 2 + zero, HALF, acc_l, BLOCK_N, HALF)
                dsb, dss = _split(ds)
                dsb = gl.convert_layout(dsb, op_l)
                dss = gl.convert_layout(dss, op_l)
                dk0 = _add_half(dk0, dsb, dss, t_smem, 0 + zero, 0, acc_l, BLOCK_N, HALF)
                dk1 = _add_half(dk1, dsb, dss, t_smem, 0 + zero, HALF, acc_l, BLOCK_N, HALF)

        out_rows = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l))[:, None]
        out_cols = gl.arange(0, HALF, layout=gl.SliceLayout(0, acc_l))[None, :]
        gk = DK + _head_offset(pid_bkv, HKV, Z2, s_gkz1, s_gkz2, s_gkh) + out_rows * s_gkn
        gv = DV + _head_offset(pid_bkv, HKV, Z2, s_gvz1, s_gvz2, s_gvh) + out_rows * s_gvn
        keep0 = (out_rows < S) & (out_cols < E)
        keep1 = (out_rows < S) & (HALF + out_cols < E)
        gl.store(gk + out_cols, dk0 * scale, mask=keep0)
        gl.store(gk + HALF + out_cols, dk1 * scale, mask=keep1)
        gl.store(gv + out_cols, dv0, mask=keep0)
        gl.store(gv + HALF + out_cols, dv1, mask=keep1)


def tile_of(head_dim):
    """The smallest tile D of HEAD_DIMS holding ``head_dim``, or None."""
    return next((d for d in HEAD_DIMS if head_dim <= d), None)


def applies(q, k, v, dout):
    """Whether the kernel takes these rank-5 operands ([Z1, Z2, H, rows, E]): Gluon, an sm_90
    device, fp32 q, k, v and dout with one head dim (q, k and v alike) of at most 128, and
    :func:`strides_apply` to each. The caller checks the rest: fp32 "tf32x3" mode, no mask, dQ
    by the dQ kernel."""
    E = q.shape[4]
    return (GLUON_AVAILABLE and q.device.type == "cuda" and is_sm90(q.device)
            and tile_of(E) is not None and k.shape[4] == E and v.shape[4] == E
            and all(t.dtype == torch.float32 and strides_apply(t.stride())
                    for t in (q, k, v, dout)))


def strides_apply(strides):
    """Whether rank-5 ``strides`` suit the kernel: unit channel stride, and 16 row strides
    within int32 (its offsets within a tile)."""
    return strides[4] == 1 and 16 * abs(strides[3]) < 2**31


def launch(q, k, v, dout, stats, delta, dk, dv, shapes, strides, is_causal, scale, qk_scale):
    """Fill dk and dv where :func:`applies`, from the forward's statistics ``stats`` ([R, Z1 *
    Z2 * HQ * L], rows m and log2 l) and ``delta`` ([Z1 * Z2 * HQ, L]). The tensors are read
    as rank 5: ``shapes`` (q's, k's) and ``strides`` (q's, k's, v's, dout's, dk's, dv's), so a
    caller may pass views of the same data in another rank; ``qk_scale`` is the scale in log2
    units."""
    (Z1, Z2, HQ, L, E), (_, _, HKV, S, _) = shapes
    D = tile_of(E)
    grid = (-(-S // BLOCK_N), Z1 * Z2 * HKV)
    args = (q, k, v, dout, stats, delta, dk, dv, *(x for st in strides for x in st[:4]),
            Z2, HQ, HQ // HKV, L, S, E, stats.stride(0), qk_scale, scale)
    _LAUNCH(grid, args, dict(D=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=is_causal,
                             FULL_E=E == D, num_warps=NUM_WARPS))


if GLUON_AVAILABLE:
    _LAUNCH = DirectLauncher(sdpa_bwd_fp32_dkdv_kernel)
