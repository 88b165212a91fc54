"""Optimized Triton kernels with the same public functions as :mod:`oracle` (docs/CONTRACT.md "1. Surface and signatures")."""
from .dsa import (
    dsa_sparse_attention,
    dsa_sparse_attention_nope,
    dsa_sparse_attention_nope_varlen,
    dsa_sparse_attention_varlen,
)
from .index import offset_gather_kv_indices
from .sdpa import scaled_dot_product_attention, scaled_dot_product_attention_with_lse

__all__ = [
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_with_lse",
    "dsa_sparse_attention_nope",
    "dsa_sparse_attention",
    "dsa_sparse_attention_nope_varlen",
    "dsa_sparse_attention_varlen",
    "offset_gather_kv_indices",
]
