"""Known-failure signatures: the elements a known failure excuses, applied by the Judge.

A known failure (``run/known_failures.py`` loads the entries) names an implementation, a check,
a device, a predicate over the case and a :class:`Signature`: the outputs it excuses, and
either every element of them or only the query rows an area's row selector picks (the fully
masked rows of F2, the rows of finite minimums of F10 and F11: docs/FINDINGS.md). While a
check runs, the runner :func:`activate` s the entries matching (implementation, check,
device, case); when a judgment of an output fails, the Judge asks :func:`judged` to re-judge
the elements outside the signature:

- every element of the output inside the signature: excused;
- a query-row output (the area's ``row_outputs``: SDPA ``out`` [*batch, Hq, L, Ev], ``lse``
  [*batch, Hq, L], ``dq`` [*batch, Hq, L, E]): the same judgment on the other rows;
- a key-side gradient (``dk``, ``dv``): the area's ``rerun`` computes the gradients again with
  the excused rows' dout set to zero (their contribution removed) and the rule judges those;
- anything else (a plain property of the whole output): outside the signature.

A failure outside the signature is raised with "outside the known signature of Fn"; an
excused one is kept in the call's ``excused`` list, the check goes on judging its other
outputs, and the runner counts the example as known once the call ends (after confirming a
mechanism, ``Signature.confirm``).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable

import torch

from attention_oracle.judge import record
from attention_oracle.judge.agreement import OracleMismatch, Verdict

ANY = "*"


@dataclasses.dataclass(frozen=True)
class Signature:
    """``outputs``: the output names excused (``"*"``: any); ``rows``: the name of a row selector
    of the case's area (None: every element of those outputs); ``confirm``: ``area.check`` that
    must pass on the same case in a fresh process before an example is excused (a mechanism
    finding: F9's dq is right without the other dout layout's plan)."""

    outputs: tuple = (ANY,)
    rows: str | None = None
    confirm: str | None = None

    def covers(self, name: str) -> bool:
        return ANY in self.outputs or name in self.outputs

    def describe(self) -> str:
        what = "any output" if ANY in self.outputs else ", ".join(self.outputs)
        where = f" on the {self.rows} rows" if self.rows else ""
        then = f", if {self.confirm} passes in a fresh process" if self.confirm else ""
        return f"{what}{where}{then}"


@dataclasses.dataclass
class AreaRows:
    """What an area offers signatures: {selector name: case -> bool [*batch, Hq, L] of excused
    query rows}, the outputs indexed by query rows first, and ``rerun(judge, case, rows) ->
    (gradients {name: tensor}, gold, lp)``: the gradients with the rows' dout set to zero."""

    selectors: dict = dataclasses.field(default_factory=dict)
    row_outputs: tuple = ()
    rerun: Callable | None = None


_AREAS: dict[str, AreaRows] = {}


def area(name: str) -> AreaRows:
    return _AREAS.setdefault(name, AreaRows())


def selector(area_name: str, name: str):
    """Decorator: register ``fn(case) -> bool tensor [*batch, Hq, L]`` as row selector ``name``."""
    def wrap(fn):
        area(area_name).selectors[name] = fn
        return fn
    return wrap


def selectors(area_name: str) -> tuple[str, ...]:
    return tuple(area(area_name).selectors)


@dataclasses.dataclass(frozen=True)
class Active:
    """One entry matched for one check call: its label, finding (``F2``), reason and signature."""

    label: str
    finding: str
    reason: str
    signature: Signature


@dataclasses.dataclass
class Call:
    """The active entries of one check call and what they excused: [(Active, output, failure)]."""

    entries: tuple
    excused: list = dataclasses.field(default_factory=list)
    reruns: dict = dataclasses.field(default_factory=dict)


_call: contextvars.ContextVar = contextvars.ContextVar("oracle_known_call", default=None)


@contextlib.contextmanager
def activate(entries):
    """While a check runs: the known-failure entries (:class:`Active`) matching its case; yields
    the :class:`Call`, whose ``excused`` lists the failures they excused."""
    call = Call(tuple(entries))
    token = _call.set(call if call.entries else None)
    try:
        yield call
    finally:
        _call.reset(token)


class _NotInside(Exception):
    """No element of the failing output lies inside the signature."""


EXCUSED = Verdict(err=0.0, bound=float("inf"), floor=float("inf"), ratio=0.0)


class Excuse:
    """The union of the covering entries' signatures for one output of one case."""

    def __init__(self, judge, name: str, covering: list):
        self.judge, self.name, self.covering = judge, name, covering
        self.all = any(a.signature.rows is None for a in covering)
        self._rows = None

    @property
    def findings(self) -> str:
        return ", ".join(dict.fromkeys(a.finding for a in self.covering))

    def rows(self) -> torch.Tensor:
        """Bool [*batch, Hq, L]: the query rows inside any covering signature."""
        if self._rows is None:
            rows_of = area(self.judge.case.AREA).selectors
            masks = [rows_of[a.signature.rows](self.judge.case) for a in self.covering]
            self._rows = torch.stack([m.bool() for m in masks]).any(0)
        return self._rows

    def query_rows(self) -> bool:
        return self.name in area(self.judge.case.AREA).row_outputs

    def elements(self, x: torch.Tensor) -> torch.Tensor:
        """Bool, shaped like ``x`` (a query-row output): the elements inside the signature."""
        rows = self.rows()
        if not self.query_rows() or tuple(x.shape[:rows.dim()]) != tuple(rows.shape):
            raise _NotInside()
        if not bool(rows.any()):
            raise _NotInside()
        full = rows.reshape(tuple(rows.shape) + (1,) * (x.dim() - rows.dim())).expand(x.shape)
        return full.to(x.device)

    def rerun(self):
        """(gradients, gold, lp) with the excused rows' dout set to zero (cached per call)."""
        call = _call.get()
        key = tuple(a.label for a in self.covering)
        if key not in call.reruns:
            fn = area(self.judge.case.AREA).rerun
            if fn is None or not bool(self.rows().any()):
                raise _NotInside()
            call.reruns[key] = fn(self.judge, self.judge.case, self.rows())
        return call.reruns[key]


def judged(judge, name: str, attempt: Callable, complement: Callable | None = None):
    """``attempt()`` (a judgment of output ``name``); if it fails and an active entry's signature
    covers ``name``, ``complement(excuse)`` re-judges what lies outside it (``excuse``: an
    :class:`Excuse`; None: only a whole-output excuse applies). Returns what the judgment
    returns (:data:`EXCUSED` where the whole output was excused)."""
    call = _call.get()
    if call is None:
        return attempt()
    sink = record.current()
    before = sink.worst if sink else 0.0
    try:
        return attempt()
    except OracleMismatch as exc:
        covering = [a for a in call.entries if a.signature.covers(name)]
        if not covering:
            raise OracleMismatch(f"{exc}\n  {_outside(call.entries, name)}") from None
        excuse = Excuse(judge, name, covering)
        if sink is not None:
            sink.worst = before
        try:
            if excuse.all:
                result = EXCUSED
            elif complement is None:
                raise _NotInside()
            else:
                result = complement(excuse)
        except _NotInside:
            raise OracleMismatch(f"{exc}\n  outside the known signature of {excuse.findings} "
                                 f"({_labels(covering)}: no failing element of {name} lies "
                                 f"inside it)") from None
        except OracleMismatch as inner:
            raise OracleMismatch(f"{inner}\n  outside the known signature of {excuse.findings} "
                                 f"({_labels(covering)}: the elements it excuses were left out "
                                 f"and the rest still fails)") from None
        for active in _relied_on(excuse):  # each one's mechanism is confirmed before the excuse holds
            call.excused.append((active, name, str(exc)))
        return result


def _relied_on(excuse: Excuse) -> list:
    """The entries an excuse rests on: one whole-output entry (one that needs no confirmation
    first), else every covering entry (their rows were left out together)."""
    if excuse.all:
        whole = [a for a in excuse.covering if a.signature.rows is None]
        return sorted(whole, key=lambda a: bool(a.signature.confirm))[:1]
    return list(excuse.covering)


def _labels(entries) -> str:
    return "; ".join(f"{a.label} excuses {a.signature.describe()}" for a in entries)


def _outside(entries, name: str) -> str:
    return (f"outside the known signature of {', '.join(dict.fromkeys(a.finding for a in entries))} "
            f"({_labels(entries)}; not {name}){_near_misses(entries, name)}")


def _near_misses(entries, name: str) -> str:
    """A hint where an entry's signature names ``name`` but for case or punctuation ("dQ",
    "dq-latent": a slip that leaves the entry excusing nothing; two real outputs never differ
    so): '' if none does."""
    def bare(text):
        return "".join(ch for ch in text.lower() if ch.isalnum())
    slips = [o for a in entries for o in a.signature.outputs
             if o != ANY and o != name and bare(o) == bare(name)]
    if not slips:
        return ""
    return (f"\n  a signature names {', '.join(repr(o) for o in dict.fromkeys(slips))}, not "
            f"{name!r}: output names are matched exactly")
