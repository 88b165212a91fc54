"""The suite's pytest plugin: options, profiles, the interpreter switch, GPU placement, the report.

Loaded by the clone's root ``conftest.py`` and by ``attention-oracle check`` (``-p``).

This is the only module that reads the environment:
- ``ORACLE_IMPL`` (comma-separated) or ``--impl NAME`` (repeatable): the implementations checked;
- no CUDA device: ``TRITON_INTERPRET=1`` is set before any Triton kernel module is imported;
- ``CI``: the default Hypothesis profile becomes ``ci``;
- ``ORACLE_NO_POISON=1`` (or ``--no-poison``): new tensors are not poisoned while checks run;
- ``PYTEST_XDIST_WORKER``: one torch thread per worker, worker ``gwN`` on GPU ``N % count``;
- ``ORACLE_FUZZ_DB``, ``ORACLE_FUZZ_READ``, ``ORACLE_CORPUS`` (or ``--oracle-fuzz-db``,
  ``--oracle-fuzz-read``, ``--oracle-corpus``): the fuzz profile's shared example database, the
  read-only databases beside it, and the directory its failures are saved to (``fuzzing.py``).

GPU memory. Workers share each device. Every test on a CUDA machine holds a shared lock on the
device for its duration and hands its cached memory back to the driver when it ends; a test
marked ``full_size`` (problems that need most of the device) takes the lock exclusively, so it
runs alone on the device (``attention_oracle.run.gpu_lock``). With several GPUs
there is one lock per device, and the full-size tests are spread over the devices (each runs on
its own, whichever worker takes it), so they run one per GPU at the same time.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import time

import pytest
import torch
from hypothesis import settings

if not torch.cuda.is_available():
    # Must precede any import of a module defining @triton.jit kernels (FACTS.md).
    os.environ.setdefault("TRITON_INTERPRET", "1")

from attention_oracle.judge import capabilities, profiles, record, targets
from attention_oracle.run import (
    baseline,
    bugs,
    crashes,
    errormap,
    exampledb,
    fuzzing,
    gpu_lock,
    known_failures,
    poison,
    report,
    triage,
)

profiles.register()

_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_TABLE = report.Table()
_OUTCOMES: dict = {}


def _budget_defaults() -> str:
    """Each profile's default check budget, as --help states it (from profiles.CHECK_BUDGET)."""
    parts = []
    for name, seconds in profiles.CHECK_BUDGET.items():
        spared = ", sparing the covering grid" if profiles.GRID_SPARED.get(name) else ""
        parts.append(f"{name} {'none' if seconds is None else f'{seconds:g}'}{spared}")
    return "; ".join(parts)


def pytest_addoption(parser):
    group = parser.getgroup("attention-oracle")
    group.addoption("--impl", action="append", default=[], metavar="NAME",
                    help="implementation to check: a built-in (" + ", ".join(targets.BUILTINS) +
                         ") or package.module[:attr]; repeatable; default: every built-in")
    group.addoption("--oracle-report", metavar="FILE.json", default=None,
                    help="write the implementation x check table as JSON")
    group.addoption("--oracle-check-budget", metavar="SECONDS", type=float, default=None,
                    help="wall time of one check's search: once spent, the search stops before its "
                         "next example and the verdict is what was judged (noted 'budget reached'); "
                         "0: none (default: " + _budget_defaults() + ")")
    group.addoption("--oracle-failures", metavar="FILE", default=None,
                    help="append every failure (full text) and skip reason to FILE as it "
                         "happens: survives an interrupted run")
    group.addoption("--oracle-fuzz-db", metavar="DIR|URL", default=None,
                    help="fuzz profile: the example database, shared by every process and host of "
                         "a campaign: a directory or a Redis server, redis://HOST:PORT/N (needs "
                         f"attention-oracle[redis]) (default {fuzzing.DEFAULT_DB}; also ORACLE_FUZZ_DB)")
    group.addoption("--oracle-fuzz-read", metavar="DIR|URL", action="append", default=[],
                    help="fuzz profile: also replay this database, never writing to it (a team's "
                         "copy); repeatable; also ORACLE_FUZZ_READ (path-separated; whitespace-"
                         "separated where it holds a URL)")
    group.addoption("--oracle-fuzz-examples", metavar="N", type=int, default=None,
                    help="fuzz profile: examples per test (default 2000)")
    group.addoption("--oracle-fuzz-replay-only", action="store_true", default=False,
                    help="fuzz profile: replay the database's examples, search nothing new")
    group.addoption("--oracle-corpus", metavar="DIR", default=None,
                    help="where the fuzz profile saves the failures it finds, once each, and from "
                         f"where every run replays them (default {fuzzing.DEFAULT_CORPUS}; also "
                         "ORACLE_CORPUS)")
    group.addoption("--baseline", metavar="OLD.json", default=None,
                    help="compare with an earlier --oracle-report (same or another implementation) "
                         "on the same examples: its judged cases of each check are replayed after the "
                         "covering grid, before the search; a newly failing check, or a worst ratio over the "
                         "cases both runs judged grown beyond the noise (1e-6 relative, or twice "
                         "the spread of cases judged twice in a run), is a regression and fails "
                         "the run; a harder new case is reported, not failed")
    group.addoption("--known-failures", metavar="FILE", default=None,
                    help="your own known failures (TOML or JSON: implementation, check, optional "
                         "'where' on case fields, reason): counted as known; entries that match "
                         "no failure are reported stale")
    group.addoption("--no-triage", action="store_true", default=False,
                    help="do not vary a failing example's fields to say what the failure depends on")
    group.addoption("--oracle-artifacts", metavar="DIR", default=None,
                    help="where the error maps (PNG of |impl - gold| per distinct failure) are "
                         "written (default: the --oracle-report file's directory, else "
                         f"{errormap.DEFAULT_DIRECTORY})")
    group.addoption("--no-poison", action="store_true", default=False,
                    help="do not fill tensors from torch.empty & co. with NaN / sentinels while "
                         "a check runs (debugging only; also ORACLE_NO_POISON=1)")
    group.addoption("--oracle-progress", action=argparse.BooleanOptionalAction, default=None,
                    help="a line per finished check: examples judged out of the budget (default: on "
                         "under the gpu and fuzz profiles)")


def _default_profile() -> str:
    if os.environ.get("CI"):
        return "ci"
    return "gpu" if torch.cuda.is_available() else "dev"


_CONFIG: list = []


MARKERS = (
    "gpu: needs a CUDA device (skipped on CPU)",
    "slow: full-size fixtures (GPU profile only)",
    "full_size: needs most of a GPU; runs alone on the device (exclusive lock)",
    "beyond_contract: a check of inputs beyond the contract (a clear error naming the argument passes)",
)
CONFORMANCE = "attention_oracle.conformance."


def pytest_configure(config):
    _CONFIG.append(config)
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    chosen = config.getoption("hypothesis_profile", None) or _default_profile()
    fuzz_database = _configure_fuzzing(config, chosen)
    profiles.activate(chosen, on_gpu=torch.cuda.is_available(), fuzz_database=fuzz_database,
                      fuzz_examples=fuzzing.settings()["examples"],
                      replay_only=fuzzing.settings()["replay_only"])
    poison.set_enabled(not (config.getoption("no_poison") or os.environ.get("ORACLE_NO_POISON") == "1"))
    _install_user_known(config)
    triage.set_enabled(not config.getoption("no_triage"))
    _configure_artifacts(config)
    _load_baseline(config)
    _prepare_crash_recovery(config)
    try:
        profiles.set_check_budget(config.getoption("oracle_check_budget"))
    except ValueError as exc:
        raise pytest.UsageError(f"--oracle-check-budget: {exc}") from None
    if _WORKER:
        torch.set_num_threads(1)
    device = gpu_lock.device_for_worker(_WORKER, _device_count())
    if device is not None:  # before any CUDA call: the worker's context and tensors live there
        torch.cuda.set_device(device)
        _PLACED[0] = device


def _prepare_crash_recovery(config) -> None:
    """xdist: a directory where each worker marks the test and example it runs (``run/crashes``),
    and worker arguments that find the controller's rootdir, configuration file and this plugin
    whatever else exists on disk by the time a crashed worker is replaced (a value such as
    ``--oracle-report DIR/r.json`` is otherwise read as a path once the file exists, and the
    replacement starts in rootdir DIR without the plugin: "unrecognized arguments: --impl")."""
    if _WORKER:
        crashes.start_worker(_WORKER)
        return
    if not getattr(config.option, "tx", None):
        return
    _CRASH_DIR.append(tempfile.mkdtemp(prefix="attention-oracle-workers-"))
    os.environ[crashes.ENV] = _CRASH_DIR[-1]
    args = list(config.invocation_params.args)
    pinned = []
    if not any(a == "--rootdir" or a.startswith("--rootdir=") for a in args):
        pinned.append(f"--rootdir={config.rootpath}")
    if config.inipath is not None and not any(a.startswith(("-c", "--config-file")) for a in args):
        pinned += ["-c", str(config.inipath)]
    if not any(a == "-p" and b == __name__ for a, b in zip(args, args[1:])):
        pinned += ["-p", __name__]
    config.invocation_params = dataclasses.replace(config.invocation_params, args=tuple(pinned + args))


_CRASH_DIR: list[str] = []  # the marker directory this controller made (a nested run inherits its parent's)


def pytest_unconfigure(config):
    for path in _CRASH_DIR:  # only the directory this process made: never a parent run's
        shutil.rmtree(path, ignore_errors=True)
        if os.environ.get(crashes.ENV) == path:
            del os.environ[crashes.ENV]
    _CRASH_DIR.clear()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A test whose worker crashed is not run again by the worker it is queued to next (its
    failure is the crash's, ``pytest_handlecrashitem``); any other is marked as running."""
    if crashes.crashed_elsewhere(item.nodeid):
        return True
    crashes.item_started(item.nodeid, _identity(item))
    return None


def pytest_runtest_logfinish(nodeid, location):
    crashes.item_finished()


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """pytest-xdist: the worker running ``crashitem`` died. Its failure names the signal, the
    example running and its replay command, and counts in the report's row of its check."""
    worker = report.node.gateway.id
    marker = crashes.marker_of(worker)
    if marker.get("why") and crashitem in _OUTCOMES:
        # the worker ended itself after this test's verdict had been reported (a CUDA fault left
        # its context broken): the verdict stands, and the ending is a note, not a second failure
        ident, outcome, info = _OUTCOMES.pop(crashitem)
        if ident["impl"] != "-":
            _TABLE.add(ident["impl"], ident["check"], outcome, info)
        report.outcome = "skipped"
        report.longrepr = (crashitem, 0, f"worker {worker} ended after this test's verdict "
                                         f"({outcome}): {marker['why']}")
        return
    report.longrepr = crashes.describe(worker, crashitem, _returncode(report.node))
    if marker.get("impl"):
        failures = [{"check": marker["check"], "case": marker["case"]}] if marker.get("case") else []
        report.user_properties.append(("oracle_id", {"impl": marker["impl"], "check": marker["check"]}))
        report.user_properties.append(("oracle_sink", {"worst": float("inf"), "failures": failures}))


def _returncode(node) -> int | None:
    """The exit status of a dead xdist worker's process (negative: the signal that killed it)."""
    popen = getattr(getattr(node.gateway, "_io", None), "popen", None)
    if popen is None:
        return None
    try:
        return popen.wait(timeout=10)
    except Exception:  # noqa: BLE001 (unknown is reported as unknown)
        return None


_PLACED = [0]  # this process' device (the lock of a test names it without initialising CUDA)


def _device_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


_CUTOFF = "ATTENTION_ORACLE_CORPUS_CUTOFF"  # the controller's start, inherited by its workers


def _configure_fuzzing(config, chosen: str):
    """Configure ``fuzzing`` from options and environment; the fuzz profile's database (opened
    now: a bad URL or an unreachable Redis server is a usage error), None for other profiles."""
    if not _WORKER:  # a nested run is a controller of its own: it sets its own start
        os.environ[_CUTOFF] = repr(time.time())
    read = config.getoption("oracle_fuzz_read") or exampledb.split_read_list(os.environ.get("ORACLE_FUZZ_READ", ""))
    try:
        fuzzing.configure(db=config.getoption("oracle_fuzz_db") or os.environ.get("ORACLE_FUZZ_DB"),
                          read=tuple(read),
                          corpus=config.getoption("oracle_corpus") or os.environ.get("ORACLE_CORPUS"),
                          examples=config.getoption("oracle_fuzz_examples"),
                          replay_only=config.getoption("oracle_fuzz_replay_only"),
                          cutoff=float(os.environ[_CUTOFF]) if os.environ.get(_CUTOFF) else None)
        return fuzzing.database() if chosen == "fuzz" else None
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def _fuzz_header() -> list[str]:
    lines = []
    if _device_count() > 1:
        lines.append(f"attention-oracle: {_device_count()} GPUs; xdist worker gwN runs on GPU N % "
                     f"{_device_count()}; full-size tests spread over the GPUs, one lock per GPU")
    if profiles.name() == "fuzz":
        s = fuzzing.settings()
        mode = "replay only" if s["replay_only"] else f"{s['examples'] or 'default'} examples per test"
        lines.append(f"attention-oracle fuzzing: database {exampledb.redacted(s['db'])}"
                     + (f" (+ read-only {', '.join(map(exampledb.redacted, s['read']))})" if s["read"] else "")
                     + f"; found failures saved to {s['corpus']}; {mode}")
    return lines


def _install_user_known(config) -> None:
    path = config.getoption("known_failures", None)
    known_failures.builtin()  # the suite's own entries, read by the same loader
    if not path:
        return
    try:
        known_failures.install(known_failures.load(path))
    except known_failures.KnownFailuresError as exc:
        raise pytest.UsageError(str(exc)) from None


_ARTIFACTS = "ATTENTION_ORACLE_ARTIFACTS"  # the controller's absolute choice, inherited by workers


def _configure_artifacts(config) -> None:
    """The error maps' directory: --oracle-artifacts, else beside --oracle-report, else the
    default; resolved once by the controller, so that every worker writes to the same place."""
    if not _WORKER or not os.environ.get(_ARTIFACTS):
        report_path = config.getoption("oracle_report")
        chosen = config.getoption("oracle_artifacts") or (
            os.path.dirname(os.path.abspath(report_path)) if report_path else errormap.DEFAULT_DIRECTORY)
        os.environ[_ARTIFACTS] = os.path.abspath(chosen)
    errormap.set_directory(os.environ[_ARTIFACTS])


_FAILED: list = []  # the failed call reports, in order (their sinks carry the bug signatures)


_BASELINE: dict = {}  # "rows": the baseline's rows, "comparison": this run against them


def _load_baseline(config) -> None:
    """Every process replays the baseline's cases first (``baseline.install``); the controller
    also compares its rows with this run's."""
    path = config.getoption("baseline", None)
    if path:
        try:
            rows = baseline.load(path)
        except baseline.BaselineError as exc:
            raise pytest.UsageError(str(exc)) from None
        baseline.install(rows)
        if not _WORKER:
            _BASELINE["rows"], _BASELINE["path"] = rows, path


def _compare_with_baseline():
    if "rows" in _BASELINE and "comparison" not in _BASELINE:
        _BASELINE["comparison"] = baseline.compare(_BASELINE["rows"], dict(_TABLE.rows), _BASELINE["path"])
    return _BASELINE.get("comparison")


def _baseline_summary(terminalreporter) -> None:
    comparison = _compare_with_baseline()
    if comparison is None:
        return
    terminalreporter.write_line("")
    terminalreporter.write_line(baseline.render(comparison))
    _TABLE.extra["baseline"] = baseline.to_dict(comparison)


def _known_failures_summary(terminalreporter) -> None:
    entries = known_failures.entries()
    if not known_failures.user_entries() and not _TABLE.known_entries:
        return
    ran = {k for k, r in _TABLE.rows.items() if r["passed"] + r["failed"] > 0}
    device = targets.default_device().type
    for line in known_failures.render(entries, _TABLE.known_entries, ran, device):
        terminalreporter.write_line(line)
    _TABLE.extra["known_failures"] = known_failures.summary(entries, _TABLE.known_entries, ran, device)


def _refuse_unloadable(config) -> None:
    """A module named on the command line that cannot be imported is a usage error, not a run
    of skips that reads as green (built-ins missing on this machine are skipped instead)."""
    names = _names(config)
    for name in names:
        if name in targets.BUILTINS:
            continue
        target = _target(name)
        if target.namespace is None and target.unavailable:
            raise pytest.UsageError(f"--impl {name}: {target.unavailable}")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    _refuse_unloadable(session.config)


def pytest_report_header(config):
    names = _names(config)
    device = targets.default_device()
    return _fuzz_header() + [f"attention-oracle: implementations {names}; device {device}; "
            f"hypothesis profile {profiles.name()} ({profiles.size()} sizes); "
            f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}; torch {torch.__version__}; "
            f"poisoned allocations {'on' if poison.is_enabled() else 'off'}"]


_LOADED: dict = {}


def _target(name: str) -> targets.Target:
    if name not in _LOADED:
        _LOADED[name] = targets.load(name)
    return _LOADED[name]


def pytest_generate_tests(metafunc):
    if "impl" in metafunc.fixturenames:
        names = _names(metafunc.config)
        metafunc.parametrize("impl", names, indirect=True)


@pytest.fixture
def impl(request) -> targets.Target:
    target = _target(request.param)
    if target.unavailable:
        pytest.skip(f"{target.name} unavailable here: {target.unavailable}")
    return target


def _identity(item) -> dict:
    """{"impl", "check"} of a test: a test generated from the check registry carries its check's
    name (``oracle_check``); a hand-written one is named ``<area>.<test name less test_>``."""
    check = getattr(getattr(item, "function", None), "oracle_check", None) or _check_from_names(item)
    impl_name = item.callspec.params.get("impl", "-") if hasattr(item, "callspec") else "-"
    return {"impl": impl_name, "check": check}


def _check_from_names(item) -> str:
    module = item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else "?"
    area = module[len("test_"):] if module.startswith("test_") else module
    name = item.originalname
    return f"{area}.{name[len('test_'):] if name.startswith('test_') else name}"


def _named_impls(config) -> bool:
    return bool(config.getoption("impl") or os.environ.get("ORACLE_IMPL"))


_NAMES = pytest.StashKey[list]()


def _names(config) -> list[str]:
    """The implementations under test, parsed once per run (``--impl`` / ``ORACLE_IMPL``)."""
    if _NAMES not in config.stash:
        config.stash[_NAMES] = targets.parse_names(config.getoption("impl"), os.environ.get("ORACLE_IMPL"))
    return config.stash[_NAMES]


def _is_conformance(item) -> bool:
    module = getattr(item, "module", None)
    return module is not None and module.__name__.startswith(CONFORMANCE)


_FULL_SIZE_DEVICE = pytest.StashKey[int]()
_FULL_SIZE_SEEN: list[int] = [0]


def pytest_itemcollected(item):
    """With several GPUs, the k-th full-size test (collection order, the same in every worker)
    runs on GPU k % count, in an xdist group of its device: one worker per device takes them."""
    count = _device_count()
    if count < 2 or item.get_closest_marker("full_size") is None:
        return
    device = gpu_lock.full_size_device(_FULL_SIZE_SEEN[0], count)
    _FULL_SIZE_SEEN[0] += 1
    item.stash[_FULL_SIZE_DEVICE] = device
    item.add_marker(pytest.mark.xdist_group(f"on_device_{device}"))


def pytest_collection_modifyitems(config, items):
    if _named_impls(config):
        # --impl NAME judges NAME: the suite's own tests (tests) are not part of that run
        kept = [i for i in items if _is_conformance(i) and "impl" in getattr(i, "fixturenames", ())]
        dropped = [i for i in items if i not in kept]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
    for item in items:
        ident = _identity(item)
        item.user_properties.append(("oracle_id", ident))
        reason = known_failures.reason(ident["impl"], ident["check"], targets.default_device())
        if reason:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=False))


_POISONED: list[str] = []  # the test after which this process' CUDA context broke


def _cuda_broken() -> bool:
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    try:
        torch.cuda.synchronize()
        return False
    except Exception:  # a sticky device fault (illegal/misaligned address): context unusable
        return True


@pytest.fixture(autouse=True)
def _device_share(request):
    """Shared use of the GPU by ordinary tests, exclusive use by ``full_size`` ones."""
    if not torch.cuda.is_available():
        yield
        return
    exclusive = request.node.get_closest_marker("full_size") is not None
    pinned = request.node.stash.get(_FULL_SIZE_DEVICE, None)  # a full-size test's own device
    device = _PLACED[0] if pinned is None else pinned
    on_device = contextlib.nullcontext() if pinned is None else torch.cuda.device(pinned)
    with on_device, gpu_lock.hold(exclusive=exclusive, device=device):
        yield
        if not _POISONED:  # a broken context raises the fault again on every call
            gpu_lock.release_cached_memory(device)


@pytest.fixture(autouse=True)
def _oracle_sink(request, _device_share):
    if _POISONED:
        pytest.skip(f"CUDA context of this worker broke during {_POISONED[0]} (a device fault "
                    f"in the implementation under test); see that test's failure")
    sink, token = record.open_sink()
    request.node._oracle_sink = sink
    yield sink
    record.close_sink(token)
    if _cuda_broken():
        _POISONED.append(request.node.nodeid)
        if _WORKER:
            _end_broken_worker(request.node.nodeid)


def _end_broken_worker(nodeid: str) -> None:
    """A CUDA fault is sticky: every later call of this process raises it again (one illegal
    address once turned a worker's next 109 tests into errors: docs/DESIGN.md "8. GPU placement, locks and device faults"). Under
    xdist the worker ends here, after this test's failure has been reported; pytest-xdist
    names the test it was in ("worker crashed") and starts a fresh worker for the rest.
    Without xdist the later tests are skipped with the reason instead."""
    sys.stderr.write(f"\nattention-oracle: CUDA context broke during {nodeid}; ending worker "
                     f"{_WORKER} so the remaining tests get a fresh one\n")
    sys.stderr.flush()
    crashes.ending(f"CUDA context broke during {nodeid}; the worker ended itself (exit 70)")
    os._exit(70)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    sink = getattr(item, "_oracle_sink", None)
    if call.when == "call" and sink is not None:
        item.user_properties.append(("oracle_sink", sink.as_dict()))
    outcome = yield
    unshared: list[str] = []
    if call.when == "call" and sink is not None and sink.failures and profiles.name() == "fuzz":
        unshared = _save_found(item, sink, outcome.get_result())
    if call.when == "call":
        _note_not_saved(outcome.get_result(), exampledb.drain_skipped(), unshared)


_NOT_SAVED: list = []  # (test id, what a lost shared database did not save), for the report


def _note_not_saved(rep, skipped, unshared) -> None:
    """Carry what a lost database skipped during this test to the controller (in the report's
    user_properties, which xdist sends along), for the end-of-run list."""
    if skipped or unshared:
        rep.user_properties.append(("oracle_not_saved", {"db": exampledb.summary(skipped), "corpus": unshared}))


def _save_found(item, sink, rep) -> list[str]:
    """Fuzz profile: the failing examples Hypothesis reported (shrunk) join the corpus, once each
    (a case already there, found by another process or host, is not written again), and, with
    a Redis database, the server's shared corpus. Returns the entries the server did not take."""
    if not rep.failed:
        return []
    impl = _identity(item)["impl"]
    lines, unshared = [], []
    for found in sink.failures:
        try:
            path, new = fuzzing.save_found(found["check"], found["case"], impl, str(targets.default_device()))
        except Exception as exc:  # an unwritable corpus must not hide the failure itself
            lines.append(f"could not save {found['check']} to {fuzzing.corpus_dir()}: {exc!r}")
            continue
        lines.append(f"{'saved to' if new else 'already in'} the corpus: {path}")
        try:
            shared = fuzzing.share_found(found["check"], found["case"], impl, str(targets.default_device()))
        except Exception as exc:  # a lost server: the local corpus has the entry
            unshared.append(f"{os.path.basename(path)[:-5]}: {type(exc).__name__}: {exc}")
            lines.append(f"not saved to the shared corpus {exampledb.redacted(fuzzing.shared_db())}: {unshared[-1]}")
            continue
        if shared is not None:
            lines.append(f"{'saved to' if shared[1] else 'already in'} the shared corpus: {shared[0]}")
    rep.sections.append(("attention-oracle corpus", "\n".join(lines)))
    return unshared


def _outcome(rep) -> str:
    if hasattr(rep, "wasxfail"):
        return "xfail" if rep.skipped else ("passed" if rep.passed else "failed")
    if rep.skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        return "unsupported" if "unsupported" in reason.split(":", 1)[-1][:40] else "skipped"
    return "passed" if rep.passed else "failed"


def _stream_failure(config, rep) -> None:
    path = config.getoption("oracle_failures")
    if not path:
        return
    sink = dict(rep.user_properties).get("oracle_sink") or {}
    if rep.when == "call" and sink.get("known"):
        with open(path, "a") as f:
            f.write(f"KNOWN {rep.nodeid}: {sink['known']} example(s) in a known failure class; "
                    f"the first:\n{sink['known_first']}\n\n")
    if rep.passed or (rep.when == "teardown" and not rep.failed):
        return
    if hasattr(rep, "wasxfail"):
        text = f"XFAIL {rep.nodeid}: {rep.wasxfail}\n{rep.longreprtext}\n\n" if rep.skipped else \
            f"XPASS {rep.nodeid}: {rep.wasxfail}\n"
    elif rep.skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        text = f"SKIPPED {rep.nodeid}: {reason}\n"
    else:
        text = f"FAILED {rep.nodeid} [{rep.when}]\n{rep.longreprtext}\n\n"
    with open(path, "a") as f:
        f.write(text)


def pytest_runtest_logreport(report):
    if not _WORKER and _CONFIG:
        _stream_failure(_CONFIG[0], report)
    props = dict(report.user_properties)
    if "oracle_not_saved" in props:
        _NOT_SAVED.append((report.nodeid, props["oracle_not_saved"]))
    ident = props.get("oracle_id")
    if ident is None:
        return
    key = report.nodeid
    if report.when == "setup" and not report.passed:
        _OUTCOMES[key] = (ident, _outcome(report), None)
    elif report.when == "call":
        _OUTCOMES[key] = (ident, _outcome(report), props.get("oracle_sink"))
        if report.failed and ident["impl"] != "-":  # bugs of implementations, not the suite's own
            _FAILED.append(report)
    elif report.when not in ("setup", "teardown"):  # a worker crash (pytest-xdist's "???")
        info = _OUTCOMES.pop(key, (ident, "failed", None))[2] or props.get("oracle_sink")
        if ident["impl"] != "-":
            _TABLE.add(ident["impl"], ident["check"], "failed", info)
    elif report.when == "teardown" and key in _OUTCOMES:
        ident, outcome, info = _OUTCOMES.pop(key)
        if report.failed:
            outcome = "failed"
        if ident["impl"] != "-":  # the suite's own tests are not rows of the verdict
            _TABLE.add(ident["impl"], ident["check"], outcome, info)
            _progress(report, ident, outcome, info)
            if info and info.get("budget"):
                _TABLE.extra.setdefault("budget_reached", []).append(
                    {"test": key, "outcome": outcome, "note": info["budget"]})


def _progress(report, ident: dict, outcome: str, info: dict | None) -> None:
    """Long runs: one line per finished conformance test, examples judged out of the budget."""
    config = _CONFIG[0] if _CONFIG else None
    if _WORKER or config is None:
        return
    wanted = config.getoption("oracle_progress")
    if wanted is None:
        wanted = profiles.name() in ("gpu", "fuzz")
    writer = config.pluginmanager.get_plugin("terminalreporter")
    if not wanted or writer is None:
        return
    writer.write_line(progress_line(ident, outcome, info or {}, settings().max_examples,
                                    report.nodeid.rsplit("::", 1)[-1]))


def progress_line(ident: dict, outcome: str, info: dict, per_search: int, test: str) -> str:
    """A finished check in one line: the examples judged (as the table counts them: a refusal
    a check expects is its verdict) and refused, the calls compared with the oracle; a check
    that judged no example says so."""
    judged, refused = info.get("judged_examples", 0), info.get("refused_examples", 0)
    calls = info.get("examples", 0) - info.get("refused", 0)
    nothing = " - NOTHING JUDGED" if judged == 0 and outcome != "skipped" else ""
    return (f"attention-oracle: {ident['impl']} {ident['check']} {outcome}: {judged} examples judged "
            f"({info.get('grid', 0)} grid, {info.get('search', 0)} search, "
            f"{info.get('replay', 0)} replay), {refused} refused, "
            f"{calls} calls compared{nothing}; {per_search} examples per search ({test})")


def _not_verified_summary(terminalreporter) -> None:
    """What each judged implementation's capability declaration leaves unverified."""
    judged = sorted({impl for impl, _ in _TABLE.rows})
    away = capabilities.not_verified_report(_target, judged)
    _TABLE.extra["not_verified"] = away
    lines = capabilities.report_lines(away)
    if lines:
        terminalreporter.write_line("")
        for line in lines:
            terminalreporter.write_line(line)


def _bug_summary(terminalreporter) -> None:
    """One line per distinct bug (``run/bugs.py``), first in the report."""
    sigs = [dict(s, nodeid=rep.nodeid) for rep in _FAILED
            for s in (dict(rep.user_properties).get("oracle_sink") or {}).get("bugs", ())]
    lines = bugs.summary(sigs)
    for line in lines:
        terminalreporter.write_line(line)
    if lines:
        terminalreporter.write_line("")
        _TABLE.extra["bugs"] = lines


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _WORKER:
        return
    terminalreporter.section("attention-oracle report")
    _bug_summary(terminalreporter)
    terminalreporter.write_line(_TABLE.render())
    _not_verified_summary(terminalreporter)
    _known_failures_summary(terminalreporter)
    _baseline_summary(terminalreporter)
    for entry in _TABLE.extra.get("budget_reached", ()):
        terminalreporter.write_line(f"{entry['test']}: {entry['outcome']}; {entry['note']}")
    for line in exampledb.render_not_saved(_NOT_SAVED):
        terminalreporter.write_line(line)
    if _NOT_SAVED:
        _TABLE.extra["not_saved"] = [{"test": nodeid, **info} for nodeid, info in _NOT_SAVED]
    path = config.getoption("oracle_report")
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(_TABLE.to_json())
        terminalreporter.write_line(f"report written to {path}")


def pytest_sessionfinish(session, exitstatus):
    if not _WORKER:  # before the failures are printed: a bug already shown in full is referenced
        bugs.shorten(_FAILED)
    if not _WORKER and _TABLE.verified_nothing() and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    comparison = None if _WORKER else _compare_with_baseline()
    if comparison is not None and comparison.regressions and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a regression against --baseline
