"""Fuzzing at scale (run/fuzzing.py): processes sharing one example database, and
the failures they find saved to one corpus, once each.

The processes are real pytest runs of the conformance suite with the ``fuzz`` profile against a
broken control (``WrongScale``), sharing temporary directories as a campaign over several hosts
shares a network directory. Process A searches and finds the failure; process B, started after
it, cannot search at all (``--oracle-fuzz-replay-only``) and still fails, on A's shrunk case,
because it replays A's database entry; with an empty database the same command finds nothing
(the negative control). Two processes finding the same failure at once write one corpus entry.
"""
import json
import os
import re
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from hypothesis import Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase

from attention_oracle.checks.sdpa import checks
from attention_oracle.checks.sdpa.cases import strategy_for
from attention_oracle.judge import targets
from attention_oracle.run import corpus, fuzzing
from attention_oracle.run.runner import run_property
from attention_oracle.tools import replay

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BROKEN = "tests.helpers:SEARCH_ONLY_BUG"  # the grid never meets it: the search finds it
CHECK = "sdpa.forward_agreement"
# replay the database only; at most 2 stored examples per test beyond the failures (a later
# round of the runner's search replays the stored examples that do not fail: keep it short)
REPLAY = ("--oracle-fuzz-replay-only", "--oracle-fuzz-examples", "2")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    for k in ("ORACLE_IMPL", "ORACLE_FUZZ_DB", "ORACLE_FUZZ_READ", "ORACLE_CORPUS"):
        env.pop(k, None)
    return env


def _fuzz_command(db, corpus, *extra) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0",
            "--hypothesis-profile", "fuzz", "--oracle-fuzz-db", str(db), "--oracle-corpus", str(corpus),
            "--no-triage", "--impl", BROKEN, "attention_oracle/conformance/test_sdpa.py",
            "attention_oracle/conformance/test_regressions.py", "-k", "forward_agreement", *extra]


def _fuzz(db, corpus, *extra) -> subprocess.CompletedProcess:
    return subprocess.run(_fuzz_command(db, corpus, *extra), cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=300)


def _cases(out: str) -> list[dict]:
    """The case notes Hypothesis printed for the failing example(s)."""
    return [json.loads(m) for m in re.findall(r"^E?\s*case: (\{.*\})$", out, re.M)]


def test_a_campaign_shares_one_database_and_one_corpus(tmp_path):
    """One test, so that under xdist one worker runs the campaign (A's search is the cost)."""
    found = _process_a(tmp_path / "a")
    _the_shrunk_failures_land_in_the_corpus(found)
    _a_later_process_replays_the_failure_from_the_shared_database(found, tmp_path / "b")
    _two_processes_finding_the_failure_at_once_write_one_entry(found, tmp_path / "cd")


def _process_a(tmp):
    """Process A: up to 60 examples of the fuzz profile find WrongScale's failure, shrink it, and
    save it to the shared database and to the corpus."""
    db, corpus = tmp / "db", tmp / "corpus"
    proc = _fuzz(db, corpus, "--oracle-fuzz-examples", "60")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    paths = sorted(corpus.glob("*.json"))  # one per distinct failure (check and output)
    assert paths, proc.stdout[-3000:]
    return SimpleNamespace(tmp=tmp, db=db, corpus=corpus, paths=paths, out=proc.stdout,
                           cases=_sorted(json.loads(p.read_text())["case"] for p in paths))


def _sorted(cases):
    """Distinct cases, in a fixed order (two failures, of two outputs, can shrink to one case:
    Hypothesis prints it twice, the corpus holds it once)."""
    return [json.loads(t) for t in sorted({json.dumps(c, sort_keys=True) for c in cases})]


def _the_shrunk_failures_land_in_the_corpus(found):
    assert found.cases == _sorted(_cases(found.out))  # the final (shrunk) examples Hypothesis reported
    for path in found.paths:
        entry = json.loads(path.read_text())
        assert entry["check"] == CHECK and BROKEN in entry["note"]
        assert path.stem == fuzzing.entry_name(CHECK, entry["case"])
        assert f"saved to the corpus: {path}" in found.out
        assert replay.replay(BROKEN, CHECK, entry["case"]) == 1  # the entry reproduces the failure
        assert replay.replay("oracle", CHECK, entry["case"]) == 0  # a correct implementation passes it


def _a_later_process_replays_the_failure_from_the_shared_database(found, tmp_path):
    """B searches nothing, so it can only fail on what the database holds: A's case. It also
    replays the corpus entry through test_regressions, and writes no second entry."""
    b = _fuzz(found.db, found.corpus, *REPLAY)
    assert b.returncode == 1, b.stdout[-3000:]
    assert "attention-oracle fuzzing: database" in b.stdout and "replay only" in b.stdout
    assert _sorted(_cases(b.stdout)) == found.cases, b.stdout[-3000:]
    for path in found.paths:
        assert f"already in the corpus: {path}" in b.stdout
        assert re.search(rf"FAILED \S*test_regression\[{re.escape(BROKEN)}-{path.stem}\]", b.stdout), b.stdout[-2000:]
    assert sorted(found.corpus.glob("*.json")) == found.paths
    # Negative control: the same process with an empty database has nothing to replay.
    alone = _fuzz(tmp_path / "empty-db", tmp_path / "empty-corpus", *REPLAY)
    assert alone.returncode == 0, alone.stdout[-3000:]
    assert "1 skipped" in alone.stdout and _cases(alone.stdout) == []
    assert not (tmp_path / "empty-corpus").exists()


def _two_processes_finding_the_failure_at_once_write_one_entry(found, tmp_path):
    """C replays the shared database, D only reads it as a team's copy beside its own (empty)
    one: both fail on A's case at about the same moment, and the corpus gets one entry."""
    corpus = tmp_path / "corpus"
    commands = [_fuzz_command(found.db, corpus, *REPLAY),
                _fuzz_command(tmp_path / "own-db", corpus, *REPLAY,
                              "--oracle-fuzz-read", str(found.db))]
    procs = [subprocess.Popen(c, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for c in commands]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [1, 1], [o[-1500:] for o in outs]
    assert [_sorted(_cases(o)) for o in outs] == [found.cases] * 2
    assert [e.name for e in sorted(corpus.glob("*.json"))] == [p.name for p in found.paths]
    for path in found.paths:  # each entry written by one of the two, and found there by the other
        said = sorted(f"saved to the corpus: {corpus / path.name}" in o for o in outs)
        assert said == [False, True], [o[-1500:] for o in outs]
        assert sum(f"already in the corpus: {corpus / path.name}" in o for o in outs) == 1


# ----------------------------------------------------------------------------- in-process

class _KeyRecorder(InMemoryExampleDatabase):
    """Records the primary key of every test that reads the database (the reuse phase)."""

    def __init__(self):
        super().__init__()
        self.keys: set[bytes] = set()

    def fetch(self, key):
        if not key.endswith((b".secondary", b".pareto")):
            self.keys.add(key)
        yield from super().fetch(key)


def _database_keys(check_names, target_names) -> set[bytes]:
    db = _KeyRecorder()
    s = settings(max_examples=1, phases=[Phase.reuse, Phase.generate], database=db)
    for t in target_names:
        target = targets.load(t)
        for name in check_names:
            run_property(checks.CHECKS[name], target, strategy_for(name, target.dtypes),
                         function=checks.FN, settings_=s)
    return db.keys


def test_each_check_and_implementation_has_its_own_database_key(monkeypatch):
    """Every check runs through one inner function, whose default key would be shared: then
    the reuse phase of one test deletes another's failures (they do not fail there)."""
    assert len(_database_keys(["forward_agreement", "fully_masked_rows"], ["oracle", "torch-math"])) == 4
    # Negative control: without the per-test key, every check and implementation shares one.
    monkeypatch.setattr(fuzzing, "key_test", lambda test, key: test)
    assert len(_database_keys(["forward_agreement", "fully_masked_rows"], ["oracle", "torch-math"])) == 1


def test_keys_name_check_function_implementation_size_and_device():
    fwd, grad = checks.CHECKS["forward_agreement"], checks.CHECKS["gradient_agreement"]
    keys = {fuzzing.key_of(fwd, checks.FN, "fast", "cpu"), fuzzing.key_of(grad, checks.FN, "fast", "cpu"),
            fuzzing.key_of(fwd, checks.FN, "torch", "cpu"), fuzzing.key_of(fwd, checks.FN, "fast", "cuda")}
    assert len(keys) == 4
    assert fuzzing.key_of(fwd, checks.FN, "fast", "cpu") == fuzzing.key_of(fwd, checks.FN, "fast", "cpu")


def test_a_case_is_saved_once_however_many_find_it(tmp_path):
    name, entry = corpus.entries()[0]
    case_json = json.dumps(entry["case"])
    results = []

    def save():
        results.append(fuzzing.save_found(entry["check"], case_json, "x", "cpu", corpus=str(tmp_path)))

    threads = [threading.Thread(target=save) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(new for _, new in results) == [False] * 7 + [True]
    assert len({p for p, _ in results}) == 1
    assert [p.name for p in tmp_path.iterdir()] == [os.path.basename(results[0][0])]  # no temporary left
    # the key is (check, case): another implementation finding it adds nothing, another case does
    assert fuzzing.save_found(entry["check"], case_json, "y", "cuda", corpus=str(tmp_path))[1] is False
    other = dict(entry["case"], seed=entry["case"]["seed"] + 1)
    assert fuzzing.save_found(entry["check"], json.dumps(other), "x", "cpu", corpus=str(tmp_path))[1] is True
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_entries_written_after_the_run_started_wait_for_the_next_run(tmp_path):
    name, entry = corpus.entries()[0]
    corpus.save("older", entry["check"], entry["case"], corpus_dir=str(tmp_path))
    cutoff = time.time() + 1e-3
    os.utime(tmp_path / "older.json", (cutoff - 10, cutoff - 10))
    corpus.save("newer", entry["check"], entry["case"], corpus_dir=str(tmp_path))
    os.utime(tmp_path / "newer.json", (cutoff + 10, cutoff + 10))
    names = [n for n, _ in corpus.entries(str(tmp_path), before=cutoff)]
    assert "older" in names and "newer" not in names
    assert "newer" in [n for n, _ in corpus.entries(str(tmp_path))]
    assert name in names  # the package's corpus is always read


def test_the_fuzz_database_reads_a_team_copy_without_writing_it(tmp_path):
    team = DirectoryBasedExampleDatabase(tmp_path / "team")
    team.save(b"k", b"found-by-the-team")
    db = fuzzing.database(str(tmp_path / "own"), read=(str(tmp_path / "team"),))
    assert b"found-by-the-team" in set(db.fetch(b"k"))
    db.save(b"k", b"mine")
    db.delete(b"k", b"found-by-the-team")  # what a process that no longer fails it would do
    assert set(team.fetch(b"k")) == {b"found-by-the-team"}
    assert set(DirectoryBasedExampleDatabase(tmp_path / "own").fetch(b"k")) == {b"mine"}
    assert isinstance(fuzzing.database(str(tmp_path / "own"), read=()).inner, DirectoryBasedExampleDatabase)


def test_a_rerun_of_a_search_deletes_no_entry():
    """The runner's search may run a test again taking the failures found as passed; Hypothesis
    would delete those entries then (they do not fail in that run). Negative control: the first
    run deletes and moves as Hypothesis asks."""
    inner = InMemoryExampleDatabase()
    db = fuzzing.RerunSafeDatabase(inner)

    def hypothesis_cleans_up():
        db.delete(b"k", b"found")
        db.move(b"k", b"k.secondary", b"shrunk-away")

    run = fuzzing.reruns_keep_entries(hypothesis_cleans_up)
    for value in (b"found", b"shrunk-away"):
        db.save(b"k", value)
    run()  # the first search: as asked
    assert set(inner.fetch(b"k")) == set() and set(inner.fetch(b"k.secondary")) == {b"shrunk-away"}
    for value in (b"found", b"shrunk-away"):
        db.save(b"k", value)
    run()  # a rerun: nothing deleted, the move copies
    assert set(inner.fetch(b"k")) == {b"found", b"shrunk-away"}
    assert set(inner.fetch(b"k.secondary")) == {b"shrunk-away"}
    db.delete(b"k", b"found")  # outside a rerun again
    assert set(inner.fetch(b"k")) == {b"shrunk-away"}


def test_fuzz_examples_must_be_positive():
    with pytest.raises(ValueError, match="--oracle-fuzz-examples"):
        fuzzing.configure(examples=0)
