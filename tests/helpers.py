"""What several meta tests share: a real pytest run of the suite in a subprocess, and the search
of a negative control until a check catches it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given

from attention_oracle.judge import profiles, record
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.run import grid
from attention_oracle.run.runner import run_check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_suite(*args) -> subprocess.CompletedProcess:
    """``pytest -q --hypothesis-profile ci ARGS`` from the repository root, in a fresh process
    that inherits neither this run's xdist worker nor its ORACLE_IMPL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.pop("ORACLE_IMPL", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "--hypothesis-profile", "ci", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def caught_message(check, target, cases, variant: str = "") -> str:
    """The check's covering grid (``run/grid.py``, ``variant``), then a search of ``cases`` with
    the controls' settings (no shrinking, first failure wins), as a conformance test runs them;
    the OracleMismatch the check must raise, as text. Fails the test if nothing is caught."""
    with record.silenced():
        for _, case in grid.cases(check, target, variant):
            try:
                run_check(check, target, case)
            except OracleMismatch as exc:
                return str(exc)

    @profiles.control_settings()
    @given(case=cases)
    def search(case):
        run_check(check, target, case)

    with record.silenced(), pytest.raises(OracleMismatch) as caught:
        search()
    return str(caught.value)
