"""What several of the suite's own tests share: a real pytest run of the suite in a subprocess, the
search of a negative control until a check catches it, and a bug only the search meets."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given

from attention_oracle import oracle
from attention_oracle.controls.sdpa_broken import WrongScale
from attention_oracle.judge import profiles, record
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.run import grid
from attention_oracle.run.runner import run_check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The ci profile's search after the covering grid, in the suite's own subprocess runs: they test
# the run's machinery (reports, crashes, known failures, triage), which the grid's cases exercise;
# a passing check would otherwise search for the profile's whole 15 s
SEARCH_SECONDS = 3.0


def run_suite(*args, search_seconds: float | None = SEARCH_SECONDS) -> subprocess.CompletedProcess:
    """``pytest -q --hypothesis-profile ci ARGS`` from the repository root, in a fresh process
    that inherits neither this run's xdist worker nor its ORACLE_IMPL. The search of each check
    stops after ``search_seconds`` without a failure (``--oracle-check-budget``), unless ARGS
    set a budget or another profile, or ``search_seconds`` is None."""
    if search_seconds is not None and not {"--oracle-check-budget", "--hypothesis-profile"} & set(args):
        args = ("--oracle-check-budget", str(search_seconds), *args)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTEST_XDIST") and k != "ATTENTION_ORACLE_CRASH_DIR"}
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


class SearchOnlyBug:
    """WrongScale's bug on head dims that are not a multiple of 16: the covering grid (head dims
    16 and 64 under this small declaration) never meets it, so the search finds it, and only the
    search's failures go to the example database (grid cases are explicit examples). For the
    tests of the database itself."""

    CAPABILITIES = {"dtypes": (torch.float32,), "size": "interpreted", "max_head_dim": 64, "ranks": (3,),
                    "gqa": False, "layouts": ("contiguous",), "masks": ("none", "bool")}

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        impl = WrongScale() if query.shape[-1] % 16 != 0 else oracle
        return impl.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                 enable_gqa)


SEARCH_ONLY_BUG = SearchOnlyBug()


@pytest.fixture
def ci_profile():
    """The ``ci`` profile (its grid strength and sizes) for the test, the active one restored after."""
    before = profiles.name()
    profiles.activate("ci", on_gpu=False)
    yield
    profiles.activate(before, on_gpu=False)
