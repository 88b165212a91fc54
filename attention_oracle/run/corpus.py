"""The regression corpus: JSON entries ``{"check", "note", "case"}``, one per file.

The package's own corpus is ``attention_oracle/fixtures/regressions/``; a fuzz campaign keeps
its found failures in a directory of its own (``--oracle-corpus``). :func:`entries` lists both
(the package's first), :func:`save` adds one, atomically and once where ``exclusive``.
Plain JSON, never pickle.
"""
from __future__ import annotations

import json
import os
import tempfile

from attention_oracle.checks.catalogue import check as find_check
from attention_oracle.checks.catalogue import load_case

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
