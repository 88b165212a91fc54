"""Placeholder: the Triton DSA kernels land here (issue 5)."""


def _todo(*args, **kwargs):
    raise NotImplementedError("fast DSA not implemented yet")


dsa_sparse_attention_nope = dsa_sparse_attention = _todo
dsa_sparse_attention_nope_varlen = dsa_sparse_attention_varlen = _todo
