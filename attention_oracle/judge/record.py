"""What one test saw, recorded while it runs: the worst error ratio, the examples an
implementation judged and refused, known failures and the failing examples reported.

The agreement rule, the targets and the runner record here (a context variable, one
:class:`Sink` per test); the run floor's report (``run/report.py``) aggregates the sinks on
the controller. The records travel with pytest's ``user_properties`` (so they survive
pytest-xdist).
"""

from __future__ import annotations

import contextlib
import contextvars
import math

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
        self.budget = ""  # "budget reached after N judged examples ...": the time budget ended the search
        self.bugs: list[dict] = []  # the signature of each triaged failure (run/bugs.py)
        # cases judged (``begin_case``/``end_case``): [check, case JSON, worst ratio or None if known],
        # the first JUDGED_CAP; the check's variant ('' or e.g. "rope"); ``--baseline`` replays them
        self.judged: list[list] = []
        self.variant = ""
        self.case_worst = 0.0
        # examples run (``record_example``): grid cases (distinct names), search examples, saved
        # cases replayed (the regression corpus), and of all of them those the implementation
        # refused and those judged
        self.grid_names: set[str] = set()
        self.counts = {"grid": 0, "search": 0, "replay": 0, "refused_examples": 0,
                       "judged_examples": 0}

    def as_dict(self) -> dict:
        return {"worst": self.worst, "examples": self.examples, "refused": self.refused,
                "functions": sorted(self.functions), "refusal": self.refusal, "failures": list(self.failures),
                "known": self.known, "known_first": self.known_first,
                "known_entries": dict(self.known_entries), "bugs": list(self.bugs),
                "judged": list(self.judged), "variant": self.variant, "budget": self.budget, **self.counts}


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


def note_budget(text: str) -> None:
    """The test's time budget stopped its search (``run/budget.py``): its verdict is what was judged."""
    sink = _sink.get()
    if sink is not None:
        sink.budget = "; ".join(filter(None, (sink.budget, text)))


def current() -> Sink | None:
    return _sink.get()


def record_ratio(check: str, impl: str, ratio: float, output: str = "") -> None:
    sink = _sink.get()
    if sink is not None and not math.isnan(ratio):
        sink.worst = max(sink.worst, ratio)
        sink.case_worst = max(sink.case_worst, ratio)
        if sink.ratios is not None:
            sink.ratios.append((check, output, ratio))


JUDGED_CAP = 256  # cases kept per test (and per report row and variant): what a baseline replays


def record_variant(variant: str) -> None:
    """The variant (``rope``, ``nope``; '' for a check with one) the current test runs."""
    sink = _sink.get()
    if sink is not None:
        sink.variant = variant


def begin_case() -> None:
    """A case starts: its own worst ratio starts at 0."""
    sink = _sink.get()
    if sink is not None:
        sink.case_worst = 0.0


def end_case(check: str, case_json: str, known: bool = False) -> None:
    """A case was judged (not refused): keep its JSON and its worst ratio (None for an example
    in a known failure class), among the first ``JUDGED_CAP`` cases; a case judged again is kept
    past the cap too (up to twice it), as its second ratio measures the implementation's noise."""
    sink = _sink.get()
    if sink is None or len(sink.judged) >= 2 * JUDGED_CAP:
        return
    if len(sink.judged) < JUDGED_CAP or any(e[0] == check and e[1] == case_json for e in sink.judged):
        sink.judged.append([check, case_json, None if known else sink.case_worst])


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


def record_bug(signature: dict) -> None:
    """A triaged failure's signature (plain data: ``run/bugs.py``), for the run's bug summary."""
    sink = _sink.get()
    if sink is not None:
        sink.bugs.append(signature)


def record_example(grid_name: str | None, refused: bool, replay: bool = False) -> None:
    """One example ran: a grid case (``grid_name``, counted once however many search rounds
    rerun it), a saved case replayed (``replay``: the regression corpus) or a search example;
    refused, or judged (passed, failed or known)."""
    sink = _sink.get()
    if sink is None:
        return
    if grid_name is not None:
        if grid_name in sink.grid_names:
            return
        sink.grid_names.add(grid_name)
    sink.counts["grid" if grid_name is not None else "replay" if replay else "search"] += 1
    sink.counts["refused_examples" if refused else "judged_examples"] += 1


def record_call(function: str, refused: bool, reason: str = "") -> None:
    sink = _sink.get()
    if sink is None:
        return
    sink.functions.add(function)
    sink.examples += 1
    if refused:
        sink.refused += 1
        sink.refusal = sink.refusal or reason
