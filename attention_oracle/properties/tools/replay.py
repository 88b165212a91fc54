"""Replay one case printed by a failure: ``python -m attention_oracle.properties.tools.replay --impl NAME --check AREA.CHECK 'JSON'``.

Runs the check once on the named implementation (built-in or ``package.module[:attr]``) and
prints the verdict; exit status 1 on a mismatch. Also replays a regression-corpus file
(``--file fixtures/regressions/X.json``), and ``--save NAME`` adds the case to that corpus
(``fixtures/regressions/NAME.json``, plain JSON: never pickle), which ``attention_oracle/conformance/test_regressions.py``
replays on every selected implementation from then on.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from attention_oracle.properties.harness import poison, registry
from attention_oracle.properties.harness.agreement import OracleMismatch
from attention_oracle.properties.harness.case import load_case
from attention_oracle.properties.harness.targets import Refused, load


def replay(impl: str, check: str, case_dict: dict) -> int:
    target = load(impl)
    if target.unavailable:
        print(f"{impl} unavailable: {target.unavailable}")
        return 2
    case = load_case(case_dict)
    try:
        with poison.poisoned():  # as in runner.run_check: unwritten output elements are NaN
            registry.check(check)(target, case)
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


CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "fixtures", "regressions")


def save(name: str, check: str, case_dict: dict, note: str = "", corpus_dir: str | None = None,
         exclusive: bool = False) -> str | None:
    """Write one corpus entry, ``<corpus_dir>/NAME.json`` (default: the package's corpus); the
    case is validated by rebuilding it first. ``exclusive``: never replace an entry; returns None
    when NAME is there already (between processes too: the entry is linked into place, which is
    atomic and refuses an existing name, also on network file systems)."""
    load_case(case_dict)
    registry.check(check)
    where = corpus_dir or CORPUS
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, f"{name}.json")
    text = json.dumps({"check": check, "note": note, "case": case_dict}, indent=2, sort_keys=True) + "\n"
    if not exclusive:
        with open(path, "w") as f:
            f.write(text)
        return path
    fd, tmp = tempfile.mkstemp(dir=where, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.link(tmp, path)
    except FileExistsError:
        return None
    finally:
        os.unlink(tmp)
    return path


def corpus(*extra: str, before: float | None = None) -> list[tuple[str, dict]]:
    """(name, entry) for every file of the regression corpus, then of each ``extra`` directory
    (a fuzz campaign's corpus; one that does not exist adds nothing; a name seen already is
    skipped; with ``before``, an extra entry modified at or after that time is left out)."""
    out, seen = [], set()
    for where in (CORPUS, *extra):
        if not os.path.isdir(where):
            continue
        for fname in sorted(os.listdir(where)):
            path = os.path.join(where, fname)
            if not fname.endswith(".json") or fname[:-5] in seen:
                continue
            if where != CORPUS and before is not None and os.stat(path).st_mtime >= before:
                continue
            seen.add(fname[:-5])
            with open(path) as f:
                out.append((fname[:-5], json.load(f)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", default="oracle")
    p.add_argument("--check", help="AREA.CHECK, e.g. sdpa.forward_agreement")
    p.add_argument("--file", help="a regression-corpus JSON file (holds check and case)")
    p.add_argument("--save", metavar="NAME", help="add the case to fixtures/regressions/NAME.json")
    p.add_argument("--note", default="", help="with --save: what the case found")
    p.add_argument("--corpus", metavar="DIR", default=None,
                   help="with --save: write to DIR instead of the package's fixtures/regressions")
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
        print(save(a.save, a.check, json.loads(a.case), a.note, corpus_dir=a.corpus))
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
    # (H200, NOTES.md), which the isolated runner would read as a failure.
    os._exit(code or 0)
