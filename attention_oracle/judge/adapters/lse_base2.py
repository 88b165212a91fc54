"""Adapter: a library whose DSA lse is in base 2 (``log2 sum 2^(x log2 e)``, FlashMLA-style
kernels that work with exp2) -> the contract's natural-log lse: ``lse_e = lse_2 * ln 2``.

``LseBase2(inner)`` offers the DSA functions ``inner`` offers (``inner``: a namespace or a
``package.module[:attr]`` name) with the lse translated, and passes ``offset_gather_kv_indices``
through. Empty rows keep their lse (``-inf * ln 2 = -inf``).

This module also holds the machinery the other DSA adapters share (:class:`DsaAdapter`,
:class:`LseAdapter`): a wrapped namespace offers exactly the DSA functions the inner one
offers (a missing function stays "not offered"), plus ``offset_gather_kv_indices`` unchanged.
"""
from __future__ import annotations

import importlib
import math

DSA_FUNCTIONS = ("dsa_sparse_attention_nope", "dsa_sparse_attention",
                 "dsa_sparse_attention_nope_varlen", "dsa_sparse_attention_varlen")
PASS_THROUGH = ("offset_gather_kv_indices",)


def resolve(inner):
    """A namespace, or a ``package.module[:attr]`` name of one."""
    if not isinstance(inner, str):
        return inner
    module, _, attr = inner.partition(":")
    ns = importlib.import_module(module)
    return getattr(ns, attr) if attr else ns


class DsaAdapter:
    """Override :meth:`wrap` (fname, fn) -> the function offered in place of ``fn``."""

    def __init__(self, inner):
        self.inner = resolve(inner)
        self.inner_name = inner if isinstance(inner, str) else repr(self.inner)

    def __repr__(self):
        return f"{type(self).__name__}({self.inner_name})"

    def __getattr__(self, name):
        if name in ("inner", "inner_name"):
            raise AttributeError(name)
        fn = getattr(self.inner, name, None)
        if name in DSA_FUNCTIONS and callable(fn):
            return self.wrap(name, fn)
        if name in PASS_THROUGH and callable(fn):
            return fn
        raise AttributeError(f"{self!r} does not offer {name}")

    def wrap(self, fname, fn):  # pragma: no cover - abstract
        raise NotImplementedError


class LseAdapter(DsaAdapter):
    """Translate the lse of ``return_lse=True`` calls with :meth:`translate_lse`."""

    def translate_lse(self, lse):  # pragma: no cover - abstract
        raise NotImplementedError

    def wrap(self, fname, fn):
        def translated(*args, return_lse=False, **kwargs):
            result = fn(*args, return_lse=return_lse, **kwargs)
            if not return_lse:
                return result
            out, lse = result
            return out, self.translate_lse(lse)
        return translated


class LseBase2(LseAdapter):
    def translate_lse(self, lse):
        return lse * math.log(2.0)
