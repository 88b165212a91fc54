"""The regression corpus: JSON entries ``{"check", "note", "case"}``, one per file.

The package's own corpus is ``attention_oracle/fixtures/regressions/``; a fuzz campaign keeps
its found failures in a directory of its own (``--oracle-corpus``). :func:`entries` lists both
(the package's first), :func:`save` adds one, atomically and once where ``exclusive``.
A campaign sharing a Redis server keeps its found failures there as well (``run.exampledb``:
one string per entry, the same JSON text); :func:`pull` (``attention-oracle corpus pull DIR``)
writes them into a directory. Plain JSON, never pickle.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from attention_oracle.checks.catalogue import check as find_check
from attention_oracle.checks.catalogue import load_case
from attention_oracle.run import exampledb

PACKAGE_CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "regressions")


def save(name: str, check: str, case_dict: dict, note: str = "", corpus_dir: str | None = None,
         exclusive: bool = False) -> str | None:
    """Write one corpus entry, ``<corpus_dir>/NAME.json`` (default: the package's corpus); the
    case is validated by rebuilding it first. ``exclusive``: never replace an entry; returns None
    when NAME is there already (between processes too: the entry is linked into place, which is
    atomic and refuses an existing name, also on network file systems)."""
    load_case(case_dict)
    find_check(check)
    where = corpus_dir or PACKAGE_CORPUS
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, f"{name}.json")
    text = entry_text(check, case_dict, note)
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


def entry_text(check: str, case_dict: dict, note: str = "") -> str:
    """The JSON text of one entry, as a corpus file holds it (and the shared corpus in Redis)."""
    return json.dumps({"check": check, "note": note, "case": case_dict}, indent=2, sort_keys=True) + "\n"


def entries(*extra: str, before: float | None = None) -> list[tuple[str, dict]]:
    """(name, entry) for every file of the regression corpus, then of each ``extra`` directory
    (a fuzz campaign's corpus; one that does not exist adds nothing; a name seen already is
    skipped; with ``before``, an extra entry modified at or after that time is left out)."""
    out, seen = [], set()
    for where in (PACKAGE_CORPUS, *extra):
        if not os.path.isdir(where):
            continue
        for fname in sorted(os.listdir(where)):
            path = os.path.join(where, fname)
            if not fname.endswith(".json") or fname[:-5] in seen:
                continue
            if where != PACKAGE_CORPUS and before is not None and os.stat(path).st_mtime >= before:
                continue
            seen.add(fname[:-5])
            with open(path) as f:
                out.append((fname[:-5], json.load(f)))
    return out


# ----------------------------------------------------------------------------- the shared corpus

def pull(url: str, corpus_dir: str) -> dict[str, list[str]]:
    """Write every corpus entry the Redis server at ``url`` holds into ``corpus_dir`` (as
    :func:`save` with ``exclusive``: an entry there already is kept). Returns the names by
    outcome: ``written``, ``present`` (in the directory already), ``invalid`` (not an entry:
    ``name: why``; nothing written for it). Raises ``exampledb.DatabaseError`` for a bad URL or
    an unreachable server."""
    client = exampledb.connect(url, option="--from")
    out: dict[str, list[str]] = {"written": [], "present": [], "invalid": []}
    for name, text in exampledb.shared_entries(client):
        try:
            entry = json.loads(text)
            path = save(name, entry["check"], entry["case"], entry.get("note", ""), corpus_dir=corpus_dir,
                        exclusive=True)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # not an entry
            out["invalid"].append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        out["written" if path is not None else "present"].append(name)
    return out


def main(argv: list[str], default_source: str | None = None) -> int:
    """``attention-oracle corpus pull DIR [--from URL]``: the shared corpus into DIR (0: all
    entries are in DIR now; 1: some were invalid; 2: usage, or the server cannot be used).
    ``default_source``: the URL when ``--from`` is not given (the cli passes ORACLE_FUZZ_DB)."""
    parser = argparse.ArgumentParser(prog="attention-oracle corpus")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pull", help="write the corpus entries a Redis server holds into DIR as JSON files")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--from", dest="source", metavar="URL", default=None,
                   help="the campaign's Redis URL, redis://HOST:PORT/N (default: ORACLE_FUZZ_DB)")
    args = parser.parse_args(argv)
    source = args.source or default_source
    if not source or not exampledb.is_url(source):
        p.error("pull needs the campaign's Redis URL: --from redis://HOST:PORT/N (or ORACLE_FUZZ_DB)")
    try:
        got = pull(source, args.dir)
    except exampledb.DatabaseError as exc:
        print(f"attention-oracle corpus: {exc}", file=sys.stderr)
        return 2
    print(f"attention-oracle corpus: {len(got['written'])} written to {args.dir}, "
          f"{len(got['present'])} there already, {len(got['invalid'])} invalid "
          f"(from {exampledb.redacted(source)})")
    for line in got["invalid"]:
        print(f"  invalid: {line}", file=sys.stderr)
    return 1 if got["invalid"] else 0
