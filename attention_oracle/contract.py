"""The contract's public surface as code: the function names and their signatures.

``docs/CONTRACT.md`` ("1. Surface and signatures") is the text; this module is the one
place the names and signatures live. The stubs below are never called: their signatures are
what an implementation's functions are checked against when a target is loaded
(:func:`signature_problem`), and their names are what a target may offer.

The signature check is by parameter name (the suite passes the leading tensors by position
and everything else by keyword):

- every contract parameter must exist under its name (``**kwargs`` covers a keyword-only
  one, ``*args`` the positional ones);
- a positional parameter must sit at the contract's position;
- a keyword-only parameter of the contract must be accepted by keyword;
- a parameter with a default in the contract must have one (the suite omits it at times);
- extra parameters are allowed if they are optional.

A signature :mod:`inspect` cannot read (a C builtin) is not judged.
"""
from __future__ import annotations

import inspect

SDPA = "scaled_dot_product_attention"
SDPA_WITH_LSE = "scaled_dot_product_attention_with_lse"
DSA_NOPE = "dsa_sparse_attention_nope"
DSA_ROPE = "dsa_sparse_attention"
DSA_NOPE_VARLEN = "dsa_sparse_attention_nope_varlen"
DSA_ROPE_VARLEN = "dsa_sparse_attention_varlen"
OFFSET_INDICES = "offset_gather_kv_indices"


# ----------------------------------------------------------------------------- stubs


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """out ``[*batch, Hq, L, Ev]``: ``torch.nn.functional.scaled_dot_product_attention``."""


def scaled_dot_product_attention_with_lse(query, key, value, attn_mask=None, dropout_p=0.0,
                                          is_causal=False, scale=None, enable_gqa=False):
    """(out, lse ``[*batch, Hq, L]`` float32, natural log): an extension some targets offer."""


def dsa_sparse_attention_nope(q, kv, indices, *, topk_length=None, softmax_scale=None,
                              return_lse=False):
    """out ``[T, H, D]`` | (out, lse ``[T, H]``)."""


def dsa_sparse_attention(q_latent, q_rope, kv_latent, k_rope, indices, *, topk_length=None,
                         softmax_scale=None, return_lse=False):
    """out ``[T, H, Dl]`` | (out, lse ``[T, H]``)."""


def dsa_sparse_attention_nope_varlen(q, kv, gather_kv_indices, cu_seqlens_q, cu_seqlens_k,
                                     max_seqlen_q=None, max_seqlen_k=None, *, causal=False,
                                     topk_length=None, softmax_scale=None, return_lse=False):
    """``offset_gather_kv_indices`` then :func:`dsa_sparse_attention_nope`."""


def dsa_sparse_attention_varlen(q_latent, q_rope, kv_latent, k_rope, gather_kv_indices,
                                cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                                *, causal=False, topk_length=None, softmax_scale=None,
                                return_lse=False):
    """``offset_gather_kv_indices`` then :func:`dsa_sparse_attention`."""


def offset_gather_kv_indices(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, *, causal=False,
                             out=None, return_topk_length=False, compact=False, topk_length=None):
    """Global rows ``[T, K]`` int32 (-1 for invalid slots) | (rows, lengths ``[T]``)."""


# ----------------------------------------------------------------------------- the surface

FUNCTIONS = (SDPA, DSA_NOPE, DSA_ROPE, DSA_NOPE_VARLEN, DSA_ROPE_VARLEN, OFFSET_INDICES)
EXTENSIONS = (SDPA_WITH_LSE,)  # optional functions some checks use when a target offers them
AREA_FUNCTIONS = {"sdpa": (SDPA,), "dsa": (DSA_NOPE, DSA_ROPE, DSA_NOPE_VARLEN, DSA_ROPE_VARLEN),
                  "index": (OFFSET_INDICES,)}
STUBS = {name: globals()[name] for name in FUNCTIONS + EXTENSIONS}

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def signature(name: str) -> inspect.Signature:
    """The contract's signature of function ``name``."""
    return inspect.signature(STUBS[name])


def _readable_signature(fn) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # C builtins without a text signature
        return None


def _positional_problem(p, index, params, positional, has_var_positional) -> str:
    if p.name not in params:
        if has_var_positional:
            return ""
        return f"missing parameter {p.name!r} (position {index})"
    got = params[p.name]
    if got.kind not in _POSITIONAL:
        return f"parameter {p.name!r} must be positional (position {index}), it is {got.kind.description}"
    where = positional.index(p.name)
    if where != index:
        return f"parameter {p.name!r} is at position {where}, the contract has it at position {index}"
    if got.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is not inspect.Parameter.empty:
        return f"parameter {p.name!r} must be accepted by keyword (the suite passes it by name)"
    return ""


def _keyword_problem(p, params, has_var_keyword) -> str:
    if p.name not in params:
        return "" if has_var_keyword else f"missing keyword-only parameter {p.name!r}"
    got = params[p.name]
    if got.kind not in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        return f"parameter {p.name!r} must be accepted by keyword, it is {got.kind.description}"
    return ""


def _mismatch(name: str, have: inspect.Signature) -> str:
    want = signature(name)
    params = have.parameters
    kinds = {p.kind for p in params.values()}
    has_var_positional = inspect.Parameter.VAR_POSITIONAL in kinds
    has_var_keyword = inspect.Parameter.VAR_KEYWORD in kinds
    positional = [n for n, p in params.items() if p.kind in _POSITIONAL]
    index = 0
    for p in want.parameters.values():
        if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            why = _positional_problem(p, index, params, positional, has_var_positional)
            index += 1
        else:
            why = _keyword_problem(p, params, has_var_keyword)
        if not why and p.name in params and p.default is not inspect.Parameter.empty \
                and params[p.name].default is inspect.Parameter.empty:
            why = f"parameter {p.name!r} must be optional (the contract's default is {p.default!r})"
        if why:
            return why
    for extra in params.values():
        if extra.name in want.parameters or extra.kind in (inspect.Parameter.VAR_POSITIONAL,
                                                           inspect.Parameter.VAR_KEYWORD):
            continue
        if extra.default is inspect.Parameter.empty:
            return f"extra parameter {extra.name!r} has no default (extra parameters must be optional)"
    return ""


def signature_problem(name: str, fn) -> str:
    """'' if ``fn`` can be called as the contract's ``name``; else what is wrong, naming the
    function and the parameter, with both signatures."""
    have = _readable_signature(fn)
    if have is None:
        return ""
    why = _mismatch(name, have)
    if not why:
        return ""
    return (f"{name}: {why}\n  contract: {name}{signature(name)}\n  offered:  {name}{have}\n"
            f"  (docs/CONTRACT.md, '1. Surface and signatures'; `attention-oracle contract` prints it)")


def offered(namespace) -> tuple[str, ...]:
    """The contract functions (extensions included) ``namespace`` offers."""
    if namespace is None:
        return ()
    return tuple(n for n in FUNCTIONS + EXTENSIONS if callable(getattr(namespace, n, None)))


def signature_problems(namespace) -> dict[str, str]:
    """{function: problem} for every offered function whose signature breaks the contract."""
    problems = {}
    for name in offered(namespace):
        why = signature_problem(name, getattr(namespace, name))
        if why:
            problems[name] = why
    return problems
