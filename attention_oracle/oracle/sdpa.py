"""Float64 reference for scaled dot-product attention (docs/CONTRACT.md "2. SDPA").

Semantics are exactly ``torch.nn.functional.scaled_dot_product_attention`` with
``dropout_p=0``, plus the contract's convention for a query row with no key left
(fully masked): out = 0, lse = -inf, zero gradients.

Shapes: ``query [*bq, Hq, L, E]``, ``key [*bk, Hk, S, E]``, ``value [*bv, Hv, S, Ev]``
(rank 3 is ``[N, L, E]``: the "head" dim -3 is then N), broadcast as PyTorch's SDPA does
(``attention_oracle/validation.py``): the batch dims against each other; without ``enable_gqa``
the head dims too (out has the broadcast count); with it, Hq is a multiple of Hk and of Hv and
query head h uses key head ``h // (Hq // Hk)`` and value head ``h // (Hq // Hv)``. The gradient
of a broadcast operand is the sum over its copies.

Memory: the work is chunked over queries. Per chunk the float64 intermediates (scores,
probabilities, dP, dS and their absolute-term twins) take about
``8 * B * Hq * chunk * S * 8`` bytes; the chunk is chosen so that this stays under
``chunk_bytes`` (default 1 GiB), at least one query per chunk. Beyond that the oracle holds
float64 copies of q, k, v (k and v expanded to Hq heads), out, lse and the gradients.
"""
from __future__ import annotations

import math

import torch

from ..validation import check_sdpa_inputs
from . import flash
from .apriori import apriori_bounds

# the standard algorithms of the lp ensemble: both oracles' three, and for float32 the flash
# algorithm on 3xTF32 tensor cores (PyTorch's fp32 EFFICIENT kernels on sm_80 and newer)
ALGORITHMS = flash.ALGORITHMS + ("tf32x3",)

__all__ = [
    "ALGORITHMS",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_with_lse",
    "sdpa_reference",
]

DEFAULT_CHUNK_BYTES = 1 << 30


# ----------------------------------------------------------------------------- broadcasting
# (the checks themselves are attention_oracle/validation.py's, shared with fast)


def _broadcast_operands(query, key, value, batch, hq, hk, hv):
    """(query, key, value) with what PyTorch's SDPA broadcasts spelled out: query
    ``batch + (Hq, L, E)``, key and value ``batch + (H, S, .)`` with their heads repeated to
    H = lcm(Hk, Hv) where enable_gqa gives them different counts (views, but for that repeat);
    None when nothing is broadcast."""
    h = math.lcm(hk, hv)
    k = key if h == hk else key.repeat_interleave(h // hk, dim=-3)
    v = value if h == hv else value.repeat_interleave(h // hv, dim=-3)
    shapes = (batch + (hq,) + tuple(query.shape[-2:]), batch + (h,) + tuple(k.shape[-2:]),
              batch + (h,) + tuple(v.shape[-2:]))
    if (k is key and v is value and query.shape == shapes[0] and key.shape == shapes[1]
            and value.shape == shapes[2]):
        return None
    return query.expand(shapes[0]), k.expand(shapes[1]), v.expand(shapes[2])


def _sum_onto(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The gradient of a broadcast (or head-repeated) operand summed onto ``like``'s shape:
    repeated head j is head ``j // r`` of ``like``."""
    h = like.shape[-3]
    if grad.shape[-3] != h:
        r = grad.shape[-3] // h
        grad = grad.reshape(tuple(grad.shape[:-3]) + (h, r) + tuple(grad.shape[-2:])).sum(-3)
    return grad.sum_to_size(like.shape)


def _reference_broadcast(wide, originals, dout, magnitudes, kwargs) -> dict:
    """:func:`sdpa_reference` on the broadcast operands ``wide``; gradients summed back onto
    ``originals``' shapes."""
    if magnitudes and dout is not None and any(w.numel() != o.numel() for w, o in zip(wide, originals)):
        raise NotImplementedError("magnitudes=True with dout for broadcast query/key/value: the "
                                  "gradient of a broadcast operand sums its copies, whose "
                                  "per-element magnitudes are not computed")
    result = sdpa_reference(*wide, dout, magnitudes=magnitudes, **kwargs)
    if dout is not None:
        for name, like in zip(("dq", "dk", "dv"), originals):
            result[name] = _sum_onto(result[name], like)
    return result


# ----------------------------------------------------------------------------- the math


def _as_bhld(t: torch.Tensor) -> torch.Tensor:
    """[*batch, H, L, D] (or [N, L, D]) -> [B, H, L, D], B the product of batch dims."""
    return t.reshape((math.prod(t.shape[:-3]),) + tuple(t.shape[-3:]))   # -1 is ambiguous for L = 0


def _chunk_rows(b: int, h: int, s: int, chunk_bytes: int) -> int:
    per_query = 8 * max(b * h, 1) * max(s, 1) * 8  # an empty batch or no head: one chunk
    return max(1, chunk_bytes // per_query)


def lp_algorithms(dtype: torch.dtype, algorithms=ALGORITHMS) -> tuple[str, ...]:
    """The members of ``algorithms`` that differ in ``dtype``: "tf32x3" only for float32 (the
    16-bit inputs, P and dS are exact in TF32, so it is the flash member there)."""
    return tuple(a for a in algorithms if a != "tf32x3" or dtype == torch.float32)


def _masked_scores(qc, k, mask_c, is_causal, row0, scale, matmul=torch.matmul):
    """Scaled scores [B, H, c, S] with -inf where a key does not take part."""
    s = matmul(qc, k.transpose(-1, -2)) * scale
    if mask_c is not None:
        if mask_c.dtype == torch.bool:
            s = s.masked_fill(~mask_c, float("-inf"))
        else:
            s = s + mask_c.to(s.dtype)
    if is_causal:
        rows = torch.arange(row0, row0 + qc.shape[-2], device=s.device)[:, None]
        cols = torch.arange(s.shape[-1], device=s.device)[None, :]
        s = s.masked_fill(cols > rows, float("-inf"))
    return s


def _softmax_with_lse(s):
    """P, natural-log lse and lse's terms (|row max| + |log sum|, 0 on empty rows) of masked
    scores; an all -inf row gives P = 0 and lse = -inf."""
    m = s.amax(dim=-1, keepdim=True)
    empty = torch.isneginf(m)
    m_safe = torch.where(empty, torch.zeros_like(m), m)
    p = torch.exp(s - m_safe)
    l = p.sum(dim=-1, keepdim=True)
    log_l = torch.log(torch.where(empty, torch.ones_like(l), l))
    lse = torch.where(empty, m, m_safe + log_l)
    terms = m_safe.abs() + log_l.abs()
    p = torch.where(empty, torch.zeros_like(p), p / torch.where(empty, torch.ones_like(l), l))
    return p, lse.squeeze(-1), terms.squeeze(-1)


def _amax(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


def _accumulation_weights(p, dout_abs, v_abs, out):
    """sqrt(Ev) * P * (|dO| @ |V|^T + rowsum(|dO| * |out|)) ``[b, h, l, s]`` (``dout_abs`` and
    ``v_abs`` given as |dO|, |V|): per score, the sums of absolute products of the two length-Ev
    dot products dP and Delta, scaled by the square root of their length (the probabilistic
    bound on summing them in any order)."""
    terms = torch.matmul(dout_abs, v_abs.transpose(-1, -2))
    terms += (dout_abs * out.abs()).sum(-1, keepdim=True)
    return p * terms * math.sqrt(v_abs.shape[-1])


# ----------------------------------------------------------------------------- algorithms
#
# The agreement rule's lp term is the largest error among the standard algorithms run in the
# implementation's dtype (docs/CONTRACT.md "5. The agreement rule", docs/agreement-rule.md). Besides the naive math
# (scores, softmax, P.V, all in the compute dtype), the oracle runs "prescaled" (q and k
# multiplied by sqrt(scale) in the dtype before the product, then the naive math with scale 1:
# PyTorch's math backend) and "flash" (fused-kernel numerics, ``oracle/flash.py``).


def _accumulate_rows(acc, a, b):
    """``acc`` plus the sum over query rows i of the outer products ``a[..., i, :]^T b[..., i, :]``,
    added one row at a time (the query heads of a GQA group in turn, each in row order);
    each product is rounded, then added. a: [B, Hq, rows, S] (dS or P), b: [B, Hq, rows, D]
    (q or dO), acc: [B, Hkv, S, D], query head j in kv head j // (Hq / Hkv)'s group.

    The fp32 naive run sums dk and dv so: the longest chain of additions a correct kernel
    makes (PyTorch's CPU flash backward: one accumulator per key head across its group's rows,
    finding F13); the prescaled and flash runs keep blocked products (matmuls), so the
    ensemble holds both orders."""
    B, hq, rows = a.shape[:3]
    hkv = acc.shape[1]
    a = a.reshape(B, hkv, hq // hkv, rows, a.shape[-1])
    b = b.reshape(B, hkv, hq // hkv, rows, b.shape[-1])
    for h in range(hq // hkv):
        for i in range(rows):
            acc.add_(a[:, :, h, i, :, None] * b[:, :, h, i, None, :])
    return acc


def _flash_scores(qc, k, mask_c, is_causal, row0, sc, acc, matmul=torch.matmul, natural=False):
    """(r, scale) for ``flash.forward``: raw float32 dots and the scale, or, with an additive
    mask (or a scale <= 0, where a raw row max is not the scaled one, or ``natural``), the
    scaled masked scores and None."""
    natural = natural or (mask_c is not None and mask_c.dtype != torch.bool) or sc <= 0
    r = _masked_scores(qc.to(acc), k.to(acc), mask_c, is_causal, row0, sc if natural else 1.0,
                       matmul)
    return r, (None if natural else sc)


def _backward_scores(qc, k, mask_c, is_causal, row0, scale, acc, tf32x3):
    """The scores a flash backward recomputes, in another summation order than the forward's:
    the dot rounded once from float64 (PyTorch's CPU flash; so P differs from the forward's by
    the forward dot's rounding and a row with one key has P != 1), or for 3xTF32 the same
    split products added in another order."""
    if tf32x3:
        mm = lambda a, b: flash.matmul_tf32x3(a, b, other_order=True)  # noqa: E731
        return _masked_scores(qc.to(acc), k.to(acc), mask_c, is_causal, row0, scale, mm)
    wide = torch.float64 if acc == torch.float32 else acc
    return _masked_scores(qc.to(wide), k.to(wide), mask_c, is_causal, row0, scale).to(acc)


def _flash_chunk(qc, k, v, doc, mask_c, is_causal, row0, sc, cd, acc, tf32x3=False):
    """One query chunk, flash style: out, lse and (with ``doc``) dq and this chunk's dk, dv
    terms in the accumulation dtype; ``tf32x3``: every product on 3xTF32 tensor cores."""
    mm = flash.matmul_tf32x3 if tf32x3 else torch.matmul
    # 3xTF32 (PyTorch's EFFICIENT): the scores scaled, then taken to log2 units, each rounded
    r, r_scale = _flash_scores(qc, k, mask_c, is_causal, row0, sc, acc, mm, natural=tf32x3)
    out, lse, stats = flash.forward(r, v, cd, r_scale, mm)
    if doc is None:
        return out, lse, None
    r = _backward_scores(qc, k, mask_c, is_causal, row0, sc if r_scale is None else 1.0, acc, tf32x3)
    p = flash.probabilities(r, lse, r_scale, stats)
    do = doc.to(acc)
    dp = mm(do, v.to(acc).transpose(-1, -2))
    ds, p = flash.softmax_backward(p, dp, do, out, cd)
    grads = (mm(ds, k.to(acc)) * sc, mm(ds.transpose(-1, -2), qc.to(acc)) * sc,
             mm(p.transpose(-1, -2), do))
    return out, lse, grads


def sdpa_reference(query, key, value, dout=None, *, attn_mask=None, is_causal=False, scale=None,
                   enable_gqa=False, compute_dtype=torch.float64, chunk_bytes=DEFAULT_CHUNK_BYTES,
                   magnitudes=False, algorithm="naive", apriori=False) -> dict:
    """Forward (and, with ``dout``, backward) of SDPA computed in ``compute_dtype``.

    float64 with ``algorithm="naive"`` gives the gold result; the input dtype gives the
    rounding the dtype forces (the ``lp`` of the agreement rule) for one of the standard
    ``ALGORITHMS`` (see above): "naive" (every operation in ``compute_dtype``), "prescaled"
    (q, k times sqrt(scale) first), "flash" (fused-kernel numerics) or, for float32,
    "tf32x3" (flash on 3xTF32 products). Returns a dict with
    ``out`` [*batch, Hq, L, Ev], ``lse`` [*batch, Hq, L] and, with dout, ``dq``, ``dk``, ``dv``
    shaped as the inputs. With ``magnitudes=True`` (naive only) also ``magnitude``: for each
    output, the largest sum of absolute terms behind one element (used for the agreement
    rule's absolute floor): out: P @ |V|; dq: scale * (P * (|dP| + |Delta|)) @ |K|; dk: the
    transpose with |Q|; dv: P^T @ |dO|; lse: |row max| + |log sum of weights| (the two terms
    lse adds). With dout also ``magnitude_acc`` {dq, dk}: the floor's accumulation term,
    sqrt(Ev) * scale * (P * (|dO| @ |V|^T + rowsum(|dO| * |out|))) @ |K| (and its transpose
    with |Q|): the sums of absolute products behind dP and Delta, the two length-Ev dot
    products whose difference dS cancels (docs/agreement-rule.md, "The floor"). With
    magnitudes=True and ``apriori=True`` also ``apriori`` {output: float}: the rule's a-priori
    term (the checks ask for it on float32 cases) in units of the
    accumulation dtype's unit roundoff (the largest first-order error the exponent argument's
    rounding can cause in an element; docs/agreement-rule.md, "The a-priori term").
    """
    batch, hq, hk, hv, sc = check_sdpa_inputs(query, key, value, attn_mask, 0.0, is_causal, scale,
                                              enable_gqa, autograd=False)
    wide = _broadcast_operands(query, key, value, batch, hq, hk, hv)
    if wide is not None:
        kwargs = dict(attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                      compute_dtype=compute_dtype, chunk_bytes=chunk_bytes, algorithm=algorithm,
                      apriori=apriori)
        return _reference_broadcast(wide, (query, key, value), dout, magnitudes, kwargs)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if magnitudes and algorithm != "naive":
        raise ValueError("magnitudes=True is computed with algorithm='naive' only")
    cd = compute_dtype
    q = _as_bhld(query).to(cd)
    k = _as_bhld(key).to(cd)
    v = _as_bhld(value).to(cd)
    root = q_root = 1.0
    if algorithm == "prescaled":  # as PyTorch's math backend: (q * sqrt(scale)) @ (k * sqrt(scale))^T,
        root = math.sqrt(abs(sc))  # a negative scale negating q
        q_root, sc = math.copysign(root, sc), 1.0
        q, k = q * q_root, k * root
    fused = algorithm in ("flash", "tf32x3")
    acc = flash.accumulation_dtype(cd) if fused else cd
    b, hq, l_q, _ = q.shape
    hkv, s_k = k.shape[1], k.shape[2]
    group = hq // hkv if hkv else 1  # no kv head: no query head either (validation)
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    mask = None
    if attn_mask is not None:
        mask = attn_mask.expand(tuple(query.shape[:-1]) + (s_k,))
    do = None if dout is None else _as_bhld(dout).to(cd)

    out = q.new_zeros((b, hq, l_q, v.shape[-1]))
    lse = q.new_zeros((b, hq, l_q), dtype=flash.lse_dtype(acc) if fused else cd)
    grads = rows_chained = None
    if do is not None:
        grads = {"dq": torch.zeros_like(q), "dk": None, "dv": None}
        if cd == torch.float32 and algorithm == "naive":  # dk, dv per key head, one chain
            rows_chained = (q.new_zeros((b, hkv, s_k, k.shape[-1])),
                            q.new_zeros((b, hkv, s_k, v.shape[-1])))
        else:
            grads.update(dk=torch.zeros_like(k, dtype=acc), dv=torch.zeros_like(v, dtype=acc))
    mags = {"out": 0.0, "lse": 0.0, "dq": 0.0}
    mags_acc = {"dq": 0.0}
    mag_dk = torch.zeros_like(k) if (magnitudes and do is not None) else None
    mag_dv = torch.zeros_like(v) if (magnitudes and do is not None) else None
    acc_dk = torch.zeros_like(k) if (magnitudes and do is not None) else None
    k_abs, v_abs = (k.abs(), v.abs()) if magnitudes else (None, None)
    with_apriori = magnitudes and apriori
    apriori_max = {"out": 0.0, "lse": 0.0, "dq": 0.0}
    apr_dk = torch.zeros_like(k) if (with_apriori and do is not None) else None
    apr_dv = torch.zeros_like(v) if (with_apriori and do is not None) else None

    step = _chunk_rows(b, hq, s_k, chunk_bytes)
    if s_k == 0:  # no key: every row is empty (out = 0, lse = -inf, zero gradients)
        lse.fill_(float("-inf"))
        l_q = 0
    for r0 in range(0, l_q, step):
        r1 = min(l_q, r0 + step)
        qc = q[:, :, r0:r1]
        mask_c = None
        if mask is not None:
            mask_c = mask[..., r0:r1, :].reshape(b, hq, r1 - r0, s_k)
        if fused:
            doc = None if do is None else do[:, :, r0:r1]
            out[:, :, r0:r1], lse[:, :, r0:r1], g = _flash_chunk(
                qc, k, v, doc, mask_c, is_causal, r0, sc, cd, acc,
                tf32x3=algorithm == "tf32x3" and acc == torch.float32)
            if g is not None:
                grads["dq"][:, :, r0:r1] = g[0]
                grads["dk"] += g[1]
                grads["dv"] += g[2]
            continue
        s = _masked_scores(qc, k, mask_c, is_causal, r0, sc)
        p, lse_c, lse_terms = _softmax_with_lse(s)
        oc = torch.matmul(p, v)
        out[:, :, r0:r1] = oc
        lse[:, :, r0:r1] = lse_c
        if magnitudes:
            mags["out"] = max(mags["out"], _amax(torch.matmul(p, v_abs)))
            mags["lse"] = max(mags["lse"], _amax(lse_terms))
        if do is None:
            if with_apriori:
                bounds = apriori_bounds(qc, k_abs, v, s, p, lse_c, oc, sc)
                apriori_max.update({n: max(apriori_max[n], _amax(bounds[n])) for n in ("out", "lse")})
            continue
        doc = do[:, :, r0:r1]
        dp = torch.matmul(doc, v.transpose(-1, -2))
        delta = (doc * oc).sum(-1, keepdim=True)
        if with_apriori:
            bounds = apriori_bounds(qc, k_abs, v, s, p, lse_c, oc, sc, doc, dp, delta)
            apriori_max.update({n: max(apriori_max[n], _amax(bounds[n]))
                                for n in ("out", "lse", "dq")})
            apr_dk += bounds["dk"]
            apr_dv += bounds["dv"]
        ds = p * (dp - delta)
        grads["dq"][:, :, r0:r1] = torch.matmul(ds, k) * sc
        if rows_chained is not None:
            _accumulate_rows(rows_chained[0], ds, qc)
            _accumulate_rows(rows_chained[1], p, doc)
        else:
            grads["dk"] += torch.matmul(ds.transpose(-1, -2), qc) * sc
            grads["dv"] += torch.matmul(p.transpose(-1, -2), doc)
        if magnitudes:
            qc_abs, doc_abs = qc.abs(), doc.abs()
            w = p * (dp.abs() + delta.abs())
            mags["dq"] = max(mags["dq"], _amax(torch.matmul(w, k_abs) * sc))
            mag_dk += torch.matmul(w.transpose(-1, -2), qc_abs) * sc
            mag_dv += torch.matmul(p.transpose(-1, -2), doc_abs)
            w_acc = _accumulation_weights(p, doc_abs, v_abs, oc)
            mags_acc["dq"] = max(mags_acc["dq"], _amax(torch.matmul(w_acc, k_abs) * sc))
            acc_dk += torch.matmul(w_acc.transpose(-1, -2), qc_abs) * sc

    result = {
        "out": out.reshape(tuple(query.shape[:-1]) + (v.shape[-1],)),
        "lse": lse.reshape(tuple(query.shape[:-1])),
    }
    if grads is not None:
        dk, dv = grads["dk"], grads["dv"]
        if rows_chained is not None:
            dk, dv = rows_chained[0] * sc, rows_chained[1]
        elif group > 1:  # sum the expanded heads back onto their kv head
            dk = dk.reshape(b, hkv, group, s_k, -1).sum(2)
            dv = dv.reshape(b, hkv, group, s_k, -1).sum(2)
        if group > 1:
            if mag_dk is not None:
                mag_dk = mag_dk.reshape(b, hkv, group, s_k, -1).sum(2)
                mag_dv = mag_dv.reshape(b, hkv, group, s_k, -1).sum(2)
                acc_dk = acc_dk.reshape(b, hkv, group, s_k, -1).sum(2)
            if apr_dk is not None:
                apr_dk = apr_dk.reshape(b, hkv, group, s_k, -1).sum(2)
                apr_dv = apr_dv.reshape(b, hkv, group, s_k, -1).sum(2)
        dq = grads["dq"]
        if algorithm == "prescaled":  # the chain rule through q * sqrt(scale), k * sqrt(scale)
            dq, dk = dq * q_root, dk * root
        grads["dq"], dk, dv = dq, dk.to(cd), dv.to(cd)
        result["dq"] = grads["dq"].reshape(query.shape)
        result["dk"] = dk.reshape(key.shape)
        result["dv"] = dv.reshape(value.shape)
        if magnitudes:
            mags["dk"] = _amax(mag_dk)
            mags["dv"] = _amax(mag_dv)
            mags_acc["dk"] = _amax(acc_dk)
            result["magnitude_acc"] = mags_acc
            if apr_dk is not None:
                apriori_max.update(dk=_amax(apr_dk), dv=_amax(apr_dv))
    if magnitudes:
        result["magnitude"] = mags
    if with_apriori:
        result["apriori"] = apriori_max
    return result


# ----------------------------------------------------------------------------- public API


class _OracleSDPA(torch.autograd.Function):
    """Forward in float64; backward written out (sdpa_reference with dout), not autograd."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, is_causal, scale, enable_gqa):
        ref = sdpa_reference(query, key, value, attn_mask=attn_mask, is_causal=is_causal,
                             scale=scale, enable_gqa=enable_gqa)
        ctx.save_for_backward(query, key, value, attn_mask)
        ctx.flags = (is_causal, scale, enable_gqa)
        ctx.mark_non_differentiable(ref["lse"])
        return ref["out"].to(query.dtype), ref["lse"].to(torch.float32)

    @staticmethod
    def backward(ctx, dout, _dlse):
        query, key, value, attn_mask = ctx.saved_tensors
        is_causal, scale, enable_gqa = ctx.flags
        ref = sdpa_reference(query, key, value, dout, attn_mask=attn_mask, is_causal=is_causal,
                             scale=scale, enable_gqa=enable_gqa)
        return (ref["dq"].to(query.dtype), ref["dk"].to(key.dtype), ref["dv"].to(value.dtype),
                None, None, None, None)


def scaled_dot_product_attention_with_lse(query, key, value, attn_mask=None, dropout_p=0.0,
                                          is_causal=False, scale=None, enable_gqa=False):
    """Like :func:`scaled_dot_product_attention`, also returning lse [*batch, Hq, L] (float32, ln)."""
    check_sdpa_inputs(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return _OracleSDPA.apply(query, key, value, attn_mask, bool(is_causal), scale, bool(enable_gqa))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """PyTorch's signature; out [*batch, Hq, L, Ev] in the input dtype, computed in float64."""
    out, _ = scaled_dot_product_attention_with_lse(query, key, value, attn_mask, dropout_p,
                                                   is_causal, scale, enable_gqa)
    return out
