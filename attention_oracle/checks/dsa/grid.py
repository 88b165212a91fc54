"""The DSA covering grid: the dimensions of a check's cases, their constraints within the
target's declaration, and how a row becomes a :class:`DsaCase` (``run/grid.py`` makes the
t-wise array).

Dimensions (global form):
- ``shape``: (K, S) pairs in which K (the slots, hence topk_length) and S run through every
  length class (``profiles.grid_lengths``) once each;
- ``holes``: ``none``, ``lead64`` / ``trail64`` (leading / trailing runs of 64 holes),
  ``chunk64`` (slots 64..127 empty), ``alternate``, ``past_s`` (valid slots only past column
  S), ``random`` (half the slots);
- ``topk``: no topk_length, ``full`` (K), ``minus1`` (K - 1: 64 for K = 65), ``random``,
  ``zeros`` (the strategy also draws ``outside``: lengths below 0 or past K);
- ``regime``: ``plain``, ``sharp`` (q spread 30), ``saturating`` (largest |score| 1e4),
  ``low_lse`` (every score moved down by 120: lse below float32's exp range), ``tiny`` (every
  value times 2^-118, all normal: fp32 rows, where the target declares fp32);
- ``dtype``, ``dims`` ((Dl, Dr)), ``H``, ``T``, ``invalid`` (-1 or mixed), ``layout`` (q),
  ``kv`` (key layout), ``dout``, ``rows`` (plain, some empty rows, a duplicate slot; unless
  the check forces one).

Varlen checks replace ``shape`` by (K, document length) pairs and add ``docs`` (the pattern
beside that document: ``plain``, ``empty`` (a (0, 0) document), ``more_q`` (more queries than
keys: with ``causal`` its first rows see no key), ``one_token``, ``no_queries``), ``causal``
and ``selection``.

Interpreted kernels get three shapes at the small tile edges and fewer values (about 10 rows).
"""
from __future__ import annotations

import math

from attention_oracle.checks.dsa.cases import (
    AREA,
    DOUT_LAYOUTS,
    TINY_DTYPES,
    TINY_MAGNITUDE,
    DsaCase,
    _layouts,
)
from attention_oracle.judge import profiles
from attention_oracle.judge.capabilities import resolve
from attention_oracle.judge.case import dtype_name
from attention_oracle.judge.registry import Grid

HOLES = ("none", "lead64", "trail64", "chunk64", "alternate", "past_s", "random")
SMALL_HOLES = ("none", "alternate", "past_s")
TOPK = ("none", "full", "minus1", "random", "zeros")
SMALL_TOPK = ("none", "minus1")
REGIMES = {"plain": (1.0, 0.0, 0.0, 0), "sharp": (30.0, 0.0, 0.0, 0),
           "saturating": (1.0, 1e4, 0.0, 0), "low_lse": (1.0, 0.0, -120.0, 0),
           "tiny": (1.0, 0.0, 0.0, TINY_MAGNITUDE)}  # value_scale, score_target, score_shift, magnitude
DIMS = {"native": ((16, 8), (64, 32), (128, 64)), "interpreted": ((16, 8),)}
HEADS = {"native": (1, 3, 16), "interpreted": (1, 2)}
TS = {"native": (1, 5), "interpreted": (3,)}
SMALL_SHAPES = ((1, 17), (16, 16), (33, 15))
DOCS = ("plain", "empty", "more_q", "one_token", "no_queries")
SMALL_DOCS = ("plain", "more_q")
MAX_SLOTS_X_HEADS = 257 * 16 * 5  # T * H * K: the float64 oracle's gathered keys per row


def _pairs(lengths: tuple) -> tuple:
    """(a, b) pairs: a runs through the classes, b through a permutation of them."""
    n = len(lengths)
    step = next((m for m in (5, 7, 3, 2) if m < n and math.gcd(m, n) == 1), 1)
    return tuple((lengths[i], lengths[(i * step) % n]) for i in range(n))


def _dims(caps, size: str, rope: bool) -> tuple:
    ok = lambda dl, dr: caps.head_dim_ok(dl) and (not rope or caps.rope_dim_ok(dr))  # noqa: E731
    dims = tuple(d for d in DIMS[size] if ok(*d))
    if not dims and caps.head_dims:
        drs = caps.rope_dims or (64,)
        dims = tuple((dl, dr) for dl in caps.head_dims for dr in drs if ok(dl, dr))[:2]
    return tuple((dl, dr if rope else 0) for dl, dr in dims)


def _factors(caps, params: dict) -> dict:
    small = caps.interpreted
    size = "interpreted" if small else "native"
    varlen = params.get("varlen", False)
    layouts = _layouts(caps, params["rope"])
    factors = {
        "shape": SMALL_SHAPES if small else _pairs(profiles.grid_lengths(False)),
        "holes": SMALL_HOLES if small else HOLES,
        "topk": (params["topk"],) if params.get("topk") else (SMALL_TOPK if small else TOPK),
        "regime": _regimes(caps, small or params.get("poison")),
        "dtype": tuple(dtype_name(d) for d in caps.dtypes),
        "dims": _dims(caps, size, params["rope"]),
        "H": tuple(h for h in HEADS[size] if caps.heads_ok(h)) or tuple(caps.heads or ())[:1],
        "invalid": ("minus_one",) if small else ("minus_one", "mixed"),
        "layout": layouts["q"][:1] if small else layouts["q"],
        "kv": layouts["kv"][:2] if small else layouts["kv"],
        "dout": tuple(params.get("dout_layouts") or DOUT_LAYOUTS)[: 2 if small else 4],
        "rows": _rows(params),
    }
    if varlen:
        factors["docs"] = SMALL_DOCS if small else DOCS
        factors["causal"] = (params["causal"],) if params.get("causal") is not None else (False, True)
        factors["selection"] = ("random",) if small or params.get("poison") else ("random", "topk")
    else:
        factors["T"] = TS[size]
    return factors


def _regimes(caps, few: bool) -> tuple:
    """The value regimes of a grid (``few``: interpreted kernels, or the isolation check);
    ``tiny`` only where the target declares a dtype that holds it."""
    regimes = ("plain", "low_lse") if few else tuple(r for r in REGIMES if r != "tiny")
    if any(dtype_name(d) in TINY_DTYPES for d in caps.dtypes):
        regimes += ("tiny",)
    return regimes


def _rows(params: dict) -> tuple:
    if params.get("empty_rows") or params.get("duplicates"):
        return ("forced",)
    return ("plain", "empty", "duplicate")


def _documents(kind: str, length: int) -> tuple:
    """The documents of a varlen row: one of ``length`` keys (its last few as queries) and the
    pattern's document beside it."""
    main = (min(2, length), length)
    return {"plain": (main,), "empty": (main, (0, 0), (2, 5)), "more_q": (main, (3, 1)),
            "one_token": ((1, 1), main), "no_queries": ((0, length), main)}[kind]


def _poison_doc(docs: tuple) -> int:
    with_queries = [d for d, (q, _) in enumerate(docs) if q > 0]
    followed = [d for d in with_queries if any(k for _, k in docs[d + 1:])]
    return (followed or with_queries or [0])[0]


def _constraints(params: dict) -> tuple:
    def few_slots(row):
        return row.get("T", 12) * row["H"] * row["shape"][0] <= MAX_SLOTS_X_HEADS

    out = [(("shape", "H"), few_slots),
           (("regime", "dtype"), lambda r: r["regime"] != "tiny" or r["dtype"] in TINY_DTYPES)]
    if params.get("varlen"):  # past_s is about the column S of a global row
        out.append((("holes",), lambda r: r["holes"] != "past_s"))
        # an indexer's rows hold no slot for a query before its document's first key
        out.append((("docs", "selection"), lambda r: not (r["docs"] == "more_q" and r["selection"] == "topk")))
    return tuple(out)


def _build(params: dict):
    rope, varlen = params["rope"], params.get("varlen", False)

    def build(row: dict) -> DsaCase:
        K, length = row["shape"]
        docs = _documents(row["docs"], length) if varlen else ()
        T = sum(q for q, _ in docs) if varlen else max(row["T"], params.get("min_T", 0))
        if varlen and T < params.get("min_T", 0):
            docs += ((params["min_T"] - T, params["min_T"] - T),)
            T = params["min_T"]
        value_scale, score, shift, magnitude = REGIMES[row["regime"]]
        dl, dr = row["dims"]
        forced = row["rows"] == "forced"
        empty = max(1, T // 2) if (params.get("empty_rows") or row["rows"] == "empty") and T else 0
        dup = 1 if (params.get("duplicates") or row["rows"] == "duplicate") and K >= 2 and T else 0
        return DsaCase(
            rope=rope, T=T, S=length, H=row["H"], K=K, Dl=dl, Dr=dr, dtype=row["dtype"],
            docs=docs, causal=row.get("causal", False) if varlen else False,
            holes=row["holes"], density=0.5 if row["holes"] == "random" else 0.0,
            invalid=row["invalid"], empty_rows=empty if (forced or row["rows"] == "empty") else 0,
            duplicates=dup if (forced or row["rows"] == "duplicate") else 0, topk=row["topk"],
            scale=0.75 if score else round(1.0 / math.sqrt(dl + dr), 6),
            layout_q=row["layout"], layout_kv=row["kv"], layout_dout=row["dout"],
            value_scale=value_scale, score_target=score, score_shift=shift, magnitude=magnitude,
            q_chunk=max(1, T // 2), poison_doc=_poison_doc(docs) if params.get("poison") else -1,
            selection=row.get("selection", "random"), seed=K * 1000 + length)
    return build


def grid(check, target_or_caps, params: dict) -> Grid:
    """The covering grid of DSA ``check`` (case parameters ``params``, the variant's ``rope``
    among them) within what ``target_or_caps`` declares for the function its cases call."""
    fn = AREA.cases.function_for(params)
    caps = resolve(target_or_caps, fn)
    return Grid(_factors(caps, params), _constraints(params), _build(params))


AREA.grid = grid
