"""Case collection for the calibration tools: draw N cases per (check, target, dtype), run the
check on each, record what every output's ratio was.

Shared by ``tools/calibrate.py`` (the calibration report) and ``benchmarks/rule_calibration.py``
(the ensemble rule against the naive-only rule on the same cases):

- :func:`draw_cases` / :class:`CaseBook`: the first N cases of a derandomized Hypothesis run
  that only collects them (no shrinking, no database), drawn within a target's capabilities
  narrowed to one dtype; the same N cases every time and for every target declaring the same;
- :func:`run_example`: one check on one case, with poisoned allocations (optional) and, for
  comparing rules, the lp ensemble replaced (``algorithms=``); the example's outcome
  (``passed`` / ``failed`` / ``refused`` / ``error``), its worst ratio, the ratio per output,
  the known-failure class it falls in, its time and the case as JSON;
- :func:`collect`: every :class:`Group`'s examples round-robin (example 1 of every group, then
  example 2, ...) until done, out of a wall budget, or stopped by SIGTERM, so a cut removes the
  last examples of every group evenly and what was collected is still there to report.

Ratios are err / allowed from the report sink (``record.open_sink(keep_ratios=True)``): 0 for an
exact match, inf for a failed exact convention, NaN where the gold is finite, or an error.
"""
from __future__ import annotations

import contextlib
import math
import signal
import time
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, settings

from attention_oracle.checks import catalogue
from attention_oracle.checks.dsa import checks as dsa_checks
from attention_oracle.checks.sdpa import checks as sdpa_checks
from attention_oracle.judge import record
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.judge.targets import Refused, load
from attention_oracle.run import known_failures, poison


@dataclass
class Group:
    """One (implementation, check, variant, dtype) and the cases it runs.

    ``impl`` is the name given to ``targets.load`` (loaded once, on first use), unless
    ``target`` holds an already built Target (e.g. an oracle algorithm offered as one)."""

    kind: str                 # "correct" or "control"
    impl: str                 # target name as given to targets.load
    label: str                # short name for tables (control class name or built-in)
    area: str
    check: str
    variant: str              # "rope" / "nope" for DSA, "" elsewhere
    dtype: str
    cases: list = field(default_factory=list)
    examples: list = field(default_factory=list)  # one judged example (a dict) per case run
    target: object = None

    @property
    def check_name(self) -> str:
        return f"{self.area}.{self.check}" + (f"[{self.variant}]" if self.variant else "")


# ----------------------------------------------------------------------------- drawing


def strategy(area: str, check: str, variant: str, caps):
    """The suite's strategy for ``area.check`` (DSA: ``variant`` "rope" / "nope") within
    ``caps`` (a target's capabilities, narrowed to one dtype): the registry's lookup."""
    return catalogue.strategy(f"{area}.{check}", caps, variant)


def draw_cases(strategy, n: int) -> list:
    """The first ``n`` cases a derandomized Hypothesis run draws (no shrinking, no database)."""

    drawn: list = []

    @settings(max_examples=n, phases=[Phase.generate], database=None, derandomize=True,
              deadline=None, suppress_health_check=list(HealthCheck), print_blob=False)
    @given(case=strategy)
    def collect(case):  # the name and source seed the derandomized draw: keep them as they are
        drawn.append(case)

    collect()
    return drawn[:n]


class CaseBook:
    """Cases drawn once per (area, check, variant, capabilities): targets declaring the same
    capabilities get the very same cases, and a larger request extends a smaller one's."""

    def __init__(self):
        self._drawn: dict = {}

    def cases(self, area: str, check: str, variant: str, caps, n: int) -> list:
        key = (area, check, variant, caps)
        raise_if_stopped()
        if len(self._drawn.get(key, ())) < n:
            self._drawn[key] = draw_cases(strategy(area, check, variant, caps), n)
        return self._drawn[key][:n]


# ----------------------------------------------------------------------------- judging one case


@contextlib.contextmanager
def lp_algorithms(algorithms):
    """The agreement checks' lp ensemble replaced by ``algorithms`` (None: left as it is).
    SDPA and DSA checks read their module's ``ALGORITHMS``; index.compacted_attention goes
    through DSA's."""
    if algorithms is None:
        yield
        return
    saved = [(m, m.ALGORITHMS) for m in (sdpa_checks, dsa_checks)]
    try:
        for m, _ in saved:
            m.ALGORITHMS = tuple(algorithms)
        yield
    finally:
        for m, value in saved:
            m.ALGORITHMS = value


def _outputs(ratios) -> dict:
    """{output: worst ratio} from the sink's (check, output, ratio) records."""
    worst: dict = {}
    for _check, output, ratio in ratios:
        key = output or "*"
        worst[key] = max(worst.get(key, 0.0), ratio)
    return worst


def _output_of(message: str) -> str:
    head = message.split("\n", 1)[0]
    for part in head.split():
        if part.startswith("output="):
            return part[len("output="):].rstrip(":")
    return "*"


def run_example(check, target, case, check_name: str, use_poison: bool = True,
                algorithms=None) -> dict:
    """Run one check on one case; the example's outcome, worst ratio and ratio per output.

    ``ratio`` is None for a refusal, inf for an error (any exception other than a refusal or
    an OracleMismatch: a crash of the implementation is a failure). ``known`` is the
    known-failure class the case falls in ('' if none); it is recorded, not applied."""

    sink, token = record.open_sink(keep_ratios=True)
    outcome, message = "passed", ""
    t0 = time.perf_counter()
    try:
        with lp_algorithms(algorithms), poison.poisoned(enabled=use_poison):
            check(target, case)
    except Refused as exc:
        outcome, message = "refused", str(exc)[:300]
    except OracleMismatch as exc:
        outcome, message = "failed", str(exc)
    except Exception as exc:
        outcome, message = "error", f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        record.close_sink(token)
    outputs = _outputs(sink.ratios)
    if outcome in ("failed", "error"):
        key = _output_of(message) if outcome == "failed" else "error"
        if outcome == "error" or key not in outputs:
            outputs[key] = max(outputs.get(key, 0.0), math.inf if outcome == "error" else sink.worst)
    ratio = max(outputs.values(), default=0.0) if outcome != "refused" else None
    known = known_failures.case_reason(target.name, check_name, target.device, case)
    return {"outcome": outcome, "ratio": ratio, "outputs": outputs, "known": known,
            "seconds": round(time.perf_counter() - t0, 4), "case": case.to_json(),
            "message": message[:3000] if outcome != "passed" else ""}


# ----------------------------------------------------------------------------- the loop


class Stopped(BaseException):
    """SIGTERM arrived (``timeout`` ending a device command): stop collecting, keep what is there.
    A BaseException, so that no check's ``except Exception`` takes it for a failure."""


_SIGNALLED: list = []  # the signal that asked to stop, once one has


def raise_if_stopped() -> None:
    """Raise :class:`Stopped` if SIGTERM arrived (the handler's own raise can land where it is
    swallowed, e.g. in a garbage-collector callback: the flag is checked between examples)."""
    if _SIGNALLED:
        raise Stopped(f"signal {_SIGNALLED[0]}")


@contextlib.contextmanager
def stop_on_sigterm():
    """Inside the block SIGTERM sets the stop flag and raises :class:`Stopped` where the program
    is (the previous handler comes back after)."""
    def handler(signum, frame):
        _SIGNALLED.append(signum)
        raise Stopped(f"signal {signum}")
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: no handler, the budget still applies
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cuda_broken(device) -> bool:
    """Whether the CUDA context is unusable (a device fault during the last example)."""
    import torch
    if device.type != "cuda":
        return False
    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True


def _expected_s(g: Group) -> float:
    """What the group's next example is expected to take: its slowest so far (0 before any)."""
    return max((_seconds(e) for e in g.examples), default=0.0)


def _seconds(example) -> float:
    if "seconds" in example:
        return example["seconds"]
    return sum(v.get("seconds", 0.0) for v in example.values() if isinstance(v, dict))


def collect(groups: list, device, *, budget_s: float | None = None, start: float | None = None,
            use_poison: bool = True, judge=None, after_round=None, log=print) -> dict:
    """Run every group's cases round-robin; append each judged example to ``group.examples``.

    ``judge(check, target, case, check_name, use_poison)`` judges one case (default
    :func:`run_example`; rule_calibration judges each case under two rules). The budget counts
    from ``start`` (``time.monotonic()``; default now): no example starts once it is spent, nor
    one whose group's slowest example so far would overrun it. SIGTERM stops the loop at once
    (the example in flight is dropped). A broken CUDA context stops it too. ``after_round(i)``
    runs after every round (e.g. to write the partial report). Returns ``elapsed_s``, ``rounds``
    (completed) and ``stopped`` ('' when every case ran)."""

    judge = judge or run_example
    start = time.monotonic() if start is None else start
    targets: dict = {}
    rounds = max((len(g.cases) for g in groups), default=0)
    stopped, done = "", 0

    def left() -> float:
        return math.inf if budget_s is None else budget_s - (time.monotonic() - start)

    with stop_on_sigterm():
        try:
            for i in range(rounds):
                for g in groups:
                    raise_if_stopped()
                    if stopped:
                        break
                    if i >= len(g.cases):
                        continue
                    if left() <= 0:
                        stopped = f"budget of {budget_s:.0f} s spent"
                        break
                    if _expected_s(g) > left():
                        continue  # would overrun: leave it, others may still fit
                    target = g.target
                    if target is None:
                        target = targets.get(g.impl) or targets.setdefault(g.impl, load(g.impl, device))
                    check = catalogue.checks(g.area)[g.check]
                    g.examples.append(judge(check, target, g.cases[i], f"{g.area}.{g.check}",
                                            use_poison))
                    if cuda_broken(device):
                        stopped = (f"CUDA context broke during {g.label} {g.check_name} {g.dtype} "
                                   f"(example {i})")
                        log(f"collect: {stopped}; stopping")
                if stopped:
                    break
                done = i + 1
                log(f"collect: round {done}/{rounds} done after {time.monotonic() - start:.0f} s")
                if after_round is not None:
                    after_round(done)
        except Stopped as exc:
            stopped = f"stopped by {exc} after {time.monotonic() - start:.0f} s"
            log(f"collect: {stopped}")
    if not stopped and any(len(g.examples) < len(g.cases) for g in groups):
        stopped = f"budget of {budget_s:.0f} s: examples that would overrun it were left out"
    return {"elapsed_s": round(time.monotonic() - start, 1), "rounds": done, "stopped": stopped}
