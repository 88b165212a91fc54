"""Run one check over Hypothesis-drawn cases against one target.

A check is ``check(target, case)`` (a declared one, ``registry.Check``, judges through its
``Judge``): it raises OracleMismatch on a failure, and the target's
:class:`~attention_oracle.judge.targets.Refused` when the implementation refuses the case (counted as
unsupported: the example is skipped, not failed). If every example was refused, the test fails
("verified nothing"): what an implementation does not take is declared (capabilities), and a
check its declaration excludes is skipped before any example is drawn. A failure inside a known
failure's signature (``run/known_failures.py``, ``judge/known.py``) is counted as known and the
search goes on.
:func:`run_declared` is what a generated conformance test runs: the declaration's capability
and function requirements, then the search over its cases.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from hypothesis import example, given, note, settings
from hypothesis.errors import Unsatisfiable

import attention_oracle
from attention_oracle.judge import profiles, record
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.judge.targets import Refused, Target
from attention_oracle.run import baseline, budget, crashes, fuzzing, gpu_lock, known_failures, poison
from attention_oracle.run import grid as covering
from attention_oracle.run.triage import MAX_ROUNDS, distinct, search

_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(attention_oracle.__file__)))  # holds attention_oracle/
ISOLATED_EXAMPLES = 5  # each isolated example pays a process start, CUDA initialisation and compiles


def run_check(check, target: Target, case) -> bool:
    """Run one case; False if the implementation refused it. A failure Hypothesis reports
    (its final, shrunk example) is noted for the fuzz profile's corpus (``fuzzing``). A case
    judged (not refused) is recorded with its worst ratio (inf for an error other than a
    mismatch), for ``--baseline`` (``record.end_case``)."""
    crashes.case_started(check_name(check, case), case, target.name)  # before a call that may crash
    sink = record.current()
    known = sink.known if sink else 0
    record.begin_case()
    try:
        judged = _run_check(check, target, case)
    except Exception as exc:
        if sink is not None and not isinstance(exc, OracleMismatch):
            # an error has no ratio: the case and the test both show inf, never a passing 0
            sink.case_worst = sink.worst = float("inf")
        record.end_case(check_name(check, case), case.to_json())
        fuzzing.note_failure(check_name(check, case), case.to_json(), exc)
        raise
    if judged:
        record.end_case(check_name(check, case), case.to_json(), known=sink is not None and sink.known > known)
    return judged


def _run_check(check, target: Target, case) -> bool:
    """Run one case; False if the implementation refused it.

    The known-failure entries matching the case are active while the check runs: the Judge
    excuses only the failing elements inside their signatures, and an example whose failures
    all lay inside is counted as known in the report instead of raised."""
    sink = record.current()
    worst_before = sink.worst if sink else 0.0
    try:
        if getattr(check, "ISOLATE_ON_CUDA", False) and target.device.type == "cuda":
            return run_isolated(check, target, case)
        with poison.poisoned(), known_failures.activated(target.name, check_name(check, case),
                                                         target.device, case) as call:
            check(target, case)  # a failure inside a known signature is excused in ``call``
        if call.excused:
            _excuse(check, target, case, call, worst_before)
    except Refused:
        return False
    except OracleMismatch as exc:  # one exception class per (check, output): each bug apart
        mismatch = distinct(exc, check, target, case, check_name(check, case))
        if mismatch is None:  # reported by an earlier round of this search
            return True
        raise mismatch from None
    return True


def _excuse(check, target: Target, case, call, worst_before: float) -> None:
    """Count an example whose every failure lay inside known signatures as known, once its
    entries' mechanisms are confirmed (``Signature.confirm``: a check that must pass on the same
    case in a fresh process); an unconfirmed one is raised."""
    first, name, text = call.excused[0]
    for active, _, failure in call.excused:
        confirm = active.signature.confirm
        why = confirm and _unconfirmed(confirm, target, case)
        if why:
            raise OracleMismatch(f"{failure}\n  inside the signature of {active.finding} "
                                 f"({active.label}), but its mechanism is not confirmed: {why}")
    sink = record.current()
    known_failures.record_match(a.label for a, _, _ in call.excused)
    record.record_known(f"{first.reason} ({first.label}; {name} inside its signature: "
                        f"{first.signature.describe()})", text, sink.worst if sink else worst_before)


_CONFIRMED: dict = {}  # (impl, check, case json) -> '' or why not: one fresh process each


def _unconfirmed(confirm: str, target: Target, case) -> str:
    """'' if ``confirm`` (``area.check``) passes on ``case`` in a fresh process, else why not."""
    key = (target.name, confirm, case.to_json())
    if key not in _CONFIRMED:
        # the known failures apply there as here: the rows of another finding (F2) stay excused
        proc = subprocess.run([sys.executable, "-m", "attention_oracle.tools.replay", "--impl",
                               target.name, *gpu_lock.replay_device_args(), *_known_args(),
                               "--check", confirm, case.to_json()], capture_output=True,
                              text=True, timeout=600, cwd=_PACKAGE_PARENT)
        text = (proc.stdout + proc.stderr).strip()
        ok = proc.returncode == 0 and text.startswith("passed")
        _CONFIRMED[key] = "" if ok else f"{confirm} in a fresh process: {text[-1500:]}"
    return _CONFIRMED[key]


def _known_args() -> list:
    """A replay's options that apply the known failures as this run does: the suite's, and the
    user's file (every user entry comes from the one --known-failures file)."""
    users = known_failures.user_entries()[:1]
    return ["--known", *(f"--known-failures={os.path.abspath(e.source)}" for e in users)]


def check_name(check, case) -> str:
    """The name a check reports under: ``area.check`` (``sdpa.strided_dout``); a declared check
    knows it, a plain function is named by the case's area."""
    return getattr(check, "full_name", None) or f"{case.AREA}.{check.__name__}"


# what a replay with --known prints when known signatures took every failure
_ISOLATED_KNOWN = re.compile(r"^passed: .*\(failures inside the known signatures of (.+)\)$")


def run_isolated(check, target: Target, case) -> bool:
    """Run one case in a fresh process (``python -m attention_oracle.tools.replay``), so that a kernel
    that faults on the device cannot poison this process' CUDA context.

    The call is recorded under the function the case calls, as an in-process call would be:
    a backend that refuses every misaligned input (torch-flash on CUDA) has still verified its
    function on other inputs. Recorded under the check's name, such refusals read as
    "torch-flash.sdpa.misaligned_inputs ... verified nothing" and turned passing GPU runs red (docs/DESIGN.md "6. Running: poisoning, the grid, triage, known failures, time, crashes, baseline")."""
    name = check_name(check, case)
    flags = [] if poison.is_enabled() else ["--no-poison"]
    sink = record.current()
    worst_before = sink.worst if sink else 0.0
    # the known failures apply there as here (an entry that must confirm its mechanism fails
    # the replay: the isolated run does not confirm it)
    proc = subprocess.run([sys.executable, "-m", "attention_oracle.tools.replay", "--impl", target.name,
                           *flags, *gpu_lock.replay_device_args(), *_known_args(), "--check", name,
                           case.to_json()],
                          capture_output=True, text=True, timeout=600,
                          cwd=_PACKAGE_PARENT)
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode == 0:
        if text.startswith("unsupported"):
            record.record_call(case.function, refused=True, reason=text[:200])
            return False
        record.record_call(case.function, refused=False)
        inside = _ISOLATED_KNOWN.search(text.splitlines()[0] if text else "")
        if inside:
            labels = [label.strip() for label in inside.group(1).split(",")]
            known_failures.record_match(labels)
            record.record_known(f"inside the known signatures of {inside.group(1)} (isolated run)",
                                text, sink.worst if sink else worst_before)
        return True
    record.record_ratio(name, target.name, float("inf"))
    raise OracleMismatch(f"[{name}] implementation={target.name}: isolated run failed "
                         f"(exit {proc.returncode}):\n{text[-3000:]}\n  reproduce: "
                         f"{case.repro(name, target.name)}")


def run_property(check, target: Target, cases, *, function: str,
                 settings_: settings | None = None, replay=(), grid=()) -> None:
    """Hypothesis search of ``check`` on ``target`` over the ``cases`` strategy; ``grid``
    ([(name, Case)]: the check's covering grid, ``run/grid.py``) and ``replay`` (Cases: a
    ``--baseline``'s, ``baseline.replay_cases``) run first, as explicit examples (the grid
    first). After a grid case fails, the rest of the grid waits for the next round of the
    search (``triage.search``: each round triages one new failure) and the search proper runs
    once the grid passes."""
    if target.unavailable:
        pytest.skip(f"{target.name} unavailable: {target.unavailable}")
    if not target.offers(function):
        pytest.skip(f"{target.name} does not offer {function}")
    if function in target.broken:  # a signature that breaks the contract: no search, one clear failure
        pytest.fail(f"{target.name}.{target.broken[function]}", pytrace=False)
    ran = {"ok": 0, "refused": 0, "grid_failed": False}
    names = {id(case): name for name, case in grid}
    limits = budget.CheckBudget(target.name, profiles.check_budget(), spare_grid=profiles.grid_spared())

    def one(case):
        name = names.get(id(case))
        if name is not None and ran["grid_failed"]:
            return  # one grid failure per round, each triaged
        if name is not None:
            note(f"grid case: {name}")
        note(f"case: {case.to_json()}")
        note(f"replay: {case.repro(check_name(check, case), target.name)}")
        judged = True
        limits.before(case, grid=name is not None)  # BudgetReached: the time is spent; a new shape of a compiling kernel: rejected
        try:
            judged = run_check(check, target, case)
        except BaseException:
            ran["grid_failed"] = ran["grid_failed"] or name is not None
            limits.after(judged, failed=True)
            raise
        finally:
            record.record_example(name, refused=not judged)
        limits.after(judged, failed=False)
        ran["ok" if judged else "refused"] += 1

    if (settings_ or settings()).database is not None:  # ci and gpu keep none: seeds unchanged
        fuzzing.key_test(one, fuzzing.key_of(check, function, target.name, target.device.type))
    test = given(case=cases)(one)
    for case in reversed(replay):  # Hypothesis runs the explicit examples last added first
        test = example(case=case)(test)
    for _, case in reversed(grid):
        test = example(case=case)(test)
    if settings_ is None and getattr(check, "ISOLATE_ON_CUDA", False) and target.device.type == "cuda":
        settings_ = settings(max_examples=min(settings().max_examples, ISOLATED_EXAMPLES))
    if settings_ is not None:
        test = settings_(test)
    test = fuzzing.reruns_keep_entries(test)  # a second search keeps the first one's failures
    isolated = getattr(check, "ISOLATE_ON_CUDA", False) and target.device.type == "cuda"

    def one_round():
        ran["grid_failed"] = False
        limits.new_round()
        try:
            test()
        except budget.BudgetReached:  # ends the rounds: the verdict is what was judged so far
            record.note_budget(limits.note())
        except Unsatisfiable:
            if not limits.rejected:
                raise
            record.note_budget(limits.note())  # every search example was a new shape: shape budget

    search(one_round, rounds=1 if isolated else MAX_ROUNDS)  # every distinct failure, each triaged
    if ran["ok"] == 0 and ran["refused"] == 0 and (limits.reached or limits.rejected):
        pytest.fail(f"judged nothing: the check's budget ended its search before any example "
                    f"ran ({limits.note()})", pytrace=False)
    if ran["ok"] == 0 and ran["refused"] > 0:  # undeclared refusals: nothing was verified
        sink = record.current()
        why = sink.refusal if sink else ""
        pytest.fail(f"verified nothing: refused all {ran['refused']} examples (first reason: "
                    f"{why}); {target.name} declares no capabilities that exclude them",
                    pytrace=False)


def run_declared(check, target: Target, variant: str = "") -> None:
    """One conformance test: a declared check (``registry.Check``) on ``target`` over its cases
    (``variant``: one of ``check.variants``). Skipped, with the reason, where the target's
    declared capabilities exclude the check or it lacks a function the check needs."""
    why = check.unsupported(target, variant)
    if why:
        pytest.skip(f"not verified: {why} (capabilities declared by {target.name})")
    for function in check.needs:
        if not target.offers(function):
            pytest.skip(f"{target.name} does not offer {function}")
    record.record_variant(variant)
    # a replay-only fuzz run replays the example database and searches nothing: no grid either
    grid = [] if fuzzing.settings()["replay_only"] else covering.cases(check, target, variant)
    run_property(check, target, check.strategy(target, variant), function=check.function(variant),
                 replay=baseline.replay_cases(target, check.full_name, variant,
                                              judged=[c.to_json() for _, c in grid]),
                 grid=grid)
