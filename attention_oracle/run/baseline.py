"""Change validation: ``--baseline OLD.json`` compares this run with an earlier report.

The baseline is any ``--oracle-report`` JSON: the same implementation at another version, or
another implementation. Rows are matched by check, and by implementation too when both runs
have it; when each run checks exactly one implementation under different names (``mykernel``
v1 against ``mykernel_v2``), by check alone. Other rows are listed as unmatched.

Per matched check the comparison shows the worst error ratio before and after (error over the
allowed bound; below 1 passes) and its growth. A **regression** is

- a newly failing check: it had failed no test before and fails now; or
- a worst ratio grown by ``GROWTH`` (2x) or more, where the new ratio is at least
  ``MIN_RATIO``: a kernel still inside the rule whose error doubled has lost precision (for
  instance by dropping fp32 accumulation), which the rule alone would not show.

``MIN_RATIO`` (0.05) keeps the growth test away from errors too small to compare: below a
twentieth of the bound, the error is a fraction of the output's own rounding (the rule allows at
least 2 ulps of it), and a different summation order moves it by whole multiples. Such changes
are shown ("grown, below 0.05") but not counted. The run exits non-zero on a regression.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

GROWTH = 2.0
MIN_RATIO = 0.05


class BaselineError(ValueError):
    """The baseline file is unreadable or not an ``--oracle-report`` JSON."""


@dataclass
class Row:
    check: str
    impl_before: str
    impl_after: str
    before: float          # worst ratio
    after: float
    failed_before: int
    failed_after: int
    status: str            # "regression: ...", "fixed", "grown, below ...", "ok"

    @property
    def regression(self) -> bool:
        return self.status.startswith("regression")

    @property
    def growth(self) -> float:
        """after / before: 1 when unchanged (0 -> 0, inf -> inf), inf from 0 or to inf."""
        if self.after == self.before:
            return 1.0
        if self.before == 0.0 or math.isinf(self.after):
            return math.inf
        return self.after / self.before


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
    return {(r["implementation"], r["check"]): r for r in rows}


def _status(before: dict, after: dict, row: Row) -> str:
    ran_before = before.get("passed", 0) + before.get("failed", 0) > 0
    if row.failed_after and not row.failed_before and ran_before:
        return "regression: newly failing"
    if row.failed_before and not row.failed_after and after.get("passed", 0):
        return "fixed"
    if row.growth >= GROWTH and row.after > 0:
        if row.after >= MIN_RATIO:
            return f"regression: worst ratio grown {_growth_text(row.growth)}"
        return f"grown, below {MIN_RATIO}"
    return "ok"


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
                  int(b.get("failed", 0)), int(a.get("failed", 0)), "")
        row.status = _status(b, a, row)
        rows.append(row)
    used_before = {kb for kb, _ in pairs}
    used_after = {ka for _, ka in pairs}
    return Comparison(baseline, matched_by, rows, sorted(set(before) - used_before),
                      sorted(set(after) - used_after))


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3f}"


def _growth_text(g: float) -> str:
    return "inf" if math.isinf(g) else f"{g:.2f}x"


def render(c: Comparison) -> str:
    """The comparison as a table, then one line per regression."""
    head = ("check", "before", "after", "worst before", "worst after", "growth", "failed", "status")
    lines = [head]
    for r in c.rows:
        lines.append((r.check, r.impl_before, r.impl_after, _fmt(r.before), _fmt(r.after),
                      _growth_text(r.growth), f"{r.failed_before} -> {r.failed_after}", r.status))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = [f"baseline {c.baseline} (rows matched by {c.matched_by})"]
    out += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in lines]
    out.insert(2, "  ".join("-" * w for w in widths))
    if c.unmatched_before:
        out.append(f"only in the baseline: {', '.join(f'{i} {k}' for i, k in c.unmatched_before)}")
    if c.unmatched_after:
        out.append(f"not in the baseline: {', '.join(f'{i} {k}' for i, k in c.unmatched_after)}")
    regressions = c.regressions
    for r in regressions:
        out.append(f"REGRESSION {r.check} ({r.impl_after} against {r.impl_before}): "
                   f"{r.status[len('regression: '):]}; worst ratio {_fmt(r.before)} -> {_fmt(r.after)}, "
                   f"failed tests {r.failed_before} -> {r.failed_after}")
    out.append(f"baseline: {len(regressions)} regression(s) in {len(c.rows)} matched check(s)"
               if regressions else f"baseline: no regression in {len(c.rows)} matched check(s)")
    return "\n".join(out)


def to_dict(c: Comparison) -> dict:
    def num(x):
        return "inf" if math.isinf(x) else x
    return {"file": c.baseline, "matched_by": c.matched_by,
            "rows": [{"check": r.check, "implementation_before": r.impl_before,
                      "implementation_after": r.impl_after, "worst_before": num(r.before),
                      "worst_after": num(r.after), "growth": num(r.growth),
                      "failed_before": r.failed_before, "failed_after": r.failed_after,
                      "status": r.status} for r in c.rows],
            "regressions": [r.check for r in c.regressions],
            "only_in_baseline": [list(k) for k in c.unmatched_before],
            "not_in_baseline": [list(k) for k in c.unmatched_after]}
