"""``benchmarks/h200.sh``, the device entry point, checked where it cannot run: a typo found
on the device costs a 10-minute call of a 30-minute budget.

The script parses; every task its dispatcher takes has a function and is named in its header;
the test node ids it runs first exist; without arguments it prints its usage."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "h200.sh")


@pytest.fixture(scope="module")
def text():
    with open(SCRIPT) as fh:
        return fh.read()


def test_the_script_parses():
    r = subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _dispatched(text):
    line = next(line for line in text.splitlines() if re.match(r"\s+sdpa\|.*\) tasks\+=", line))
    return line.strip().split(")")[0].split("|")


def test_every_dispatched_task_has_a_function_and_a_line_in_the_header(text):
    tasks = _dispatched(text)
    assert "newbwd" in tasks and "gluonfwd" in tasks
    header = text.split("set -uo pipefail")[0]
    for task in tasks:
        assert re.search(rf"^task_{task}\(\) {{", text, re.M), f"no task_{task} function"
        assert re.search(rf"^#\s+{task}\s", header, re.M), f"{task} is not described in the header"
    usage = re.search(r"h200\.sh \{([a-z0-9,]+)\}", text).group(1).split(",")
    assert set(tasks) <= set(usage), set(tasks) - set(usage)


def test_the_first_cases_it_runs_exist(text):
    """DSA_FIRST / SDPA_FIRST: the small cases a new kernel's call starts with (collected on
    any machine; they run on a GPU only)."""
    ids = re.findall(r'^[A-Z]+_FIRST="\$TESTS/([^"]+)"', text, re.M)
    assert len(ids) == 2, ids
    nodes = [os.path.join("tests", "fast", i) for i in ids]
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                        "-p", "no:cacheprovider", *nodes], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and f"{len(nodes)} tests collected" in r.stdout, r.stdout[-2000:]


def test_without_a_task_it_prints_its_usage():
    r = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "usage:" in r.stderr, (r.returncode, r.stderr)
