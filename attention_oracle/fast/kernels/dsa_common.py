"""Small @triton.jit helpers shared by the DSA forward and backward kernels.

Conventions: a *slot block* is BLOCK_K consecutive slots of one query row; a slot is valid iff
it lies before the row's slot count (``topk_length`` clamped to [0, K]) and its index is in
[0, S). Invalid slots gather row 0 under a false mask, so they cost no memory traffic.

Score units: with fp32 inputs the kernels keep scores in natural units (dot * scale, rounded
once as the naive fp32 math does), take the raw row max, an accurate exponential and
lse = m + log(l) (docs/FINDINGS.md F6). With 16-bit inputs they keep base-2 units
(dot * fl(scale * log2e)) and tl.exp2: that extra rounding and ex2.approx's error are far below
the 16-bit rounding the rule allows. The switch is a compile-time test on the q pointer's
element type inside each kernel (``q_ptr.dtype.element_ty == tl.float32``).
"""
import triton
import triton.language as tl

from .accurate_math import exp_accurate, log_accurate  # noqa: F401  (re-exported)


@triton.jit
def row_slot_count(len_ptr, t, K, HAS_LEN: tl.constexpr, I32: tl.constexpr = False):
    """Number of leading slots of row t that may hold keys: min(max(topk_length[t], 0), K)
    (int32 with I32, so that the slot loop counts in 32 bits, else int64; the clamp comes
    first either way)."""
    if I32:
        n = (t * 0).to(tl.int32) + K
        if HAS_LEN:
            # clamped in the length's own dtype, then narrowed: an int64 length past int32
            # would wrap (2**32 + 3 to 3; docs/FINDINGS.md F30)
            n = tl.minimum(tl.maximum(tl.load(len_ptr + t), 0), n).to(tl.int32)
    else:
        n = K + t * 0
        if HAS_LEN:
            n = tl.minimum(tl.maximum(tl.load(len_ptr + t).to(tl.int64), 0), K)
    return n


@triton.jit
def slot_block(idx_ptr, row_offset, stride_k, offs_k, n_slots, S, I32: tl.constexpr = False):
    """Returns (valid [BLOCK_K] bool, rows [BLOCK_K] with 0 where invalid).

    rows are int64, or with I32 int32 (the host sets I32 only for int32 indices and key
    buffers whose element offsets stay below 2**31, fast.dsa._int32_rows): 64-bit compares
    and multiplies per gathered row cost two to four ALU instructions each."""
    in_range = offs_k < n_slots
    idx = tl.load(idx_ptr + row_offset + offs_k * stride_k, mask=in_range, other=-1)
    if not I32:
        idx = idx.to(tl.int64)
    valid = in_range & (idx >= 0) & (idx < S)
    return valid, tl.where(valid, idx, 0)


@triton.jit
def gather_rows(base_ptr, rows, stride_s, stride_d, offs_d, d_lim, valid,
                EVEN: tl.constexpr = False):
    """Gathers key rows: [BLOCK_K, BLOCK_D] tile of base[rows, offs_d], 0 outside.

    Column offsets in the rows' integer type: int64, or int32 where the host set I32 (its
    check counts the columns' offsets too); a channel-major view's column stride times a
    column passes 2**31 from 2**31 elements on (docs/FINDINGS.md F40).
    EVEN: every offs_d is below d_lim (the host's EVEN_D: the tiles divide the widths), so
    the mask is the slot validity alone (no compare and AND per column vector)."""
    ptrs = base_ptr + rows[:, None] * stride_s + offs_d[None, :].to(rows.dtype) * stride_d
    if EVEN:
        return tl.load(ptrs, mask=valid[:, None], other=0.0)
    return tl.load(ptrs, mask=valid[:, None] & (offs_d[None, :] < d_lim), other=0.0)


@triton.jit
def load_heads(base_ptr, row_offset, offs_h, stride_h, h_lim, offs_d, stride_d, d_lim):
    """Loads a [BLOCK_H, BLOCK_D] tile of one token's heads, 0 outside. Head and channel
    offsets in int64: a head-major view's head stride (T * D) times a head index passes 2**31
    from T * D * H of 2**31 on (docs/FINDINGS.md F35), a channel-major view's channel stride
    (T * H) times a channel likewise (F40)."""
    ptrs = (base_ptr + row_offset + offs_h[:, None].to(tl.int64) * stride_h
            + offs_d[None, :].to(tl.int64) * stride_d)
    return tl.load(ptrs, mask=(offs_h[:, None] < h_lim) & (offs_d[None, :] < d_lim), other=0.0)


# fp32 path: the reduction order of the dots (docs/FINDINGS.md F6, F17).
# Natively an fp32 tl.dot (input_precision="ieee") sums each element as ONE sequential FMA chain
# over the reduction dimension, and tl.dot(a, b, acc) extends that chain through acc across
# blocks (576 terms for a score, thousands of slots for out / dq). The fp32 kernels therefore
# take scores and dP from fp64-accumulated dots rounded once (products of fp32 values are exact
# in fp64), and add each slot block's P.V / dS.K product to the fp32 accumulator as its own dot;
# with ACC64 (fast.dsa.KernelConfig.acc64) those products are fp64 dots into fp64 accumulators
# instead (an fp64 chain's rounding is far below fp32's).
FP32_CHUNK = tl.constexpr(32)  # width of the fp64 operand pieces (shared memory: 2 x 64 x 32 x 8 B = 32 KB)


@triton.jit
def dot_gather_f64(acc, a_ptr, a_off, offs_h, stride_ah, stride_ad, H, b_ptr, rows, stride_bs,
                   stride_bd, valid, D, CHUNK: tl.constexpr):
    """acc (fp64 [BLOCK_H, BLOCK_K]) + a[heads, :D] . b[rows, :D]^T accumulated in fp64.

    a: one token's heads (load_heads), b: gathered key rows (gather_rows, 0 where invalid).
    A dynamic loop over CHUNK-wide pieces (an unrolled one lets Triton hoist fp64 copies of
    loop-invariant operands into shared memory, as found for fast SDPA)."""
    for d0 in range(0, D, CHUNK):
        offs_d = d0 + tl.arange(0, CHUNK)
        a = load_heads(a_ptr, a_off, offs_h, stride_ah, H, offs_d, stride_ad, D)
        b = gather_rows(b_ptr, rows, stride_bs, stride_bd, offs_d, D, valid)
        acc = tl.dot(a.to(tl.float64), tl.trans(b.to(tl.float64)), acc, input_precision="ieee",
                     out_dtype=tl.float64)
    return acc


@triton.jit
def add_block_dot(acc, alpha, a, b, PRECISION: tl.constexpr):
    """acc * alpha + a.b, with a.b summed as its own dot (its chain starts at 0).

    Written as ``acc * alpha + tl.dot(a, b)`` Triton's combine pass (addf(dot(a, b, 0), d) ->
    dot(a, b, d)) folds the sum into the dot natively, so an fp32 accumulator becomes ONE
    sequential FMA chain over every slot of the row (1536 duplicate slots of one key: relative
    error 1.5e-5; docs/FINDINGS.md F17). The interpreter does not fold.
    math.fma is not an addf, so the pattern does not match; the product acc * alpha + block is
    rounded once. tests/fast/test_fast_dsa_smoke.py::test_fp32_block_dots_not_folded checks the
    sm_90 TTIR."""
    return tl.fma(acc, alpha, tl.dot(a, b, input_precision=PRECISION))


# fp32 "bf16x6" path (fast.dsa.set_fp32_mode): each fp32 operand is split exactly into three
# bf16 parts, a = a0 + a1 + a2 (each part the round-to-nearest bf16 of what the previous ones
# left: 8 + 8 + 8 significant bits cover fp32's 24), and a.b is the sum of the six part products
# with i + j <= 2 on the bf16 tensor cores (each product exact in their fp32 accumulator; the
# three dropped ones, a1.b2 + a2.b1 + a2.b2, are below 2^-23 of |a.b| per term). The part
# products are summed smallest first, into a zero accumulator, and the callers add each
# piece's product to their sums in fp32 themselves: with the six part dots chained through a
# score's running sum (nine 64-wide pieces, 216 steps 16 deep) the H200 gave out 1.27e-05
# against the rule's 5.92e-06 at the production geometry (tests/fast/test_fast_dsa_smoke.py,
# test_production_geometry_fp32), and a CPU emulation that rounds the accumulator toward zero
# at every 16-deep step gives 1.32e-05 on that case, 3.96e-07 with a zero accumulator per
# piece. The interpreter computes bf16 dots
# wrongly, so on the CPU (BF16 false) the parts are kept as fp32 values and the six products
# are IEEE fp32 dots: the same split and products, summed by numpy.


@triton.jit
def _bf16_value(x):
    """x (fp32) rounded to the nearest bf16 (ties to even), as an fp32 value, by its bits.

    The interpreter's own fp32 <-> bf16 conversions get subnormal values wrong (2**-128 x 1.07
    came back as 0.24 of itself), which the split of tiny values meets (F45); the GPU's are
    exact, as is this."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _bf16_bits_as_fp32(x):
    """A bf16 tile's values as fp32, by their bits (exact, subnormals included)."""
    return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _parts_as(x0, x1, x2, BF16: tl.constexpr):
    """Three bf16 parts as they are with BF16, else as fp32 tiles of the same values (the
    interpreter's dots)."""
    if not BF16:
        x0 = _bf16_bits_as_fp32(x0)
        x1 = _bf16_bits_as_fp32(x1)
        x2 = _bf16_bits_as_fp32(x2)
    return x0, x1, x2


@triton.jit
def split3(x, BF16: tl.constexpr):
    """(x0, x1, x2) with x == x0 + x1 * 2**-8 + x2 * 2**-16 exactly, each a bf16 value (bf16
    tensors with BF16, else fp32 tensors holding bf16 values, rounded by their bits); x fp32.

    The lower parts are kept scaled up by 2**8 and 2**16 (exact powers of two, :func:`dot6`
    scales them back): unscaled, x2 falls below bf16's smallest normal from |x| < 2**-110
    on and loses its bits (docs/FINDINGS.md F45); scaled, the split is exact for every
    normal x."""
    if BF16:
        x0 = x.to(tl.bfloat16)
        r = x - x0.to(tl.float32)
        x1 = (r * 256.0).to(tl.bfloat16)
        x2 = ((r - x1.to(tl.float32) * 0.00390625) * 65536.0).to(tl.bfloat16)
    else:
        x0 = _bf16_value(x)
        r = x - x0
        x1 = _bf16_value(r * 256.0)
        x2 = _bf16_value((r - x1 * 0.00390625) * 65536.0)
    return x0, x1, x2


@triton.jit
def gather_parts(parts_ptr, part_stride, rows, stride_s, stride_d, offs_d, d_lim, valid,
                 EVEN: tl.constexpr, BF16: tl.constexpr):
    """The three split-bf16 parts of gathered key rows (:func:`gather_rows` of the host's
    [3, S, W] parts buffer, part p at p * part_stride elements): bf16 tiles with BF16, else the
    same values as fp32 tiles."""
    x0 = gather_rows(parts_ptr, rows, stride_s, stride_d, offs_d, d_lim, valid, EVEN)
    x1 = gather_rows(parts_ptr + part_stride, rows, stride_s, stride_d, offs_d, d_lim, valid, EVEN)
    x2 = gather_rows(parts_ptr + 2 * part_stride, rows, stride_s, stride_d, offs_d, d_lim, valid,
                     EVEN)
    return _parts_as(x0, x1, x2, BF16)


@triton.jit
def add_rope_part_scores(s, qr_ptr, qr_off, offs_h, stride_qrh, stride_qrd, H, DR, krp_ptr, part,
                         rows, stride_ps, valid, zero, BLOCK_DR: tl.constexpr,
                         BF16: tl.constexpr):
    """(s + q_rope . k_rope^T from their split-bf16 parts (:func:`dot6` from ``zero``, added in
    fp32), the query rope parts r0, r1, r2): one token's heads against the gathered rows of
    the key rope parts buffer (:func:`gather_parts`)."""
    offs_r = tl.arange(0, BLOCK_DR)
    qr = load_heads(qr_ptr, qr_off, offs_h, stride_qrh, H, offs_r, stride_qrd, DR)
    r0, r1, r2 = split3(qr, BF16)
    k0, k1, k2 = gather_parts(krp_ptr, part, rows, stride_ps, 1, offs_r, DR, valid, False, BF16)
    s += dot6(r0, r1, r2, tl.trans(k0), tl.trans(k1), tl.trans(k2), zero, BF16)
    return s, r0, r1, r2


@triton.jit
def dot6(a0, a1, a2, b0, b1, b2, zero, BF16: tl.constexpr):
    """a.b from the parts of :func:`split3` (the six products with i + j <= 2, the smallest
    first), from ``zero`` (an fp32 zero tile; the caller adds the result to its own sum).

    Horner in the parts' scales: the three products of scale 2**-16 (x2's, and x1 x x1),
    times 2**-8, plus the two of scale 2**-8, times 2**-8, plus a0.b0; the multiplies are
    exact (powers of two)."""
    if BF16:
        acc = tl.dot(a0, b2, zero)
        acc = tl.dot(a1, b1, acc)
        acc = tl.dot(a2, b0, acc)
        acc = tl.dot(a0, b1, acc * 0.00390625)
        acc = tl.dot(a1, b0, acc)
        acc = tl.dot(a0, b0, acc * 0.00390625)
    else:
        acc = tl.dot(a0, b2, zero, input_precision="ieee")
        acc = tl.dot(a1, b1, acc, input_precision="ieee")
        acc = tl.dot(a2, b0, acc, input_precision="ieee")
        acc = tl.dot(a0, b1, acc * 0.00390625, input_precision="ieee")
        acc = tl.dot(a1, b0, acc, input_precision="ieee")
        acc = tl.dot(a0, b0, acc * 0.00390625, input_precision="ieee")
    return acc


@triton.jit
def chain_break(x, keep):
    """x itself (``keep`` is true at run time), through a branch the compiler cannot fold.

    Triton picks a dot's warp layout from the dot's forward slice: a dot whose result reaches
    another dot ("chained", as S reaches P.V) gets every warp along M (warpsPerCTA
    [num_warps, 1]). With 64 heads and 8 warps that is 128 rows of warps for 64 rows, so both
    warpgroups compute the whole score tile. An scf.if ends the forward slice (its yield has no
    results), so a score dot whose result goes through this branch gets warpsPerCTA [4, 2]:
    each warpgroup computes half of the slot columns (docs/DESIGN.md "11. fast DSA (Triton)").
    The other branch computes (x * 0) inside the region, so canonicalisation cannot turn
    the branch into a select of two outside values."""
    if keep:
        y = x
    else:
        y = x * 0.0
    return y


@triton.jit
def chain_break2(x, y, keep):
    """(x, y) through one branch, as :func:`chain_break`."""
    if keep:
        a = x
        b = y
    else:
        a = x * 0.0
        b = y * 0.0
    return a, b
