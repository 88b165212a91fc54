"""Replay one case printed by a failure: ``python -m attention_oracle.tools.replay --impl NAME --check AREA.CHECK 'JSON'``.

Runs the check once on the named implementation (built-in or ``package.module[:attr]``) and
prints the verdict; exit status 1 on a mismatch. Also replays a regression-corpus file
(``--file DIR/X.json``), and ``--save NAME`` adds the case to your corpus (``--corpus DIR``,
default ``.hypothesis/corpus``; plain JSON, never pickle), which every later run replays on
every selected implementation (``conformance/test_regressions.py``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from attention_oracle.checks.catalogue import case_class, load_case
from attention_oracle.checks.catalogue import check as find_check
from attention_oracle.judge import known
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.judge.targets import Refused, load
from attention_oracle.run import corpus, fuzzing, known_failures, poison


def replay(impl: str, check: str, case_dict: dict, with_known: bool = False) -> int:
    """``with_known``: the known failures matching the case excuse what their signatures
    cover, as in a run (a mechanism they would confirm counts as a failure here)."""
    target = load(impl)
    if target.unavailable:
        print(f"{impl} unavailable: {target.unavailable}")
        return 2
    case = load_case(case_dict)
    excusing = (known_failures.activated(target.name, check, target.device, case) if with_known
                else known.activate(()))
    try:
        with poison.poisoned(), excusing as call:
            find_check(check)(target, case)  # as in runner.run_check: unwritten elements are NaN
        unconfirmed = [a for a, _, _ in call.excused if a.signature.confirm]
        if unconfirmed:
            print(f"FAILED\n{unconfirmed[0].label} excuses a failure only once {unconfirmed[0].signature.confirm} "
                  f"passes in a fresh process; not confirmed in a replay")
            return 1
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
    labels = ", ".join(dict.fromkeys(a.label for a, _, _ in call.excused))
    print(f"passed: {check} on {impl}" + (f" (failures inside the known signatures of {labels})"
                                          if labels else ""))
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
    p.add_argument("--known", action="store_true",
                   help="apply the suite's known failures (and --known-failures FILE's) as a run does")
    p.add_argument("--known-failures", metavar="FILE", default=None,
                   help="with --known: your known failures too (TOML or JSON)")
    p.add_argument("case", nargs="?", help="the case JSON printed by a failure")
    a = p.parse_args(argv)
    if a.known_failures:
        try:
            known_failures.install(known_failures.load(a.known_failures))
        except known_failures.KnownFailuresError as exc:
            p.error(str(exc))
    if a.cuda_device is not None:
        import torch
        torch.cuda.set_device(a.cuda_device)
    if a.no_poison:
        poison.set_enabled(False)
    if a.file:
        try:
            with open(a.file) as f:
                entry = json.load(f)
            check, case = entry["check"], entry["case"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            p.error(f"--file {a.file}: not a corpus entry ({type(exc).__name__}: {exc})")
    elif not (a.check and a.case):
        p.error("give --check and the case JSON, or --file")
    else:
        try:
            check, case = a.check, json.loads(a.case)
        except ValueError as exc:
            p.error(f"the case is not JSON: {exc}")
    why = _invalid(check, case)
    if why:
        p.error(f"{'--file ' + a.file + ': ' if a.file else ''}{why}")
    if a.save:
        print(corpus.save(a.save, check, case, a.note, corpus_dir=a.corpus or fuzzing.DEFAULT_CORPUS))
    return replay(a.impl, check, case, a.known)


def _invalid(check, case) -> str:
    """Why ``check`` and the ``case`` dict cannot be replayed ('' if they can): the check must
    exist and the case be a dict of its area's fields (a misspelt field is not dropped)."""
    try:
        find_check(str(check))
    except ValueError as exc:
        return f"--check {check}: {exc}"
    if not isinstance(case, dict):
        return f"the case must be a JSON object, got {type(case).__name__}"
    area = str(check).partition(".")[0]
    if case.get("area") != area:
        return f"the case's area {case.get('area')!r} is not {check}'s ({area!r})"
    fields = {f.name for f in dataclasses.fields(case_class(area))} | {"area"}
    unknown = sorted(set(case) - fields)
    if unknown:
        return f"the case has unknown field(s) {unknown}; a {area} case has {sorted(fields - {'area'})}"
    return ""


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The verdict is printed; skip interpreter teardown, where a CUDA process once aborted
    # ("terminate called without an active exception", exit -6) after its check had passed
    # (H200; docs/DESIGN.md "8. GPU placement, locks and device faults"), which the isolated runner would read as a failure.
    os._exit(code or 0)
