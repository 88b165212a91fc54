"""One GPU shared by many pytest-xdist workers: a readers-writer lock between processes.

Ordinary tests take the lock shared; a test that needs most of the device (the full-size DSA
fixtures: tens of GiB) takes it exclusively, so no other worker holds device memory beyond its
CUDA context while it runs (each test returns its cached blocks to the driver when it ends:
``release_cached_memory``). Without this, a 14-worker run on one H200 ran out of memory: the
full-size worker held ~82 GiB and the thirteen others 2-6 GiB each (NOTES.md, GPU run 13).

The lock is ``flock`` on a file in the temporary directory, per user, so it also spans several
pytest runs on the same machine. Readers are not held back for a waiting writer: a full-size
test waits until no ordinary test runs, which in a busy run happens near its end, so the
full-size tests run last and alone. (Writer preference would idle every worker until the
longest running test ends, minutes in the gpu profile, once per full-size test.)
"""
from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import tempfile

import torch


def _path(kind: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"attention-oracle-gpu-{os.getuid()}.{kind}")


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
def hold(exclusive: bool):
    """Hold the device shared (ordinary test) or exclusively (full-size test).

    A process started by a test that holds the lock (a nested pytest run) inherits it through
    the environment: its tests run inside the parent's hold (an exclusive test nested in a
    shared hold would otherwise wait for its own parent forever).
    """
    if os.environ.get(_HELD):
        yield
        return
    os.environ[_HELD] = "1"
    try:
        with _hold(exclusive):
            yield
    finally:
        del os.environ[_HELD]


@contextlib.contextmanager
def _hold(exclusive: bool):
    with _flock(_path("lock"), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH):
        if exclusive:
            release_cached_memory()
        yield


def release_cached_memory() -> None:
    """Return this process' cached CUDA blocks to the driver (its live tensors stay)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()
