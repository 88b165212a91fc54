"""Placeholder: the Triton SDPA lands here (issue 4)."""


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    raise NotImplementedError("fast SDPA not implemented yet")
