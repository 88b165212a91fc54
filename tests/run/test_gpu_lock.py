"""The device lock between pytest workers (run/gpu_lock.py): exclusive excludes
shared on the same device, and only there (one lock per device)."""
import os
import subprocess
import sys
import tempfile
import time

from attention_oracle.run import gpu_lock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOLDER = """
import sys, time
from attention_oracle.run import gpu_lock
with gpu_lock.hold(exclusive={exclusive}, device={device}):
    print("held", flush=True)
    time.sleep({seconds})
"""


def _holder(tmp_path, exclusive: bool, seconds: float, device: int | None = None) -> subprocess.Popen:
    env = {"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    code = HOLDER.format(exclusive=exclusive, seconds=seconds, device=device)
    proc = subprocess.Popen([sys.executable, "-c", code],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _time_to_acquire(tmp_path, monkeypatch, exclusive: bool, device: int | None = None) -> float:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(gpu_lock._HELD, raising=False)
    start = time.perf_counter()
    with gpu_lock.hold(exclusive=exclusive, device=device):
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


def _two_devices_or_cpu():
    """The per-device tests name devices 0 and 1: CUDA indices on a GPU host (two needed), the
    index-named lock files on a CPU machine."""
    import pytest
    import torch
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        pytest.skip(f"needs two CUDA devices (this host has {torch.cuda.device_count()})")


def test_exclusive_on_one_device_does_not_hold_back_another(tmp_path, monkeypatch):
    _two_devices_or_cpu()
    proc = _holder(tmp_path, exclusive=True, seconds=2.0, device=1)
    waited = _time_to_acquire(tmp_path, monkeypatch, exclusive=False, device=0)
    proc.wait()
    assert waited < 1.0, f"device 0 waited {waited:.2f} s for an exclusive hold of device 1"


def test_exclusive_on_a_device_holds_back_that_device(tmp_path, monkeypatch):
    """Negative control of the previous test: the same pair of holds, on one device, waits."""
    _two_devices_or_cpu()
    proc = _holder(tmp_path, exclusive=True, seconds=1.0, device=1)
    waited = _time_to_acquire(tmp_path, monkeypatch, exclusive=False, device=1)
    proc.wait()
    assert waited >= 0.5, f"a shared hold of device 1 was granted beside an exclusive one ({waited:.2f} s)"


FAULT_THEN_WORK = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _store_far_away(ptr):
    tl.store(ptr + (1 << 40), 1.0)  # an illegal address: the context is broken from here on


def test_a_device_fault():
    x = torch.zeros(1, device="cuda")
    _store_far_away[(1,)](x)
    torch.cuda.synchronize()


def test_b_after_the_fault():
    assert torch.ones(4, device="cuda").sum().item() == 4.0
'''


def test_a_device_fault_does_not_poison_the_next_tests(tmp_path):
    """One illegal address in a worker once turned its next 109 tests into errors (docs/DESIGN.md "8. GPU placement, locks and device faults"). The
    worker now ends after the faulting test, and xdist runs the rest in a fresh one. Negative
    control: without the exit (``-n 0``, one process) the second test cannot pass and is skipped
    with the reason."""
    import pytest
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (a real device fault)")
    (tmp_path / "test_fault.py").write_text(FAULT_THEN_WORK)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")

    def run(workers: str) -> str:
        r = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-n", workers, "-rA",
                            "-p", "no:cacheprovider", str(tmp_path / "test_fault.py")],
                           capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
        return r.stdout + r.stderr

    import re
    out = run("1")
    assert re.search(r"PASSED \S*test_b_after_the_fault", out), out[-3000:]
    assert re.search(r"FAILED \S*test_a_device_fault", out), out[-3000:]
    single = run("0")
    assert "CUDA context of this worker broke" in single, single[-3000:]
