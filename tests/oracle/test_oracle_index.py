"""Self-tests of the varlen index preparation oracle (docs/CONTRACT.md "4. Varlen index preparation")."""

import pytest
import torch

from attention_oracle.oracle.index import (
    document_of_token,
    key_position,
    offset_gather_kv_indices,
)

# ------------------------------------------------------------------ a table worked by hand
# Documents: 0 has 2 queries / 4 keys (positions 2, 3), 1 has keys but no query, 2 is empty,
# 3 has 3 queries / 3 keys (positions 0, 1, 2) at key offset 6.
CU_Q = [0, 2, 2, 2, 5]
CU_K = [0, 4, 6, 6, 9]
LOCAL = [
    [3, 0, -1, 2],    # doc 0, pos 2
    [1, 4, 3, 0],     # doc 0, pos 3 (4 is past the 4 keys)
    [0, 1, 2, -5],    # doc 3, pos 0
    [2, 1, 1, 0],     # doc 3, pos 1 (a duplicate)
    [5, 2, 0, 3],     # doc 3, pos 2 (5 and 3 are past the 3 keys)
]
TOPK = [2, 4, 0, 3, 1]

EXPECTED = {
    # (causal, compact, with topk): (rows, lengths)
    (False, False, False): ([[3, 0, -1, 2], [1, -1, 3, 0], [6, 7, 8, -1], [8, 7, 7, 6],
                             [-1, 8, 6, -1]], [4, 4, 3, 4, 3]),
    (True, False, False): ([[-1, 0, -1, 2], [1, -1, 3, 0], [6, -1, -1, -1], [-1, 7, 7, 6],
                            [-1, 8, 6, -1]], [4, 4, 1, 4, 3]),
    (True, True, False): ([[0, 2, -1, -1], [1, 3, 0, -1], [6, -1, -1, -1], [7, 7, 6, -1],
                           [8, 6, -1, -1]], [2, 3, 1, 3, 2]),
    (False, True, False): ([[3, 0, 2, -1], [1, 3, 0, -1], [6, 7, 8, -1], [8, 7, 7, 6],
                            [8, 6, -1, -1]], [3, 3, 3, 4, 2]),
    (True, False, True): ([[-1, 0, -1, -1], [1, -1, 3, 0], [-1, -1, -1, -1], [-1, 7, 7, -1],
                           [-1, -1, -1, -1]], [2, 4, 0, 3, 0]),
    (True, True, True): ([[0, -1, -1, -1], [1, 3, 0, -1], [-1, -1, -1, -1], [7, 7, -1, -1],
                          [-1, -1, -1, -1]], [1, 3, 0, 2, 0]),
}


def _table(index_dtype=torch.int32, cu_dtype=torch.int32):
    return (torch.tensor(LOCAL, dtype=index_dtype), torch.tensor(CU_Q, dtype=cu_dtype),
            torch.tensor(CU_K, dtype=cu_dtype))


@pytest.mark.parametrize("causal,compact,with_topk", sorted(EXPECTED))
def test_hand_worked_table(causal, compact, with_topk):
    local, cu_q, cu_k = _table()
    topk = torch.tensor(TOPK, dtype=torch.int32) if with_topk else None
    rows, lengths = offset_gather_kv_indices(local, cu_q, cu_k, causal=causal, compact=compact,
                                             topk_length=topk, return_topk_length=True)
    want_rows, want_lengths = EXPECTED[(causal, compact, with_topk)]
    assert rows.dtype == torch.int32 and lengths.dtype == torch.int32
    assert rows.tolist() == want_rows
    assert lengths.tolist() == want_lengths


def test_document_and_position_helpers():
    _, cu_q, cu_k = _table()
    assert document_of_token(cu_q, 5).tolist() == [0, 0, 3, 3, 3]
    assert key_position(cu_q, cu_k, 5).tolist() == [2, 3, 0, 1, 2]


def test_more_queries_than_keys_gives_negative_positions_and_empty_causal_rows():
    cu_q, cu_k = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32)
    local = torch.tensor([[0, 1], [0, 1], [1, 0]], dtype=torch.int32)
    assert key_position(cu_q, cu_k, 3).tolist() == [-1, 0, 1]
    rows, lengths = offset_gather_kv_indices(local, cu_q, cu_k, causal=True, return_topk_length=True)
    assert rows.tolist() == [[-1, -1], [0, -1], [1, 0]]
    assert lengths.tolist() == [0, 1, 2]


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
def test_int64_inputs_give_int32_outputs(index_dtype, cu_dtype):
    local, cu_q, cu_k = _table(index_dtype, cu_dtype)
    rows = offset_gather_kv_indices(local, cu_q, cu_k, causal=True)
    assert rows.dtype == torch.int32
    assert rows.tolist() == EXPECTED[(True, False, False)][0]


def test_out_is_written_and_returned_even_when_aliasing_the_input():
    local, cu_q, cu_k = _table()
    out = torch.full((5, 4), 99, dtype=torch.int32)
    result = offset_gather_kv_indices(local, cu_q, cu_k, causal=True, compact=True, out=out)
    assert result is out
    assert out.tolist() == EXPECTED[(True, True, False)][0]
    in_place = local.clone()
    result, lengths = offset_gather_kv_indices(in_place, cu_q, cu_k, causal=True, compact=True,
                                               out=in_place, return_topk_length=True)
    assert result is in_place and in_place.tolist() == EXPECTED[(True, True, False)][0]
    assert lengths.tolist() == EXPECTED[(True, True, False)][1]


def test_empty_shapes():
    cu = torch.tensor([0, 0], dtype=torch.int32)
    rows, lengths = offset_gather_kv_indices(torch.empty(0, 4, dtype=torch.int32), cu, cu,
                                             return_topk_length=True)
    assert rows.shape == (0, 4) and lengths.shape == (0,)
    cu_q = torch.tensor([0, 3], dtype=torch.int32)
    rows, lengths = offset_gather_kv_indices(torch.empty(3, 0, dtype=torch.int32), cu_q, cu_q,
                                             compact=True, return_topk_length=True)
    assert rows.shape == (3, 0) and lengths.tolist() == [0, 0, 0]


# ------------------------------------------------------------------ against a naive loop

def _naive(local, K, cu_q, cu_k, causal, compact, topk):
    """Token-by-token translation written straight from the text of docs/CONTRACT.md."""
    rows, lengths = [], []
    for d in range(len(cu_q) - 1):
        seqlen_q, seqlen_k = cu_q[d + 1] - cu_q[d], cu_k[d + 1] - cu_k[d]
        for t in range(cu_q[d], cu_q[d + 1]):
            pos = (seqlen_k - seqlen_q) + (t - cu_q[d])
            row = []
            for s in range(K):
                j = local[t][s]
                ok = 0 <= j < seqlen_k and (not causal or j <= pos)
                ok = ok and (topk is None or s < topk[t])
                row.append(j + cu_k[d] if ok else -1)
            if compact:
                kept = [r for r in row if r >= 0]
                rows.append(kept + [-1] * (K - len(kept)))
                lengths.append(len(kept))
            else:
                rows.append(row)
                lengths.append(max([s + 1 for s, r in enumerate(row) if r >= 0], default=0))
    return rows, lengths


def _random_table(seed):
    g = torch.Generator().manual_seed(seed)
    n_docs = int(torch.randint(1, 6, (1,), generator=g))
    seqlen_q = torch.randint(0, 7, (n_docs,), generator=g)
    seqlen_k = seqlen_q + torch.randint(-2, 8, (n_docs,), generator=g)
    seqlen_k = seqlen_k.clamp_min(0)
    cu_q = [0] + torch.cumsum(seqlen_q, 0).tolist()
    cu_k = [0] + torch.cumsum(seqlen_k, 0).tolist()
    T, K = cu_q[-1], int(torch.randint(0, 9, (1,), generator=g))
    local = torch.randint(-3, 12, (T, K), generator=g)
    topk = torch.randint(-1, K + 2, (T,), generator=g)
    return local, cu_q, cu_k, topk


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("use_topk", [False, True])
def test_matches_naive_loop(seed, causal, compact, use_topk):
    local, cu_q, cu_k, topk = _random_table(seed)
    want_rows, want_lengths = _naive(local.tolist(), local.shape[1], cu_q, cu_k, causal, compact,
                                     topk.tolist() if use_topk else None)
    rows, lengths = offset_gather_kv_indices(
        local.to(torch.int32), torch.tensor(cu_q, dtype=torch.int32),
        torch.tensor(cu_k, dtype=torch.int32), causal=causal, compact=compact,
        topk_length=topk.to(torch.int32) if use_topk else None, return_topk_length=True)
    assert rows.reshape(-1).tolist() == [r for row in want_rows for r in row]
    assert lengths.tolist() == want_lengths


@pytest.mark.parametrize("seed", range(6))
def test_compaction_keeps_the_set_and_order_of_keys(seed):
    local, cu_q, cu_k, _ = _random_table(seed + 100)
    args = (local.to(torch.int32), torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32))
    holey, holey_len = offset_gather_kv_indices(*args, causal=True, return_topk_length=True)
    packed, packed_len = offset_gather_kv_indices(*args, causal=True, compact=True,
                                                  return_topk_length=True)
    for h_row, p_row, n in zip(holey.tolist(), packed.tolist(), packed_len.tolist()):
        kept = [r for r in h_row if r >= 0]
        assert p_row[:n] == kept and all(r == -1 for r in p_row[n:])
    assert bool((packed_len <= holey_len).all())


# ------------------------------------------------------------------ validation

def _args():
    local, cu_q, cu_k = _table()
    return {"gather_kv_indices": local, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}


def _call(**overrides):
    args = _args()
    kwargs = {k: overrides.pop(k) for k in list(overrides)
              if k in ("out", "topk_length", "causal", "compact")}
    args.update(overrides)
    return offset_gather_kv_indices(args["gather_kv_indices"], args["cu_seqlens_q"],
                                    args["cu_seqlens_k"], **kwargs)


@pytest.mark.parametrize("overrides,error,name", [
    ({"gather_kv_indices": torch.zeros(5, 4)}, TypeError, "gather_kv_indices"),
    ({"gather_kv_indices": torch.zeros(5, 4, dtype=torch.int16)}, TypeError, "gather_kv_indices"),
    ({"gather_kv_indices": [[0]]}, TypeError, "gather_kv_indices"),
    ({"gather_kv_indices": torch.zeros(20, dtype=torch.int32)}, ValueError, "gather_kv_indices"),
    ({"gather_kv_indices": torch.zeros(5, 4, 1, dtype=torch.int32)}, ValueError, "gather_kv_indices"),
    ({"cu_seqlens_q": torch.tensor([0., 2, 2, 2, 5])}, TypeError, "cu_seqlens_q"),
    ({"cu_seqlens_k": torch.tensor([[0, 4, 6, 6, 9]], dtype=torch.int32)}, ValueError, "cu_seqlens_k"),
    ({"cu_seqlens_q": torch.tensor([1, 2, 2, 2, 5], dtype=torch.int32)}, ValueError, "cu_seqlens_q"),
    ({"cu_seqlens_k": torch.tensor([0, 4, 3, 6, 9], dtype=torch.int32)}, ValueError, "cu_seqlens_k"),
    ({"cu_seqlens_q": torch.tensor([0, 3, 2, 2, 5], dtype=torch.int32)}, ValueError, "cu_seqlens_q"),
    ({"cu_seqlens_k": torch.tensor([0, 4, 9], dtype=torch.int32)}, ValueError, "cu_seqlens_k"),
    ({"cu_seqlens_q": torch.tensor([0, 2, 2, 2, 6], dtype=torch.int32)}, ValueError, "cu_seqlens_q[-1]"),
    ({"cu_seqlens_q": torch.tensor([], dtype=torch.int32)}, ValueError, "cu_seqlens_q"),
    ({"topk_length": torch.zeros(4, dtype=torch.int32)}, ValueError, "topk_length"),
    ({"topk_length": torch.zeros(5)}, TypeError, "topk_length"),
    ({"out": torch.zeros(5, 4, dtype=torch.int64)}, TypeError, "out"),
    ({"out": torch.zeros(5, 3, dtype=torch.int32)}, ValueError, "out"),
    ({"out": "buffer"}, TypeError, "out"),
])
def test_validation_names_the_argument(overrides, error, name):
    with pytest.raises(error, match=name.replace("[", r"\[").replace("]", r"\]")):
        _call(**overrides)


def test_fast_leaves_an_aliased_input_untouched_when_the_metadata_is_bad():
    """fast checks the metadata in its kernel, after the rows are formed: on the CPU (flags) it
    works in a scratch buffer, so that an ``out`` aliasing the input is left as it was when the
    call fails (the oracle checks first)."""
    import os
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("fast runs on the CPU under Triton's interpreter only")
    from attention_oracle import fast
    local, cu_q, cu_k = _table()
    bad_q = torch.tensor([0, 2, 2, 2, 4], dtype=cu_q.dtype)  # ends before T = 5
    for impl in (offset_gather_kv_indices, fast.offset_gather_kv_indices):
        in_place = local.clone()
        with pytest.raises(ValueError, match="cu_seqlens_q"):
            impl(in_place, bad_q, cu_k, compact=True, out=in_place)
        assert torch.equal(in_place, local), impl


@pytest.mark.parametrize("layout", ["sliding_rows", "sliding_columns", "expanded_rows"])
def test_out_with_overlapping_elements_is_refused(layout):
    """An ``out`` two of whose elements share a memory location cannot hold the rows: refused
    with a ValueError naming it (PyTorch's overlap check in ``copy_`` passes a sliding window,
    so the result read back through it was silently wrong; fast writes it directly on CUDA).
    The oracle, and fast where Triton's interpreter runs it."""
    import os
    local, cu_q, cu_k = _table()  # T 5, K 4
    out = {"sliding_rows": lambda: torch.zeros(8, dtype=torch.int32).as_strided((5, 4), (1, 1)),
           "sliding_columns": lambda: torch.zeros(11, dtype=torch.int32).as_strided((5, 4), (1, 2)),
           "expanded_rows": lambda: torch.zeros(1, 4, dtype=torch.int32).expand(5, 4)}[layout]
    impls = [offset_gather_kv_indices]
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        from attention_oracle import fast
        impls.append(fast.offset_gather_kv_indices)
    for impl in impls:
        with pytest.raises(ValueError, match="out"):
            impl(local, cu_q, cu_k, out=out())
    # rows that interleave but share no element (i * 4 + j * 5 differ for i < 5) stay fine
    interleaved = torch.zeros(32, dtype=torch.int32).as_strided((5, 4), (4, 5))
    for impl in impls:
        assert impl(local, cu_q, cu_k, out=interleaved).tolist() == EXPECTED[(False, False, False)][0]
