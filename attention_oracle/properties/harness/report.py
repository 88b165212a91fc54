"""Per-test records and the end-of-run table (implementation x check).

During a test, the checks record the error ratios they see and the examples an
implementation refused. The records travel with pytest's ``user_properties`` (so they
survive pytest-xdist), and conftest aggregates them on the controller into a table:
passed / failed / skipped / unsupported / known failures (xfail: whole tests; known: examples
in a known failure class) and the worst error ratio.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import math
from collections import defaultdict

_sink: contextvars.ContextVar = contextvars.ContextVar("oracle_sink", default=None)


class Sink:
    """What one test saw: the worst ratio, examples run and refused, functions called."""

    def __init__(self, keep_ratios: bool = False):
        self.worst = 0.0
        self.ratios: list | None = [] if keep_ratios else None  # (check, output, ratio); calibration
        self.examples = 0
        self.refused = 0
        self.functions: set[str] = set()
        self.refusal = ""
        self.known = 0
        self.known_first = ""
        self.failures: list[dict] = []  # {"check", "case"} of each failing example reported
        self.known_entries: dict[str, int] = {}  # --known-failures entry label -> examples it took

    def as_dict(self) -> dict:
        return {"worst": self.worst, "examples": self.examples, "refused": self.refused,
                "functions": sorted(self.functions), "refusal": self.refusal, "failures": list(self.failures),
                "known": self.known, "known_first": self.known_first,
                "known_entries": dict(self.known_entries)}


def open_sink(keep_ratios: bool = False) -> tuple[Sink, contextvars.Token]:
    """A sink for one test (``keep_ratios``: also every ratio, as the calibration report needs)."""
    sink = Sink(keep_ratios)
    return sink, _sink.set(sink)


def close_sink(token) -> None:
    _sink.reset(token)


@contextlib.contextmanager
def silenced():
    """Run checks without recording (negative controls: their failures are the point)."""
    token = _sink.set(None)
    try:
        yield
    finally:
        _sink.reset(token)


def current() -> Sink | None:
    return _sink.get()


def record_ratio(check: str, impl: str, ratio: float, output: str = "") -> None:
    sink = _sink.get()
    if sink is not None and not math.isnan(ratio):
        sink.worst = max(sink.worst, ratio)
        if sink.ratios is not None:
            sink.ratios.append((check, output, ratio))


def record_known(reason: str, failure: str, worst_before: float) -> None:
    """An example failed in a known failure class: count it, keep the first failure's text, and
    leave the worst ratio as it was (that column is for examples judged by the rule)."""
    sink = _sink.get()
    if sink is None:
        return
    sink.worst = worst_before
    sink.known += 1
    sink.known_first = sink.known_first or f"{failure}\n  known: {reason}"


def record_known_entry(label: str) -> None:
    """A user's known-failures entry took a failing example (for the stale-entry report)."""
    sink = _sink.get()
    if sink is not None:
        sink.known_entries[label] = sink.known_entries.get(label, 0) + 1


def record_failure(check: str, case_json: str) -> None:
    """A failing example the test reports (Hypothesis' shrunk one): the fuzz profile saves it."""
    sink = _sink.get()
    if sink is not None:
        sink.failures.append({"check": check, "case": case_json})


def record_call(function: str, refused: bool, reason: str = "") -> None:
    sink = _sink.get()
    if sink is None:
        return
    sink.functions.add(function)
    sink.examples += 1
    if refused:
        sink.refused += 1
        sink.refusal = sink.refusal or reason


# ----------------------------------------------------------------------------- aggregation

OUTCOMES = ("passed", "failed", "skipped", "unsupported", "xfail")


class Table:
    """Aggregates test reports into rows keyed by (implementation, check)."""

    def __init__(self):
        self.rows: dict = defaultdict(lambda: {**{o: 0 for o in OUTCOMES}, "worst_ratio": 0.0,
                                               "examples": 0, "refused": 0, "known": 0,
                                               "known_first": ""})
        # (impl, function) -> [tests that verified something, tests fully refused]
        self.functions: dict = defaultdict(lambda: [0, 0])
        self.known_entries: dict[str, int] = defaultdict(int)  # user entry label -> examples
        self.extra: dict = {}  # further top-level keys of the JSON report (baseline, known file)

    def add(self, impl: str, check: str, outcome: str, info: dict | None) -> None:
        row = self.rows[(impl, check)]
        row[outcome] += 1
        if info:
            row["worst_ratio"] = max(row["worst_ratio"], info.get("worst", 0.0))
            row["examples"] += info.get("examples", 0)
            row["refused"] += info.get("refused", 0)
            row["known"] += info.get("known", 0)
            row["known_first"] = row["known_first"] or info.get("known_first", "")
            for label, n in info.get("known_entries", {}).items():
                self.known_entries[label] += n
            for fn in info.get("functions", []):
                entry = self.functions[(impl, fn)]
                if outcome in ("passed", "failed", "xfail"):
                    entry[0] += 1
                elif outcome == "unsupported":
                    entry[1] += 1

    def verified_nothing(self) -> list[tuple[str, str]]:
        """Functions offered by an implementation that refused every input given to them."""
        return sorted(k for k, (ok, refused) in self.functions.items() if ok == 0 and refused > 0)

    def render(self) -> str:
        if not self.rows:
            return "(no oracle checks ran)"
        head = ("implementation", "check", "pass", "fail", "skip", "unsup", "xfail", "known",
                "worst ratio")
        lines = [head]
        for (impl, check), r in sorted(self.rows.items()):
            worst = r["worst_ratio"]
            lines.append((impl, check, str(r["passed"]), str(r["failed"]), str(r["skipped"]),
                          str(r["unsupported"]), str(r["xfail"]), str(r["known"]),
                          "inf" if math.isinf(worst) else f"{worst:.3f}"))
        widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
        out = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in lines]
        out.insert(1, "  ".join("-" * w for w in widths))
        nothing = self.verified_nothing()
        if nothing:
            out.append("")
            for impl, fn in nothing:
                out.append(f"FAILURE: {impl}.{fn} is offered but refused every input it was given: "
                           f"it verified nothing")
        return "\n".join(out)

    def to_json(self) -> str:
        rows = [{"implementation": i, "check": c, **r} for (i, c), r in sorted(self.rows.items())]
        for r in rows:
            if math.isinf(r["worst_ratio"]):
                r["worst_ratio"] = "inf"
        return json.dumps({"rows": rows, "verified_nothing": [f"{i}.{f}" for i, f in self.verified_nothing()],
                           **self.extra}, indent=2)
