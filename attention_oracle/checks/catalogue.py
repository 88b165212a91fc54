"""Every area and its checks, looked up by name: the one catalogue the run floor, the tools, the
conformance tests and the negative controls read.

``check("sdpa.strided_dout")`` is the declared :class:`~attention_oracle.judge.registry.Check`;
``strategy(name, target)`` its cases drawn within a target's declaration; ``load_case(d)`` rebuilds
a Case of any area from its JSON dict (``area`` names its class).
"""
from __future__ import annotations

from collections.abc import Mapping

from attention_oracle.checks.dsa import cases as dsa_cases
from attention_oracle.checks.dsa import checks as dsa_checks  # noqa: F401 (declares the checks)
from attention_oracle.checks.dsa import edges as dsa_edges  # noqa: F401
from attention_oracle.checks.dsa import grid as dsa_grid  # noqa: F401 (sets the covering grid)
from attention_oracle.checks.dsa import triage as dsa_triage  # noqa: F401 (sets the variations)
from attention_oracle.checks.index import cases as index_cases
from attention_oracle.checks.index import checks as index_checks  # noqa: F401
from attention_oracle.checks.index import edges as index_edges  # noqa: F401
from attention_oracle.checks.index import grid as index_grid  # noqa: F401
from attention_oracle.checks.index import triage as index_triage  # noqa: F401
from attention_oracle.checks.sdpa import cases as sdpa_cases
from attention_oracle.checks.sdpa import checks as sdpa_checks  # noqa: F401
from attention_oracle.checks.sdpa import edges as sdpa_edges  # noqa: F401
from attention_oracle.checks.sdpa import grid as sdpa_grid  # noqa: F401
from attention_oracle.checks.sdpa import triage as sdpa_triage  # noqa: F401
from attention_oracle.judge import registry

AREAS: dict[str, registry.Area] = {m.AREA.name: m.AREA for m in (sdpa_cases, dsa_cases, index_cases)}


def areas() -> list[str]:
    return sorted(AREAS)


def area(name: str) -> registry.Area:
    if name not in AREAS:
        raise ValueError(f"unknown area {name!r}; known: {areas()}")
    return AREAS[name]


def case_class(name: str) -> type:
    return area(name).case_class


def checks(name: str) -> Mapping[str, registry.Check]:
    """Every check of area ``name`` ({name: Check}, in declaration order)."""
    area(name)
    return registry.declared(name)


def all_checks() -> list[registry.Check]:
    return [c for a in areas() for c in checks(a).values()]


def check(name: str) -> registry.Check:
    """``area.check`` -> the check."""
    area_name, _, fn = name.partition(".")
    table = checks(area_name)
    if fn not in table:
        raise ValueError(f"unknown check {name!r}; {area_name} has {sorted(table)}")
    return table[fn]


def variants(check_name: str) -> tuple[str, ...]:
    """The variants a check runs in: DSA checks run on NoPE and RoPE cases (``("nope",
    "rope")``), the others in one (``("",)``). Test ids carry the variant
    (``test_forward_agreement[fast-nope]``)."""
    return check(check_name).variants


def strategy(check_name: str, target_or_caps, variant: str = ""):
    """The Hypothesis strategy of the cases ``check_name`` (``area.check``) runs on, drawn within
    ``target_or_caps`` (a Target, a Capabilities, or a tuple of dtypes); ``variant`` one of
    :func:`variants` (``""`` is the area's default: RoPE for DSA)."""
    return check(check_name).strategy(target_or_caps, variant)


def load_case(d: dict):
    """Rebuild a Case of any area from its dict (``area`` names its class)."""
    return case_class(d["area"]).from_dict(d)
