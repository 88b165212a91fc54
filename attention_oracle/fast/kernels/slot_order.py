"""Triton kernel behind ``fast.dsa``'s slot order: each row's valid slots sorted by key and
rotated by its token's place among the programs resident at once.

The DSA kernels gather a row's key rows in slot order, one program a token, about one program
an SM resident at once. Rows in a top-k's order (random over the document) make the resident
programs gather from the whole document at once; where its rows exceed the L2 (packed_glm_a:
documents of 57-68k keys, 65-78 MB of rows) half the gathers and key-gradient atomics went
to DRAM (docs/FINDINGS.md F96). Sorted, every row walks its document from the first key to the
last; rotated left by ``(t mod C) / C`` of its ``n`` valid slots (``C`` the resident
programs), the programs that start one after another walk the same stretch of keys together,
so the L2 holds what they share.

Per row t of ``rows [T, K]`` (int32 or int64, any strides): slot s is valid iff
``s < lengths[t]`` (with HAS_LEN) and ``0 <= rows[t, s] < S``, the kernels' rule. Writes
``out [T, K]`` int32 contiguous: the ``n`` valid keys ascending, rotated left by
``shift = (t mod C) * n // C`` (slot j holds sorted key ``(j + shift) mod n``), then -1;
``out_len [T]`` int32 = n. The same multiset of valid keys a row (duplicates kept), so
every sum the kernels form is the same sum in another order.
"""
import triton
import triton.language as tl

_SENTINEL = tl.constexpr(2147483647)  # sorts after every valid key (S < 2**31)


@triton.jit
def slot_order_kernel(rows_ptr, len_ptr, out_ptr, out_len_ptr, T, K, S, stride_rt, stride_rk, C,
                      HAS_LEN: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr):
    """ROWS rows a program, each sorted alone (a [ROWS, BLOCK_K] block sorted along its last
    axis)."""
    t = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    row_ok = t < T
    in_row = row_ok[:, None] & (offs[None, :] < K)
    if HAS_LEN:
        length = tl.load(len_ptr + t, mask=row_ok, other=0)
        in_row = in_row & (offs[None, :] < length[:, None])
    key = tl.load(rows_ptr + t[:, None] * stride_rt + offs[None, :] * stride_rk, mask=in_row,
                  other=-1)
    valid = in_row & (key >= 0) & (key < S)
    key = tl.where(valid, key, _SENTINEL).to(tl.int32)
    n = tl.sum(valid.to(tl.int32), axis=1)
    ordered = tl.sort(key)
    shift = ((t % C) * n // C).to(tl.int32)[:, None]
    n2 = n[:, None]
    slot = offs[None, :]
    dest = tl.where(slot < n2, tl.where(slot >= shift, slot - shift, slot - shift + n2), slot)
    tl.store(out_ptr + t[:, None] * K + dest, tl.where(slot < n2, ordered, -1),
             mask=row_ok[:, None] & (slot < K))
    tl.store(out_len_ptr + t, n, mask=row_ok)
