"""The index covering grid: the dimensions of an index check's cases and how a row becomes an
:class:`IndexCase` (``run/grid.py`` makes the t-wise array).

Dimensions: ``shape`` ((K, document length) pairs through every length class,
``profiles.grid_lengths``), ``docs`` (the pattern beside that document: ``plain``, ``empty``,
``more_q`` (more queries than keys), ``one_token``, ``no_queries``), ``holes`` (the index cases'
patterns at half density, and every slot a hole), ``topk``, ``causal``, ``compact``, ``lengths``
(return_topk_length), ``out`` (none, fresh, alias), ``invalid``, ``layout`` and the attention
``dtype`` (compacted_attention). A check's declared case parameters fix what they force.
Interpreted kernels get the small tile edges and fewer patterns.
"""
from __future__ import annotations

import math

from attention_oracle.checks.index.cases import AREA, ATTENTION_FN, TOPK_MODES, IndexCase
from attention_oracle.judge import profiles
from attention_oracle.judge.capabilities import INDEX_FN, resolve
from attention_oracle.judge.case import dtype_name
from attention_oracle.judge.registry import Grid

DOCS = ("plain", "empty", "more_q", "one_token", "no_queries")
HOLES = ("none", "head", "tail", "interleaved", "random", "full")
SMALL_SHAPES = ((1, 17), (16, 16), (33, 15))
SMALL_DOCS = ("plain", "empty", "more_q")
SMALL_HOLES = ("none", "random", "full")


def _pairs(lengths: tuple) -> tuple:
    n = len(lengths)
    step = next((m for m in (5, 7, 3, 2) if m < n and math.gcd(m, n) == 1), 1)
    return tuple((lengths[i], lengths[(i * step) % n]) for i in range(n))


def _documents(kind: str, length: int, max_tokens: int | None) -> tuple:
    q = min(2, length, max_tokens or 2)
    main = (q, length)
    return {"plain": (main,), "empty": (main, (0, 0), (2, 5)), "more_q": (main, (3, 1)),
            "one_token": ((1, 1), main), "no_queries": ((0, length), main)}[kind]


def _fixed(params: dict, name: str, values: tuple) -> tuple:
    return (params[name],) if params.get(name) is not None else values


def grid(check, target_or_caps, params: dict) -> Grid:
    """The covering grid of index ``check`` (case parameters ``params``) within what
    ``target_or_caps`` declares (the attention dtypes of ``compacted_attention``)."""
    small = resolve(target_or_caps, INDEX_FN).interpreted
    dtypes = tuple(dtype_name(d) for d in resolve(target_or_caps, ATTENTION_FN).dtypes)
    factors = {
        "shape": SMALL_SHAPES if small else _pairs(profiles.grid_lengths(False)),
        "docs": SMALL_DOCS if small else DOCS,
        "holes": SMALL_HOLES if small else HOLES,
        "topk": TOPK_MODES,
        "causal": _fixed(params, "causal", (False, True)),
        "compact": _fixed(params, "compact", (False, True)),
        "lengths": (True, False),
        "out": tuple(params.get("out_modes") or ("none", "fresh", "alias")),
        "invalid": ("minus_one", "mixed"),
        "layout": ("contiguous", "transposed"),
        "dtype": dtypes[:1] if small else dtypes,
    }

    def build(row: dict) -> IndexCase:
        K, length = row["shape"]
        pattern = {"full": "random"}.get(row["holes"], row["holes"])
        return IndexCase(
            docs=_documents(row["docs"], length, params.get("max_tokens")), K=K,
            causal=row["causal"], compact=row["compact"], topk=row["topk"],
            return_topk_length=row["lengths"], out=row["out"], holes=pattern,
            density={"none": 0.0, "full": 1.0}.get(row["holes"], 0.5), invalid=row["invalid"],
            layout=row["layout"], dtype=row["dtype"], seed=K * 1000 + length)

    return Grid(factors, (), build)


AREA.grid = grid
