"""DSA sparse attention oracle (docs/CONTRACT.md "3. DSA sparse attention"), float64 reference in plain PyTorch.

Shapes and conventions
----------------------
* NoPE: ``q [T, H, D]``, ``kv [S, D]`` or ``[S, 1, D]``; scores ``scale * q . kv[idx]``, values
  ``kv[idx]``. Internally NoPE is the RoPE math with no rope part (``q_rope = k_rope = None``).
* RoPE: ``q_latent [T, H, Dl]``, ``q_rope [T, H, Dr]``, ``kv_latent [S, Dl]`` (or ``[S, 1, Dl]``),
  ``k_rope [S, Dr]`` (or ``[S, 1, Dr]``); scores
  ``scale * (q_latent . kv_latent[idx] + q_rope . k_rope[idx])``, values ``kv_latent[idx]``.
* ``indices [T, K]`` int32/int64 global rows. Slot ``s`` of token ``t`` is valid iff
  ``0 <= indices[t, s] < S`` and ``s < topk_length[t]`` when ``topk_length`` is given. Invalid
  slots contribute nothing; duplicates count once per slot (softmax and gradient).
* ``softmax_scale=None`` means ``1/sqrt(Dl + Dr)`` (RoPE) or ``1/sqrt(D)`` (NoPE).
* Outputs: ``out [T, H, Dv]`` (Dv = Dl, or D for NoPE) in the input dtype, ``lse [T, H]`` float32
  natural log. A row without valid slot gives out = 0, lse = -inf, dq = 0 and adds nothing to
  the key gradients.
* Gradients (explicit backward, never autograd through the forward): ``dq_latent``, ``dq_rope``,
  ``dkv_latent = dK_latent + dV`` and ``dk_rope``, scattered with ``index_add_``.

Memory
------
The work is done in chunks of queries. The chunk is chosen so that the estimated transient
memory of one chunk (gathered key rows, scores, probabilities, per-slot key gradients and,
when asked, the magnitude terms) stays below ``chunk_bytes`` (default 2 GiB); a single query
is always processed even if it alone exceeds the budget. Beyond that, memory holds the results
(``out``, ``lse``, ``dq*`` in the result dtype) and the key-gradient accumulators
(``(S + 1) x (Dl + Dr)`` in the compute dtype, float32 for 16-bit compute dtypes, plus the
same again in float64 for magnitudes).
Everything runs on the device of the inputs.

Measured on one H200 (torch 2.11): the full packed_glm_a geometry (T 16231, S 268757, H 64,
Dl 512, Dr 64, top-k 2048, bf16 inputs) takes 2.4-2.7 s for the float64 gold forward +
backward + magnitudes with the default 2 GiB budget, peak extra memory 11.6 GiB (9.6 GiB of
float64 results, 2.0 GiB transient including 1.15 GiB of magnitude accumulators); the public
bf16 autograd forward + backward takes 3.4 s with a 4.5 GiB peak. The per-chunk estimate is
conservative: the measured chunk transient is about half of ``chunk_bytes``. The gold figure
is reproduced by ``tests/test_oracle_dsa.py::test_packed_glm_a_full_size_fits_budget``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..validation import check_dsa_inputs, check_flags, floating_tensor, key_rows
from . import flash
from .apriori import apriori_bounds
from .flash import ALGORITHMS
from .index import offset_gather_kv_indices

__all__ = [
    "dsa_sparse_attention_nope",
    "dsa_sparse_attention",
    "dsa_sparse_attention_nope_varlen",
    "dsa_sparse_attention_varlen",
    "dsa_reference",
    "ALGORITHMS",
    "DEFAULT_CHUNK_BYTES",
]

DEFAULT_CHUNK_BYTES = 2 * 2**30
_MAGNITUDE_DTYPE = torch.float64


# --------------------------------------------------------------------------- operands

@dataclass
class _Operands:
    """Validated operands, key tensors flattened to 2-D views (``[S, Dl]``, ``[S, Dr]``)."""

    q_latent: torch.Tensor          # [T, H, Dl]
    q_rope: torch.Tensor | None     # [T, H, Dr]
    kv_latent: torch.Tensor         # [S, Dl]
    k_rope: torch.Tensor | None     # [S, Dr]
    indices: torch.Tensor           # [T, K]
    topk_length: torch.Tensor | None
    scale: float

    @property
    def T(self) -> int:
        return self.q_latent.shape[0]

    @property
    def H(self) -> int:
        return self.q_latent.shape[1]

    @property
    def S(self) -> int:
        return self.kv_latent.shape[0]

    @property
    def K(self) -> int:
        return self.indices.shape[1]

    @property
    def Dl(self) -> int:
        return self.q_latent.shape[2]

    @property
    def Dr(self) -> int:
        return 0 if self.q_rope is None else self.q_rope.shape[2]


def _validate_operands(q_latent, q_rope, kv_latent, k_rope, indices, topk_length,
                       softmax_scale, rope=None) -> _Operands:
    """Check every operand (attention_oracle/validation.py; ``rope`` as there) and return them
    normalised; errors name the offending argument."""
    kv2, kr2, scale = check_dsa_inputs(q_latent, q_rope, kv_latent, k_rope, indices, topk_length,
                                       softmax_scale, rope=rope)
    return _Operands(q_latent, q_rope, kv2, kr2, indices, topk_length, scale)


def _validate_dout(dout, ops: _Operands) -> None:
    floating_tensor("dout", dout)
    expected = (ops.T, ops.H, ops.Dl)
    if tuple(dout.shape) != expected:
        raise ValueError(f"dout must have shape {list(expected)}, got {tuple(dout.shape)}")
    if dout.device != ops.q_latent.device:
        raise ValueError(f"dout is on {dout.device} but the queries are on {ops.q_latent.device}")


# --------------------------------------------------------------------------- chunking

def _bytes_per_query(ops: _Operands, compute_itemsize: int, grads: bool, magnitude: bool,
                     apriori: bool = False) -> int:
    """Conservative estimate of the transient bytes one query costs inside a chunk."""
    K, H, Dl, Dr = max(ops.K, 1), ops.H, ops.Dl, ops.Dr
    rows, head_rows, scores = K * (Dl + Dr), H * (Dl + Dr), H * K
    in_itemsize = ops.q_latent.element_size()
    total = 2 * rows * max(compute_itemsize, in_itemsize)   # gathered rows (+ raw gather)
    total += compute_itemsize * (4 * scores + 3 * head_rows)
    if grads:
        total += compute_itemsize * (4 * scores + 2 * rows + 3 * head_rows)
    if magnitude:
        m = torch.finfo(_MAGNITUDE_DTYPE).bits // 8
        total += m * (2 * rows + 5 * scores + (2 * rows if grads else 0) + 3 * head_rows)
        if grads:  # the accumulation terms: |dout| @ |kv|^T and their products
            total += m * (3 * scores + rows + 2 * head_rows)
    if apriori:  # scores again, |q k|, rho and the weights, the bounds' rows (_Apriori)
        total += compute_itemsize * (10 * scores + 4 * rows + 4 * head_rows)
    return total + 64 * K  # index, validity and routing vectors


def _queries_per_chunk(ops: _Operands, compute_dtype: torch.dtype, grads: bool,
                       magnitude: bool, chunk_bytes: int, apriori: bool = False) -> int:
    if not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool) or chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
    itemsize = torch.finfo(compute_dtype).bits // 8
    per_query = _bytes_per_query(ops, itemsize, grads, magnitude, apriori)
    return max(1, min(max(ops.T, 1), chunk_bytes // per_query))


# --------------------------------------------------------------------------- chunk math

@dataclass
class _Chunk:
    """Per-chunk tensors in the compute dtype: gathered rows and the forward result."""

    valid: torch.Tensor       # bool [c, K]
    route: torch.Tensor       # int64 [c, K]: key row, or S (a spill row) for invalid slots
    ql: torch.Tensor          # [c, H, Dl]
    qr: torch.Tensor | None   # [c, H, Dr]
    kl: torch.Tensor          # [c, K, Dl] gathered latent rows (keys and values), 0 at invalid
    kr: torch.Tensor | None   # [c, K, Dr]
    P: torch.Tensor           # [c, H, K] probabilities, 0 at invalid slots
    out: torch.Tensor         # [c, H, Dl]
    lse: torch.Tensor         # [c, H]
    lse_terms: torch.Tensor   # [c, H]: |row max| + |log(sum of weights)|, the terms lse adds
    # the score side of the product, scores = a * b * (qs . ks): ql, kl, qr, kr with
    # a = b = scale, except with "prescaled" (qs = q * a, ks = k * b, a = +-b = +-sqrt(|scale|)):
    # dq = a * dS ks, dk = b * dS^T qs
    qs: torch.Tensor | None = None
    ks: torch.Tensor | None = None
    qrs: torch.Tensor | None = None
    krs: torch.Tensor | None = None
    q_factor: float = 1.0
    k_factor: float = 1.0


def _gather_rows(source: torch.Tensor, safe: torch.Tensor, valid: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
    """``source[safe]`` in ``dtype`` with invalid slots zeroed (so non-finite rows stay out)."""
    if source.shape[0] == 0:
        return torch.zeros(*safe.shape, source.shape[1], dtype=dtype, device=source.device)
    rows = source[safe].to(dtype)
    return rows.masked_fill_(~valid[..., None], 0)


def _scores(qs, ks, qrs, krs, valid, scale, dtype):
    """``scale * (qs . ks + qrs . krs)`` [c, H, K] in ``dtype`` (products of the operands'
    values, accumulated in ``dtype``), -inf at invalid slots."""
    scores = torch.matmul(qs.to(dtype), ks.to(dtype).transpose(1, 2))
    if qrs is not None:
        scores.baddbmm_(qrs.to(dtype), krs.to(dtype).transpose(1, 2))
    if scale != 1.0:
        scores.mul_(scale)
    return scores.masked_fill_(~valid[:, None, :], float("-inf"))


def _forward_chunk(ops: _Operands, start: int, stop: int, cd: torch.dtype,
                   algorithm: str = "naive") -> _Chunk:
    idx = ops.indices[start:stop].to(torch.int64)
    valid = (idx >= 0) & (idx < ops.S)
    if ops.topk_length is not None:
        slots = torch.arange(ops.K, device=idx.device)
        valid &= slots[None, :] < ops.topk_length[start:stop].to(torch.int64)[:, None]
    safe = torch.where(valid, idx, 0)
    route = torch.where(valid, idx, ops.S)
    ql = ops.q_latent[start:stop].to(cd)
    kl = _gather_rows(ops.kv_latent, safe, valid, cd)
    qr = kr = None
    if ops.q_rope is not None:
        qr = ops.q_rope[start:stop].to(cd)
        kr = _gather_rows(ops.k_rope, safe, valid, cd)
    side = dict(qs=ql, ks=kl, qrs=qr, krs=kr, q_factor=ops.scale, k_factor=ops.scale)
    if algorithm == "flash":  # oracle/flash.py; P is the backward's, recomputed from lse
        r_scale = ops.scale if ops.scale > 0 else None  # raw dots, unless a raw max is not the max
        acc = flash.accumulation_dtype(cd)
        r = _scores(ql, kl, qr, kr, valid, 1.0 if r_scale else ops.scale, acc)
        out, lse, stats = flash.forward(r, kl, cd, r_scale)
        # the backward's scores in another summation order (the dot rounded once from float64)
        wide = torch.float64 if acc == torch.float32 else acc
        r = _scores(ql, kl, qr, kr, valid, 1.0 if r_scale else ops.scale, wide).to(acc)
        P = flash.probabilities(r, lse, r_scale, stats)
        return _Chunk(valid, route, ql, qr, kl, kr, P, out, lse, torch.zeros_like(lse), **side)
    scale = ops.scale
    if algorithm == "prescaled":  # PyTorch's math backend: (q * sqrt(scale)) . (k * sqrt(scale))
        root = math.sqrt(abs(ops.scale))
        q_root = math.copysign(root, ops.scale)   # a negative scale negates q
        side = dict(qs=ql * q_root, ks=kl * root, qrs=None if qr is None else qr * q_root,
                    krs=None if kr is None else kr * root, q_factor=q_root, k_factor=root)
        scale = 1.0
    scores = _scores(side["qs"], side["ks"], side["qrs"], side["krs"], valid, scale, cd)
    row_max = scores.amax(dim=2, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, 0)   # empty rows: all -inf
    weights = torch.exp_(scores.sub_(row_max))                    # 0 at invalid slots
    total = weights.sum(dim=2, keepdim=True)
    log_total = torch.log(total)
    lse = (row_max + log_total).squeeze(2)                        # log(0) = -inf for empty rows
    lse_terms = (row_max.abs() + log_total.abs()).squeeze(2)
    P = weights.div_(torch.where(total > 0, total, 1))
    out = torch.matmul(P, kl)
    return _Chunk(valid, route, ql, qr, kl, kr, P, out, lse, lse_terms, **side)


@dataclass
class _ChunkGrads:
    dq_latent: torch.Tensor            # [c, H, Dl]
    dq_rope: torch.Tensor | None       # [c, H, Dr]
    dkv_slots: torch.Tensor            # [c, K, Dl]: dK_latent + dV per slot
    dkr_slots: torch.Tensor | None     # [c, K, Dr]
    dP: torch.Tensor                   # [c, H, K]
    delta: torch.Tensor                # [c, H, 1]


def _backward_chunk(ch: _Chunk, dout: torch.Tensor) -> _ChunkGrads:
    """Softmax backward: dS = P * (dP - Delta), Delta = rowsum(dout * out).

    In the dtype of ``ch.P``: the compute dtype, or float32 for a flash chunk of 16-bit
    inputs, where dS and P are rounded to the inputs' dtype before the products (as flash
    kernels feed them to their tensor-core dots) and the products accumulate in float32.
    """
    acc, cd = ch.P.dtype, ch.kl.dtype
    do = dout.to(acc)
    dP = torch.matmul(do, ch.kl.to(acc).transpose(1, 2))
    delta = (do * ch.out.to(acc)).sum(dim=2, keepdim=True)
    if acc == cd:
        dS, P = ch.P * (dP - delta), ch.P
    else:
        dS, P = flash.softmax_backward(ch.P, dP, do, ch.out, cd)
    fq, fk = ch.q_factor, ch.k_factor
    dq_latent = torch.matmul(dS, ch.ks.to(acc)).mul_(fq)
    dS_t = dS.transpose(1, 2)
    dkv_slots = torch.baddbmm(torch.matmul(P.transpose(1, 2), do), dS_t, ch.qs.to(acc), alpha=fk)
    dq_rope = dkr_slots = None
    if ch.qr is not None:
        dq_rope = torch.matmul(dS, ch.krs.to(acc)).mul_(fq)
        dkr_slots = torch.matmul(dS_t, ch.qrs.to(acc)).mul_(fk)
    return _ChunkGrads(dq_latent, dq_rope, dkv_slots, dkr_slots, dP, delta)


def _key_gradient_rows(dkv: torch.Tensor | None, dkr: torch.Tensor | None) -> dict:
    """{"dkv_latent", "dk_rope": the accumulator's rows without the spill row} (present ones)."""
    rows = {"dkv_latent": dkv, "dk_rope": dkr}
    return {name: acc[:-1] for name, acc in rows.items() if acc is not None}


class _AbsoluteRows:
    """A chunk's operands as float64 absolute values (computed once for every magnitude term)."""

    def __init__(self, ch: _Chunk):
        md = _MAGNITUDE_DTYPE
        self.route = ch.route.reshape(-1)
        self.kl, self.ql = ch.kl.to(md).abs(), ch.ql.to(md).abs()
        self.kr = None if ch.kr is None else ch.kr.to(md).abs()
        self.qr = None if ch.qr is None else ch.qr.to(md).abs()


class _Magnitudes:
    """Running maxima of the sums of absolute terms behind each output element (float64).

    They give the suite an absolute error floor where a result cancels to (near) zero:
    out: sum_s P |V|; lse: |row max| + |log sum|; dq: scale sum_s P (|dP| + |Delta|) |K|; dkv row r:
    scale sum_{(t,h,s) -> r} P (|dP| + |Delta|) |q| + sum P |dout|.

    ``acc`` holds the floor's accumulation terms of the gradients whose dS cancels: the same
    sums with |dP| + |Delta| replaced by sqrt(Dl) (|dout| . |kv_latent[s]| + |dout| . |out|),
    the sums of absolute products of those two length-Dl dot products (docs/agreement-rule.md).
    """

    def __init__(self, ops: _Operands, grads: bool):
        self.values = {"out": 0.0, "lse": 0.0}
        self.acc = {}
        self.dkv = self.dkr = self.acc_dkv = self.acc_dkr = None
        if grads:
            self.values.update(dq_latent=0.0, dkv_latent=0.0)
            self.acc.update(dq_latent=0.0, dkv_latent=0.0)
            dev = ops.q_latent.device
            self.dkv = torch.zeros(ops.S + 1, ops.Dl, dtype=_MAGNITUDE_DTYPE, device=dev)
            self.acc_dkv = torch.zeros_like(self.dkv)
            if ops.q_rope is not None:
                self.values.update(dq_rope=0.0, dk_rope=0.0)
                self.acc.update(dq_rope=0.0, dk_rope=0.0)
                self.dkr = torch.zeros(ops.S + 1, ops.Dr, dtype=_MAGNITUDE_DTYPE, device=dev)
                self.acc_dkr = torch.zeros_like(self.dkr)

    def _raise(self, key: str, tensor: torch.Tensor, table: dict | None = None) -> None:
        table = self.values if table is None else table
        if tensor.numel():
            table[key] = max(table[key], float(tensor.max()))

    def add_forward(self, ch: _Chunk) -> None:
        md = _MAGNITUDE_DTYPE
        P = ch.P.to(md)
        self._raise("out", torch.matmul(P, ch.kl.to(md).abs()))
        # lse = row max + log(sum): the floor scales with those terms (they can cancel)
        finite = ch.lse_terms[torch.isfinite(ch.lse)]
        self._raise("lse", finite.to(md))

    def add_backward(self, ch: _Chunk, g: _ChunkGrads, dout: torch.Tensor, scale: float) -> None:
        md = _MAGNITUDE_DTYPE
        P = ch.P.to(md)
        dout_abs = dout.to(md).abs()
        rows = _AbsoluteRows(ch)
        A = P * (g.dP.to(md).abs() + g.delta.to(md).abs())
        self._tally(A, rows, abs(scale), self.values, self.dkv, self.dkr,
                    dv_slots=torch.matmul(P.transpose(1, 2), dout_abs))
        terms = torch.matmul(dout_abs, rows.kl.transpose(1, 2))
        terms += (dout_abs * ch.out.to(md).abs()).sum(dim=2, keepdim=True)
        W = P * terms * math.sqrt(ch.kl.shape[2])
        self._tally(W, rows, abs(scale), self.acc, self.acc_dkv, self.acc_dkr)

    def _tally(self, weights: torch.Tensor, rows: _AbsoluteRows, scale: float, table: dict,
               dkv: torch.Tensor, dkr: torch.Tensor | None, dv_slots: torch.Tensor | None = None) -> None:
        """Raise ``table``'s dq terms to scale * weights @ |k| and add the key-gradient terms
        scale * weights^T @ |q| (plus ``dv_slots``) onto the rows they route to."""
        route = rows.route
        w_t = weights.transpose(1, 2)
        self._raise("dq_latent", torch.matmul(weights, rows.kl).mul_(scale), table)
        slots = torch.matmul(w_t, rows.ql).mul_(scale)
        if dv_slots is not None:
            slots += dv_slots
        dkv.index_add_(0, route, slots.reshape(-1, slots.shape[2]))
        if dkr is not None:
            self._raise("dq_rope", torch.matmul(weights, rows.kr).mul_(scale), table)
            slots = torch.matmul(w_t, rows.qr).mul_(scale)
            # the row count spelled out: reshape(-1, 0) of no elements is ambiguous (Dr 0)
            dkr.index_add_(0, route, slots.reshape(route.numel(), slots.shape[2]))

    def key_rows(self) -> dict:
        """Per-element magnitudes of the key gradients (float64 ``[S, D]``): a caller that runs
        the oracle in query chunks sums these over chunks before taking the maximum."""
        return _key_gradient_rows(self.dkv, self.dkr)

    def accumulation_rows(self) -> dict:
        """The accumulation terms of the key gradients per element (as :meth:`key_rows`)."""
        return _key_gradient_rows(self.acc_dkv, self.acc_dkr)

    def finish(self) -> dict:
        if self.dkv is not None:
            self._raise("dkv_latent", self.dkv[:-1])
            self._raise("dkv_latent", self.acc_dkv[:-1], self.acc)
        if self.dkr is not None:
            self._raise("dk_rope", self.dkr[:-1])
            self._raise("dk_rope", self.acc_dkr[:-1], self.acc)
        return dict(self.values)


# --------------------------------------------------------------------------- driver

def _accumulator_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """The key-gradient scatter-add accumulates 16-bit terms in float32 and rounds once.

    That is how torch's own reductions (sum, matmul) treat fp16/bf16 inputs, and how every
    kernel accumulates dK/dV; rounding at each of thousands of additions would measure an
    error the dtype does not force and widen the agreement rule's bound for dkv.
    """
    return torch.float32 if compute_dtype in (torch.float16, torch.bfloat16) else compute_dtype


class _Apriori:
    """The a-priori term's bounds (oracle/apriori.py, in units of u) over a run's chunks: DSA is
    SDPA over each token's gathered slots, queries [c, H, Dl + Dr] against keys [c, K, Dl + Dr]
    with the latent rows as values; the key-side bounds are added into key rows as the
    gradients are (a duplicate slot twice)."""

    def __init__(self, ops: _Operands, grads: bool):
        self.Dl, self.rope = ops.Dl, ops.q_rope is not None
        self.max = {"out": 0.0, "lse": 0.0}
        self.dkv = self.dkr = None  # key-row bounds, with gradients
        if grads:
            self.max.update(dq_latent=0.0, **({"dq_rope": 0.0} if self.rope else {}))
            dev = ops.q_latent.device
            self.dkv = torch.zeros(ops.S + 1, ops.Dl, dtype=torch.float64, device=dev)
            self.dkr = (torch.zeros(ops.S + 1, ops.Dr, dtype=torch.float64, device=dev)
                        if self.rope else None)

    def _peak(self, name: str, x: torch.Tensor) -> None:
        if x.numel():
            self.max[name] = max(self.max[name], float(x.max()))

    def add(self, ch: _Chunk, scale: float, g: _ChunkGrads | None = None,
            dout: torch.Tensor | None = None) -> None:
        cat = (lambda a, b: a if b is None else torch.cat([a, b], -1))
        q, k_abs = cat(ch.ql, ch.qr), cat(ch.kl, ch.kr).abs()
        s = _scores(ch.ql, ch.kl, ch.qr, ch.kr, ch.valid, scale, ch.ql.dtype)
        if g is None:
            b = apriori_bounds(q, k_abs, ch.kl, s, ch.P, ch.lse, ch.out, scale)
        else:
            b = apriori_bounds(q, k_abs, ch.kl, s, ch.P, ch.lse, ch.out, scale, dout, g.dP, g.delta)
        self._peak("out", b["out"])
        self._peak("lse", b["lse"])
        if g is None:
            return
        Dl, route = self.Dl, ch.route.reshape(-1)
        self._peak("dq_latent", b["dq"][..., :Dl])
        self.dkv.index_add_(0, route, (b["dk"][..., :Dl] + b["dv"]).reshape(-1, Dl).double())
        if self.rope:
            self._peak("dq_rope", b["dq"][..., Dl:])
            dr = b["dk"][..., Dl:]
            self.dkr.index_add_(0, route, dr.reshape(route.numel(), dr.shape[-1]).double())  # Dr 0

    def finish(self) -> dict:
        if self.dkv is not None:
            self._peak_rows("dkv_latent", self.dkv)
        if self.dkr is not None:
            self._peak_rows("dk_rope", self.dkr)
        return dict(self.max)

    def _peak_rows(self, name: str, acc: torch.Tensor) -> None:
        self.max[name] = float(acc[:-1].max()) if acc[:-1].numel() else 0.0  # S 0 or Dr 0


def _attend(ops: _Operands, dout: torch.Tensor | None, *, compute_dtype: torch.dtype,
            result_dtype: torch.dtype, magnitudes: bool, chunk_bytes: int,
            want_forward: bool = True, algorithm: str = "naive", apriori: bool = False) -> dict:
    """Run the chunked math; return out/lse (if ``want_forward``), gradients, magnitudes and,
    with ``apriori``, the a-priori term's bounds."""
    grads = dout is not None
    T, H, S, Dl, Dr, device = ops.T, ops.H, ops.S, ops.Dl, ops.Dr, ops.q_latent.device
    work_dtype = _accumulator_dtype(compute_dtype) if algorithm == "flash" else compute_dtype
    chunk = _queries_per_chunk(ops, work_dtype, grads, magnitudes, chunk_bytes, apriori)
    result: dict = {}
    if want_forward:
        result["out"] = torch.empty(T, H, Dl, dtype=result_dtype, device=device)
        result["lse"] = torch.empty(T, H, dtype=torch.float32, device=device)
    if grads:
        result["dq_latent"] = torch.empty(T, H, Dl, dtype=result_dtype, device=device)
        result["dq_rope"] = (torch.empty(T, H, Dr, dtype=result_dtype, device=device)
                             if ops.q_rope is not None else None)
        acc = _accumulator_dtype(compute_dtype)
        dkv_acc = torch.zeros(S + 1, Dl, dtype=acc, device=device)   # row S: spill
        dkr_acc = (torch.zeros(S + 1, Dr, dtype=acc, device=device)
                   if ops.q_rope is not None else None)
    tally = _Magnitudes(ops, grads) if magnitudes else None
    bounds = _Apriori(ops, grads) if apriori else None
    for start in range(0, T, chunk):
        stop = min(T, start + chunk)
        ch = _forward_chunk(ops, start, stop, compute_dtype, algorithm)
        if want_forward:
            result["out"][start:stop] = ch.out
            result["lse"][start:stop] = ch.lse
        if tally is not None:
            tally.add_forward(ch)
        if not grads:
            if bounds is not None:
                bounds.add(ch, ops.scale)
            continue
        dout_c = dout[start:stop].to(compute_dtype)
        g = _backward_chunk(ch, dout_c)
        result["dq_latent"][start:stop] = g.dq_latent
        route = ch.route.reshape(-1)
        dkv_acc.index_add_(0, route, g.dkv_slots.reshape(-1, Dl).to(dkv_acc.dtype))
        if dkr_acc is not None:
            result["dq_rope"][start:stop] = g.dq_rope
            # the row count spelled out: reshape(-1, 0) of no elements is ambiguous (Dr 0)
            dkr_acc.index_add_(0, route, g.dkr_slots.reshape(route.numel(), Dr).to(dkr_acc.dtype))
        if tally is not None:
            tally.add_backward(ch, g, dout_c, ops.scale)
        if bounds is not None:
            bounds.add(ch, ops.scale, g, dout_c)
        del ch, g, dout_c
    if grads:
        result["dkv_latent"] = dkv_acc[:S].to(compute_dtype).to(result_dtype)
        result["dk_rope"] = (dkr_acc[:S].to(compute_dtype).to(result_dtype)
                             if dkr_acc is not None else None)
    if tally is not None:
        result["magnitude"] = tally.finish()
        if grads:
            result["magnitude_rows"] = tally.key_rows()
            result["magnitude_acc"] = dict(tally.acc)
            result["magnitude_acc_rows"] = tally.accumulation_rows()
    if bounds is not None:
        result["apriori"] = bounds.finish()
    return result


def _pad_empty_index_table(indices: torch.Tensor) -> torch.Tensor:
    """A ``[T, 0]`` table means every row is empty; one invalid column says the same."""
    if indices.shape[1] > 0:
        return indices
    return torch.full((indices.shape[0], 1), -1, dtype=indices.dtype, device=indices.device)


# --------------------------------------------------------------------------- reference entry

def dsa_reference(q_latent, q_rope, kv_latent, k_rope, indices, dout=None, *, topk_length=None,
                  softmax_scale=None, compute_dtype=torch.float64,
                  chunk_bytes=DEFAULT_CHUNK_BYTES, magnitudes=True, algorithm="naive",
                  apriori=False) -> dict:
    """The oracle's DSA math run in ``compute_dtype`` (float64 and "naive" give the gold result).

    Args:
        q_latent ``[T, H, Dl]``, q_rope ``[T, H, Dr]`` or None (NoPE), kv_latent ``[S, Dl]`` or
        ``[S, 1, Dl]``, k_rope ``[S, Dr]`` / ``[S, 1, Dr]`` or None, indices int ``[T, K]``,
        dout ``[T, H, Dl]`` (any strides; never modified) or None for forward only.
        compute_dtype: every operation (gathers, matmuls, exp, sums) runs in it; inputs are
            cast to it chunk by chunk. The key-gradient ``index_add_`` accumulates 16-bit terms
            in float32 and rounds once to the dtype, as torch's reductions do.
        chunk_bytes: budget for one chunk's transient memory (see the module docstring).
        magnitudes: also return the absolute-term magnitudes (computed in float64 from the
            compute-dtype intermediates; "naive" only).
        algorithm: one of ``ALGORITHMS``, the standard algorithms whose rounding in the dtype
            the agreement rule measures (as in ``oracle/sdpa.py``): "naive" (every operation in
            ``compute_dtype``), "prescaled" (q and the score side of the keys times
            sqrt(scale) before the product; the values unscaled) or "flash" (fused-kernel
            numerics, ``oracle/flash.py``, over slot tiles; key gradients accumulated in
            float32 per slot and rounded once).
        apriori: with ``magnitudes`` and float64, also ``apriori`` {output: float}: the
            agreement rule's a-priori term (oracle/apriori.py) in units of the accumulation
            dtype's unit roundoff, the largest over each output's elements (docs/CONTRACT.md
            "5. The agreement rule").

    Returns:
        dict with ``out [T, H, Dl]`` (compute dtype), ``lse [T, H]`` float32, and when ``dout``
        is given ``dq_latent``, ``dq_rope`` (None for NoPE), ``dkv_latent`` (shape of
        ``kv_latent``), ``dk_rope`` (shape of ``k_rope``, None for NoPE), all in compute dtype;
        plus ``magnitude``: {output name: python float} when ``magnitudes``, and with ``dout``
        ``magnitude_rows``: {"dkv_latent", "dk_rope": float64 per-element magnitudes, shaped
        ``[S, D]``} (what a chunked caller sums over query chunks), ``magnitude_acc``
        {gradient name: python float} and ``magnitude_acc_rows`` (the same for the floor's
        accumulation term; ``_Magnitudes``).
    """
    ops = _validate_operands(q_latent, q_rope, kv_latent, k_rope, indices, topk_length,
                             softmax_scale)
    if not isinstance(compute_dtype, torch.dtype) or not compute_dtype.is_floating_point:
        raise TypeError(f"compute_dtype must be a floating torch.dtype, got {compute_dtype!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if magnitudes and algorithm != "naive":
        raise ValueError("magnitudes=True is computed with algorithm='naive' only")
    if apriori and not magnitudes:
        raise ValueError("apriori=True needs magnitudes=True (the gold run)")
    if dout is not None:
        _validate_dout(dout, ops)
    ops.indices = _pad_empty_index_table(ops.indices)
    result = _attend(ops, dout, compute_dtype=compute_dtype, result_dtype=compute_dtype,
                     magnitudes=magnitudes, chunk_bytes=chunk_bytes, algorithm=algorithm,
                     apriori=apriori)
    if dout is not None:
        result["dkv_latent"] = result["dkv_latent"].reshape(kv_latent.shape)
        if k_rope is not None:
            result["dk_rope"] = result["dk_rope"].reshape(k_rope.shape)
    return result


# --------------------------------------------------------------------------- autograd

class _DSAFunction(torch.autograd.Function):
    """Forward in float64 (result in the input dtype); backward written out explicitly.

    The backward recomputes the forward chunk by chunk in float64 (nothing large is saved).
    """

    @staticmethod
    def forward(ctx, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, scale,
                chunk_bytes):
        ops = _Operands(q_latent, q_rope, key_rows("kv_latent", kv_latent),
                        None if k_rope is None else key_rows("k_rope", k_rope),
                        _pad_empty_index_table(indices), topk_length, scale)
        res = _attend(ops, None, compute_dtype=torch.float64, result_dtype=q_latent.dtype,
                      magnitudes=False, chunk_bytes=chunk_bytes)
        ctx.save_for_backward(q_latent, q_rope, kv_latent, k_rope, indices, topk_length)
        ctx.scale, ctx.chunk_bytes = scale, chunk_bytes
        ctx.mark_non_differentiable(res["lse"])
        return res["out"], res["lse"]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        q_latent, q_rope, kv_latent, k_rope, indices, topk_length = ctx.saved_tensors
        if dout is None:
            return (None,) * 8
        ops = _Operands(q_latent, q_rope, key_rows("kv_latent", kv_latent),
                        None if k_rope is None else key_rows("k_rope", k_rope),
                        _pad_empty_index_table(indices), topk_length, ctx.scale)
        res = _attend(ops, dout, compute_dtype=torch.float64, result_dtype=q_latent.dtype,
                      magnitudes=False, chunk_bytes=ctx.chunk_bytes, want_forward=False)
        dkv = res["dkv_latent"].reshape(kv_latent.shape)
        dkr = None if k_rope is None else res["dk_rope"].reshape(k_rope.shape)
        return res["dq_latent"], res["dq_rope"], dkv, dkr, None, None, None, None


def _run(ops: _Operands, originals, return_lse: bool, chunk_bytes: int):
    check_flags(return_lse=return_lse)
    q_latent, q_rope, kv_latent, k_rope = originals
    out, lse = _DSAFunction.apply(q_latent, q_rope, kv_latent, k_rope, ops.indices,
                                  ops.topk_length, ops.scale, chunk_bytes)
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------- public API

def _dsa_nope(q, kv, indices, *, topk_length=None, softmax_scale=None, return_lse=False,
              chunk_bytes=DEFAULT_CHUNK_BYTES):
    ops = _validate_operands(q, None, kv, None, indices, topk_length, softmax_scale, rope=False)
    return _run(ops, (q, None, kv, None), return_lse, chunk_bytes)


def _dsa_rope(q_latent, q_rope, kv_latent, k_rope, indices, *, topk_length=None,
              softmax_scale=None, return_lse=False, chunk_bytes=DEFAULT_CHUNK_BYTES):
    ops = _validate_operands(q_latent, q_rope, kv_latent, k_rope, indices, topk_length,
                             softmax_scale, rope=True)
    return _run(ops, (q_latent, q_rope, kv_latent, k_rope), return_lse, chunk_bytes)


def dsa_sparse_attention_nope(q, kv, indices, *, topk_length=None, softmax_scale=None,
                              return_lse=False):
    """NoPE DSA: ``q [T, H, D]``, ``kv [S, D]`` or ``[S, 1, D]``, ``indices [T, K]`` global rows.

    Returns ``out [T, H, D]`` in the input dtype (and ``lse [T, H]`` float32 natural log when
    ``return_lse``). Differentiable in ``q`` and ``kv`` (``dkv = dK + dV``) through an explicit
    float64 backward. ``softmax_scale=None`` means ``1/sqrt(D)``.
    """
    return _dsa_nope(q, kv, indices, topk_length=topk_length, softmax_scale=softmax_scale,
                     return_lse=return_lse)


def dsa_sparse_attention(q_latent, q_rope, kv_latent, k_rope, indices, *, topk_length=None,
                         softmax_scale=None, return_lse=False):
    """RoPE DSA: ``q_latent [T, H, Dl]``, ``q_rope [T, H, Dr]``, ``kv_latent [S, Dl]``,
    ``k_rope [S, Dr]`` (key rows may also be ``[S, 1, D]``), ``indices [T, K]`` global rows.

    Returns ``out [T, H, Dl]`` in the input dtype (and ``lse [T, H]`` float32 when
    ``return_lse``). Gradients: ``dq_latent``, ``dq_rope``, ``dkv_latent = dK_latent + dV``,
    ``dk_rope``. ``softmax_scale=None`` means ``1/sqrt(Dl + Dr)``.
    """
    return _dsa_rope(q_latent, q_rope, kv_latent, k_rope, indices, topk_length=topk_length,
                     softmax_scale=softmax_scale, return_lse=return_lse)


def _global_indices(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, causal, topk_length,
                    key_rows: int, kv_name: str):
    rows = offset_gather_kv_indices(gather_kv_indices, cu_seqlens_q, cu_seqlens_k,
                                    causal=causal, topk_length=topk_length)
    total = int(cu_seqlens_k[-1])
    if total > key_rows:
        raise ValueError(f"cu_seqlens_k[-1] = {total} exceeds the {key_rows} rows of {kv_name}")
    return rows


def _key_row_count(name: str, kv) -> int:
    return key_rows(name, kv).shape[0]


def dsa_sparse_attention_nope_varlen(q, kv, gather_kv_indices, cu_seqlens_q, cu_seqlens_k,
                                     max_seqlen_q=None, max_seqlen_k=None, *, causal=False,
                                     topk_length=None, softmax_scale=None, return_lse=False):
    """Varlen NoPE DSA: ``offset_gather_kv_indices`` (docs/CONTRACT.md "4. Varlen index preparation") then the global kernel.

    ``gather_kv_indices [T, K]`` are local to each token's document; ``cu_seqlens_k[-1]`` must
    not exceed the rows of ``kv``. ``max_seqlen_q``/``max_seqlen_k`` are accepted for signature
    compatibility and not used.
    """
    rows = _global_indices(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, causal, topk_length,
                           _key_row_count("kv", kv), "kv")
    return _dsa_nope(q, kv, rows, softmax_scale=softmax_scale, return_lse=return_lse)


def dsa_sparse_attention_varlen(q_latent, q_rope, kv_latent, k_rope, gather_kv_indices,
                                cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                                *, causal=False, topk_length=None, softmax_scale=None,
                                return_lse=False):
    """Varlen RoPE DSA: ``offset_gather_kv_indices`` then :func:`dsa_sparse_attention`.

    ``max_seqlen_q``/``max_seqlen_k`` are accepted for signature compatibility and not used.
    """
    rows = _global_indices(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, causal, topk_length,
                           _key_row_count("kv_latent", kv_latent), "kv_latent")
    return _dsa_rope(q_latent, q_rope, kv_latent, k_rope, rows, softmax_scale=softmax_scale,
                     return_lse=return_lse)


def without_duplicates(indices: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices with every repeated valid index (after its first slot) made a hole; the rows touched."""
    once = indices.clone()
    touched = torch.zeros(indices.shape[0], dtype=torch.bool)
    for t in range(indices.shape[0]):
        seen = set()
        for s in torch.nonzero(valid[t]).flatten().tolist():
            j = int(indices[t, s])
            if j in seen:
                once[t, s] = -1
                touched[t] = True
            seen.add(j)
    return once, touched
