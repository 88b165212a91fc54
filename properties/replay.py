"""Replay one case printed by a failure: ``python -m properties.replay --impl NAME --check AREA.CHECK 'JSON'``.

Runs the check once on the named implementation (built-in or ``package.module[:attr]``) and
prints the verdict; exit status 1 on a mismatch. Also replays a regression-corpus file
(``--file fixtures/regressions/X.json``).
"""
from __future__ import annotations

import argparse
import json
import sys

from . import registry
from .agreement import OracleMismatch
from .case import load_case
from .targets import Refused, load


def replay(impl: str, check: str, case_dict: dict) -> int:
    target = load(impl)
    if target.unavailable:
        print(f"{impl} unavailable: {target.unavailable}")
        return 2
    case = load_case(case_dict)
    try:
        registry.check(check)(target, case)
    except Refused as exc:
        print(f"unsupported: {exc}")
        return 0
    except OracleMismatch as exc:
        print(f"FAILED\n{exc}")
        return 1
    print(f"passed: {check} on {impl}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", default="oracle")
    p.add_argument("--check", help="AREA.CHECK, e.g. sdpa.forward_agreement")
    p.add_argument("--file", help="a regression-corpus JSON file (holds check and case)")
    p.add_argument("case", nargs="?", help="the case JSON printed by a failure")
    a = p.parse_args(argv)
    if a.file:
        with open(a.file) as f:
            entry = json.load(f)
        return replay(a.impl, entry["check"], entry["case"])
    if not (a.check and a.case):
        p.error("give --check and the case JSON, or --file")
    return replay(a.impl, a.check, json.loads(a.case))


if __name__ == "__main__":
    sys.exit(main())
