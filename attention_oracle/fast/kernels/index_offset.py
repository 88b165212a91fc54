"""Triton kernel behind :func:`fast.index.offset_gather_kv_indices` (docs/CONTRACT.md "4. Varlen index preparation").

Each program takes a run of consecutive query rows (``rows_per_prog``; the launcher sizes the
grid to the multiprocessors). Per row it finds the document by binary search over
``cu_seqlens_q``, turns local indices into global
rows, applies the ``topk_length`` cut, the key-range and causal cuts, and either keeps slot
positions or compacts the valid rows to the front in their original order (a stable
partition). It also writes the row's length. Everything happens in this one launch.

Rows of at most one block (K <= BLOCK_K) go through a software-pipelined loop, so row loads
are in flight while earlier rows are cut and stored; a compacted row whose valid slots already lead (top-k
rows padded with -1 at the end) is stored in place, with no prefix sum and no scatter, which
is the partition's result for such a row. Longer rows go block by block (:func:`_offset_row`).

Program 0 also checks the metadata (docs/CONTRACT.md "4. Varlen index preparation"). With
``ASSERT`` (CUDA; compiled with ``debug=True``) a failure is a device-side assertion of this
launch, with no host sync and no second launch; otherwise it writes ``flags [2]`` int32:
``flags[0]`` = 1 if it is valid, ``flags[1]`` the bits of :data:`BAD_BITS` that failed, which
the launcher turns into a ValueError (the CPU interpreter). Reads never leave the tensors
whatever the metadata: the document stays in [0, n_docs - 1].
"""
import triton
import triton.language as tl

from .pdl import gdc_launch_dependents

# bit -> (argument, condition), for the launcher's error message
BAD_BITS = {
    1: ("cu_seqlens_q", "must start at 0"),
    2: ("cu_seqlens_q", "must be non-decreasing"),
    4: ("cu_seqlens_q", "must end at T, the rows of gather_kv_indices"),
    8: ("cu_seqlens_k", "must start at 0"),
    16: ("cu_seqlens_k", "must be non-decreasing"),
    32: ("cu_seqlens_k", "must end within the key rows (kv's rows; int32 for the global rows)"),
}
CHECK_BLOCK = 1024
# the device assertion's message (the launcher's CPU path names each failed condition instead)
ASSERT_MSG = tl.constexpr(
    "offset_gather_kv_indices: bad varlen metadata (cu_seqlens_q must start at 0, end at T and "
    "not decrease; cu_seqlens_k must start at 0, not decrease and end within the key rows)")


@triton.jit
def _decreasing(cu_ptr, offs, n_docs):
    """1 if some cu[i] < cu[i - 1] for i in offs (1 <= i <= n_docs), else 0."""
    inside = (offs >= 1) & (offs <= n_docs)
    cur = tl.load(cu_ptr + offs, mask=inside, other=0).to(tl.int64)
    prev = tl.load(cu_ptr + offs - 1, mask=inside, other=0).to(tl.int64)
    return tl.max((inside & (cur < prev)).to(tl.int32), axis=0)


@triton.jit
def _metadata_bits(cu_q_ptr, cu_k_ptr, n_docs, T, key_rows, CHECK_BLOCK: tl.constexpr):
    """The BAD_BITS of cu_seqlens_q / cu_seqlens_k (one program scans both arrays)."""
    dec_q = n_docs * 0
    dec_k = n_docs * 0
    for start in range(0, n_docs + 1, CHECK_BLOCK):
        offs = start + tl.arange(0, CHECK_BLOCK)
        dec_q = tl.maximum(dec_q, _decreasing(cu_q_ptr, offs, n_docs))
        dec_k = tl.maximum(dec_k, _decreasing(cu_k_ptr, offs, n_docs))
    q_first = tl.load(cu_q_ptr).to(tl.int64)
    q_last = tl.load(cu_q_ptr + n_docs).to(tl.int64)
    k_first = tl.load(cu_k_ptr).to(tl.int64)
    k_last = tl.load(cu_k_ptr + n_docs).to(tl.int64)
    bits = tl.where(q_first != 0, 1, 0) + 2 * dec_q + tl.where(q_last != T, 4, 0)
    bits += tl.where(k_first != 0, 8, 0) + 16 * dec_k + tl.where(k_last > key_rows, 32, 0)
    return bits


@triton.jit
def _find_document(cu_q_ptr, t, n_docs, SEARCH_STEPS: tl.constexpr):
    """Largest d in [0, n_docs - 1] with cu_seqlens_q[d] <= t (empty documents skipped)."""
    lo = t * 0
    hi = n_docs - 1 + lo
    for _ in tl.static_range(SEARCH_STEPS):
        mid = (lo + hi + 1) // 2
        start = tl.load(cu_q_ptr + mid).to(tl.int64)
        go_up = start <= t
        lo = tl.where(go_up, mid, lo)
        hi = tl.where(go_up, hi, mid - 1)
    return lo


@triton.jit
def _row_document(idx_ptr, cu_q_ptr, cu_k_ptr, t, n_docs, SEARCH_STEPS: tl.constexpr):
    """Row t's document: (its query end, its key count, the row's key position, its first key
    row). The last three are int32 for int32 indices (the row's vector arithmetic in int32:
    valid metadata bounds them by the int32 key rows, and bad metadata fails the call)."""
    doc = _find_document(cu_q_ptr, t, n_docs, SEARCH_STEPS)
    q_start = tl.load(cu_q_ptr + doc).to(tl.int64)
    q_end = tl.load(cu_q_ptr + doc + 1).to(tl.int64)
    k_start = tl.load(cu_k_ptr + doc).to(tl.int64)
    k_end = tl.load(cu_k_ptr + doc + 1).to(tl.int64)
    seqlen_k = k_end - k_start
    pos = (seqlen_k - (q_end - q_start)) + (t - q_start)
    if idx_ptr.dtype.element_ty != tl.int64:
        seqlen_k = seqlen_k.to(tl.int32)
        pos = pos.to(tl.int32)
        k_start = k_start.to(tl.int32)
    return q_end, seqlen_k, pos, k_start


@triton.jit
def _valid_global_rows(idx_ptr, row_offset, stride_k, offs, K, limit, seqlen_k, pos, key_start,
                       CAUSAL: tl.constexpr):
    """Loads one block of a row; returns (valid flags, global rows). int32 indices stay int32
    (``seqlen_k``, ``pos``, ``key_start`` come as int32 then: valid metadata bounds them by the
    int32 key rows, and bad metadata fails the call); int64 indices compare in int64."""
    in_row = offs < K
    local = tl.load(idx_ptr + row_offset + offs * stride_k, mask=in_row, other=-1)
    valid = in_row & (offs < limit) & (local >= 0) & (local < seqlen_k)
    if CAUSAL:
        valid = valid & (local <= pos)
    return valid, local + key_start


@triton.jit
def offset_gather_kernel(
    idx_ptr, cu_q_ptr, cu_k_ptr, topk_len_ptr, out_ptr, len_out_ptr, flags_ptr,
    T, n_rows, K, n_docs, key_rows, rows_per_prog,
    stride_it, stride_ik, stride_ot, stride_ok,
    CAUSAL: tl.constexpr, COMPACT: tl.constexpr, HAS_TOPK_LEN: tl.constexpr,
    SEARCH_STEPS: tl.constexpr, BLOCK_K: tl.constexpr, SINGLE_BLOCK: tl.constexpr,
    CHECK_BLOCK: tl.constexpr, PDL: tl.constexpr = False, ASSERT: tl.constexpr = False,
    NUM_STAGES: tl.constexpr = 3,
):
    """Program p: rows [p * rows_per_prog, (p + 1) * rows_per_prog) of the n_rows (row p when
    rows take several blocks)."""
    p = tl.program_id(0).to(tl.int64)
    if PDL:  # a dependent launched with PDL may start; it waits for this grid to finish
        gdc_launch_dependents()
    if p == 0:
        bits = _metadata_bits(cu_q_ptr, cu_k_ptr, n_docs, T, key_rows, CHECK_BLOCK)
        if ASSERT:  # fails the launch on the device (compiled with debug=True)
            tl.device_assert(bits == 0, ASSERT_MSG)
        else:
            tl.store(flags_ptr, (bits == 0).to(tl.int32))
            tl.store(flags_ptr + 1, bits.to(tl.int32))
    if SINGLE_BLOCK:
        first = p * rows_per_prog
        last = tl.minimum(first + rows_per_prog, n_rows)
        if first < last:
            _offset_rows_one_block(idx_ptr, cu_q_ptr, cu_k_ptr, topk_len_ptr, out_ptr,
                                   len_out_ptr, first, last, K, n_docs,
                                   stride_it, stride_ik, stride_ot, stride_ok, CAUSAL, COMPACT,
                                   HAS_TOPK_LEN, SEARCH_STEPS, BLOCK_K, NUM_STAGES)
    elif p < n_rows:  # longer rows: one row per program (the launcher sets rows_per_prog 1)
        _offset_row(idx_ptr, cu_q_ptr, cu_k_ptr, topk_len_ptr, out_ptr, len_out_ptr, p, K,
                    n_docs, stride_it, stride_ik, stride_ot, stride_ok, CAUSAL, COMPACT,
                    HAS_TOPK_LEN, SEARCH_STEPS, BLOCK_K, SINGLE_BLOCK)


@triton.jit
def _offset_rows_one_block(idx_ptr, cu_q_ptr, cu_k_ptr, topk_len_ptr, out_ptr, len_out_ptr,
                           first, last, K, n_docs, stride_it, stride_ik, stride_ot, stride_ok,
                           CAUSAL: tl.constexpr, COMPACT: tl.constexpr,
                           HAS_TOPK_LEN: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                           BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Rows first..last - 1 (K <= BLOCK_K), one block each. The loop is software-pipelined
    (``NUM_STAGES``; on CUDA the row loads become asynchronous copies into shared memory,
    ``NUM_STAGES - 1`` rows ahead), so loads stay in flight while earlier rows are cut,
    compacted and stored; the document search is per row, as in :func:`_offset_row` (a
    data-dependent loop in the body would stop the pipelining)."""
    offs = tl.arange(0, BLOCK_K)
    in_row = offs < K
    for t in tl.range(first, last, num_stages=NUM_STAGES):
        local = tl.load(idx_ptr + t * stride_it + offs * stride_ik, mask=in_row, other=-1)
        limit = K + t * 0
        if HAS_TOPK_LEN:
            limit = tl.load(topk_len_ptr + t).to(tl.int64)
        q_end, seqlen_k, pos, key_start = _row_document(idx_ptr, cu_q_ptr, cu_k_ptr, t, n_docs,
                                                        SEARCH_STEPS)
        if HAS_TOPK_LEN:
            limit = tl.minimum(tl.maximum(limit, 0), K)
        # a token past the last document (T > cu_seqlens_q[-1]) belongs to none
        limit = tl.where(t < q_end, limit, 0).to(tl.int32)
        valid = in_row & (offs < limit) & (local >= 0) & (local < seqlen_k)
        if CAUSAL:
            valid = valid & (local <= pos)
        vals = tl.where(valid, local + key_start, -1).to(out_ptr.dtype.element_ty)
        last_valid = tl.max(tl.where(valid, offs + 1, 0), axis=0)
        row_out = out_ptr + t * stride_ot
        if COMPACT:
            flags = valid.to(tl.int32)
            n_valid = tl.sum(flags, axis=0)
            if last_valid == n_valid:  # valid slots already lead: the partition keeps them
                tl.store(row_out + offs * stride_ok, vals, mask=in_row)
            else:  # stable partition (as _offset_row); each slot written exactly once
                rank_valid = tl.cumsum(flags, axis=0) - 1
                rank_hole = n_valid + offs - (rank_valid + 1)
                dest = tl.where(valid, rank_valid, rank_hole)
                tl.store(row_out + dest * stride_ok, vals, mask=in_row)
            length = n_valid
        else:
            tl.store(row_out + offs * stride_ok, vals, mask=in_row)
            length = last_valid
        tl.store(len_out_ptr + t, length.to(tl.int32))


@triton.jit
def _offset_row(idx_ptr, cu_q_ptr, cu_k_ptr, topk_len_ptr, out_ptr, len_out_ptr, t, K, n_docs,
                stride_it, stride_ik, stride_ot, stride_ok,
                CAUSAL: tl.constexpr, COMPACT: tl.constexpr, HAS_TOPK_LEN: tl.constexpr,
                SEARCH_STEPS: tl.constexpr, BLOCK_K: tl.constexpr, SINGLE_BLOCK: tl.constexpr):
    """Row t: global rows (compacted or in place) and the row's length."""
    q_end, seqlen_k, pos, k_start = _row_document(idx_ptr, cu_q_ptr, cu_k_ptr, t, n_docs,
                                                  SEARCH_STEPS)

    limit = K + t * 0
    if HAS_TOPK_LEN:
        limit = tl.minimum(tl.maximum(tl.load(topk_len_ptr + t).to(tl.int64), 0), K)
    # a token past the last document (T > cu_seqlens_q[-1]) belongs to none: all slots invalid
    limit = tl.where(t < q_end, limit, 0)

    row_in = t * stride_it
    row_out = t * stride_ot
    base = tl.arange(0, BLOCK_K)
    if COMPACT:
        # stable partition: valid rows to slots [0, n_valid), -1 to the rest; each slot is
        # written exactly once, so the output needs no prior fill. Ranks are int32 (K < 2^31):
        # int64 scans take twice the registers and instructions
        n_valid = (t * 0).to(tl.int32)
        if not SINGLE_BLOCK:
            for start in range(0, K, BLOCK_K):
                valid, _ = _valid_global_rows(idx_ptr, row_in, stride_ik, start + base, K, limit,
                                              seqlen_k, pos, k_start, CAUSAL)
                n_valid += tl.sum(valid.to(tl.int32), axis=0)
        valid_before = (t * 0).to(tl.int32)
        for start in range(0, K, BLOCK_K):
            offs = start + base
            valid, rows = _valid_global_rows(idx_ptr, row_in, stride_ik, offs, K, limit,
                                             seqlen_k, pos, k_start, CAUSAL)
            flags = valid.to(tl.int32)
            if SINGLE_BLOCK:
                n_valid = tl.sum(flags, axis=0)
            rank_valid = valid_before + tl.cumsum(flags, axis=0) - 1
            rank_hole = n_valid + offs - (rank_valid + 1)
            dest = tl.where(valid, rank_valid, rank_hole)
            tl.store(out_ptr + row_out + dest * stride_ok, tl.where(valid, rows, -1)
                     .to(out_ptr.dtype.element_ty), mask=offs < K)
            valid_before += tl.sum(flags, axis=0)
        length = n_valid
    else:
        length = t * 0
        for start in range(0, K, BLOCK_K):
            offs = start + base
            valid, rows = _valid_global_rows(idx_ptr, row_in, stride_ik, offs, K, limit,
                                             seqlen_k, pos, k_start, CAUSAL)
            tl.store(out_ptr + row_out + offs * stride_ok, tl.where(valid, rows, -1)
                     .to(out_ptr.dtype.element_ty), mask=offs < K)
            length = tl.maximum(length, tl.max(tl.where(valid, offs + 1, 0), axis=0))
    tl.store(len_out_ptr + t, length.to(tl.int32))
