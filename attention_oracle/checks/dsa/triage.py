"""Triage variations of DSA cases: the fields a failing case is varied in, one at a time, and
whether a variant stays inside the target's declaration (``run/triage.py`` runs them)."""
from __future__ import annotations

from attention_oracle.checks.dsa.cases import AREA, TINY_DTYPES
from attention_oracle.judge import variations as v
from attention_oracle.judge.case import dtype_name

VARIATIONS = (
    ("dtype", "dtype", v.dtypes), ("causal", "causal", v.flip("causal")),
    ("T", "T", v.lengths("T"), v.probe_lengths("T")), ("S", "S", v.lengths("S"), v.probe_lengths("S")), ("K", "K", v.lengths("K"), v.probe_lengths("K")),
    ("H", "H", v.values("H", (1, 2, 4, 16))), ("Dl", "Dl", v.dims("Dl"), v.probe_dims("Dl")),
    ("Dr", "Dr", v.values("Dr", (8, 16, 64))), ("holes", "holes", v.to("holes", "none")),
    ("invalid", "invalid", v.to("invalid", "minus_one")),
    ("empty_rows", "empty_rows", v.to("empty_rows", 0)),
    ("duplicates", "duplicates", v.to("duplicates", 0)), ("topk", "topk", v.to("topk", "none")),
    ("scale", "scale", v.scale),
    ("layout_q", "layout_q", v.to("layout_q", "contiguous")),
    ("layout_q_rope", "layout_q_rope", v.to("layout_q_rope", "contiguous")),
    ("layout_kv", "layout_kv", v.to("layout_kv", "contiguous")),
    ("layout_dout", "layout_dout", v.to("layout_dout", "contiguous")),
    ("value_scale", "value_scale", v.to("value_scale", 1.0)),
    ("score_target", "score_target", v.to("score_target", 0.0)),
    ("score_shift", "score_shift", v.to("score_shift", 0.0)),
    ("magnitude", "magnitude", v.to("magnitude", 0)), ("seed", "seed", v.seeds),
)


def within(caps, case) -> bool:
    """Whether ``case`` is inside ``caps`` (the target's declaration for the case's function)."""
    return (case.dtype in {dtype_name(d) for d in caps.dtypes}
            and caps.head_dim_ok(case.Dl) and caps.heads_ok(case.H)
            and (not case.rope or caps.rope_dim_ok(case.Dr))
            and (not case.magnitude or case.dtype in TINY_DTYPES))


AREA.variations, AREA.within = VARIATIONS, within
