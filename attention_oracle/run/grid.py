"""The covering grid each check runs before its Hypothesis search.

A check's area describes the grid (``checks/<area>/grid.py``: a :class:`~attention_oracle.judge.
registry.Grid` of dimensions, constraints and a row -> Case builder, within the target's
declared capabilities); this module makes the t-wise covering array (``covertable``, strength
per profile: ``profiles.grid_strength``) and names its cases.

- Deterministic: covertable's hash sorter with a fixed salt, no randomness; the same commit,
  profile and declaration give the same rows, in the same order.
- Constraints prune the array while it is built (covertable's ``fn`` conditions), so every
  t-tuple of values that some allowed row holds is covered by an allowed row; a declaration's
  limits are constraints too, so coverage holds within what the implementation declares.
- A case the area's ``within`` puts outside the declaration is dropped (none should be).
- Case ``i`` of check ``area.check`` (variant ``v``) is named ``grid:area.check:i``
  (``grid:area.check[v]:i``) and replays like any example (``Case.repro``).
"""
from __future__ import annotations

from itertools import combinations, product

import covertable

from attention_oracle.checks import catalogue
from attention_oracle.judge import profiles
from attention_oracle.judge.capabilities import resolve
from attention_oracle.judge.registry import Grid

SALT = "attention-oracle grid"


def _condition(keys, predicate) -> dict:
    return {"operator": "fn", "requires": list(keys), "evaluate": predicate}


def allowed(row: dict, constraints) -> bool:
    """Whether ``row`` (a full or partial row) satisfies every constraint whose dimensions it holds."""
    return all(fn(row) for keys, fn in constraints if all(k in row for k in keys))


def covering(factors, strength: int, constraints=()) -> list[dict]:
    """A ``strength``-wise covering array of ``factors`` ({dimension: values}) under
    ``constraints`` ([(dimensions, predicate(row))]): rows as {dimension: value}, deterministic."""
    factors = {k: list(v) for k, v in factors.items()}
    empty = [k for k, v in factors.items() if not v]
    if empty:
        raise ValueError(f"grid dimensions without a value: {empty}")
    if not factors:
        return [{}]
    strength = max(1, min(strength, len(factors)))
    rows = covertable.make(factors, strength=strength, sorter=covertable.sorters.hash, salt=SALT,
                           constraints=[_condition(k, f) for k, f in constraints] or None)
    return [dict(r) for r in rows if allowed(r, constraints)]


def uncovered(rows, factors, strength: int, constraints=()) -> list[dict]:
    """The t-tuples of values (as partial rows) that some allowed full row holds but no row of
    ``rows`` does: empty for a covering array. Exhaustive: for small grids (the tests)."""
    keys = list(factors)
    feasible = [r for r in (dict(zip(keys, vals)) for vals in product(*factors.values()))
                if allowed(r, constraints)]
    missing = []
    for dims in combinations(keys, min(strength, len(keys))):
        seen = {tuple(r[d] for d in dims) for r in rows}
        need = {tuple(r[d] for d in dims) for r in feasible}
        missing += [dict(zip(dims, t)) for t in sorted(need - seen, key=repr)]
    return missing


def spec(check, target_or_caps, variant: str = "") -> Grid | None:
    """The grid ``check`` declares through its area, within ``target_or_caps``; None where the
    area has no grid."""
    make = catalogue.area(check.area).grid
    return None if make is None else make(check, target_or_caps, check.params(variant))


def name(check, variant: str, i: int) -> str:
    return f"grid:{check.full_name}{f'[{variant}]' if variant else ''}:{i}"


def cases(check, target_or_caps, variant: str = "", strength: int | None = None) -> list[tuple[str, object]]:
    """[(name, Case)]: the covering grid of ``check`` (``variant``) on what ``target_or_caps``
    declares, at ``strength`` (the profile's by default)."""
    strength = profiles.grid_strength() if strength is None else strength
    key = (check.full_name, variant, repr(resolve(target_or_caps)), strength, profiles.size())
    if key not in _MADE:
        _MADE[key] = _cases(check, target_or_caps, variant, strength)
    return list(_MADE[key])


_MADE: dict = {}  # the grids made in this process (covertable takes ~0.1-0.5 s for one)


def _cases(check, target_or_caps, variant: str, strength: int) -> list[tuple[str, object]]:
    grid = spec(check, target_or_caps, variant)
    if grid is None or not all(grid.factors.values()):  # nothing of a dimension is declared
        return []
    rows = covering(grid.factors, strength, grid.constraints)
    area = catalogue.area(check.area)
    caps = resolve(target_or_caps, check.function(variant))
    out, seen = [], set()
    for row in rows:
        case = grid.build(row)
        if case in seen or (area.within is not None and not area.within(caps, case)):
            continue
        seen.add(case)
        out.append(case)
    return [(name(check, variant, i), c) for i, c in enumerate(out)]
