"""Input checks shared by the oracle and fast (docs/CONTRACT.md "2. SDPA", "3. DSA sparse
attention", "4. Varlen index preparation").

Each check raises, with a message that starts with the argument's name:
- ``TypeError``: not a tensor, a wrong dtype kind (an integer query, a float index), a dtype that
  differs between operands that must share one, a non-number scale;
- ``ValueError``: a wrong rank or shape, operands on different devices, a non-finite scale;
- ``NotImplementedError``: inside the contract but not done by the calling implementation (a
  dtype outside its ``dtypes``, an index dtype outside its ``index_dtypes``, dropout, a gradient
  with respect to ``attn_mask``).

SDPA broadcasting is PyTorch's (measured on torch 2.14.1's math backend, docs/DESIGN.md "4. Contract,
signatures and input validation"): the batch dims of query, key and value broadcast against each other (ranks may
differ); without ``enable_gqa`` the head dims (dim -3) broadcast too, and out has the broadcast
head count; with ``enable_gqa`` Hq must be a multiple of Hk and of Hv (which may differ).

Host cost: plain Python on shapes and dtypes; no tensor is created and nothing is read from the
device (the fast wrappers call this on their host hot path). The *values* of cu_seqlens are
checked by the implementations (fast: by its kernel, without a host sync; the oracle: on the
host).
"""
from __future__ import annotations

import math

import torch

__all__ = [
    "FLOAT_DTYPES",
    "INDEX_DTYPES",
    "broadcast_shapes",
    "check_dsa_inputs",
    "check_index_inputs",
    "check_sdpa_inputs",
    "floating_tensor",
    "key_rows",
    "resolve_scale",
]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # the contract's input dtypes
INDEX_DTYPES = (torch.int32, torch.int64)  # int32 is the contract's; int64 an extension


# ----------------------------------------------------------------------------- building blocks

def broadcast_shapes(*shapes) -> tuple:
    """``torch.broadcast_shapes`` for plain tuples without its cost (~10 us a call: ~35% of fast
    SDPA's wrapper); equal shapes return at once. Raises ValueError where they do not
    broadcast."""
    first = tuple(shapes[0])
    if all(s == first for s in shapes[1:]):
        return first
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(-ndim, 0):
        dims = {s[i] for s in shapes if len(s) >= -i} - {1}
        if len(dims) > 1:
            raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _tensor(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided or x.is_nested:
        raise TypeError(f"{name} must be a dense (strided) tensor, got "
                        f"{'a nested tensor' if x.is_nested else f'layout {x.layout}'}")


def floating_tensor(name: str, x) -> None:
    """A tensor of a floating-point dtype (TypeError otherwise)."""
    _tensor(name, x)
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating-point dtype, got {x.dtype}")


def _index(name: str, x, ndim: int) -> None:
    _tensor(name, x)
    if x.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {x.dtype}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(x.shape)}")


def _same_dtype(first_name: str, first, named) -> None:
    for name, x in named:
        if x.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {x.dtype} but {first_name} has {first.dtype}; "
                            f"they must share one dtype")


def _same_device(first_name: str, first, named) -> None:
    device = first.device
    for name, x in named:
        if x is not None and x.device != device:
            raise ValueError(f"{name} is on {x.device} but {first_name} is on {device}")


def _supported(name: str, dtype, dtypes) -> None:
    if dtypes is not None and dtype not in dtypes:
        raise NotImplementedError(f"{name}: dtype {dtype} is not supported by this "
                                  f"implementation ({', '.join(str(d) for d in dtypes)})")


def resolve_scale(name: str, value, width: int) -> float:
    """The scale as a float: ``value``, or ``1 / sqrt(width)`` for None (1.0 when width is 0:
    the dot products are empty sums then)."""
    if value is None:
        return 1.0 / math.sqrt(width) if width > 0 else 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float or None, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:  # an int past float's range (docs/FINDINGS.md F44)
        raise ValueError(f"{name} must be finite, got an int beyond float's range") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def _flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def check_flags(**flags) -> None:
    """The boolean options of the DSA and index functions (``causal``, ``compact``,
    ``return_lse``, ``return_topk_length``): bools only, as the contract's signatures say (a
    string "False" is true, and would be taken as such)."""
    for name, value in flags.items():
        _flag(name, value)


# ----------------------------------------------------------------------------- SDPA

def _sdpa_heads(hq: int, hk: int, hv: int, enable_gqa: bool) -> tuple:
    """(Hq, Hk, Hv) the kernel sees: with GQA as given, else the broadcast head count thrice."""
    if enable_gqa:
        for name, h in (("key", hk), ("value", hv)):
            if h == 0 or hq % h != 0:
                raise ValueError(f"{name}: enable_gqa needs query heads ({hq}) to be a multiple "
                                 f"of {name} heads ({h})")
        return hq, hk, hv
    if hq == hk == hv:
        return hq, hq, hq
    for name, h in (("key", hk), ("value", hv)):
        if h != hq and h != 1 and hq != 1:
            raise ValueError(f"{name} has {h} heads (dim -3) but query has {hq}: without "
                             f"enable_gqa they must be equal or one of them 1 (broadcast); pass "
                             f"enable_gqa=True for grouped-query attention")
    try:
        h = broadcast_shapes((hq,), (hk,), (hv,))[0]
    except ValueError:
        raise ValueError(f"value has {hv} heads (dim -3) and key {hk}: they do not broadcast "
                         f"with the query's {hq}") from None
    return h, h, h


def _sdpa_mask(attn_mask, query, target: tuple, is_causal: bool, autograd: bool) -> None:
    _tensor("attn_mask", attn_mask)
    dtype = attn_mask.dtype
    if dtype != torch.bool and dtype != torch.float32 and dtype != query.dtype:
        raise TypeError(f"attn_mask must be bool, float32 or the query's dtype {query.dtype} "
                        f"(as in PyTorch), got {dtype}")
    if is_causal:
        raise ValueError("attn_mask must be None when is_causal=True (as in PyTorch)")
    shape = attn_mask.shape
    n = len(shape)
    tail = target[len(target) - n:] if n <= len(target) else None
    if shape != tail and (tail is None or any(m != 1 and m != t for m, t in zip(shape, tail))):
        raise ValueError(f"attn_mask of shape {tuple(shape)} does not broadcast to {target}")
    if attn_mask.device != query.device:
        raise ValueError(f"attn_mask is on {attn_mask.device} but query is on {query.device}")
    if autograd and attn_mask.requires_grad and torch.is_grad_enabled():
        raise NotImplementedError("attn_mask: a gradient with respect to the mask is not computed")


def check_sdpa_inputs(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                      scale=None, enable_gqa=False, *, dtypes=None, autograd=True) -> tuple:
    """Check SDPA's arguments (``torch.nn.functional.scaled_dot_product_attention``'s signature).

    query ``[*bq, Hq, L, E]``, key ``[*bk, Hk, S, E]``, value ``[*bv, Hv, S, Ev]`` (rank >= 3).
    ``dtypes``: the floating dtypes the caller computes (None: every floating dtype).
    ``autograd``: refuse an ``attn_mask`` that requires a gradient while grad mode is on.

    Returns ``(batch, hq, hk, hv, scale)``: the broadcast batch shape (a tuple), the head counts
    the computation sees (without GQA all three are the broadcast count; out has ``hq``
    heads) and the scale as a float (``1/sqrt(E)`` for None).
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        floating_tensor(name, t)
        if t.dim() < 3:
            raise ValueError(f"{name} must have rank >= 3 ([..., seq, dim]), got shape "
                             f"{tuple(t.shape)}")
    _same_dtype("query", query, (("key", key), ("value", value)))
    _supported("query", query.dtype, dtypes)
    _same_device("query", query, (("key", key), ("value", value)))
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p must be 0 (the contract has no dropout), got "
                                  f"{dropout_p}")
    _flag("is_causal", is_causal)
    _flag("enable_gqa", enable_gqa)
    qs, ks, vs = query.shape, key.shape, value.shape
    if ks[-1] != qs[-1]:
        raise ValueError(f"key has head dim {ks[-1]} but query has {qs[-1]}")
    if vs[-2] != ks[-2]:
        raise ValueError(f"value has {vs[-2]} rows (dim -2) but key has {ks[-2]}")
    sc = resolve_scale("scale", scale, qs[-1])
    bq, bk, bv = qs[:-3], ks[:-3], vs[:-3]
    if bq == bk == bv:
        batch = tuple(bq)
    else:
        try:
            batch = broadcast_shapes(bq, bk, bv)
        except ValueError:
            name = "key" if _no_broadcast(bq, bk) else "value"
            raise ValueError(f"{name}: the batch dims of query {tuple(qs)}, key {tuple(ks)} and "
                             f"value {tuple(vs)} do not broadcast") from None
    hq, hk, hv = _sdpa_heads(qs[-3], ks[-3], vs[-3], enable_gqa)
    if attn_mask is not None:
        _sdpa_mask(attn_mask, query, batch + (hq, qs[-2], ks[-2]), is_causal, autograd)
    return batch, hq, hk, hv, sc


def _no_broadcast(a, b) -> bool:
    try:
        broadcast_shapes(a, b)
    except ValueError:
        return True
    return False


# ----------------------------------------------------------------------------- DSA

def key_rows(name: str, x, dtypes=None) -> torch.Tensor:
    """Key rows ``[S, D]`` or ``[S, 1, D]`` (one kv head) -> the ``[S, D]`` view; ``dtypes`` as
    in :func:`check_dsa_inputs`."""
    floating_tensor(name, x)
    _supported(name, x.dtype, dtypes)
    if x.dim() == 2:
        return x
    if x.dim() == 3 and x.shape[1] == 1:
        return x[:, 0]
    raise ValueError(f"{name} must be [S, D] or [S, 1, D] (one kv head), got shape "
                     f"{tuple(x.shape)}")


def check_dsa_inputs(q, q_rope, kv, k_rope, indices, topk_length=None, softmax_scale=None, *,
                     rope, dtypes=None, index_dtypes=INDEX_DTYPES) -> tuple:
    """Check DSA's arguments (docs/CONTRACT.md "3. DSA sparse attention").

    ``rope``: True for the RoPE entry (q_rope and k_rope required; names q_latent, kv_latent),
    False for the NoPE entry (names q, kv; q_rope and k_rope None), None for a reference that
    takes both or neither under the RoPE names. ``dtypes`` / ``index_dtypes``: what the caller
    computes (None: every floating dtype).

    Returns ``(kv [S, Dl] view, k_rope [S, Dr] view or None, scale)``, the scale a float
    (``1/sqrt(Dl + Dr)`` for None).
    """
    q_name, kv_name = ("q", "kv") if rope is False else ("q_latent", "kv_latent")
    if rope and (q_rope is None or k_rope is None):
        raise ValueError("q_rope and k_rope are required (use dsa_sparse_attention_nope "
                         "without rope)")
    if (q_rope is None) != (k_rope is None):
        raise ValueError("q_rope and k_rope must be given together (both or neither)")
    floating_tensor(q_name, q)
    if q.dim() != 3:
        raise ValueError(f"{q_name} must be [T, H, D], got shape {tuple(q.shape)}")
    T, H, DL = q.shape
    if DL == 0:  # the values are the latent rows: a zero-width latent attends to nothing
        raise ValueError(f"{q_name} has 0 channels: the latent width must be at least 1")
    kv2 = key_rows(kv_name, kv)
    if kv2.shape[1] != DL:
        raise ValueError(f"{kv_name} has {kv2.shape[1]} channels but {q_name} has {DL}")
    floats = [(kv_name, kv2)]
    kr2, DR = None, 0
    if q_rope is not None:
        floating_tensor("q_rope", q_rope)
        if q_rope.dim() != 3 or q_rope.shape[0] != T or q_rope.shape[1] != H:
            raise ValueError(f"q_rope must be [{T}, {H}, Dr] like {q_name}, got shape "
                             f"{tuple(q_rope.shape)}")
        DR = q_rope.shape[2]
        kr2 = key_rows("k_rope", k_rope)
        if kr2.shape[0] != kv2.shape[0] or kr2.shape[1] != DR:
            raise ValueError(f"k_rope must be [{kv2.shape[0]}, {DR}] (the rows of {kv_name}, "
                             f"the channels of q_rope), got shape {tuple(k_rope.shape)}")
        floats += [("q_rope", q_rope), ("k_rope", kr2)]
    _same_dtype(q_name, q, floats)
    _supported(q_name, q.dtype, dtypes)
    _index("indices", indices, 2)
    if indices.shape[0] != T:
        raise ValueError(f"indices must be [T={T}, K], got shape {tuple(indices.shape)}")
    _supported("indices", indices.dtype, index_dtypes)
    named = floats + [("indices", indices)]
    if topk_length is not None:
        _topk_length(topk_length, T)
        named.append(("topk_length", topk_length))
    _same_device(q_name, q, named)
    return kv2, kr2, resolve_scale("softmax_scale", softmax_scale, DL + DR)


def _topk_length(topk_length, T: int) -> None:
    _index("topk_length", topk_length, 1)
    if topk_length.shape[0] != T:
        raise ValueError(f"topk_length must have shape [{T}], got {tuple(topk_length.shape)}")


# ----------------------------------------------------------------------------- index preparation

def _overlaps_itself(x) -> bool:
    """Whether two elements of the 2-D tensor ``x`` share a memory location (exact: i0 * s0 ==
    i1 * s1 first holds at the strides' least common multiple; PyTorch's own check gives up on
    such views, docs/FINDINGS.md F71)."""
    (n0, n1), (s0, s1) = x.shape, x.stride()
    if n0 > 1 and n1 > 1 and s0 and s1:
        common = math.lcm(s0, s1)
        return common // s0 < n0 and common // s1 < n1
    return n0 * n1 > 1 and ((n0 > 1 and s0 == 0) or (n1 > 1 and s1 == 0))


def check_index_inputs(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, topk_length=None,
                       out=None) -> tuple:
    """Check ``offset_gather_kv_indices``' arguments (types, dtypes, shapes, devices; not the
    values of cu_seqlens). Returns ``(T, K)``."""
    _index("gather_kv_indices", gather_kv_indices, 2)
    T, K = gather_kv_indices.shape
    _index("cu_seqlens_q", cu_seqlens_q, 1)
    _index("cu_seqlens_k", cu_seqlens_k, 1)
    if cu_seqlens_q.shape[0] < 1:
        raise ValueError("cu_seqlens_q must hold at least one entry (the leading 0)")
    if cu_seqlens_k.shape != cu_seqlens_q.shape:
        raise ValueError(f"cu_seqlens_k must have the shape of cu_seqlens_q "
                         f"{tuple(cu_seqlens_q.shape)} (the same documents), got "
                         f"{tuple(cu_seqlens_k.shape)}")
    named = [("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)]
    if topk_length is not None:
        _topk_length(topk_length, T)
        named.append(("topk_length", topk_length))
    if out is not None:
        _tensor("out", out)
        if out.dtype != torch.int32:
            raise TypeError(f"out must be int32, got {out.dtype}")
        if out.dim() != 2 or out.shape[0] != T or out.shape[1] != K:
            raise ValueError(f"out must have shape [{T}, {K}], got {tuple(out.shape)}")
        if _overlaps_itself(out):
            raise ValueError(f"out must not have elements that share memory, got strides "
                             f"{tuple(out.stride())} for shape {tuple(out.shape)}")
        named.append(("out", out))
    _same_device("gather_kv_indices", gather_kv_indices, named)
    return T, K
