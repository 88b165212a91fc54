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
