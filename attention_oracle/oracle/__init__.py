"""Float64 reference implementations: the judge of every kernel (docs/CONTRACT.md sections 2-4).

Offers the docs/CONTRACT.md "1. Surface and signatures" functions with the exact public signatures; each computes in
float64 and returns results in the input dtype, with backward passes written out explicitly.
The ``*_reference`` functions run the same math in any dtype and are what the suite uses
for the gold (float64) and low-precision results of the agreement rule.
"""
from .dsa import (
    dsa_reference,
    dsa_sparse_attention,
    dsa_sparse_attention_nope,
    dsa_sparse_attention_nope_varlen,
    dsa_sparse_attention_varlen,
)
from .index import offset_gather_kv_indices
from .sdpa import (
    scaled_dot_product_attention,
    scaled_dot_product_attention_with_lse,
    sdpa_reference,
)

__all__ = [
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_with_lse",
    "sdpa_reference",
    "dsa_sparse_attention_nope",
    "dsa_sparse_attention",
    "dsa_sparse_attention_nope_varlen",
    "dsa_sparse_attention_varlen",
    "dsa_reference",
    "offset_gather_kv_indices",
]
