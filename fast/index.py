"""Placeholder: the Triton index preparation lands here (issue 5)."""


def offset_gather_kv_indices(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, *, causal=False,
                             out=None, return_topk_length=False, compact=False, topk_length=None):
    raise NotImplementedError("fast offset_gather_kv_indices not implemented yet")
