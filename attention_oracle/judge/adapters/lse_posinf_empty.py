"""Adapter: a library that reports +inf lse for an empty row (FlashMLA's convention) -> the
contract's -inf. Finite values pass unchanged; out must already be 0 there (not translated:
a wrong out stays wrong).

``LsePosinfEmpty(inner)`` offers the DSA functions ``inner`` offers and passes
``offset_gather_kv_indices`` through.
"""
from __future__ import annotations

import torch

from attention_oracle.judge.adapters.lse_base2 import LseAdapter


class LsePosinfEmpty(LseAdapter):
    def translate_lse(self, lse):
        return torch.where(torch.isposinf(lse), torch.full_like(lse, float("-inf")), lse)
