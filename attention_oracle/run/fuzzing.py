"""Fuzzing at scale: one Hypothesis example database shared by many processes or hosts, and
failures found saved to a regression corpus, once each.

- The database (``fuzz`` profile): a directory (``DirectoryBasedExampleDatabase``; a network
  directory for several hosts) or a Redis server (``redis://HOST:PORT/N``: Hypothesis'
  ``RedisExampleDatabase``, for hosts that share no file system; ``run.exampledb``), optionally
  read-only copies beside it (a team's database), each a directory or a Redis URL.
  Hypothesis replays every saved failure of a test before searching (its ``reuse`` phase), so a
  failure one process saved is the first example every later process runs.
- Database keys. Every check runs through the one inner function of ``runner.run_property``,
  whose Hypothesis key (a digest of its source) is therefore the same for every check and
  implementation; since the reuse phase deletes entries that do not fail, one test would erase
  another's failures. :func:`key_test` gives each (check, function, implementation, size,
  device type) its own key, the same in every process and on every host running the suite's
  version of the code.
- The corpus: a directory of ``run.corpus`` entries. A failing conformance example under the
  ``fuzz`` profile (the shrunk example: the one Hypothesis runs last, ``is_final``) lands in
  ``<corpus>/<area>_<check>_<hash>.json``, the hash taken over (check, case JSON): a case found
  by several processes, or on several implementations, is written once (``os.link`` refuses to
  replace a file, atomically, on local and network file systems alike). With a Redis database
  the entry is also stored on the server (:func:`share_found`, ``SET NX``: the first writer of
  a name wins), from where ``attention-oracle corpus pull DIR`` exports the campaign's corpus.

The plugin reads options and environment and calls :func:`configure`; nothing here reads the
environment.
"""
from __future__ import annotations

import contextvars
import hashlib
import json
import os

from hypothesis.control import current_build_context
from hypothesis.database import ExampleDatabase, MultiplexedDatabase, ReadOnlyDatabase
from hypothesis.errors import HypothesisException

from attention_oracle.judge import profiles, record
from attention_oracle.run import corpus as corpus_store
from attention_oracle.run import exampledb

DEFAULT_DB = os.path.join(".hypothesis", "fuzz")
DEFAULT_CORPUS = os.path.join(".hypothesis", "corpus")

_config = {"db": DEFAULT_DB, "read": (), "corpus": DEFAULT_CORPUS, "examples": None, "replay_only": False,
           "cutoff": None}


def configure(db: str | None = None, read: tuple[str, ...] = (), corpus: str | None = None,
              examples: int | None = None, replay_only: bool = False, cutoff: float | None = None) -> None:
    """Where the fuzz profile keeps its database and its found failures, and how long it searches
    (``examples`` per test; ``replay_only``: run the database's examples and search nothing).

    ``cutoff``: corpus entries written at or after this time (``time.time()``) are not replayed
    in this run. Every process of one run gets the controller's start time, so all xdist
    workers, also one started later to replace a crashed worker, collect the same tests while
    this run (or another host of the campaign) adds entries."""
    if examples is not None and examples < 1:
        raise ValueError(f"--oracle-fuzz-examples must be >= 1, got {examples}")
    for option, where in [("--oracle-fuzz-db", db or DEFAULT_DB)] + [("--oracle-fuzz-read", r) for r in read]:
        if exampledb.is_url(where):
            exampledb.check_url(where, option)
    _config.update(db=db or DEFAULT_DB, read=tuple(read), corpus=corpus or DEFAULT_CORPUS,
                   examples=examples, replay_only=replay_only, cutoff=cutoff)


def settings() -> dict:
    return dict(_config)


def corpus_dir() -> str:
    return _config["corpus"]


def corpus_cutoff() -> float | None:
    return _config["cutoff"]


def database(path: str | None = None, read: tuple[str, ...] | None = None) -> ExampleDatabase:
    """The fuzz database: ``path`` read and written, each of ``read`` only read; each a directory
    or a Redis URL (whose server must answer now: ``exampledb.DatabaseError`` otherwise)."""
    own = exampledb.open_database(path or _config["db"], "--oracle-fuzz-db")
    extra = _config["read"] if read is None else read
    if extra:
        own = MultiplexedDatabase(own, *(ReadOnlyDatabase(exampledb.open_database(p, "--oracle-fuzz-read"))
                                         for p in extra))
    return RerunSafeDatabase(own)


def shared_db() -> str | None:
    """The URL of the fuzz database when it is a Redis server (where found failures are shared
    as well), else None."""
    return _config["db"] if exampledb.is_url(_config["db"]) else None


_RERUN: contextvars.ContextVar = contextvars.ContextVar("oracle_fuzz_rerun", default=False)


class RerunSafeDatabase(ExampleDatabase):
    """A database that deletes nothing while a test's search runs a second time in one process.

    The runner's search may run one Hypothesis test several times (rounds that take the
    failures already found as passed, to find the bugs behind them). Hypothesis deletes every
    database entry that does not fail when it replays it, so the second round would erase the
    first round's failure from the shared database and no other process would replay it.
    During a rerun (:func:`reruns_keep_entries`) deletions are dropped and moves keep the
    source; entries are saved as usual."""

    def __init__(self, inner: ExampleDatabase):
        super().__init__()
        self.inner = inner

    def __repr__(self) -> str:
        return f"RerunSafeDatabase({self.inner!r})"

    def save(self, key: bytes, value: bytes) -> None:
        self.inner.save(key, value)

    def fetch(self, key: bytes):
        yield from self.inner.fetch(key)

    def delete(self, key: bytes, value: bytes) -> None:
        if not _RERUN.get():
            self.inner.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        if _RERUN.get():
            self.inner.save(dest, value)
        else:
            self.inner.move(src, dest, value)


def reruns_keep_entries(test):
    """``test`` (a Hypothesis test), whose second and later calls delete no database entry."""
    calls = [0]

    def run():
        calls[0] += 1
        token = _RERUN.set(calls[0] > 1)
        try:
            return test()
        finally:
            _RERUN.reset(token)
    return run


# ----------------------------------------------------------------------------- database keys

def key_of(check, function: str, impl: str, device_type: str) -> bytes:
    """The Hypothesis database key of one conformance property, the same in every process.

    The problem sizes (``profiles.size()``) and the device type are part of it: a failure found
    with large sizes on a GPU does not reproduce from the same choices with small sizes on a CPU,
    and a host that fails to reproduce an entry deletes it from the shared database."""
    return (f"attention-oracle|{check.__module__}.{check.__qualname__}|{function}|{impl}|"
            f"{profiles.size()}|{device_type}").encode()


def key_test(test, key: bytes):
    """Give ``test`` (the function ``given`` wraps) its own database key. This is the attribute
    Hypothesis' own pytest plugin sets to separate parametrized tests; Hypothesis adds it to the
    digest of the function's source."""
    test._hypothesis_internal_add_digest = key
    return test


# ----------------------------------------------------------------------------- found failures

def note_failure(check: str, case_json: str, exc: BaseException) -> None:
    """Record, in the test's report sink, a failing example Hypothesis is reporting (its final,
    shrunk run). Hypothesis' own control flow (rejections, stops) is not a failure."""
    if isinstance(exc, HypothesisException) or not isinstance(exc, Exception):
        return
    try:
        final = current_build_context().is_final
    except Exception:  # outside a Hypothesis test (a plain call): nothing is being reported
        return
    if final:
        record.record_failure(check, case_json)


def entry_name(check: str, case: dict) -> str:
    """``<area>_<check>_<12 hex digits>``, the digits a hash of (check, case): the corpus key."""
    text = json.dumps({"check": check, "case": case}, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{check.replace('.', '_')}_{digest}"


def _note(impl: str, device: str) -> str:
    return f"found by fuzzing {impl} on {device}"


def save_found(check: str, case_json: str, impl: str, device: str, corpus: str | None = None) -> tuple[str, bool]:
    """Add a fuzz-found failure to the corpus unless it is there: (path, newly written)."""
    case = json.loads(case_json)
    name = entry_name(check, case)
    path = corpus_store.save(name, check, case, _note(impl, device), corpus_dir=corpus or corpus_dir(), exclusive=True)
    if path is None:
        return os.path.join(corpus or corpus_dir(), f"{name}.json"), False
    return path, True


def share_found(check: str, case_json: str, impl: str, device: str) -> tuple[str, bool] | None:
    """With a Redis fuzz database, store a fuzz-found failure on the server unless an entry of
    that name is there (``SET NX``): (``URL NAME``, newly written); None without one. The text
    is the corpus file's (:func:`save_found`). A lost server raises (redis or socket errors)."""
    url = shared_db()
    if url is None:
        return None
    case = json.loads(case_json)
    name = entry_name(check, case)
    text = corpus_store.entry_text(check, case, _note(impl, device))
    new = exampledb.share_entry(exampledb.connect(url), name, text)
    return f"{exampledb.redacted(url)} {name}", new
