"""Triton kernel behind ``fast.dsa``'s slot order: each row's valid slots sorted by key from a
pivot key that depends on the token's place among the programs resident at once.

The DSA kernels gather a row's key rows in slot order, one program a token, about one program
an SM resident at once. Rows in a top-k's order (random over the document) make the resident
programs gather from the whole document at once; where its rows exceed the L2 (packed_glm_a:
documents of 57-68k keys, 65-78 MB of rows) half the gathers and key-gradient atomics went
to DRAM (docs/FINDINGS.md F96). Sorted, every row walks its document from the first key to the
last; started at the fraction ``(t mod C) / C`` of its key range (``C`` the resident
programs) and wrapped around, the programs that start one after another walk the same stretch
of keys together, so the L2 holds what they share.

Per row t of ``rows [T, K]`` (int32 or int64, any strides): slot s is valid iff
``s < lengths[t]`` (with HAS_LEN) and ``0 <= rows[t, s] < S``, the kernels' rule. With ``lo``,
``hi`` the row's least and greatest valid key and ``pivot = lo + (hi - lo + 1) * (t mod C) // C``,
FORM 0 and 1 write ``out [T, K]`` int32 contiguous: the ``n`` valid keys, those ``>= pivot``
ascending and then those ``< pivot`` ascending, then -1; ``out_len [T]`` int32 = n. The same
multiset of valid keys a row (duplicates kept), so every sum the kernels form is the same sum
in another order. ``S <= 2**30``: keys are sorted as ``(key - pivot) mod 2**30``.

The sort is a bitonic network of its own rather than ``tl.sort``: the row is held with each
thread's keys on the low bits of the index (a transposed load), so 51 of a 2048-key sort's 66
rounds exchange registers, not lanes; a descending run is sorted as an ascending run of
complemented keys, so every round is a min and a max with no select on the direction (9.3k
instructions a row against ``tl.sort``'s 16.1k at one warp; 0.74-0.78 ms on 16k x 2048 slots
on an H100 against 0.86 and, at four warps, 2.2, and 0.58-0.60 with its warp reductions
reordered; docs/PERFORMANCE.md). Unrolled, that is 150 KB of straight-line code a row; FORM 1
("loop", fast's default) runs the stages past a thread's registers in a loop (5.0k
instructions, about 10.7k executed a row against the network's 9.4k): fetching the network's instructions was its limit, and the loop takes
0.41-0.43 ms against 0.58-0.60 on an H100.

FORM 2 ("runs") does not sort the row. Sample l holds the slots l, l + L, l + 2L, ... (the
lanes of the transposed load, L = BLOCK_K / 64 of them, 64 keys each). Each sample is sorted
from the pivot in its thread's registers, with no exchange between lanes, and the samples are
written rank by rank: position r * L + l, -1 where sample l has no r-th valid key. Top-k rows
are random over the document, so each sample's r-th key lies near the quantile r / 64 of the
row's range. The row then walks its keys from the pivot about as the sorted row does: a model
of the L2 gives the same hit rate (benchmarks/dsa_l2_model.py). It takes 3.8k instructions a
row, 0.27-0.28 ms on an H100, but the DSA backward gains less on it than on sorted rows
(docs/FINDINGS.md F97). A compacted row (its valid slots first) stays compacted with the
same length. Another row keeps its holes inside its length, which is the end of its last
valid key.
"""
import triton
import triton.language as tl

_SENTINEL = tl.constexpr(2147483647)  # sorts after every valid key
_WRAP = tl.constexpr(1 << 30)  # keys are sorted as (key - pivot) mod _WRAP; S <= _WRAP


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _bit(N: tl.constexpr, j: tl.constexpr):
    """Bit j of the flat index, as a [2] * N hypercube's broadcastable 0/1 (axis N-1-j)."""
    return tl.reshape(tl.arange(0, 2), [1] * (N - j - 1) + [2] + [1] * j)


@triton.jit
def _min_max_round(x, N: tl.constexpr, j: tl.constexpr):
    """One ascending compare-exchange round on bit j: each pair's low element keeps the min."""
    partner = x ^ tl.reduce(x, N - 1 - j, _xor, keep_dims=True)
    return tl.where(_bit(N, j) == 1, tl.maximum(x, partner), tl.minimum(x, partner))


@triton.jit
def _sort_stages(x, N: tl.constexpr, STAGES: tl.constexpr, ALTERNATE: tl.constexpr):
    """Stages 1..STAGES of the network on an int32 [2] * N hypercube, so every run of
    2**STAGES is sorted along the flat index (STAGES = N: all of it, ascending). Stage s sorts
    runs of 2**s, descending where index bit s is set: those runs' keys complemented (~x
    reverses the order) and sorted ascending, then complemented back. ALTERNATE: the last
    stage too (its runs alternate, ready for the next stage's merge), else it sorts every run
    ascending."""
    for s in tl.static_range(1, STAGES + 1):
        if s < N and (s < STAGES or ALTERNATE):
            flip = -_bit(N, s)  # all ones where bit s is set
            x = x ^ flip
        for r in tl.static_range(s):
            x = _min_max_round(x, N, s - 1 - r)
        if s < N and (s < STAGES or ALTERNATE):
            x = x ^ flip
    return x


@triton.jit
def _lane_stages(x, LANES: tl.constexpr, R: tl.constexpr, N: tl.constexpr, LOG_R: tl.constexpr):
    """Stages LOG_R+1..N of the network on x [LANES, R] (flat index lane * R + register; each
    run of 2**LOG_R sorted by the stages before) in a loop, so the code stays small: each
    stage's rounds on lane bits exchange x with a gather along the lane axis (warp shuffles
    at one warp), its rounds on register bits are unrolled."""
    lane = tl.arange(0, LANES)[:, None]
    for s in range(LOG_R + 1, N + 1):
        flip = -((lane >> (s - LOG_R)) & 1)  # 0 at the last stage
        x = x ^ flip
        for d in range(s - LOG_R):
            b = s - LOG_R - 1 - d  # this round's lane bit
            partner = tl.gather(x, tl.broadcast_to(lane ^ (1 << b), [LANES, R]), 0)
            x = tl.where(((lane >> b) & 1) == 1, tl.maximum(x, partner), tl.minimum(x, partner))
        cube = tl.reshape(x, [2] * N)
        for r in tl.static_range(LOG_R):
            cube = _min_max_round(cube, N, LOG_R - 1 - r)
        x = tl.reshape(cube, [LANES, R]) ^ flip
    return x


@triton.jit
def _store_runs(out_row, x, K, LANES: tl.constexpr, R: tl.constexpr):
    """Stores x [LANES, R] (each lane's keys ascending, invalid ones last as _SENTINEL, valid
    ones absolute) rank-major: position r * LANES + lane, -1 where a lane has no r-th key.
    Returns the end of the last valid key. A lane holds the row's slots lane + i * LANES, so
    where the valid slots were the row's first n (a compacted row), its valid keys are its
    ranks r with r * LANES + lane < n: the first n positions, and the end is n."""
    y = tl.trans(x)  # [R, LANES]
    p = tl.arange(0, R)[:, None] * LANES + tl.arange(0, LANES)[None, :]
    ok = y != _SENTINEL
    tl.store(out_row + p, tl.where(ok, y, -1), mask=p < K)
    return tl.max(tl.max(tl.where(ok, p + 1, 0), axis=0), axis=0)


@triton.jit(do_not_specialize=["stride_rk"])
def slot_order_kernel(rows_ptr, len_ptr, out_ptr, out_len_ptr, K, S, stride_rt, stride_rk, C,
                      HAS_LEN: tl.constexpr, BLOCK_K: tl.constexpr, LANES: tl.constexpr,
                      LOG_K: tl.constexpr, FORM: tl.constexpr):
    """One row a program, ``BLOCK_K = 2**LOG_K >= K`` keys: X[i, j] = row[i * LANES + j],
    lanes along j (coalesced loads; stride_rk is not specialised, so the load keeps one key a
    lane), held as trans(X) [LANES, R] whose flat index's low bits (R's) are each thread's
    registers. FORM 0: the whole network unrolled; 1: the stages past the registers in a loop
    (:func:`_lane_stages`); both sort the row, its n valid keys first, out_len n. 2: each
    lane's R keys sorted, stored rank-major (:func:`_store_runs`), out_len the end of the last
    valid key."""
    R: tl.constexpr = BLOCK_K // LANES
    LOG_R: tl.constexpr = LOG_K - (LANES.bit_length() - 1)
    t = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, R)[:, None]
    j = tl.arange(0, LANES)[None, :]
    offs = i * LANES + j
    in_row = offs < K
    if HAS_LEN:
        in_row = in_row & (offs < tl.load(len_ptr + t))
    key = tl.load(rows_ptr + t * stride_rt + offs * stride_rk, mask=in_row, other=-1)
    valid = in_row & (key >= 0) & (key < S)
    key = key.to(tl.int32)
    # each thread's registers (axis 0) first: one lane reduction each, not one a register
    n = tl.sum(tl.sum(valid.to(tl.int32), axis=0), axis=0)
    lo = tl.min(tl.min(tl.where(valid, key, _SENTINEL), axis=0), axis=0)
    hi = tl.max(tl.max(tl.where(valid, key, -1), axis=0), axis=0)
    pivot = (lo + (hi - lo + 1).to(tl.int64) * (t % C) // C).to(tl.int32)
    rel = tl.where(key >= pivot, key - pivot, key - pivot + _WRAP)
    rel = tl.where(valid, rel, _SENTINEL)
    cube = tl.reshape(tl.trans(rel), [2] * LOG_K)
    if FORM == 2:
        x = tl.reshape(_sort_stages(cube, LOG_K, LOG_R, False), [LANES, R])
        x = tl.where(x != _SENTINEL, (x + pivot) & (_WRAP - 1), _SENTINEL)
        n = _store_runs(out_ptr + t * K, x, K, LANES, R)
    else:
        if FORM == 1:
            x = _lane_stages(tl.reshape(_sort_stages(cube, LOG_K, LOG_R, True), [LANES, R]),
                             LANES, R, LOG_K, LOG_R)
        else:
            x = _sort_stages(cube, LOG_K, LOG_K, True)
        ordered = tl.reshape(x, [BLOCK_K])
        k = tl.arange(0, BLOCK_K)
        keys = (ordered + pivot) & (_WRAP - 1)
        tl.store(out_ptr + t * K + k, tl.where(k < n, keys, -1), mask=k < K)
    tl.store(out_len_ptr + t, n)
