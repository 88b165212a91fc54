"""A worker that dies inside the implementation (SIGSEGV) fails the test it was running, naming
the signal and the example with its replay command; the rest of the run finishes with a report
(``run/crashes.py``, the plugin's ``pytest_handlecrashitem``)."""
from __future__ import annotations

import json
import signal

from attention_oracle.run import crashes
from tests.helpers import SEARCH_SECONDS, run_suite

CRASHING = "attention_oracle.controls.crashing"


def test_a_segfault_fails_its_test_and_the_run_finishes(tmp_path):
    report = tmp_path / "reports" / "r.json"  # outside the clone: the rootdir must not move there
    proc = run_suite("-n", "2", "--impl", CRASHING, "--oracle-report", str(report),
                     "attention_oracle/conformance/test_sdpa.py",
                     "-k", "mismatched_value_rows or rank3_equals_rank4")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "crashed with SIGSEGV (signal 11) during test_mismatched_value_rows" in out, out[-3000:]
    assert "replay: python -m attention_oracle replay --impl " + CRASHING in out
    assert "unrecognized arguments" not in out and "maximum crashed workers" not in out
    assert out.count("node down") == 1, "the crashed test ran again on the replacement worker"
    rows = {r["check"]: r for r in json.loads(report.read_text())["rows"]
            if r["implementation"] == CRASHING}
    assert rows["sdpa.mismatched_value_rows"]["failed"] == 1
    assert rows["sdpa.rank3_equals_rank4"]["passed"] == 1


def test_exit_status_names_the_signal():
    assert crashes.exit_status(-signal.SIGSEGV) == "SIGSEGV (signal 11)"
    assert crashes.exit_status(-signal.SIGABRT) == "SIGABRT (signal 6)"
    assert crashes.exit_status(70) == "exit 70"
    assert crashes.exit_status(None) == "exit status unknown"


def test_an_isolated_run_finds_the_package():
    """On CUDA some checks run each example in a fresh process (``run_isolated``): that process
    must import the package it was started from, wherever the run's working directory is."""
    from attention_oracle.checks.catalogue import check
    from attention_oracle.checks.sdpa.cases import SdpaCase
    from attention_oracle.judge.targets import load
    from attention_oracle.run.runner import run_isolated

    case = SdpaCase(batch=(1,), hq=1, hkv=1, L=3, S=4, E=8, Ev=8, layout_q="misaligned", seed=1)
    assert run_isolated(check("sdpa.misaligned_inputs"), load("oracle"), case) is True


def test_the_installed_command_finishes_after_a_crash_among_several_checks(tmp_path):
    """``attention-oracle check`` with a crash before the last tests: the replacement worker must
    not leave the run waiting (pytest-xdist's loadgroup did, after every test had reported:
    docs/FINDINGS.md F22). It ends with the crash failed, the rest judged and the report written."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTEST_XDIST") and k != crashes.ENV}
    env["CI"] = "true"
    report = tmp_path / "out" / "r.json"
    proc = subprocess.run([sys.executable, "-m", "attention_oracle", "check", "--impl",
                           "attention_oracle.controls.crashing", "-n", "2", "-k",
                           "value_rows or rank3 or scale", "--oracle-check-budget", str(SEARCH_SECONDS),
                           "--oracle-report", str(report)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "crashed with SIGSEGV (signal 11)" in proc.stdout, proc.stdout[-3000:]
    assert "1 failed" in proc.stdout and "passed" in proc.stdout, proc.stdout[-1500:]
    assert report.exists()
