"""Opening the fuzz profile's example databases from what a user writes: a directory, or the URL
of a Redis server (``redis://HOST:PORT/DB``, ``rediss://...``, ``unix:///path.sock?db=N``).

- A Redis URL opens Hypothesis' ``RedisExampleDatabase`` (keys under :data:`EXAMPLE_PREFIX`,
  Hypothesis' own keys below it, so the same keys as a directory database). The ``redis``
  client is the optional extra ``attention-oracle[redis]``; without it a Redis URL is a
  :class:`DatabaseError` that names the extra.
- :func:`connect` checks the URL and pings the server (``TIMEOUT`` seconds): a bad URL or a
  server that cannot be reached is a :class:`DatabaseError` (a ``ValueError``) when the run is
  configured, before any test runs.
- :class:`SkippingDatabase` wraps a Redis database so that a lost server never fails a test:
  each operation that raises a Redis or socket error is skipped and noted (:func:`drain_skipped`
  hands the notes to the report); after an error the server is not asked again for
  ``retry_after`` seconds (every operation in between is skipped and noted too).
- The campaign's shared corpus: one Redis string per entry, ``CORPUS_PREFIX + NAME``, holding the
  entry's JSON text (``run.corpus`` format), written with ``SET NX`` (set if absent: atomic, the
  first writer wins).

Nothing here reads the environment.
"""
from __future__ import annotations

import dataclasses
import os
import re
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

try:  # the optional extra attention-oracle[redis]
    import redis
    from hypothesis.extra.redis import RedisExampleDatabase
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError:
    redis = RedisExampleDatabase = NoBackoff = Retry = None

SCHEMES = ("redis", "rediss", "unix")
INSTALL_HINT = "pip install 'attention-oracle[redis]'"
TIMEOUT = 2.0  # seconds: connecting, and each command
RETRY_AFTER = 30.0  # seconds a lost server is left alone before it is asked again
EXAMPLE_PREFIX = b"attention-oracle:example:"
CORPUS_PREFIX = "attention-oracle:corpus:"


class DatabaseError(ValueError):
    """A database that cannot be opened: a bad URL, no redis client, an unreachable server."""


def is_url(where: str) -> bool:
    return "://" in where


def redacted(url: str) -> str:
    """``url`` without its password, ``redis://user:***@host:port/N`` (for reports and headers)."""
    return re.sub(r"^(\w+://[^:@/]*:)[^@/]*@", r"\1***@", url)


def check_url(url: str, option: str = "--oracle-fuzz-db") -> None:
    """Raise :class:`DatabaseError` (naming ``option``) unless ``url`` is a Redis URL the client
    can open: scheme redis/rediss/unix, an integer port, a database number in the path."""
    if redis is None:
        raise DatabaseError(f"{option} {redacted(url)}: a Redis database needs the redis client: {INSTALL_HINT}")
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise DatabaseError(f"{option} {redacted(url)}: scheme {parts.scheme!r} is not one of "
                            f"{', '.join(s + '://' for s in SCHEMES)} (a directory needs no scheme)")
    try:
        port = parts.port  # raises for a port that is not an integer in 0..65535
    except ValueError:
        port = -1
    if port is not None and not 0 < port < 65536:
        raise DatabaseError(f"{option} {redacted(url)}: the port is not an integer in 1..65535")
    if parts.scheme != "unix" and not re.fullmatch(r"/?|/\d+", parts.path):
        raise DatabaseError(f"{option} {redacted(url)}: the path must be a database number "
                            f"(redis://HOST:PORT/N), got {parts.path!r}")


_CLIENTS: dict[str, object] = {}
_CLIENTS_LOCK = threading.Lock()


def connect(url: str, option: str = "--oracle-fuzz-db", timeout: float = TIMEOUT):
    """A ``redis.Redis`` client of ``url`` that has answered a ping, one per URL in a process.
    Raises :class:`DatabaseError` for a bad URL or a server that does not answer in ``timeout``."""
    check_url(url, option)
    with _CLIENTS_LOCK:
        if url in _CLIENTS:
            return _CLIENTS[url]
        try:
            # one immediate retry: a pooled connection the server closed reconnects once
            client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout,
                                          retry=Retry(NoBackoff(), 1))
            client.ping()
        except (ValueError, redis.exceptions.RedisError, OSError) as exc:
            raise DatabaseError(f"{option} {redacted(url)}: cannot use the Redis server: "
                                f"{type(exc).__name__}: {exc}") from None
        _CLIENTS[url] = client
        return client


def open_database(where: str, option: str = "--oracle-fuzz-db") -> ExampleDatabase:
    """The example database at ``where``: a directory, or (URL) a Redis database that answered a
    ping, wrapped in :class:`SkippingDatabase`."""
    if not is_url(where):
        return DirectoryBasedExampleDatabase(where)
    return SkippingDatabase(RedisExampleDatabase(connect(where, option), key_prefix=EXAMPLE_PREFIX),
                            redacted(where))


def split_read_list(text: str) -> list[str]:
    """The entries of a list of databases in one string (``ORACLE_FUZZ_READ``): separated by
    ``os.pathsep`` as a list of directories is; a list that holds a URL (whose ``:`` cannot
    separate) is separated by whitespace, and its non-URL words by ``os.pathsep`` as well."""
    if not is_url(text):
        return [p for p in text.split(os.pathsep) if p]
    out = []
    for word in text.split():
        out += [word] if is_url(word) else [p for p in word.split(os.pathsep) if p]
    return out


# ----------------------------------------------------------------------------- a lost server

@dataclasses.dataclass(frozen=True)
class Skipped:
    """One database operation that was not carried out: ``op`` (save, delete, move, fetch) on
    Hypothesis key ``key`` of database ``where``, and the error that stopped it (or the first
    error, while the server is left alone)."""
    where: str
    op: str
    key: bytes
    error: str


_SKIPPED: list[Skipped] = []
_SKIPPED_LOCK = threading.Lock()


def note_skipped(item: Skipped) -> None:
    with _SKIPPED_LOCK:
        _SKIPPED.append(item)


def drain_skipped() -> list[Skipped]:
    """The operations skipped since the last call (in this process), oldest first."""
    with _SKIPPED_LOCK:
        out = list(_SKIPPED)
        _SKIPPED.clear()
    return out


class SkippingDatabase(ExampleDatabase):
    """``inner`` (a Redis database), whose operations never raise a connection error: each one
    that fails is skipped (a fetch yields nothing) and noted with :func:`note_skipped`. After a
    failure the server is left alone for ``retry_after`` seconds."""

    def __init__(self, inner: ExampleDatabase, where: str, retry_after: float = RETRY_AFTER):
        super().__init__()
        self.inner, self.where, self.retry_after = inner, where, retry_after
        self._lost_at: float | None = None
        self._error = ""
        self._errors = (redis.exceptions.RedisError, OSError) if redis is not None else (OSError,)

    def __repr__(self) -> str:
        return f"SkippingDatabase({self.where})"

    def _attempt(self, op: str, key: bytes, call) -> bool:
        """Run ``call()`` unless the server is being left alone; False (and noted) if skipped."""
        if self._lost_at is not None and time.monotonic() - self._lost_at < self.retry_after:
            note_skipped(Skipped(self.where, op, key, self._error))
            return False
        try:
            call()
        except self._errors as exc:
            self._lost_at, self._error = time.monotonic(), f"{type(exc).__name__}: {exc}"
            note_skipped(Skipped(self.where, op, key, self._error))
            return False
        self._lost_at = None
        return True

    def fetch(self, key: bytes) -> Iterator[bytes]:
        got: list[bytes] = []
        if self._attempt("fetch", key, lambda: got.extend(self.inner.fetch(key))):
            yield from got

    def save(self, key: bytes, value: bytes) -> None:
        self._attempt("save", key, lambda: self.inner.save(key, value))

    def delete(self, key: bytes, value: bytes) -> None:
        self._attempt("delete", key, lambda: self.inner.delete(key, value))

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self._attempt("move", dest, lambda: self.inner.move(src, dest, value))


# ----------------------------------------------------------------------------- the shared corpus

def share_entry(client, name: str, text: str) -> bool:
    """Store corpus entry ``name`` (its JSON ``text``) unless the server holds it: True when this
    call wrote it. ``SET NX`` is atomic: of any number of concurrent writers, one wins."""
    return bool(client.set(CORPUS_PREFIX + name, text.encode(), nx=True))


def shared_entries(client) -> Iterator[tuple[str, str]]:
    """(name, JSON text) of every corpus entry the server holds, in name order."""
    keys = sorted(k.decode() for k in client.scan_iter(match=CORPUS_PREFIX + "*", count=500))
    for key in keys:
        value = client.get(key)
        if value is not None:  # removed since the scan
            yield key[len(CORPUS_PREFIX):], value.decode()


# ----------------------------------------------------------------------------- the report

def summary(skipped: list[Skipped]) -> dict:
    """What ``skipped`` (one test's operations) left undone, as JSON-able counts: ``saves`` (entries
    not written), of them ``failures`` (to a test's primary key: the failing examples Hypothesis
    replays first), ``deletes`` (entries left that no longer fail), ``fetches`` (stored examples
    not replayed), the databases and the first error."""
    primary = [s for s in skipped if s.op in ("save", "move") and not s.key.endswith((b".secondary", b".pareto"))]
    return {"where": sorted({s.where for s in skipped}), "error": skipped[0].error if skipped else "",
            "saves": sum(s.op in ("save", "move") for s in skipped), "failures": len(primary),
            "deletes": sum(s.op == "delete" for s in skipped), "fetches": sum(s.op == "fetch" for s in skipped)}


def render_not_saved(rows: list[tuple[str, dict]]) -> list[str]:
    """Report lines for (test id, what was not saved) rows: ``summary`` counts under ``db``, corpus
    entries not stored on the server under ``corpus`` (``NAME: error``)."""
    if not rows:
        return []
    lines = ["attention-oracle: a shared database could not be reached during the run; not saved:"]
    for nodeid, info in rows:
        db = info.get("db")
        if db and (db["saves"] or db["deletes"] or db["fetches"]):
            lines.append(f"  {nodeid}: {db['saves']} example(s) not saved ({db['failures']} failing), "
                         f"{db['deletes']} deletion(s) and {db['fetches']} replay(s) skipped "
                         f"[{', '.join(db['where'])}: {db['error']}]")
        for entry in info.get("corpus", ()):
            lines.append(f"  {nodeid}: corpus entry not shared: {entry} (the local corpus has it)")
    return lines
