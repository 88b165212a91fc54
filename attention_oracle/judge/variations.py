"""Building blocks of triage variations: each maker, given a failing case and its target, returns
the variants of one field to try, ``[(value, changes)]`` (``changes`` for ``dataclasses.replace``).
An area lists its variations with these (``checks/<area>/triage.py``)."""
from __future__ import annotations

from attention_oracle.judge.case import dtype_name

LENGTHS = (1, 2, 16, 32, 64)
HEAD_DIMS = (8, 16, 64)


def values(name, options):
    def make(case, target):
        return [(v, {name: v}) for v in options if v != getattr(case, name)]
    return make


def flip(name):
    def make(case, target):
        return [(not getattr(case, name), {name: not getattr(case, name)})]
    return make


def to(name, value):
    def make(case, target):
        return [] if getattr(case, name) == value else [(value, {name: value})]
    return make


def lengths(name, limit=65):
    def make(case, target):
        v = getattr(case, name)
        options = sorted({x for x in LENGTHS + (v - 1, v + 1) if 1 <= x <= limit} - {v})
        return [(x, {name: x}) for x in options]
    return make


def dims(name):
    def make(case, target):
        v = getattr(case, name)
        return [(x, {name: x}) for x in HEAD_DIMS if x != v]
    return make


def dtypes(case, target):
    return [(dtype_name(d), {"dtype": dtype_name(d)}) for d in target.dtypes
            if dtype_name(d) != case.dtype]


def seeds(case, target):
    return [(case.seed + i, {"seed": case.seed + i}) for i in (1, 2)]


def scale(case, target):
    return [(0.5, {"scale": 0.5})] if case.scale is None else [(None, {"scale": None})]


# ----------------------------------------------------------------------------- fresh probes
# Values a rule is re-verified on: not among the variants above, so that a rule read off those
# (``S > 64``, ``E == 1``) is tested on a case it did not come from (``run/triage.py``).

LENGTH_PROBES = (3, 5, 48, 63, 65, 66, 96, 127, 129)
HEAD_DIM_PROBES = (2, 3, 24, 32, 40, 72)


def probe_lengths(name, limit=130):
    def make(case, target):
        v = getattr(case, name)
        options = [x for x in LENGTH_PROBES + (v + 2, 2 * v + 1) if 1 <= x <= max(limit, v + 2)]
        return [(x, {name: x}) for x in dict.fromkeys(options) if x != v]
    return make


def probe_dims(name, options=HEAD_DIM_PROBES):
    def make(case, target):
        v = getattr(case, name)
        return [(x, {name: x}) for x in options if x != v]
    return make
