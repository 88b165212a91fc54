"""Varlen index cases: document geometries, local top-k rows with holes, and how they are built.

Shared by the index area (``offset_gather_kv_indices``) and the varlen DSA cases. Hypothesis
draws structure (documents, K, hole pattern and density, flags, a seed); the index values
come from a seeded ``torch.Generator``.

Documents are ``(seqlen_q, seqlen_k)`` pairs with ``seqlen_q <= seqlen_k``: every query
segment is the tail of its key segment (docs/CONTRACT.md "4. Varlen index preparation"). Empty documents ``(0, 0)`` and
documents without queries ``(0, n)`` are drawn too.

Hole patterns (which slots of a row are invalid): ``none``, ``head`` (the first slots),
``middle``, ``tail``, ``interleaved`` (evenly spread), ``random``. ``density`` is the hole
fraction (0 .. 1; 0.758 and 1.0 are drawn on purpose). Invalid values are ``-1``
(``minus_one``) or a mix of -1, large negatives and indices at or past the end (``mixed``;
for local indices, past the document's end is the first row of the next document).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from attention_oracle.judge import profiles, registry
from attention_oracle.judge.capabilities import resolve
from attention_oracle.judge.case import CaseMixin, dtype_name

HOLE_PATTERNS = ("none", "head", "middle", "tail", "interleaved", "random")
DENSITIES = (0.1, 0.25, 0.5, 0.758, 0.9, 1.0)   # pattern "none" is the 0% case
TOPK_MODES = ("none", "random", "zeros", "full", "outside")
INT32_MIN = -(2 ** 31)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _as_pairs(docs) -> tuple:
    return tuple((int(q), int(k)) for q, k in docs)


def cu_seqlens(lengths, dtype=torch.int32) -> torch.Tensor:
    """``[0, l0, l0+l1, ...]`` as a 1-D tensor."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    if lengths:
        out[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    return out.to(dtype)


def token_documents(docs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per query token: document id, seqlen_k of its document, key position ``pos`` (int64)."""
    doc_ids, seqlen_k, pos = [], [], []
    for d, (lq, lk) in enumerate(docs):
        doc_ids += [d] * lq
        seqlen_k += [lk] * lq
        pos += [lk - lq + i for i in range(lq)]
    as_t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return as_t(doc_ids), as_t(seqlen_k), as_t(pos)


# ----------------------------------------------------------------------------- hole masks


def hole_mask(T: int, K: int, pattern: str, density: float, g: torch.Generator) -> torch.Tensor:
    """Bool ``[T, K]``: True where the slot is a hole (``round(density*K)`` per row, at least
    one when ``density > 0``)."""
    n = 0 if pattern == "none" or density <= 0 else max(1, int(round(density * K)))
    mask = torch.zeros(T, K, dtype=torch.bool)
    if n == 0 or T == 0:
        return mask
    if pattern == "head":
        mask[:, :n] = True
    elif pattern == "tail":
        mask[:, K - n:] = True
    elif pattern == "middle":
        start = (K - n) // 2
        mask[:, start:start + n] = True
    elif pattern == "interleaved":
        slots = torch.floor(torch.arange(n, dtype=torch.float64) * K / n).to(torch.int64)
        mask[:, slots] = True
    elif pattern == "random":
        order = torch.rand(T, K, generator=g).argsort(dim=1)
        mask.scatter_(1, order[:, :n], True)
    else:
        raise ValueError(f"unknown hole pattern {pattern!r}; expected one of {HOLE_PATTERNS}")
    return mask


def invalid_values(shape, invalid: str, limit: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Values that make a slot invalid: -1, or (``mixed``) -1 / any negative / >= ``limit``.

    ``limit`` broadcasts against ``shape`` (the row count S, or each token's seqlen_k).
    """
    if invalid == "minus_one":
        return torch.full(shape, -1, dtype=torch.int64)
    kind = torch.randint(0, 6, shape, generator=g)
    limit = torch.as_tensor(limit, dtype=torch.int64).expand(shape)
    past = limit + torch.randint(0, 4, shape, generator=g)
    choices = torch.stack([torch.full(shape, -1, dtype=torch.int64),
                           torch.full(shape, INT32_MIN, dtype=torch.int64),
                           -torch.randint(2, 1000, shape, generator=g),
                           limit.clone(), limit.clone(), past])  # the boundary twice: off-by-ones
    return choices.gather(0, kind[None]).squeeze(0)


OUTSIDE_LENGTHS = (-1, -2, INT32_MIN, 1, 2, 2 ** 31 - 1)  # below 0, or K + these past K


def topk_lengths(T: int, K: int, mode: str, g: torch.Generator) -> torch.Tensor | None:
    """int32 ``[T]`` lengths (``None`` for mode ``none``); ``zeros`` forces some rows to 0;
    ``outside`` gives most rows a length outside ``[0, K]`` (negative: no slot; past K: every
    slot), the rest one inside."""
    if mode == "none":
        return None
    if mode == "full":
        return torch.full((T,), K, dtype=torch.int32)
    lengths = torch.randint(0, K + 1, (T,), generator=g)
    if mode == "zeros" and T:
        lengths[torch.rand(T, generator=g) < 0.4] = 0
    if mode == "outside" and T:
        outside = torch.tensor(OUTSIDE_LENGTHS, dtype=torch.int64)
        outside = torch.where((outside > 0) & (outside < 2 ** 31 - 1), outside + K, outside)
        pick = outside[torch.randint(0, outside.numel(), (T,), generator=g)]
        lengths = torch.where(torch.rand(T, generator=g) < 0.7, pick, lengths)
    return lengths.to(torch.int32)


def local_rows(docs, K: int, *, causal: bool, g: torch.Generator) -> torch.Tensor:
    """int64 ``[T, K]`` local indices, all inside their document (``0 <= j < seqlen_k``).

    Causal rows draw mostly from ``0..pos`` (with a few future keys, which the causal cut
    must drop); others from the whole document. A quarter of the slots hold a boundary
    value (0, pos, pos + 1, seqlen_k - 1) where off-by-one errors show. Documents without
    keys give -1.
    """
    _, seqlen_k, pos = token_documents(docs)
    T = seqlen_k.numel()
    u = torch.rand(T, K, generator=g, dtype=torch.float64)
    if causal:
        visible = (pos + 1).clamp(min=0)
        future = torch.rand(T, K, generator=g) < 0.2
        span = torch.where(future, seqlen_k[:, None], visible[:, None])
    else:
        span = seqlen_k[:, None].expand(T, K)
    rows = torch.floor(u * span).to(torch.int64)
    boundary = torch.stack([torch.zeros_like(pos), pos, pos + 1, seqlen_k - 1], dim=1)
    pick = boundary.gather(1, torch.randint(0, 4, (T, K), generator=g))
    pick = torch.minimum(pick.clamp(min=0), (seqlen_k - 1).clamp(min=0)[:, None])
    rows = torch.where(torch.rand(T, K, generator=g) < 0.25, pick, rows)
    return torch.where(seqlen_k[:, None] > 0, rows, -1)


def topk_like_rows(docs, K: int, g: torch.Generator) -> torch.Tensor:
    """int64 ``[T, K]`` rows as a causal top-k indexer gives them: ``min(pos + 1, K)``
    distinct local keys ``<= pos`` (spread over ``0..pos``, ascending), then -1 holes.

    A causal document shorter than K thus has its natural hole rate: 992-token documents
    with K = 2048 give 1 - 496.5/2048 = 75.8% holes.
    """
    _, _, pos = token_documents(docs)
    T = pos.numel()
    visible = (pos + 1).clamp(min=0)
    n = visible.clamp(max=K)
    step = visible.double() / n.clamp(min=1).double()               # >= 1
    slots = torch.arange(K, dtype=torch.float64)
    jitter = torch.rand(T, K, generator=g, dtype=torch.float64) * (step[:, None] - 1)
    # s*step + jitter lies in [s*step, (s+1)*step - 1): floors strictly increase, <= pos
    rows = torch.floor(slots[None, :] * step[:, None] + jitter).to(torch.int64)
    return torch.where(slots[None, :] < n[:, None].double(), rows, -1)


# ----------------------------------------------------------------------------- the case


@dataclass(frozen=True)
class IndexCase(CaseMixin):
    """``offset_gather_kv_indices`` on drawn documents; H, D, dtype serve the attention check."""

    AREA = "index"
    function = "offset_gather_kv_indices"  # the public function its checks call
    docs: tuple = ((2, 4),)
    K: int = 4
    causal: bool = False
    compact: bool = False
    topk: str = "none"
    return_topk_length: bool = True
    out: str = "none"            # none | fresh | alias (the int32 input itself)
    index_dtype: str = "int32"
    holes: str = "random"
    density: float = 0.25
    invalid: str = "minus_one"
    layout: str = "contiguous"   # contiguous | transposed (column-major indices)
    H: int = 2
    D: int = 8
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "docs", _as_pairs(self.docs))

    @property
    def T(self) -> int:
        return sum(q for q, _ in self.docs)

    @property
    def S(self) -> int:
        return sum(k for _, k in self.docs)


@dataclass
class IndexInputs:
    gather_kv_indices: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    topk_length: torch.Tensor | None


def holey_local_indices(docs, K, *, causal, holes, density, invalid, g) -> torch.Tensor:
    """int64 ``[T, K]`` local indices with holes punched by ``hole_mask``/``invalid_values``."""
    rows = local_rows(docs, K, causal=causal, g=g)
    T = rows.shape[0]
    mask = hole_mask(T, K, holes, density, g)
    _, seqlen_k, _ = token_documents(docs)
    bad = invalid_values((T, K), invalid, seqlen_k[:, None], g)
    return torch.where(mask, bad, rows)


def _lay_indices(values: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "transposed":
        return values.t().contiguous().t()
    return values.contiguous()


def build_index(case: IndexCase, device: torch.device) -> IndexInputs:
    g = _gen(case.seed)
    local = holey_local_indices(case.docs, case.K, causal=case.causal, holes=case.holes,
                                density=case.density, invalid=case.invalid, g=g)
    idx_dtype = getattr(torch, case.index_dtype)
    topk = topk_lengths(case.T, case.K, case.topk, g)
    return IndexInputs(
        gather_kv_indices=_lay_indices(local.to(idx_dtype), case.layout).to(device),
        cu_seqlens_q=cu_seqlens([q for q, _ in case.docs]).to(device),
        cu_seqlens_k=cu_seqlens([k for _, k in case.docs]).to(device),
        topk_length=None if topk is None else topk.to(device),
    )


# ----------------------------------------------------------------------------- strategies


def _limits() -> dict:
    if profiles.size() == "large":
        return {"max_docs": 12, "max_q": 300, "max_extra_k": 5000, "K": (1, 64, 300, 2048),
                "boundaries": (63, 64, 65, 127, 128, 129, 4095, 4096, 4097)}
    return {"max_docs": 5, "max_q": 12, "max_extra_k": 40, "K": (1, 3, 8, 17, 40),
            "boundaries": (15, 16, 17, 63, 64, 65)}


@st.composite
def documents(draw, *, max_tokens: int | None = None, min_tokens: int = 0):
    """``((seqlen_q, seqlen_k), ...)``: empty documents, tails of longer key segments,
    key segments at tile boundaries; at most ``max_tokens`` queries in all."""
    lim = _limits()
    cap = max_tokens if max_tokens is not None else lim["max_docs"] * lim["max_q"]
    n = draw(st.integers(1, lim["max_docs"]))
    docs, used = [], 0
    for _ in range(n):
        kind = draw(st.sampled_from(("full", "tail", "tail", "empty", "no_queries", "boundary")))
        room = max(0, cap - used)
        if kind == "empty":
            docs.append((0, 0))
            continue
        lq = 0 if kind == "no_queries" else draw(st.integers(1, max(1, min(lim["max_q"], room))))
        lq = min(lq, room)
        if kind == "boundary":
            lk = max(lq, draw(st.sampled_from(lim["boundaries"])))
        elif kind == "full":
            lk = lq
        else:
            lk = lq + draw(st.integers(1, lim["max_extra_k"]))
        docs.append((lq, lk))
        used += lq
    if used < min_tokens:
        docs.append((min_tokens - used, min_tokens - used + draw(st.integers(0, 5))))
    return tuple(docs)


def holes(draw, allow_full: bool = True) -> tuple[str, float]:
    pattern = draw(st.sampled_from(HOLE_PATTERNS))
    densities = DENSITIES if allow_full else DENSITIES[:-1]
    return pattern, (0.0 if pattern == "none" else draw(st.sampled_from(densities)))


@st.composite
def index_cases(draw, *, compact=None, causal=None, dtypes=(torch.float32,), max_tokens=None,
                out_modes=("none", "fresh", "alias")):
    """Draw an IndexCase (``compact``/``causal`` forced when given)."""
    lim = _limits()
    pattern, density = holes(draw)
    out = draw(st.sampled_from(out_modes))
    index_dtype = "int32"  # the contract's; int64 has its own check (checks/index/edges.py)
    return IndexCase(
        docs=draw(documents(max_tokens=max_tokens)),
        K=draw(st.sampled_from(lim["K"])),
        causal=draw(st.booleans()) if causal is None else causal,
        compact=draw(st.booleans()) if compact is None else compact,
        topk=draw(st.sampled_from(TOPK_MODES)),
        return_topk_length=draw(st.booleans()),
        out=out, index_dtype=index_dtype, holes=pattern, density=density,
        invalid=draw(st.sampled_from(("minus_one", "mixed", "mixed"))),
        layout=draw(st.sampled_from(("contiguous", "transposed"))),
        H=draw(st.integers(1, 3)), D=draw(st.sampled_from((4, 8, 16))),
        dtype=dtype_name(draw(st.sampled_from(tuple(dtypes)))),
        seed=draw(st.integers(0, 2 ** 31 - 1)),
    )


# ----------------------------------------------------------------------------- the area (judge/registry.py)

VARIANTS = {"": {}}
ATTENTION_FN = "dsa_sparse_attention_nope"  # compacted_attention's; its dtypes are the cases'


def strategy(target_or_caps, params: dict):
    """Index cases with a check's declared parameters (``index_cases``' keywords), in the
    dtypes the target declares for NoPE attention."""
    return index_cases(dtypes=resolve(target_or_caps, ATTENTION_FN).dtypes, **params)


def function_for(params: dict) -> str:
    return IndexCase.function


REQUIREMENTS: dict = {}


def unsupported_for(check, target_or_caps, params: dict) -> str:
    return ""


def strategy_for(check: str, target_or_caps=(torch.float32,)):
    """The cases the index check ``check`` declares (``judge.registry``); the
    attention dtype of ``compacted_attention`` from the target's capabilities (a Target, a
    Capabilities, or a tuple of dtypes)."""
    return registry.declared("index")[check].strategy(target_or_caps)


AREA = registry.register(registry.Area("index", sys.modules[__name__], IndexCase))
