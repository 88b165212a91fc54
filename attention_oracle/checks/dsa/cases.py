"""DSA cases: what Hypothesis draws for sparse attention (global and varlen) and how it is built.

A :class:`DsaCase` is plain data: sizes, the index structure (holes, empty rows, out-of-range
values, duplicates, ``topk_length``), layouts and a seed. Values come from a seeded
``torch.Generator``. With ``docs == ()`` the indices are global rows into ``S`` keys
(``dsa_sparse_attention[_nope]``); with documents they are local to each token's document
(``dsa_sparse_attention[_nope]_varlen``, ``T``/``S`` then follow from the documents).

Layouts (the trainer's, scaled down):
- ``layout_q``: contiguous / transposed (head-major storage) / sliced (NaN-poisoned window);
- ``layout_q_rope``: also ``channel_slice``: the last ``Dr`` channels of a ``[T, H, 4*Dr]``
  buffer (the 192:256 slice of a ``[T, H, 256]`` buffer);
- ``layout_kv``: contiguous ``[S, D]``, ``kv3d`` (``[S, 1, D]``), ``packed`` (latent and rope
  columns of one ``[S, Dl+Dr]`` buffer, like ``[S, 576]``), ``packed_filler`` (plus NaN
  filler columns after, like ``[S, 704]``), ``sliced``;
- ``layout_dout``: contiguous / transposed (head-major ``[H, T, Dv]`` storage viewed
  ``[T, H, Dv]``) / sliced / broadcast (stride 0 over heads).

``scale`` is always an explicit float (the contract's default 1/sqrt(Dl + Dr) among the
values drawn); ``softmax_scale=None`` is checked only where an implementation declares a
default (``checks/dsa/edges.py``). Value regimes: ``value_scale`` 30 makes rows nearly
one-hot; ``score_target`` > 0 rescales q so that the largest |scale * score| is that value
(1e4, near fp16's range); ``score_shift`` < 0 moves every score of every row down by that
much (a shared key channel against a shared query channel), so each row's lse is below -100
and exp of the scores underflows fp32; ``magnitude`` (fp32) scales q, q_rope, kv and k_rope
by 2^magnitude (-118: near the bottom of the exponent range, where a split of fp32 values
into bf16 or tf32 parts for the tensor cores loses its lowest part), the values first
pushed off zero so that every one stays normal. Native targets also draw K and S at tile edges
(63/64/65, 127/128/129); interpreted kernels keep small sizes.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from attention_oracle.checks.index.cases import (
    _as_pairs,
    cu_seqlens,
    documents,
    hole_mask,
    holes,
    holey_local_indices,
    invalid_values,
    token_documents,
    topk_lengths,
    topk_like_rows,
)
from attention_oracle.judge import profiles, registry
from attention_oracle.judge.capabilities import Capabilities, resolve
from attention_oracle.judge.case import CaseMixin, dtype_name
from attention_oracle.judge.layouts import fresh, lay_out

FUNCTIONS = {(False, False): "dsa_sparse_attention_nope", (True, False): "dsa_sparse_attention",
             (False, True): "dsa_sparse_attention_nope_varlen",
             (True, True): "dsa_sparse_attention_varlen"}
KV_LAYOUTS = ("contiguous", "kv3d", "packed", "packed_filler", "sliced")
DOUT_LAYOUTS = ("contiguous", "transposed", "sliced", "broadcast")
POISON = 64.0   # key value planted in other documents by the isolation check
VALUE_SCALES = (0.3, 1.0, 3.0, 30.0)
LARGE_SCORE = 1e4
SCORE_SHIFT = -120.0     # lse near -120 + log(K): below -100
SHIFT_KEY = 4.0          # the shared key channel's value in the score_shift regime
TINY_MAGNITUDE = -118    # the tiny regime: values times 2**-118 (all normal, see _tiny)
TINY_DTYPES = ("float32",)  # where the tiny regime is drawn: fp32's emulations by parts


@dataclass(frozen=True)
class DsaCase(CaseMixin):
    AREA = "dsa"
    rope: bool = True
    T: int = 4                   # global form only (varlen: sum of seqlen_q)
    S: int = 8                   # global form only (varlen: sum of seqlen_k)
    H: int = 2
    K: int = 4
    Dl: int = 16                 # NoPE: D
    Dr: int = 8                  # NoPE: unused
    dtype: str = "float32"
    docs: tuple = ()             # varlen: ((seqlen_q, seqlen_k), ...)
    causal: bool = False         # varlen only
    holes: str = "none"
    density: float = 0.0
    invalid: str = "minus_one"   # minus_one | mixed (negatives, >= S)
    empty_rows: int = 0          # rows whose every slot is invalid
    duplicates: int = 0          # rows given a planted duplicate slot
    topk: str = "none"           # none | random | zeros | full
    scale: float | None = None
    layout_q: str = "contiguous"
    layout_q_rope: str = "contiguous"
    layout_kv: str = "contiguous"
    layout_dout: str = "contiguous"
    value_scale: float = 1.0
    score_target: float = 0.0    # > 0: q rescaled so that max|scale * score| is this
    score_shift: float = 0.0     # < 0: every score moved down by about this much
    magnitude: int = 0           # != 0: q, q_rope, kv, k_rope times 2**magnitude (tiny regime)
    q_chunk: int = 0             # query chunk of the chunked-backward check (0: T)
    poison_doc: int = -1         # varlen isolation: keep this document's keys, poison the rest
    selection: str = "random"    # varlen: random local rows, or "topk" (a causal indexer's rows)
    gap: tuple = ()              # (start, stop): query rows made fully empty (100% holes)
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "docs", _as_pairs(self.docs))
        object.__setattr__(self, "gap", tuple(int(x) for x in self.gap))
        if self.docs:
            object.__setattr__(self, "T", sum(q for q, _ in self.docs))
            object.__setattr__(self, "S", sum(k for _, k in self.docs))

    @property
    def varlen(self) -> bool:
        return bool(self.docs)

    @property
    def function(self) -> str:
        return FUNCTIONS[(self.rope, self.varlen)]

    @property
    def qk_dim(self) -> int:
        return self.Dl + (self.Dr if self.rope else 0)

    @property
    def effective_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.qk_dim)


@dataclass
class DsaInputs:
    """Tensors of a case as passed to the implementation (views where the layout says so)."""

    q_latent: torch.Tensor
    q_rope: torch.Tensor | None
    kv_latent: torch.Tensor
    k_rope: torch.Tensor | None
    indices: torch.Tensor              # global rows, or local indices (varlen)
    topk_length: torch.Tensor | None
    cu_seqlens_q: torch.Tensor | None
    cu_seqlens_k: torch.Tensor | None
    dout: torch.Tensor                 # in its drawn layout
    case: DsaCase

    @property
    def differentiable(self) -> tuple:
        """The tensors gradients are taken for, in the oracle's order (None skipped)."""
        return tuple(t for t in (self.q_latent, self.q_rope, self.kv_latent, self.k_rope)
                     if t is not None)

    @property
    def grad_names(self) -> tuple:
        names = ("dq_latent", "dq_rope", "dkv_latent", "dk_rope")
        return tuple(n for n, t in zip(names, (self.q_latent, self.q_rope, self.kv_latent,
                                               self.k_rope)) if t is not None)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- indices


def _plant_duplicates(idx: torch.Tensor, valid: torch.Tensor, n: int, g: torch.Generator) -> None:
    """In ``n`` rows with >= 2 valid slots, copy one valid slot's index into another."""
    if n == 0:
        return
    rows = [t for t in range(idx.shape[0]) if int(valid[t].sum()) >= 2]
    for r in torch.randperm(len(rows), generator=g)[:n].tolist():
        t = rows[r]
        slots = torch.nonzero(valid[t]).flatten()
        a, b = slots[torch.randperm(slots.numel(), generator=g)[:2]].tolist()
        idx[t, b] = idx[t, a]


def _empty_out_rows(idx: torch.Tensor, n: int, limit, g: torch.Generator) -> None:
    T, K = idx.shape
    if n == 0 or T == 0 or K == 0:
        return
    rows = torch.randperm(T, generator=g)[:n]
    lim = limit[rows][:, None] if isinstance(limit, torch.Tensor) else limit
    idx[rows] = invalid_values((rows.numel(), K), "minus_one" if torch.rand(1, generator=g) < 0.5
                               else "mixed", lim, g)


def _only_future_keys(idx: torch.Tensor, n: int, seqlen_k, pos, g: torch.Generator) -> None:
    """Empty up to ``n`` rows by the causal cut alone: every slot names a key of the
    document after the query's position (rows at their document's last key are skipped)."""
    T, K = idx.shape
    candidates = torch.nonzero(pos + 1 < seqlen_k).flatten()
    if n == 0 or K == 0 or candidates.numel() == 0:
        return
    rows = candidates[torch.randperm(candidates.numel(), generator=g)[:n]]
    first, span = pos[rows] + 1, seqlen_k[rows] - pos[rows] - 1
    u = torch.rand(rows.numel(), K, generator=g, dtype=torch.float64)
    idx[rows] = first[:, None] + torch.floor(u * span[:, None]).to(torch.int64)


def _slot_in_topk(T: int, K: int, topk: torch.Tensor | None) -> torch.Tensor:
    if topk is None:
        return torch.ones(T, K, dtype=torch.bool)
    return torch.arange(K)[None, :] < topk.to(torch.int64)[:, None]


# hole patterns of the covering grid (``checks/dsa/grid.py``), beside ``index.cases.HOLE_PATTERNS``
GRID_HOLES = ("lead64", "trail64", "chunk64", "alternate", "past_s")
RUN = 64  # a tile of slots


def grid_hole_mask(T: int, K: int, S: int, pattern: str) -> torch.Tensor:
    """Bool ``[T, K]`` for the grid's patterns: the first / last ``min(64, K - 1)`` slots
    (``lead64`` / ``trail64``: a valid slot stays), slots 64..127 (``chunk64``: a whole empty
    64-slot chunk), every odd slot (``alternate``), every slot before column S (``past_s``:
    valid slots only past column S)."""
    cols = torch.arange(K)
    run = min(RUN, max(K - 1, 0))
    hole = {"lead64": cols < run, "trail64": cols >= K - run,
            "chunk64": (cols >= RUN) & (cols < 2 * RUN), "alternate": cols % 2 == 1,
            "past_s": cols < S}
    if pattern not in hole:
        raise ValueError(f"unknown hole pattern {pattern!r}; expected one of {GRID_HOLES}")
    return hole[pattern][None, :].expand(T, K).clone()


def _hole_mask(T: int, K: int, S: int, pattern: str, density: float, g: torch.Generator) -> torch.Tensor:
    if pattern in GRID_HOLES:
        return grid_hole_mask(T, K, S, pattern)
    return hole_mask(T, K, pattern, density, g)


def _topk_lengths(T: int, K: int, mode: str, g: torch.Generator):
    """``index.cases.topk_lengths``, and ``minus1``: every row cut to K - 1 slots (the grid's:
    K = 65 gives a length of 64)."""
    if mode == "minus1":
        return torch.full((T,), max(K - 1, 0), dtype=torch.int32)
    return topk_lengths(T, K, mode, g)


def _global_indices(case: DsaCase, g: torch.Generator, topk) -> torch.Tensor:
    idx = torch.randint(0, case.S, (case.T, case.K), generator=g, dtype=torch.int64)
    mask = _hole_mask(case.T, case.K, case.S, case.holes, case.density, g)
    idx = torch.where(mask, invalid_values((case.T, case.K), case.invalid, case.S, g), idx)
    _empty_out_rows(idx, case.empty_rows, case.S, g)
    _punch_gap(idx, case.gap)
    valid = (idx >= 0) & (idx < case.S) & _slot_in_topk(case.T, case.K, topk)
    _plant_duplicates(idx, valid, case.duplicates, g)
    return idx


def _punch_gap(idx: torch.Tensor, gap: tuple) -> None:
    if gap:
        idx[gap[0]:gap[1]] = -1


def _local_indices(case: DsaCase, g: torch.Generator, topk) -> torch.Tensor:
    if case.selection == "topk":
        idx = topk_like_rows(case.docs, case.K, g)
        if case.holes != "none":
            idx[_hole_mask(case.T, case.K, case.S, case.holes, case.density, g)] = -1
    elif case.holes in GRID_HOLES:
        idx = holey_local_indices(case.docs, case.K, causal=case.causal, holes="none",
                                  density=0.0, invalid=case.invalid, g=g)
        idx[grid_hole_mask(case.T, case.K, case.S, case.holes)] = -1
    else:
        idx = holey_local_indices(case.docs, case.K, causal=case.causal, holes=case.holes,
                                  density=case.density, invalid=case.invalid, g=g)
    _, seqlen_k, pos = token_documents(case.docs)
    _empty_out_rows(idx, case.empty_rows, seqlen_k, g)
    if case.causal:
        _only_future_keys(idx, case.empty_rows, seqlen_k, pos, g)
    _punch_gap(idx, case.gap)
    valid = (idx >= 0) & (idx < seqlen_k[:, None]) & _slot_in_topk(case.T, case.K, topk)
    if case.causal:
        valid &= idx <= pos[:, None]
    _plant_duplicates(idx, valid, case.duplicates, g)
    return idx


# ----------------------------------------------------------------------------- layouts


def _q_rope(values: torch.Tensor, layout: str) -> torch.Tensor:
    if layout != "channel_slice":
        return fresh(values, layout, dims=(0, 1), requires_grad=True)
    T, H, Dr = values.shape
    buf = torch.full((T, H, 4 * Dr), float("nan"), dtype=values.dtype, device=values.device)
    buf[..., 3 * Dr:] = values
    return buf.requires_grad_()[..., 3 * Dr:]


def _key_rows(latent: torch.Tensor, rope: torch.Tensor | None, layout: str):
    """(kv_latent, k_rope) in the layout; packed layouts are views of one leaf buffer."""
    if layout in ("packed", "packed_filler"):
        S, Dl = latent.shape
        Dr = 0 if rope is None else rope.shape[1]
        # [S, 704] at production size: filler up to a multiple of 8 columns, at least Dl/4
        filler = (-(Dl + Dr + Dl // 4) % 8) + max(1, Dl // 4) if layout == "packed_filler" else 0
        buf = torch.full((S, Dl + Dr + filler), float("nan"), dtype=latent.dtype, device=latent.device)
        buf[:, :Dl] = latent
        if rope is not None:
            buf[:, Dl:Dl + Dr] = rope
        buf.requires_grad_()
        return buf[:, :Dl], (None if rope is None else buf[:, Dl:Dl + Dr])
    if layout == "kv3d":
        make = lambda x: x[:, None, :].clone().requires_grad_()  # noqa: E731
    else:
        make = lambda x: fresh(x, layout, requires_grad=True)  # noqa: E731
    return make(latent), (None if rope is None else make(rope))


def poison_other_documents(kv: torch.Tensor, docs, keep: int, g: torch.Generator) -> torch.Tensor:
    """``kv`` with every key row outside document ``keep`` set to +-POISON (huge scores)."""
    cu = cu_seqlens([k for _, k in docs], torch.int64)
    outside = torch.ones(kv.shape[0], dtype=torch.bool)
    outside[int(cu[keep]):int(cu[keep + 1])] = False
    signs = torch.where(torch.rand(kv.shape, generator=g) < 0.5, -POISON, POISON).to(kv.dtype)
    return torch.where(outside[:, None], signs, kv)


def build(case: DsaCase, device: torch.device, *, values_on_device: bool = False) -> DsaInputs:
    """Tensors of the case on ``device`` in their layouts; q/kv tensors require grad.

    Indices always come from the CPU generator (reproducible anywhere). With
    ``values_on_device`` the float values are drawn by a generator on ``device`` directly
    in the case dtype (full-size fixtures: no host copy of GBs of float32); they then
    differ from the CPU-drawn values of the same seed.
    """
    g = _gen(case.seed)
    dt, T, S, H = case.torch_dtype, case.T, case.S, case.H
    topk = _topk_lengths(T, case.K, case.topk, g)
    idx = _local_indices(case, g, topk) if case.varlen else _global_indices(case, g, topk)
    if values_on_device:
        gv = torch.Generator(device=device).manual_seed(case.seed)
        randn = lambda *shape: torch.randn(*shape, generator=gv, device=device, dtype=dt)  # noqa: E731
    else:
        randn = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    ql = randn(T, H, case.Dl) * case.value_scale
    qr = randn(T, H, case.Dr) * case.value_scale if case.rope else None
    kl = randn(S, case.Dl)
    kr = randn(S, case.Dr) if case.rope else None
    dout = randn(T, H, case.Dl)
    if case.score_shift and not values_on_device:
        ql, kl = _shift_scores(ql, kl, case)
    if case.score_target > 0 and not values_on_device:
        ql, qr = _rescale_to_target(ql, qr, kl, kr, case)
    if case.magnitude:
        ql, qr, kl, kr = (None if x is None else _tiny(x, case.magnitude) for x in (ql, qr, kl, kr))
    if case.varlen and case.poison_doc >= 0:
        kl = poison_other_documents(kl, case.docs, case.poison_doc, g)
        kr = None if kr is None else poison_other_documents(kr, case.docs, case.poison_doc, g)
        dout = dout * document_query_mask(case)[:, None, None]
    to = dict(device=device, dtype=dt)
    kv_latent, k_rope = _key_rows(kl.to(**to), None if kr is None else kr.to(**to), case.layout_kv)
    cu_q = cu_k = None
    if case.varlen:
        cu_q = cu_seqlens([q for q, _ in case.docs]).to(device)
        cu_k = cu_seqlens([k for _, k in case.docs]).to(device)
    return DsaInputs(
        q_latent=fresh(ql.to(**to), case.layout_q, dims=(0, 1), requires_grad=True),
        q_rope=None if qr is None else _q_rope(qr.to(**to), case.layout_q_rope),
        kv_latent=kv_latent, k_rope=k_rope,
        indices=idx.to(torch.int32).to(device),
        topk_length=None if topk is None else topk.to(device),
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        dout=lay_out(dout.to(**to), case.layout_dout, dims=(0, 1)),
        case=case,
    )


def _tiny(x: torch.Tensor, magnitude: int) -> torch.Tensor:
    """``x`` times 2**magnitude, every value first moved to at least 2**-8 in magnitude (its
    sign kept), so that none falls below the smallest normal (2**-126 for magnitude -118):
    the regime is about normal values near the bottom of the range, not subnormals."""
    floor = torch.full_like(x, 2.0 ** -8).copysign(x)
    return torch.where(x.abs() < 2.0 ** -8, floor, x) * 2.0 ** magnitude


def _shift_scores(ql: torch.Tensor, kl: torch.Tensor, case: DsaCase):
    """Latent channel 0 of every key set to SHIFT_KEY and of every query to the value that
    moves each score by ``case.score_shift`` (the other channels keep their spread)."""
    ql, kl = ql.clone(), kl.clone()
    kl[:, 0] = SHIFT_KEY
    ql[:, :, 0] = case.score_shift / (SHIFT_KEY * case.effective_scale)
    return ql, kl


def _rescale_to_target(ql, qr, kl, kr, case: DsaCase):
    """q scaled so that the largest |scale * score| of any query against any key row is
    ``case.score_target`` (so no slot, valid or not, exceeds it)."""
    if case.T == 0 or case.S == 0:
        return ql, qr
    s = torch.einsum("thd,sd->ths", ql.double(), kl.double())
    if qr is not None:
        s = s + torch.einsum("thd,sd->ths", qr.double(), kr.double())
    peak = float((s * case.effective_scale).abs().max())
    if peak == 0.0:
        return ql, qr
    f = case.score_target / peak
    return ql * f, (None if qr is None else qr * f)


def document_query_mask(case: DsaCase) -> torch.Tensor:
    """Bool ``[T]``: the queries of document ``case.poison_doc``."""
    doc_of, _, _ = token_documents(case.docs)
    return doc_of == case.poison_doc


def document_key_mask(case: DsaCase) -> torch.Tensor:
    """Bool ``[S]``: the key rows of document ``case.poison_doc``."""
    cu = cu_seqlens([k for _, k in case.docs], torch.int64)
    keep = torch.zeros(case.S, dtype=torch.bool)
    keep[int(cu[case.poison_doc]):int(cu[case.poison_doc + 1])] = True
    return keep


# ----------------------------------------------------------------------------- strategies


TILE_EDGES = (63, 64, 65, 127, 128, 129)


def _limits(caps: Capabilities) -> dict:
    """Sizes drawn (sampled, so a short derandomized run still sees a spread of them)."""
    if profiles.size() == "large":
        return {"T": (0, 1, 37, 128, 300), "S": (1, 64, 1000, 4097), "K": (1, 64, 300, 512),
                "H": (1, 16, 64, 128), "max_T": 300,
                "dims": ((512, 64), (128, 64), (64, 32), (16, 8), (576, 0)),
                "K_edges": TILE_EDGES + (255, 256, 257, 1023, 1024, 1025, 2048),
                "S_edges": TILE_EDGES + (4095, 4096, 4097)}
    small = {"T": (0, 1, 5, 9, 12), "S": (1, 7, 16, 33, 48), "K": (1, 3, 8, 16, 24),
             "H": (1, 2, 3), "max_T": 12,
             "dims": ((16, 8), (8, 4), (32, 16), (4, 2), (24, 8))}
    if caps.interpreted:
        return {**small, "K_edges": (15, 16, 17, 33), "S_edges": (16, 17, 33)}
    return {**small, "K_edges": TILE_EDGES, "S_edges": TILE_EDGES + (255, 256, 257)}


def _dims(caps: Capabilities, lim, rope: bool) -> tuple:
    """(Dl, Dr) pairs within the declaration (the declared dims themselves if none of the
    profile's fit: a kernel for Dl = 512 only is checked at 512)."""
    ok = lambda dl, dr: caps.head_dim_ok(dl) and (not rope or caps.rope_dim_ok(dr))  # noqa: E731
    dims = tuple(d for d in lim["dims"] if (d[1] > 0 or not rope) and ok(*d))
    if not dims and caps.head_dims:
        drs = caps.rope_dims or tuple(d for _, d in lim["dims"] if d > 0)
        dims = tuple((dl, dr) for dl in caps.head_dims for dr in (drs if rope else (0,)) if ok(dl, dr))
    return dims


def _heads(caps: Capabilities, lim) -> tuple:
    heads = tuple(h for h in lim["H"] if caps.heads_ok(h))
    return heads or tuple(caps.heads or ())


# what a check can require of the declared capabilities (``registry.declare(..., requires=...)``):
# {requirement: caps -> why it is not met ('' if it is)}
REQUIREMENTS = {
    "misaligned": lambda caps: "" if "misaligned" in caps.layouts else "misaligned inputs not declared",
    "default_scale": lambda caps: "" if caps.default_scale else "no softmax_scale default",
}


def unsupported(check: str, target_or_caps, *, rope: bool, varlen: bool = False,
                requires: tuple | None = None) -> str:
    """Why ``check`` cannot run on what the target declares ('' if it can); ``requires``: the
    check's declared requirements (``REQUIREMENTS``; looked up by name when not given)."""
    caps = resolve(target_or_caps, FUNCTIONS[(rope, varlen)])
    lim = _limits(caps)
    if not caps.dtypes:
        return "no dtype declared"
    if not _dims(caps, lim, rope):
        return "no declared head dims among those drawn"
    if not _heads(caps, lim):
        return "no declared head count"
    for need in _requires(check) if requires is None else requires:
        why = REQUIREMENTS[need](caps)
        if why:
            return why
    return ""


def _requires(check: str) -> tuple:
    declared = registry.declared("dsa").get(check)
    return declared.requires if declared is not None else ()


def _scale(draw, qk_dim: int, large_scores: bool) -> float:
    """An explicit softmax_scale: the contract's default value, or drawn."""
    if large_scores:
        return draw(st.floats(0.5, 1.0).map(lambda x: round(x, 4)))
    return draw(st.one_of(st.just(1.0 / math.sqrt(qk_dim)),
                          st.floats(0.05, 1.0).map(lambda x: round(x, 4))))


def _layouts(caps: Capabilities, rope: bool) -> dict:
    base = tuple(lay for lay in ("contiguous", "transposed", "sliced") if lay in caps.layouts) or ("contiguous",)
    views = "sliced" in caps.layouts  # views of a larger buffer
    q_rope = base + (("channel_slice",) if views else ()) if rope else ("contiguous",)
    kv = ("contiguous", "kv3d") + (("packed", "packed_filler", "sliced") if views else ())
    if not rope:
        kv = tuple(k for k in kv if k != "packed")
    return {"q": base, "q_rope": q_rope, "kv": kv}


@st.composite
def dsa_cases(draw, dtypes_or_caps, *, rope: bool, varlen: bool = False, empty_rows=None,
              duplicates=None, dout_layouts=DOUT_LAYOUTS, topk=None, min_T: int = 0,
              poison: bool = False, causal=None):
    """Draw a DsaCase within what the target declares (``dtypes_or_caps``: a Target, a
    Capabilities, or a tuple of dtypes).

    ``empty_rows``/``duplicates``: force (True) or forbid (False) them; ``topk``: force a
    ``topk_length`` mode; ``causal``: force the varlen causal flag; ``min_T``: at least that
    many queries;
    ``poison``: choose a document with queries for the isolation check.
    """
    caps = resolve(dtypes_or_caps, FUNCTIONS[(rope, varlen)])
    lim = _limits(caps)
    dl, dr = draw(st.sampled_from(_dims(caps, lim, rope)))
    if not rope:
        dr = 0
    H = draw(st.sampled_from(_heads(caps, lim)))
    K = draw(st.one_of(st.sampled_from(lim["K"]), st.sampled_from(lim["K_edges"])))
    docs, T, S = (), 0, 1
    if varlen:
        docs = draw(documents(max_tokens=lim["max_T"], min_tokens=max(min_T, 1 if poison else 0)))
    else:
        T = max(draw(st.sampled_from(lim["T"])), min_T)
        S = draw(st.one_of(st.sampled_from(lim["S"]), st.sampled_from(lim["S"]),
                           st.sampled_from(lim["S_edges"])))
    pattern, density = holes(draw)
    n_tok = sum(q for q, _ in docs) if varlen else T
    want_empty = draw(st.booleans()) if empty_rows is None else empty_rows
    n_empty = draw(st.integers(1, max(1, n_tok // 2))) if want_empty and n_tok else 0
    want_dup = draw(st.booleans()) if duplicates is None else duplicates
    n_dup = draw(st.integers(1, max(1, n_tok))) if want_dup and n_tok and K >= 2 else 0
    poison_doc = -1
    if poison:
        with_queries = [d for d, (q, _) in enumerate(docs) if q > 0]
        # prefer a document followed by keys: a leak past its end lands in them
        followed = [d for d in with_queries if any(k for _, k in docs[d + 1:])]
        poison_doc = draw(st.sampled_from(followed or with_queries))
    layouts = _layouts(caps, rope)
    dtype = dtype_name(draw(st.sampled_from(tuple(caps.dtypes))))
    regimes = ("plain",) * 6 + ("large_scores", "low_lse") + (("tiny",) if dtype in TINY_DTYPES else ())
    regime = "plain" if poison else draw(st.sampled_from(regimes))
    scale = _scale(draw, dl + dr, regime == "large_scores")
    return DsaCase(
        rope=rope, T=T, S=S, H=H, K=K, Dl=dl, Dr=dr,
        dtype=dtype,
        docs=docs, causal=(draw(st.booleans()) if causal is None else causal) if varlen else False,
        holes=pattern, density=density, invalid=draw(st.sampled_from(("minus_one", "mixed", "mixed"))),
        empty_rows=n_empty, duplicates=n_dup,
        topk=draw(st.sampled_from(("none", "random", "zeros", "full", "outside"))) if topk is None else topk,
        scale=scale,
        layout_q=draw(st.sampled_from(layouts["q"])),
        layout_q_rope=draw(st.sampled_from(layouts["q_rope"])),
        layout_kv=draw(st.sampled_from(layouts["kv"])),
        layout_dout=draw(st.sampled_from(tuple(dout_layouts))),
        value_scale=1.0 if regime == "low_lse" else draw(st.sampled_from(VALUE_SCALES)),
        score_target=LARGE_SCORE if regime == "large_scores" else 0.0,
        score_shift=SCORE_SHIFT if regime == "low_lse" else 0.0,
        magnitude=TINY_MAGNITUDE if regime == "tiny" else 0,
        q_chunk=draw(st.integers(1, max(1, n_tok))),
        poison_doc=poison_doc,
        seed=draw(st.integers(0, 2 ** 31 - 1)),
    )


# ----------------------------------------------------------------------------- the area (judge/registry.py)

VARIANTS = {"nope": {"rope": False}, "rope": {"rope": True}}
DEFAULT_VARIANT = "rope"


def strategy(target_or_caps, params: dict):
    """DSA cases with a check's declared parameters (``dsa_cases``' keywords; ``rope`` from the
    variant)."""
    return dsa_cases(resolve(target_or_caps), **params)


def function_for(params: dict) -> str:
    return FUNCTIONS[(params["rope"], params.get("varlen", False))]


def unsupported_for(check, target_or_caps, params: dict) -> str:
    return unsupported(check.name, target_or_caps, rope=params["rope"], varlen=params.get("varlen", False),
                       requires=check.requires)


def strategy_for(check: str, target_or_caps, *, rope: bool = True):
    """The cases the DSA check ``check`` declares (``judge.registry``), drawn
    within the target's capabilities (a Target, a Capabilities, or a tuple of dtypes)."""
    return registry.declared("dsa")[check].strategy(target_or_caps, "rope" if rope else "nope")


AREA = registry.register(registry.Area("dsa", sys.modules[__name__], DsaCase))
