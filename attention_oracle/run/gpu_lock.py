"""GPUs shared by many pytest-xdist workers: placement, and a readers-writer lock per device.

Placement. Worker ``gwN`` runs on CUDA device ``N % device_count`` (:func:`device_for_worker`;
the plugin sets it before any test). Its tensors live there: the targets' device is plain
``cuda``, the current device. An isolated example (a fresh ``replay`` process) is given the same
device (:func:`replay_device_args`).

The lock. Ordinary tests take their device's lock shared; a test that needs most of a device
(the full-size DSA fixtures: tens of GiB) takes it exclusively, so no other worker holds memory
on that device beyond its CUDA context while it runs (each test returns its cached blocks to the
driver when it ends: ``release_cached_memory``). Without this, a 14-worker run on one H200 ran
out of memory: the full-size worker held ~82 GiB and the thirteen others 2-6 GiB each (docs/DESIGN.md "8. GPU placement, locks and device faults"). There is one lock per device, so on a host with several GPUs the full-size tests
run one per GPU at the same time (:func:`full_size_device` spreads them; the plugin runs each on
its device, whichever worker takes it), not one per host.

The lock is ``flock`` on a file in the temporary directory, per user and per device
(:func:`lock_path`, keyed by the physical device, so that runs with different
``CUDA_VISIBLE_DEVICES`` agree on which file is which GPU), so it also spans several
pytest runs on the same machine. Readers are not held back for a waiting writer: a full-size
test waits until no ordinary test runs on its device, which in a busy run happens near its end,
so the full-size tests run last and alone on their devices. (Writer preference would idle every
worker until the longest running test ends, minutes in the gpu profile, once per full-size test.)
"""
from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import re
import tempfile

import torch


def worker_index(worker: str | None) -> int | None:
    """``gw3`` -> 3 (pytest-xdist's ``PYTEST_XDIST_WORKER``); None outside xdist."""
    if not worker:
        return None
    m = re.fullmatch(r"gw(\d+)", worker)
    if m is None:
        raise ValueError(f"PYTEST_XDIST_WORKER={worker!r}: expected gw<N>")
    return int(m.group(1))


def device_for_worker(worker: str | None, device_count: int) -> int | None:
    """The CUDA device index worker ``gwN`` runs on: ``N % device_count``, round robin.

    None when there is nothing to choose (not an xdist worker, or fewer than two devices): the
    process stays on torch's default device."""
    index = worker_index(worker)
    if index is None or device_count < 2:
        return None
    return index % device_count


def full_size_device(position: int, device_count: int) -> int:
    """The device of the ``position``-th full-size test (collection order): round robin, so
    that with D devices D of them run at once, each alone on its device."""
    return position % max(device_count, 1)


def physical_id(index: int, visible: str | None) -> str:
    """The host's name of visible CUDA device ``index`` under ``CUDA_VISIBLE_DEVICES=visible``:
    its entry there (a physical index or a GPU-/MIG- UUID), the index itself when unset."""
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    return entries[index] if index < len(entries) else str(index)


def device_key(device: int | None = None) -> str:
    """Names a device for its lock file, the same in every process on the host whatever its
    ``CUDA_VISIBLE_DEVICES`` (in one form, indices or UUIDs): ``cuda-<physical id>``; ``cpu``
    for no device on a machine without CUDA (``cuda<index>`` for a named one). Initialises
    nothing: ``device=None`` is the current device once CUDA is initialised, else device 0."""
    if not torch.cuda.is_available():
        return "cpu" if device is None else f"cuda{device}"
    if device is None:
        device = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    return f"cuda-{physical_id(device, os.environ.get('CUDA_VISIBLE_DEVICES'))}"


def lock_path(key: str, kind: str = "lock") -> str:
    """The lock file of the device named ``key``, per user, in the temporary directory."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key)
    return os.path.join(tempfile.gettempdir(), f"attention-oracle-gpu-{os.getuid()}.{safe}.{kind}")


def replay_device_args() -> list[str]:
    """``--cuda-device N`` for a ``replay`` process started by this one: the isolated example
    runs on this worker's device, not on device 0. Empty with fewer than two devices."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return []
    return ["--cuda-device", str(torch.cuda.current_device())]


@contextlib.contextmanager
def _flock(path: str, mode: int):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


_HELD = "ATTENTION_ORACLE_GPU_LOCK_HELD"


@contextlib.contextmanager
def hold(exclusive: bool, device: int | None = None):
    """Hold ``device`` (default: the current one) shared (ordinary test) or exclusively
    (full-size test).

    A process started by a test that holds the lock (a nested pytest run) inherits it through
    the environment: its tests run inside the parent's hold (an exclusive test nested in a
    shared hold would otherwise wait for its own parent forever).
    """
    if os.environ.get(_HELD):
        yield
        return
    os.environ[_HELD] = "1"
    try:
        with _hold(exclusive, device):
            yield
    finally:
        del os.environ[_HELD]


@contextlib.contextmanager
def _hold(exclusive: bool, device: int | None):
    with _flock(lock_path(device_key(device)), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH):
        if exclusive:
            release_cached_memory()
        yield


def release_cached_memory(device: int | None = None) -> None:
    """Return this process' cached CUDA blocks (on ``device``, default the current one) to the
    driver; its live tensors stay."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        with torch.cuda.device(torch.cuda.current_device() if device is None else device):
            torch.cuda.empty_cache()
