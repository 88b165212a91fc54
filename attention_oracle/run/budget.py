"""Bounded time per check: a wall-time budget that ends the search with a verdict, and a shape
budget for implementations that compile (JIT, autotune) on every new shape.

Time. A check's search (grid, replays, Hypothesis' examples, every triage round) stops before
the next example once ``seconds`` have passed (``--oracle-check-budget``, else the profile's,
``profiles.check_budget``), unless the current round has already seen a failing example: that
failure is shrunk and reported as usual. Stopping raises :class:`BudgetReached`, a
``BaseException`` that Hypothesis does not count as a failure (it leaves ``given`` at once); the
runner ends the round on it and the test's verdict is what was judged so far, with the note
"budget reached after N judged examples" in its Sink (``record.note_budget``).

Under ``ci`` (``spare_grid``) the covering grid always runs whole and no shape budget applies:
the grid's verdict depends on the commit alone; the search after it is cut by time. Without a
time budget (``fuzz``) neither budget applies.

Shapes. The shape of a case is its size fields and dtype (:data:`SHAPE_FIELDS` it has). Each
process keeps, per implementation, the shapes already called and the wall time of their first
and of a later call (:class:`Shapes`). An implementation whose first call of some shape costs
more than :data:`JIT_SECONDS` over a later call of the same shape, for
:data:`JIT_EVIDENCE` shapes, is compiling. From then on a
check gives at most :data:`NEW_SHAPES_PER_CHECK` shapes not seen before in this process a call;
other examples of new shapes are rejected (``hypothesis.reject``: not run, not failed). So the
search reuses shapes that earlier checks compiled, and shrinking, whose smaller shapes are new,
keeps to compiled ones. A search whose every example was such a new shape
(Hypothesis' Unsatisfiable) ends as the time budget does, with a note. Deterministic: the same draws give the same decisions, except for the
JIT detection itself, which is a measurement.
"""
from __future__ import annotations

import dataclasses
import time

from hypothesis import reject

SHAPE_FIELDS = ("L", "S", "E", "Ev", "dtype", "topk", "topk_length")
JIT_EVIDENCE = 2  # shapes whose first call cost the excess: a process' one-time warm-up is not a compile
JIT_SECONDS = 0.5
NEW_SHAPES_PER_CHECK = 4


class BudgetReached(BaseException):
    """The check's time budget ran out before this example (not a failure)."""


def shape_of(case) -> tuple:
    """(field, value) of ``case``'s :data:`SHAPE_FIELDS` (lists as tuples)."""
    fields = dataclasses.asdict(case) if dataclasses.is_dataclass(case) else dict(vars(case))
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(fields.items())
                 if k in SHAPE_FIELDS)


class Shapes:
    """One implementation's shapes called in this process: shape -> [first call s, later call s]."""

    def __init__(self):
        self.times: dict[tuple, list] = {}
        self.compiling = False
        self.evidence = 0

    def seen(self, shape: tuple) -> bool:
        return shape in self.times

    def record(self, shape: tuple, seconds: float) -> None:
        entry = self.times.get(shape)
        if entry is None:
            self.times[shape] = [seconds, None]
        elif entry[1] is None:
            entry[1] = seconds
            self.evidence += entry[0] - seconds > JIT_SECONDS
            self.compiling = self.evidence >= JIT_EVIDENCE


_SHAPES: dict[str, Shapes] = {}


def shapes(impl: str) -> Shapes:
    """The per-process shape registry of implementation ``impl``."""
    return _SHAPES.setdefault(impl, Shapes())


class CheckBudget:
    """The budgets of one check's search on one implementation (``seconds`` None: no time
    limit)."""

    def __init__(self, impl: str, seconds: float | None, spare_grid: bool = False):
        self.seconds = seconds
        self.spare_grid = spare_grid  # the grid always runs whole; no shape budget (ci)
        self.shapes = shapes(impl)
        self.start = time.monotonic()
        self.new_shapes = 0
        self.judged = 0
        self.failing = False  # this round has seen a failing example: let it shrink
        self.reached = False
        self.rejected = 0  # examples of new shapes not run (shape budget)
        self._call: tuple | None = None

    def new_round(self) -> None:
        self.failing = False

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def before(self, case, grid: bool = False) -> None:
        """Before an example's call (``grid``: a covering-grid case): stop the search if the time
        is spent, skip a new shape beyond the shape budget of a compiling implementation."""
        if grid and self.spare_grid:
            return
        if self.seconds is not None and not self.failing and self.elapsed() > self.seconds:
            self.reached = True
            raise BudgetReached(f"budget of {self.seconds:g} s reached")
        shape = shape_of(case)
        if not self.shapes.seen(shape):
            # the shape budget rides with the time budget: without one (ci) nothing is measured
            # into the verdict, which then depends on the draws alone
            if (self.seconds is not None and not self.spare_grid and self.shapes.compiling
                    and self.new_shapes >= NEW_SHAPES_PER_CHECK):
                self.rejected += 1
                reject()
            self.new_shapes += 1
        self._call = (shape, time.perf_counter())

    def after(self, judged: bool, failed: bool) -> None:
        """After the call of the example ``before`` let through."""
        if self._call is None:
            return
        shape, t0 = self._call
        self._call = None
        self.shapes.record(shape, time.perf_counter() - t0)
        self.judged += bool(judged and not failed)
        self.failing = self.failing or failed

    def note(self) -> str:
        """The verdict's note once the budget stopped the search."""
        limit = "no time limit" if self.seconds is None else f"{self.seconds:g} s"
        return (f"budget reached after {self.judged} judged examples ({self.elapsed():.0f} s of "
                f"{limit}; {self.new_shapes} new shapes"
                f"{', implementation compiling per shape' if self.shapes.compiling else ''}"
                f"{f', {self.rejected} examples of new shapes not run' if self.rejected else ''})")
