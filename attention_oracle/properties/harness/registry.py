"""Areas of the suite: each maps a Case class to its checks (for replay and the regression corpus)."""
from __future__ import annotations

import importlib

_AREAS = {
    "sdpa": ("attention_oracle.properties.sdpa.cases:SdpaCase", "attention_oracle.properties.sdpa.checks"),
    "dsa": ("attention_oracle.properties.dsa.cases:DsaCase", "attention_oracle.properties.dsa.checks"),
    "index": ("attention_oracle.properties.index.cases:IndexCase", "attention_oracle.properties.index.checks"),
}


def register(area: str, case_class: str, checks_module: str) -> None:
    _AREAS[area] = (case_class, checks_module)


def _import(path: str):
    module, _, attr = path.partition(":")
    mod = importlib.import_module(module)
    return getattr(mod, attr) if attr else mod


def areas() -> list[str]:
    return sorted(_AREAS)


def case_class(area: str):
    if area not in _AREAS:
        raise ValueError(f"unknown area {area!r}; known: {areas()}")
    return _import(_AREAS[area][0])


def checks(area: str) -> dict:
    return _import(_AREAS[area][1]).CHECKS


def check(name: str):
    """``area.check`` -> the check function."""
    area, _, fn = name.partition(".")
    table = checks(area)
    if fn not in table:
        raise ValueError(f"unknown check {name!r}; {area} has {sorted(table)}")
    return table[fn]


def variants(check: str) -> tuple[str, ...]:
    """The variants a check runs in (``area.check``): DSA checks run on NoPE and RoPE cases
    (``("nope", "rope")``), the others in one (``("",)``). Test ids carry the variant
    (``test_forward_agreement[fast-nope]``)."""
    area, _, _ = check.partition(".")
    return ("nope", "rope") if area == "dsa" else ("",)


def strategy(check: str, target_or_caps, variant: str = ""):
    """The Hypothesis strategy of the cases ``check`` (``area.check``) runs on, drawn within
    ``target_or_caps`` (a Target, a Capabilities, or a tuple of dtypes); ``variant`` one of
    :func:`variants` (``""`` is the check's first-declared default: RoPE for DSA).

    The one lookup the conformance tests, the negative controls, ``tools/calibrate.py`` and
    ``benchmarks/rule_calibration.py`` share."""
    area, _, name = check.partition(".")
    if area == "sdpa":
        from attention_oracle.properties.sdpa.cases import strategy_for
        return strategy_for(name, target_or_caps)
    if area == "dsa":
        from attention_oracle.properties.dsa.cases import strategy_for
        return strategy_for(name, target_or_caps, rope=variant != "nope")
    if area == "index":
        from attention_oracle.properties.index.cases import strategy_for
        return strategy_for(name, target_or_caps)
    raise ValueError(f"unknown area in {check!r}; known: {areas()}")
