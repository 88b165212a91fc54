"""Change validation: ``--baseline OLD.json`` compares this run with an earlier report, on the
same examples.

The baseline is any ``--oracle-report`` JSON: the same implementation at another version, or
another implementation. Rows are matched by check, and by implementation too when both runs
have it; when each run checks exactly one implementation under different names (``mykernel``
v1 against ``mykernel_v2``), by check alone. Other rows are listed as unmatched.

**The same examples.** A report keeps, per (implementation, check), the cases each test judged
(``cases``: the case JSON, its worst error ratio and the check's variant; the first
``report.CASES_CAP`` per variant, in the order they ran; ratio = error over the allowed bound,
below 1 passes). A run with ``--baseline`` first replays the baseline's cases of each check
(:func:`replay_cases`, at most ``MAX_REPLAY``, those inside the implementation's declared
capabilities) as Hypothesis explicit examples, right after the covering grid (``run/grid.py``:
the same commit gives the same grid, so grid cases are not replayed again), then searches as
usual. A check's time budget (``run/budget.py``) may end the replay early; the comparison then
covers the cases both runs judged. Its ``REPEATS`` worst
cases are replayed twice: the two ratios of one case in one run are the implementation's own
noise. Without this, each run of a randomized profile (``dev``, ``fuzz``) judged other
examples, and a correct kernel's worst ratio moved 30x between two runs of itself.

Per matched check the comparison shows the worst ratio over the cases both runs judged (the
*same* cases) before and after, and the worst over all the cases of each run. A
**regression** is

- a newly failing check: it had failed no test before and fails now; or
- a case judged by both runs that passed before and fails now (a check failing before on
  another case keeps its worst at inf, which hides it otherwise); or
- a worst ratio over the same cases grown beyond the noise: after > before x (1 + tolerance),
  tolerance = max(``REL_TOL``, ``NOISE_MARGIN`` x the largest relative spread of one case's
  ratios within either run).

A deterministic implementation gives one case the same ratio every time (measured for the
oracle on the CPU: spread 0 on the repeated cases of ``ci``, ``dev`` and ``fuzz`` runs, and 0
between a run in one process and one under ``-n 2``, one torch thread per worker); reports keep
ratios as exact float repr, so any growth past ``REL_TOL`` (1e-6: above the last-bit changes a
float64 reference summed in another order could make in an fp16/fp32 ratio, below any lost bit
of precision) is a change of the kernel. A nondeterministic one (atomics in a GPU backward)
shows its spread on the repeated cases, and the tolerance grows with it; ``NOISE_MARGIN`` (2)
allows for a spread larger than the few repeated cases showed (not yet measured on such a
backend).

A larger worst over *new* cases (this run's search found a harder example than the baseline's)
is information, not a regression: it is listed as "new case harder". A check whose baseline
recorded no cases (an older report) cannot be compared on the same examples: only a newly
failing check counts there. The run exits non-zero on a regression, and each is named on a
``REGRESSION`` line.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from attention_oracle.checks import catalogue

REL_TOL = 1e-6
NOISE_MARGIN = 2.0
MAX_REPLAY = 200
REPEATS = 3
_INSTALLED: dict = {}  # {(impl, check): row} of the baseline, for replay_cases


class BaselineError(ValueError):
    """The baseline file is unreadable or not an ``--oracle-report`` JSON."""


@dataclass
class Row:
    check: str
    impl_before: str
    impl_after: str
    before: float          # worst ratio over all the cases of each run
    after: float
    failed_before: int
    failed_after: int
    same: int = 0          # cases judged by both runs
    same_before: float = 0.0  # worst ratio over those cases
    same_after: float = 0.0
    noise: float = 0.0     # largest relative spread of one case's ratios within a run
    repeated: int = 0      # cases judged more than once within a run (what measured the noise)
    newly_failing: int = 0  # cases judged by both runs, passing before and failing now
    status: str = ""       # "regression: ...", "fixed", "not compared: ...", "ok"
    notes: list = field(default_factory=list)  # information, not regressions

    @property
    def regression(self) -> bool:
        return self.status.startswith("regression")

    @property
    def tolerance(self) -> float:
        return max(REL_TOL, NOISE_MARGIN * self.noise)

    @property
    def growth(self) -> float:
        """Growth of the worst ratio over the same cases (1 when unchanged or none shared)."""
        return _growth(self.same_before, self.same_after)

    @property
    def growth_all(self) -> float:
        """Growth of the worst ratio over all the cases of each run."""
        return _growth(self.before, self.after)


@dataclass
class Comparison:
    baseline: str
    matched_by: str        # "implementation and check" | "check"
    rows: list
    unmatched_before: list  # (impl, check) only in the baseline
    unmatched_after: list   # (impl, check) only in this run

    @property
    def regressions(self) -> list:
        return [r for r in self.rows if r.regression]


def _growth(before: float, after: float) -> float:
    """after / before: 1 when unchanged (0 -> 0, inf -> inf), inf from 0 or to inf."""
    if after == before:
        return 1.0
    if before == 0.0 or math.isinf(after):
        return math.inf
    return after / before


def _ratio(value) -> float:
    if value in ("inf", None):
        return math.inf if value == "inf" else 0.0
    return float(value)


def load(path: str) -> dict:
    """{(impl, check): row} of an ``--oracle-report`` JSON file."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as exc:
        raise BaselineError(f"--baseline {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise BaselineError(f"--baseline {path}: not JSON: {exc}") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and {"implementation", "check"} <= set(r)
                                             for r in rows):
        raise BaselineError(f"--baseline {path}: not an --oracle-report JSON (no 'rows' of "
                            f"implementation and check)")
    for r in rows:
        cases = r.get("cases", [])
        if not isinstance(cases, list) or not all(isinstance(c, dict) and {"case", "ratio"} <= set(c)
                                                  for c in cases):
            raise BaselineError(f"--baseline {path}: row {r['implementation']} {r['check']}: "
                                f"'cases' is not a list of {{case, ratio}}")
    return {(r["implementation"], r["check"]): r for r in rows}


# ----------------------------------------------------------------------------- replay


def install(rows: dict) -> None:
    """Make the baseline's cases (``load``'s rows) what :func:`replay_cases` replays."""
    _INSTALLED.clear()
    _INSTALLED.update(rows)


def _baseline_row(impl: str, check: str) -> dict | None:
    """The baseline row to replay for (impl, check): the same implementation's, else, when the
    baseline checked one implementation only, that one's (the matching of :func:`compare`)."""
    if (impl, check) in _INSTALLED:
        return _INSTALLED[(impl, check)]
    impls = {i for i, _ in _INSTALLED}
    if len(impls) == 1:
        return _INSTALLED.get((impls.pop(), check))
    return None


def replay_order(entries: list) -> list[str]:
    """The case JSONs to replay from a row's ``cases`` entries of one check and variant: each
    once, in the order they ran (at most ``MAX_REPLAY``), the ``REPEATS`` worst of them first
    and twice (a case's two ratios within one run measure the implementation's noise)."""
    worst: dict[str, float] = {}
    for e in entries:
        if len(worst) >= MAX_REPLAY and e["case"] not in worst:
            continue
        worst[e["case"]] = max(worst.get(e["case"], 0.0), _ratio(e["ratio"]))
    ranked = sorted((c for c in worst if not math.isinf(worst[c])), key=lambda c: -worst[c])[:REPEATS]
    return [c for c in ranked for _ in (0, 1)] + [c for c in worst if c not in ranked]


def _within(target, case) -> bool:
    """Whether ``case`` lies inside the target's declared capabilities (its area decides)."""
    caps = getattr(target, "capabilities", None)
    area = catalogue.area(case.AREA)
    if caps is None or area.within is None:
        return True
    if hasattr(caps, "for_function") and getattr(case, "function", None):
        caps = caps.for_function(case.function)
    try:
        return area.within(caps, case)
    except (AttributeError, TypeError, ValueError):  # a declaration of another shape
        return True


def _case(text: str):
    try:
        return catalogue.load_case(json.loads(text))
    except (KeyError, TypeError, ValueError):  # a case of an older layout: not replayable
        return None


def replay_cases(target, check: str, variant: str = "", judged=()) -> list:
    """The Cases of ``check`` (``area.check``) and ``variant`` to replay on ``target``
    (:func:`replay_order`; those outside its declared capabilities left out; one occurrence of
    each case JSON in ``judged`` dropped: the covering grid runs them anyway, just before);
    [] without an installed baseline or a matching row."""
    row = _baseline_row(target.name, check) if _INSTALLED else None
    if row is None:
        return []
    entries = [e for e in row.get("cases", []) if e.get("variant", "") == variant
               and e.get("check", check) == check]
    order, skip = [], set(judged)
    for text in replay_order(entries):
        if text in skip:
            skip.discard(text)
            continue
        order.append(text)
    cases = [_case(text) for text in order]
    return [c for c in cases if c is not None and _within(target, c)]


# ----------------------------------------------------------------------------- comparison


def _ratios(row: dict) -> dict:
    """{(variant, check, case JSON): [ratios]} of a report row's judged cases (known ones left
    out: their ratio is not the rule's)."""
    out: dict = {}
    for e in row.get("cases", []):
        if e["ratio"] is not None:
            key = (e.get("variant", ""), e.get("check", ""), e["case"])
            out.setdefault(key, []).append(_ratio(e["ratio"]))
    return out


def spread(ratios: dict) -> tuple[float, int]:
    """(largest relative spread (max - min) / max of one case's ratios, cases seen twice or
    more) over ``_ratios``' table; failures (inf) and all-zero cases spread 0."""
    worst, repeated = 0.0, 0
    for values in ratios.values():
        if len(values) < 2:
            continue
        repeated += 1
        hi, lo = max(values), min(values)
        if hi > 0 and not math.isinf(hi):
            worst = max(worst, (hi - lo) / hi)
    return worst, repeated


def _same_cases(row: Row, before: dict, after: dict) -> None:
    rb, ra = _ratios(before), _ratios(after)
    same = set(rb) & set(ra)
    row.same = len(same)
    row.same_before = max((max(rb[k]) for k in same), default=0.0)
    row.same_after = max((max(ra[k]) for k in same), default=0.0)
    row.newly_failing = sum(1 for k in same if max(rb[k]) <= 1.0 < max(ra[k]))  # an inf worst hides them
    (nb, kb), (na, ka) = spread(rb), spread(ra)
    row.noise, row.repeated = max(nb, na), kb + ka


def _grew(before: float, after: float, tolerance: float) -> bool:
    if math.isinf(before):
        return False
    return after > before * (1.0 + tolerance) if before > 0 else after > 0


def _status(before: dict, after: dict, row: Row) -> str:
    ran_before = before.get("passed", 0) + before.get("failed", 0) > 0
    if row.failed_after and not row.failed_before and ran_before:
        return "regression: newly failing"
    if row.failed_before and not row.failed_after and after.get("passed", 0):
        return "fixed"
    if not row.same:
        why = "the baseline recorded no cases" if not before.get("cases") else "no case judged by both"
        return f"not compared: {why}"
    if row.newly_failing:
        return f"regression: {row.newly_failing} of the same {row.same} cases newly failing"
    if _grew(row.same_before, row.same_after, row.tolerance):
        return f"regression: worst ratio over the same {row.same} cases grown {_growth_text(row.growth)}"
    return "ok"


def _notes(row: Row) -> list:
    if _grew(row.before, row.after, row.tolerance) and not row.regression:
        return [f"new case harder: worst over all the cases {_fmt(row.before)} -> {_fmt(row.after)} "
                f"(the same cases: {_fmt(row.same_before)} -> {_fmt(row.same_after)})"]
    return []


def _pairs(before: dict, after: dict) -> tuple[str, list]:
    impls_before = {i for i, _ in before}
    impls_after = {i for i, _ in after}
    if len(impls_before) == 1 and len(impls_after) == 1 and impls_before != impls_after:
        (ib,), (ia,) = impls_before, impls_after
        return "check", [((ib, c), (ia, c)) for (_, c) in sorted(after) if (ib, c) in before]
    return "implementation and check", [(k, k) for k in sorted(after) if k in before]


def compare(before: dict, after: dict, baseline: str = "") -> Comparison:
    """Compare {(impl, check): row} tables (the baseline's and this run's)."""
    matched_by, pairs = _pairs(before, after)
    rows = []
    for kb, ka in pairs:
        b, a = before[kb], after[ka]
        row = Row(ka[1], kb[0], ka[0], _ratio(b.get("worst_ratio")), _ratio(a.get("worst_ratio")),
                  int(b.get("failed", 0)), int(a.get("failed", 0)))
        _same_cases(row, b, a)
        row.status = _status(b, a, row)
        row.notes = _notes(row)
        rows.append(row)
    used_before = {kb for kb, _ in pairs}
    used_after = {ka for _, ka in pairs}
    return Comparison(baseline, matched_by, rows, sorted(set(before) - used_before),
                      sorted(set(after) - used_after))


# ----------------------------------------------------------------------------- output


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3f}"


def _growth_text(g: float) -> str:
    return "inf" if math.isinf(g) else f"{g:.2f}x"


def _table(c: Comparison) -> list[str]:
    head = ("check", "before", "after", "same cases", "worst same", "growth", "worst all",
            "failed", "status")
    lines = [head]
    for r in c.rows:
        lines.append((r.check, r.impl_before, r.impl_after, str(r.same),
                      f"{_fmt(r.same_before)} -> {_fmt(r.same_after)}", _growth_text(r.growth),
                      f"{_fmt(r.before)} -> {_fmt(r.after)}",
                      f"{r.failed_before} -> {r.failed_after}", r.status))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


def _noise_line(c: Comparison) -> str:
    repeated = sum(r.repeated for r in c.rows)
    noise = max((r.noise for r in c.rows), default=0.0)
    tol = max((r.tolerance for r in c.rows), default=REL_TOL)
    return (f"noise: {repeated} case(s) judged twice within a run, largest relative spread "
            f"{noise:.3g}; growth tolerance {tol:.3g}")


def render(c: Comparison) -> str:
    """The comparison as a table, the measured noise, notes, then one line per regression."""
    out = [f"baseline {c.baseline} (rows matched by {c.matched_by}; worst ratios over the cases "
           f"both runs judged, and over all)"] + _table(c) + [_noise_line(c)]
    if c.unmatched_before:
        out.append(f"only in the baseline: {', '.join(f'{i} {k}' for i, k in c.unmatched_before)}")
    if c.unmatched_after:
        out.append(f"not in the baseline: {', '.join(f'{i} {k}' for i, k in c.unmatched_after)}")
    for r in c.rows:
        out += [f"note {r.check} ({r.impl_after}): {n}" for n in r.notes]
    regressions = c.regressions
    for r in regressions:
        out.append(f"REGRESSION {r.check} ({r.impl_after} against {r.impl_before}): "
                   f"{r.status[len('regression: '):]}; worst ratio over the same cases "
                   f"{_fmt(r.same_before)} -> {_fmt(r.same_after)} (tolerance {r.tolerance:.3g}), "
                   f"over all {_fmt(r.before)} -> {_fmt(r.after)}, failed tests "
                   f"{r.failed_before} -> {r.failed_after}")
    out.append(f"baseline: {len(regressions)} regression(s) in {len(c.rows)} matched check(s)"
               if regressions else f"baseline: no regression in {len(c.rows)} matched check(s)")
    return "\n".join(out)


def to_dict(c: Comparison) -> dict:
    def num(x):
        return "inf" if math.isinf(x) else x
    return {"file": c.baseline, "matched_by": c.matched_by, "rel_tol": REL_TOL,
            "noise_margin": NOISE_MARGIN,
            "rows": [{"check": r.check, "implementation_before": r.impl_before,
                      "implementation_after": r.impl_after, "same_cases": r.same,
                      "worst_same_before": num(r.same_before), "worst_same_after": num(r.same_after),
                      "growth": num(r.growth), "worst_before": num(r.before),
                      "worst_after": num(r.after), "growth_all": num(r.growth_all),
                      "noise": r.noise, "repeated_cases": r.repeated, "tolerance": r.tolerance,
                      "failed_before": r.failed_before, "failed_after": r.failed_after,
                      "status": r.status, "notes": list(r.notes)} for r in c.rows],
            "regressions": [r.check for r in c.regressions],
            "only_in_baseline": [list(k) for k in c.unmatched_before],
            "not_in_baseline": [list(k) for k in c.unmatched_after]}
