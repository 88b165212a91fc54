"""Worker crashes under pytest-xdist: the test that crashed fails, naming the signal and its case,
and the rest of the run goes on.

A worker that dies inside a native call (SIGSEGV, SIGABRT, a CUDA fault that ends the worker)
sends no report. So each worker keeps a marker file ``<dir>/<worker>.running`` (``dir``: made by
the controller, ``ATTENTION_ORACLE_CRASH_DIR``, inherited by every worker) naming the test it
runs and, once the runner starts an example, that example's case and replay command. A crashed
worker leaves its marker behind; the controller reads it to write the failure
(:func:`describe`), and a worker handed a test that another worker's marker names (pytest-xdist's
load-group scheduling queues the crashed test again) does not run it a second time
(:func:`crashed_elsewhere`): one crash is one failure, not a crash on every replacement worker
until the restart limit stops the run.

Marker JSON: ``{"nodeid", "impl", "check", "case", "replay", "why"}`` (``case``/``replay``: the
last example started, absent before the first; ``why``: a reason the worker gave before ending
itself, e.g. a broken CUDA context).
"""
from __future__ import annotations

import glob
import json
import os
import signal

ENV = "ATTENTION_ORACLE_CRASH_DIR"
_STATE: dict = {"worker": None, "marker": {}}


def start_worker(worker: str | None) -> None:
    """This process is xdist worker ``worker`` (None: not a worker, nothing is written)."""
    _STATE["worker"] = worker if worker and os.environ.get(ENV) else None


def _path(worker: str) -> str:
    return os.path.join(os.environ[ENV], f"{worker}.running")


def _write() -> None:
    worker = _STATE["worker"]
    if worker is None:
        return
    tmp = _path(worker) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_STATE["marker"], f)
    os.replace(tmp, _path(worker))  # a crash mid-write leaves the previous marker whole


def item_started(nodeid: str, ident: dict) -> None:
    """Before a test runs (``ident``: its {"impl", "check"})."""
    _STATE["marker"] = {"nodeid": nodeid, **ident}
    _write()


def case_started(check: str, case, impl: str) -> None:
    """Before an example's call (``case``: a Case of ``check``, run on ``impl``): the case a
    crash in it leaves replayable."""
    if _STATE["worker"] is None or not _STATE["marker"]:
        return
    _STATE["marker"].update(check=check, case=case.to_json(), replay=case.repro(check, impl))
    _write()


def ending(why: str) -> None:
    """The worker is about to end itself (``why`` goes into the crash's failure)."""
    if _STATE["marker"]:
        _STATE["marker"]["why"] = why
        _write()


def item_finished() -> None:
    """The test ended with its reports sent: no marker is left behind."""
    worker = _STATE["worker"]
    _STATE["marker"] = {}
    if worker is not None and os.path.exists(_path(worker)):
        os.remove(_path(worker))


def crashed_elsewhere(nodeid: str) -> bool:
    """True if another worker's marker names ``nodeid``: that worker died running it."""
    if _STATE["worker"] is None:
        return False
    mine = _path(_STATE["worker"])
    for path in glob.glob(os.path.join(os.environ[ENV], "*.running")):
        if path != mine and read(path).get("nodeid") == nodeid:
            return True
    return False


def read(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def marker_of(worker: str) -> dict:
    """The marker the dead worker ``worker`` left ({} if none)."""
    return read(_path(worker)) if os.environ.get(ENV) else {}


def exit_status(returncode: int | None) -> str:
    """"SIGSEGV (signal 11)" for a process killed by a signal (``returncode`` -11), "exit 70",
    or "exit status unknown"."""
    if returncode is None:
        return "exit status unknown"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "signal"
        return f"{name} (signal {-returncode})"
    return f"exit {returncode}"


def describe(worker: str, nodeid: str, returncode: int | None) -> str:
    """The failure of a test whose worker died: the signal, the test, the case and its replay."""
    marker = marker_of(worker)
    how = "crashed with " + exit_status(returncode) if (returncode or 0) < 0 else \
        f"ended ({exit_status(returncode)})"
    test = nodeid.rsplit("::", 1)[-1]
    lines = [f"worker {worker} {how} during {test}"]
    if marker.get("why"):
        lines.append(f"  the worker said: {marker['why']}")
    if marker.get("case"):
        lines.append(f"  check {marker.get('check', '?')}, the example running: {marker['case']}")
        lines.append(f"  replay: {marker['replay']}")
    else:
        lines.append("  no example had started (the crash came before the first call)")
    return "\n".join(lines)
