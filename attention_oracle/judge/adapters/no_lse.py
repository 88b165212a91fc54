"""Adapter: a library whose DSA functions return ``out`` only (no lse at all).

``return_lse=True`` is refused with NotImplementedError (the suite reports "unsupported"
for the lse part and still checks out); otherwise the call goes to ``inner`` without the
``return_lse`` argument and ``out`` passes through unchanged. ``offset_gather_kv_indices``
passes through.
"""
from __future__ import annotations

from attention_oracle.judge.adapters.lse_base2 import DsaAdapter


class NoLse(DsaAdapter):
    def wrap(self, fname, fn):
        def without_lse(*args, return_lse=False, **kwargs):
            if return_lse:
                raise NotImplementedError(f"{self.inner_name}.{fname} returns no lse")
            return fn(*args, **kwargs)
        return without_lse
