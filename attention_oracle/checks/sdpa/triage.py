"""Triage variations of SDPA cases: the fields a failing case is varied in, one at a time, and
whether a variant stays inside the target's declaration (``run/triage.py`` runs them)."""
from __future__ import annotations

from attention_oracle.checks.sdpa.cases import AREA, MASKS
from attention_oracle.judge import variations as v
from attention_oracle.judge.case import dtype_name


def _causal(case, target):
    if case.causal:
        return [(False, {"causal": False})]
    return [] if case.mask != "none" else [(True, {"causal": True})]  # a mask or is_causal, not both


def _masks(case, target):
    if case.causal:
        return []  # PyTorch takes a mask or is_causal, not both
    out = []
    # the kind at this shape and the shape of this kind, one at a time (and no mask)
    shape, kind = case.mask_shape, case.mask_kind
    for m in MASKS:
        same_shape = m.rsplit("_", 1)[-1] == (shape if shape != "none" else "full")
        same_kind = m.rsplit("_", 1)[0] == kind
        if m != case.mask and (m == "none" or same_shape or same_kind):
            keys = m.endswith("_keys")
            out.append((m, {"mask": m, "empty_rows": 0 if m == "none" or keys else case.empty_rows}))
    return out


def _gqa(case, target):
    if case.gqa and case.hq != case.hkv:
        return [(False, {"gqa": False, "hq": case.hkv})]
    if not case.gqa:
        return [(True, {"gqa": True, "hq": 2 * case.hkv})]
    return []


def _rank(case, target):
    """Rank 3 <-> 4 (a rank-5 case also tries rank 4)."""
    if not case.batch:
        return [(4, {"batch": (1,)})]
    out = [(3, {"batch": ()})]
    if len(case.batch) > 1:
        out.append((4, {"batch": case.batch[:1]}))
    return out


# (label, field the rule is phrased in, variant maker[, fresh-probe maker]); fields a case
# lacks are skipped; the probes re-verify a rule on values the variants did not try


VARIATIONS = (
    ("causal", "causal", _causal), ("mask", "mask", _masks),
    ("gqa", "gqa", _gqa), ("dtype", "dtype", v.dtypes), ("rank", "rank", _rank),
    ("L", "L", v.lengths("L"), v.probe_lengths("L")), ("S", "S", v.lengths("S"), v.probe_lengths("S")), ("E", "E", v.dims("E"), v.probe_dims("E")),
    ("Ev", "Ev", v.dims("Ev"), v.probe_dims("Ev")), ("scale", "scale", v.scale),
    ("empty_rows", "empty_rows", v.to("empty_rows", 0)),
    ("layout_q", "layout_q", v.to("layout_q", "contiguous")),
    ("layout_k", "layout_k", v.to("layout_k", "contiguous")),
    ("layout_v", "layout_v", v.to("layout_v", "contiguous")),
    ("layout_dout", "layout_dout", v.to("layout_dout", "contiguous")),
    ("value_scale", "value_scale", v.to("value_scale", 1.0)), ("seed", "seed", v.seeds),
)


def _mask_family(mask: str) -> str:
    return "none" if mask == "none" else ("bool" if mask.startswith("bool") else "float")


def within(caps, case) -> bool:
    """Whether ``case`` is inside ``caps`` (the target's declaration for the case's function)."""
    return (case.dtype in {dtype_name(d) for d in caps.dtypes}
            and caps.head_dim_ok(case.E) and caps.head_dim_ok(case.Ev) and caps.heads_ok(case.hq)
            and _mask_family(case.mask) in caps.masks and case.rank in caps.ranks
            and not (caps.causal == "only" and not case.causal)
            and not (caps.causal == "never" and case.causal)
            and not (caps.l_le_s and case.L > case.S)
            and not (caps.causal_square and case.causal and case.L != case.S)
            and not (caps.same_head_dims and case.E != case.Ev)
            and not (case.gqa and case.hq != case.hkv and not caps.gqa)
            and all(getattr(case, f) in caps.layouts for f in ("layout_q", "layout_k", "layout_v")))


AREA.variations, AREA.within = VARIATIONS, within
