"""Implementations whose signatures break the contract (docs/CONTRACT.md, "1. Surface and
signatures"): each must be reported at load, naming the function and the parameter, and every
check of that function must fail with that message (not crash the collection, not a TypeError
deep inside a check). The numbers they compute are the oracle's: only the signature is wrong.
"""
from __future__ import annotations

from attention_oracle import oracle


class _Base:
    def __repr__(self):
        return type(self).__name__


class NoEnableGqa(_Base):
    """SDPA without ``enable_gqa`` (an older PyTorch signature)."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None):
        return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                   is_causal, scale)


class SwappedKeyValue(_Base):
    """SDPA taking ``value`` before ``key``: positional calls would swap them."""

    def scaled_dot_product_attention(self, query, value, key, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                   is_causal, scale, enable_gqa)


class RequiredTopkLength(_Base):
    """NoPE DSA whose ``topk_length`` has no default; its RoPE DSA keeps to the contract."""

    def dsa_sparse_attention_nope(self, q, kv, indices, *, topk_length, softmax_scale=None,
                                  return_lse=False):
        return oracle.dsa_sparse_attention_nope(q, kv, indices, topk_length=topk_length,
                                                softmax_scale=softmax_scale, return_lse=return_lse)

    def dsa_sparse_attention(self, q_latent, q_rope, kv_latent, k_rope, indices, *,
                             topk_length=None, softmax_scale=None, return_lse=False):
        return oracle.dsa_sparse_attention(q_latent, q_rope, kv_latent, k_rope, indices,
                                           topk_length=topk_length, softmax_scale=softmax_scale,
                                           return_lse=return_lse)


class ExtraOptionalParameter(_Base):
    """Keeps to the contract: an extra optional parameter is allowed."""

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False, *,
                                     block_size=64):
        return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                   is_causal, scale, enable_gqa)
