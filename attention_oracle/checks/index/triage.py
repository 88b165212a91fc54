"""Triage variations of index cases: the fields a failing case is varied in, one at a time, and
whether a variant stays inside the target's declaration (``run/triage.py`` runs them)."""
from __future__ import annotations

from attention_oracle.checks.index.cases import AREA
from attention_oracle.judge import variations as v
from attention_oracle.judge.case import dtype_name

VARIATIONS = (
    ("causal", "causal", v.flip("causal")), ("compact", "compact", v.flip("compact")),
    ("topk", "topk", v.to("topk", "none")), ("K", "K", v.lengths("K"), v.probe_lengths("K")),
    ("return_topk_length", "return_topk_length", v.flip("return_topk_length")),
    ("out", "out", v.to("out", "none")), ("holes", "holes", v.to("holes", "none")),
    ("invalid", "invalid", v.to("invalid", "minus_one")),
    ("layout", "layout", v.to("layout", "contiguous")), ("seed", "seed", v.seeds),
)


def within(caps, case) -> bool:
    """Whether ``case`` is inside ``caps`` (the target's declaration for the case's function)."""
    return not hasattr(case, "dtype") or case.dtype in {dtype_name(d) for d in caps.dtypes}


AREA.variations, AREA.within = VARIATIONS, within
