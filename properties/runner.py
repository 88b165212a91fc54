"""Run one check over Hypothesis-drawn cases against one target.

A check is ``check(target, case)``: it raises OracleMismatch on a failure, and the target's
:class:`~properties.targets.Refused` when the implementation refuses the case (counted as
unsupported: the example is skipped, not failed). If every example was refused, the test is
skipped as "unsupported"; the report turns a function refused everywhere into a failure.
"""
from __future__ import annotations

import pytest
from hypothesis import given, note, settings

from . import report
from .targets import Refused, Target


def run_check(check, target: Target, case) -> bool:
    """Run one case; False if the implementation refused it."""
    try:
        check(target, case)
    except Refused:
        return False
    return True


def run_property(check, target: Target, cases, *, function: str,
                 settings_: settings | None = None) -> None:
    """Hypothesis search of ``check`` on ``target`` over the ``cases`` strategy."""
    if target.unavailable:
        pytest.skip(f"{target.name} unavailable: {target.unavailable}")
    if not target.offers(function):
        pytest.skip(f"{target.name} does not offer {function}")
    ran = {"ok": 0, "refused": 0}

    def one(case):
        note(f"case: {case.to_json()}")
        note(f"replay: {case.repro(f'{case.AREA}.{check.__name__}', target.name)}")
        ran["ok" if run_check(check, target, case) else "refused"] += 1

    test = given(case=cases)(one)
    if settings_ is not None:
        test = settings_(test)
    test()
    if ran["ok"] == 0 and ran["refused"] > 0:
        sink = report.current()
        why = sink.refusal if sink else ""
        pytest.skip(f"unsupported: {target.name} refused all {ran['refused']} examples ({why})")
