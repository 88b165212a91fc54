"""Small @triton.jit helpers shared by the DSA forward and backward kernels.

Conventions: a *slot block* is BLOCK_K consecutive slots of one query row; a slot is valid iff
it lies before the row's slot count (``topk_length`` clamped to [0, K]) and its index is in
[0, S). Invalid slots gather row 0 under a false mask, so they cost no memory traffic.
"""
import triton
import triton.language as tl


@triton.jit
def row_slot_count(len_ptr, t, K, HAS_LEN: tl.constexpr):
    """Number of leading slots of row t that may hold keys: min(max(topk_length[t], 0), K)."""
    n = K + t * 0
    if HAS_LEN:
        n = tl.minimum(tl.maximum(tl.load(len_ptr + t).to(tl.int64), 0), K)
    return n


@triton.jit
def slot_block(idx_ptr, row_offset, stride_k, offs_k, n_slots, S):
    """Returns (valid [BLOCK_K] bool, rows [BLOCK_K] int64 with 0 where invalid)."""
    in_range = offs_k < n_slots
    idx = tl.load(idx_ptr + row_offset + offs_k * stride_k, mask=in_range, other=-1).to(tl.int64)
    valid = in_range & (idx >= 0) & (idx < S)
    return valid, tl.where(valid, idx, 0)


@triton.jit
def gather_rows(base_ptr, rows, stride_s, stride_d, offs_d, d_lim, valid):
    """Gathers key rows: [BLOCK_K, BLOCK_D] tile of base[rows, offs_d], 0 outside."""
    ptrs = base_ptr + rows[:, None] * stride_s + offs_d[None, :] * stride_d
    return tl.load(ptrs, mask=valid[:, None] & (offs_d[None, :] < d_lim), other=0.0)


@triton.jit
def load_heads(base_ptr, row_offset, offs_h, stride_h, h_lim, offs_d, stride_d, d_lim):
    """Loads a [BLOCK_H, BLOCK_D] tile of one token's heads, 0 outside."""
    ptrs = base_ptr + row_offset + offs_h[:, None] * stride_h + offs_d[None, :] * stride_d
    return tl.load(ptrs, mask=(offs_h[:, None] < h_lim) & (offs_d[None, :] < d_lim), other=0.0)
