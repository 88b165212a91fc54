"""The device lock between pytest workers (properties/gpu_lock.py): exclusive excludes shared."""
import os
import subprocess
import sys
import tempfile
import time

from properties import gpu_lock

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOLDER = """
import sys, time
from properties import gpu_lock
with gpu_lock.hold(exclusive={exclusive}):
    print("held", flush=True)
    time.sleep({seconds})
"""


def _holder(tmp_path, exclusive: bool, seconds: float) -> subprocess.Popen:
    env = {"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER.format(exclusive=exclusive, seconds=seconds)],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _time_to_acquire(tmp_path, monkeypatch, exclusive: bool) -> float:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(gpu_lock._HELD, raising=False)
    start = time.perf_counter()
    with gpu_lock.hold(exclusive=exclusive):
        return time.perf_counter() - start


def test_shared_waits_for_exclusive(tmp_path, monkeypatch):
    proc = _holder(tmp_path, exclusive=True, seconds=1.0)
    waited = _time_to_acquire(tmp_path, monkeypatch, exclusive=False)
    proc.wait()
    assert waited >= 0.5, f"a shared hold was granted while another process held it exclusively ({waited:.2f} s)"


def test_shared_holders_do_not_wait_for_each_other(tmp_path, monkeypatch):
    proc = _holder(tmp_path, exclusive=False, seconds=2.0)
    waited = _time_to_acquire(tmp_path, monkeypatch, exclusive=False)
    proc.wait()
    assert waited < 1.0, f"two shared holds serialised ({waited:.2f} s)"


def test_exclusive_waits_for_shared(tmp_path, monkeypatch):
    proc = _holder(tmp_path, exclusive=False, seconds=1.0)
    waited = _time_to_acquire(tmp_path, monkeypatch, exclusive=True)
    proc.wait()
    assert waited >= 0.5, f"an exclusive hold was granted beside a shared one ({waited:.2f} s)"
