"""Helpers of every Gluon kernel here.

``partition_barrier()``: every warp of the calling partition has reached this point (a named
barrier over the partition's warps inside ``gl.warp_specialize``; ``gl.thread_barrier`` in 3.6,
renamed ``gl.barrier`` in 3.8, where the old name is gone and a kernel calling it fails to
compile). Triton spells it differently between the releases the project runs on: 3.6 (the
H200 machines) and 3.8 (CI's pins, constraints.txt).

``opaque_zero(i)``: 0, which the compiler cannot see through, for shared-memory indices in
loops (below).

``mask_kind(ty)``: what an SDPA kernel's mask pointer of element type ``ty`` carries, as a
constexpr: NO_MASK (an fp32 stand-in), BOOL_MASK (a boolean mask read as uint8) or ADD_MASK
(an additive mask of the 16-bit inputs' dtype). The kind travels as the pointer's type
because worker partitions take no constexpr arguments.

``causal_program(rows, row_bytes, group, SECTION, HEAVY_LAST)``: (block, head) of this program
of a causal launch on the grid (blocks, heads): the order of ``sdpa_common.causal_program``,
the Triton kernels' (Gluon calls no ``tl`` function), which tells it in full.

``tma_add(desc, coord, value)``: the block of ``desc`` at ``coord`` in global memory += value
(a register tensor of the block's shape, leading unit dims dropped), as one TMA reduction
(``cp.reduce.async.bulk.tensor``): Triton's descriptor reduce (what ``tl``'s
``desc.atomic_add`` builds), which its TMA lowering turns into a shared-memory tile, the bulk
reduction and a wait until the tile has been read. Elements outside the descriptor's shape are
left alone. Triton 3.6's Gluon has no wrapper of its own for it.

``tma_add_shared(desc, coord, tile)``: the same reduction from a shared-memory tile of the
block's shape and the descriptor's layout, with no wait: the tile may be written again after
``tma.store_wait`` (by the issuing threads) and a barrier (for the others). The caller stores
the tile and fences it (``fence_async_shared``) and a barrier first. Triton's Gluon builder op
(``create_async_tma_reduce``), which 3.6 has with no Python wrapper and 3.8 wraps as
``tma.async_atomic_add``.
"""
try:  # Gluon is experimental: a Triton without it leaves the Gluon paths off
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    GLUON_AVAILABLE = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    GLUON_AVAILABLE = False

if GLUON_AVAILABLE and hasattr(gl, "thread_barrier"):

    @gluon.jit
    def partition_barrier():
        gl.thread_barrier()

elif GLUON_AVAILABLE:

    @gluon.jit
    def partition_barrier():
        gl.barrier()


if GLUON_AVAILABLE:

    @gluon.jit
    def opaque_zero(i):
        """0, which the compiler cannot see through. Buffer indices offset by it make the wgmma
        descriptors of the shared-memory operands loop-variant: computed where they are used
        (uniform-register adds) instead of dozens of 64-bit descriptors hoisted out of a
        consumer loop, which a worker partition's registers cannot hold beside its
        accumulators (the DSA forward's worker spilled 292 bytes of them at 224 registers,
        reloaded before every wgmma; docs/FINDINGS.md F31)."""
        return gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r,r", [i], dtype=gl.int32,
                                         is_pure=False, pack=1)


if GLUON_AVAILABLE:

    @gluon.jit
    def causal_program(rows, row_bytes, group, SECTION: gl.constexpr, HEAVY_LAST: gl.constexpr):
        blk = gl.program_id(0)
        head = gl.program_id(1)
        n_blk = gl.num_programs(0)
        if SECTION > 0:
            n_head = gl.num_programs(1)
            shared = gl.maximum(SECTION // row_bytes // rows + blk * 0, 1)
            per = n_head.to(gl.int64)
            if shared < gl.cdiv(n_head, group):  # then group * shared < n_head + group
                per = (shared * group).to(gl.int64)
            lin = head.to(gl.int64) * n_blk + blk
            first = lin // (per * n_blk) * per
            here = gl.minimum(per, n_head - first)
            r = lin - first * n_blk
            blk = (r // here).to(gl.int32)
            head = (first + r % here).to(gl.int32)
        if HEAVY_LAST:
            blk = n_blk - 1 - blk
        return blk, head


if GLUON_AVAILABLE:
    NO_MASK, BOOL_MASK, ADD_MASK = gl.constexpr(0), gl.constexpr(1), gl.constexpr(2)

    @gluon.constexpr_function
    def mask_kind(ty):
        if ty == gl.uint8:
            return BOOL_MASK
        if ty == gl.float16 or ty == gl.bfloat16:
            return ADD_MASK
        return NO_MASK


try:  # Triton internals (3.6 and 3.8 have them): a Triton without them compiles no tma_add
    from triton._C.libtriton import ir
    from triton.experimental.gluon.language._core import builtin
except ImportError:  # pragma: no cover - depends on the installed Triton
    builtin = None

if GLUON_AVAILABLE and builtin is not None:

    @builtin
    def tma_add(desc, coord, value, _semantic=None):
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_descriptor_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle,
                                                   value.handle, coord)
    @builtin
    def tma_add_shared(desc, coord, tile, _semantic=None):
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle,
                                                  coord, tile.handle)
else:  # pragma: no cover - depends on the installed Triton
    # the kernels naming them fail to compile; fast falls back (BuildGuard)
    tma_add = tma_add_shared = None
