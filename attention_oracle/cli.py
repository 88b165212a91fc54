"""The ``attention-oracle`` command (also ``python -m attention_oracle``).

    attention-oracle check --impl NAME [pytest options]   the conformance suite, from any directory
    attention-oracle replay --impl NAME --check AREA.CHECK 'CASE-JSON'
    attention-oracle dispatch [--json FILE]                which SDPA backend each call takes
    attention-oracle calibrate [--examples N] [--out DIR]  separation of correct kernels and controls

``check`` runs the conformance modules shipped inside the installed package with the suite's
pytest plugin and a pytest configuration of its own (``conformance/suite.ini``), so nothing of
the current directory (its ``conftest.py``, ``tests``, ``fixtures`` or ``benchmarks`` packages)
is mixed into the run: the suite's own modules all live under the ``attention_oracle`` name.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
USAGE = __doc__.split("\n\n")[1]


def check(argv: list[str]) -> int:
    import pytest

    # --impl names modules as `python -m` would find them: from the current directory too
    # (xdist workers inherit PYTHONPATH)
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH")) if p)
    args = [os.path.join(HERE, "conformance"), "-c", os.path.join(HERE, "conformance", "suite.ini"),
            "--rootdir", HERE, "-p", "attention_oracle.plugin", "-p", "no:cacheprovider"]
    if any(a == "-n" or a.startswith("-n") or a.startswith("--numprocesses") for a in argv):
        args += ["--dist", "loadgroup"]
    return int(pytest.main(args + list(argv)))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "check":
        return check(rest)
    if command == "replay":
        from .tools import replay
        return replay.main(rest)
    if command == "dispatch":
        from .tools import dispatch
        return dispatch.main(rest)
    if command == "calibrate":
        from .tools import calibrate
        return calibrate.main(rest)
    print(f"attention-oracle: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2
