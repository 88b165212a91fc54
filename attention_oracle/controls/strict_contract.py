"""A correct implementation that keeps strictly to the contract and no further.

It wraps the oracle and refuses, with its own ValueError naming the argument, everything the
contract does not promise: DSA without an explicit ``softmax_scale``, and indices
(``indices``, ``gather_kv_indices``) of any dtype but int32. It declares no capabilities.
Every conformance check must pass it (``tests/test_strict_contract.py``): a check that
fails it goes beyond the contract.

    pytest --impl attention_oracle.controls.strict_contract:StrictContract
"""
from __future__ import annotations

import torch

from attention_oracle import oracle


def _int32(name: str, t) -> None:
    if isinstance(t, torch.Tensor) and t.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {t.dtype}")


def _scale(softmax_scale) -> None:
    if softmax_scale is None:
        raise ValueError("softmax_scale is required (this implementation has no default)")


class StrictContract:
    def __repr__(self):
        return "StrictContract"

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                   is_causal, scale, enable_gqa)

    def dsa_sparse_attention_nope(self, q, kv, indices, *, topk_length=None, softmax_scale=None,
                                  return_lse=False):
        _int32("indices", indices)
        _scale(softmax_scale)
        return oracle.dsa_sparse_attention_nope(q, kv, indices, topk_length=topk_length,
                                                softmax_scale=softmax_scale, return_lse=return_lse)

    def dsa_sparse_attention(self, q_latent, q_rope, kv_latent, k_rope, indices, *, topk_length=None,
                             softmax_scale=None, return_lse=False):
        _int32("indices", indices)
        _scale(softmax_scale)
        return oracle.dsa_sparse_attention(q_latent, q_rope, kv_latent, k_rope, indices,
                                           topk_length=topk_length, softmax_scale=softmax_scale,
                                           return_lse=return_lse)

    def dsa_sparse_attention_nope_varlen(self, q, kv, gather_kv_indices, cu_seqlens_q, cu_seqlens_k,
                                         max_seqlen_q=None, max_seqlen_k=None, *, causal=False,
                                         topk_length=None, softmax_scale=None, return_lse=False):
        _int32("gather_kv_indices", gather_kv_indices)
        _scale(softmax_scale)
        return oracle.dsa_sparse_attention_nope_varlen(
            q, kv, gather_kv_indices, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            causal=causal, topk_length=topk_length, softmax_scale=softmax_scale, return_lse=return_lse)

    def dsa_sparse_attention_varlen(self, q_latent, q_rope, kv_latent, k_rope, gather_kv_indices,
                                    cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                                    *, causal=False, topk_length=None, softmax_scale=None,
                                    return_lse=False):
        _int32("gather_kv_indices", gather_kv_indices)
        _scale(softmax_scale)
        return oracle.dsa_sparse_attention_varlen(
            q_latent, q_rope, kv_latent, k_rope, gather_kv_indices, cu_seqlens_q, cu_seqlens_k,
            max_seqlen_q, max_seqlen_k, causal=causal, topk_length=topk_length,
            softmax_scale=softmax_scale, return_lse=return_lse)

    def offset_gather_kv_indices(self, gather_kv_indices, cu_seqlens_q, cu_seqlens_k, *,
                                 causal=False, out=None, return_topk_length=False, compact=False,
                                 topk_length=None):
        _int32("gather_kv_indices", gather_kv_indices)
        return oracle.offset_gather_kv_indices(gather_kv_indices, cu_seqlens_q, cu_seqlens_k,
                                               causal=causal, out=out,
                                               return_topk_length=return_topk_length,
                                               compact=compact, topk_length=topk_length)
