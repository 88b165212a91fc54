"""Replay one case printed by a failure: ``python -m attention_oracle.tools.replay --impl NAME --check AREA.CHECK 'JSON'``.

Runs the check once on the named implementation (built-in or ``package.module[:attr]``) and
prints the verdict; exit status 1 on a mismatch. Also replays a regression-corpus file
(``--file DIR/X.json``), and ``--save NAME`` adds the case to your corpus (``--corpus DIR``,
default ``.hypothesis/corpus``; plain JSON, never pickle), which every later run replays on
every selected implementation (``conformance/test_regressions.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from attention_oracle.checks.catalogue import check as find_check
from attention_oracle.checks.catalogue import load_case
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.judge.targets import Refused, load
from attention_oracle.run import corpus, fuzzing, poison


def replay(impl: str, check: str, case_dict: dict) -> int:
    target = load(impl)
    if target.unavailable:
        print(f"{impl} unavailable: {target.unavailable}")
        return 2
    case = load_case(case_dict)
    try:
        with poison.poisoned():  # as in runner.run_check: unwritten output elements are NaN
            find_check(check)(target, case)
    except Refused as exc:
        print(f"unsupported: {exc}")
        return 0
    except OracleMismatch as exc:
        print(f"FAILED\n{exc}")
        return 1
    except Exception as exc:  # a crash of the implementation (or of the device) is a failure too
        import traceback
        traceback.print_exc()
        print(f"ERROR {type(exc).__name__}: {exc}")
        return 3
    print(f"passed: {check} on {impl}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="attention-oracle replay", description="Re-run one case a failure printed, on one implementation: the verdict, exit 1 on a mismatch.")
    p.add_argument("--impl", default="oracle")
    p.add_argument("--check", help="AREA.CHECK, e.g. sdpa.forward_agreement")
    p.add_argument("--file", help="a regression-corpus JSON file (holds check and case)")
    p.add_argument("--save", metavar="NAME",
                   help=f"add the case to your corpus, DIR/NAME.json (DIR: --corpus, default "
                        f"{fuzzing.DEFAULT_CORPUS}, which every later run replays)")
    p.add_argument("--note", default="", help="with --save: what the case found")
    p.add_argument("--corpus", metavar="DIR", default=None,
                   help=f"with --save: the corpus directory (default {fuzzing.DEFAULT_CORPUS}; the "
                        f"suite's own corpus is attention_oracle/fixtures/regressions)")
    p.add_argument("--cuda-device", type=int, default=None, metavar="N",
                   help="run on CUDA device N (the isolated runner passes its worker's device)")
    p.add_argument("--no-poison", action="store_true",
                   help="leave new tensors uninitialised (by default torch.empty and its family "
                        "return NaN / sentinel-filled tensors while the check runs)")
    p.add_argument("case", nargs="?", help="the case JSON printed by a failure")
    a = p.parse_args(argv)
    if a.cuda_device is not None:
        import torch
        torch.cuda.set_device(a.cuda_device)
    if a.no_poison:
        poison.set_enabled(False)
    if a.save:
        print(corpus.save(a.save, a.check, json.loads(a.case), a.note, corpus_dir=a.corpus or fuzzing.DEFAULT_CORPUS))
    if a.file:
        with open(a.file) as f:
            entry = json.load(f)
        return replay(a.impl, entry["check"], entry["case"])
    if not (a.check and a.case):
        p.error("give --check and the case JSON, or --file")
    return replay(a.impl, a.check, json.loads(a.case))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The verdict is printed; skip interpreter teardown, where a CUDA process once aborted
    # ("terminate called without an active exception", exit -6) after its check had passed
    # (H200; docs/DESIGN.md "8. GPU placement, locks and device faults"), which the isolated runner would read as a failure.
    os._exit(code or 0)
