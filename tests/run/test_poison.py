"""Poisoned allocations (``run/poison.py``): what the ``empty`` family returns
inside ``poisoned()``, that everything is restored, and that the checks run poisoned, so a
kernel that leaves output rows unwritten is caught (control ``UnwrittenRows``)."""
import threading

import pytest
import torch

from attention_oracle.checks.dsa import checks as dsa_checks
from attention_oracle.checks.dsa.cases import strategy_for as dsa_strategy
from attention_oracle.checks.sdpa import checks as sdpa_checks
from attention_oracle.checks.sdpa.cases import SdpaCase
from attention_oracle.checks.sdpa.cases import strategy_for as sdpa_strategy
from attention_oracle.controls import dsa_broken, sdpa_broken
from attention_oracle.judge import record
from attention_oracle.judge.targets import Target, load
from attention_oracle.run import poison
from attention_oracle.run.runner import run_check
from tests.helpers import caught_message

DTYPES = (torch.float32, torch.float16)


def _originals():
    return [(owner, name, getattr(owner, name, None), name in vars(owner))
            for owner, name in poison._TARGETS]


def _allocations(like):
    return {
        "empty": lambda dt: torch.empty(3, 2, dtype=dt),
        "empty_like": lambda dt: torch.empty_like(like, dtype=dt),
        "empty_strided": lambda dt: torch.empty_strided((2, 3), (1, 2), dtype=dt),
        "empty_permuted": lambda dt: torch.empty_permuted((2, 3), (1, 0), dtype=dt),
        "new_empty": lambda dt: like.new_empty((4,), dtype=dt),
        "new_empty_strided": lambda dt: like.new_empty_strided((2, 2), (1, 2), dtype=dt),
    }


@pytest.mark.parametrize("how", sorted(_allocations(torch.zeros(1))))
def test_every_allocation_is_filled(how):
    make = _allocations(torch.zeros(2, 3))[how]
    with poison.poisoned():
        for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            assert bool(torch.isnan(make(dt)).all()), dt
        assert bool(torch.isnan(make(torch.complex64)).all())
        assert bool((make(torch.int32) == torch.iinfo(torch.int32).min).all())
        assert bool((make(torch.int64) == torch.iinfo(torch.int64).min).all())
        assert bool((make(torch.uint8) == 255).all())
        assert bool(make(torch.bool).all())


def test_leaf_requiring_grad_and_empty_shapes():
    with poison.poisoned():
        t = torch.empty(3, requires_grad=True)
        z = torch.empty(0, 5)
    assert t.requires_grad and t.is_leaf and bool(torch.isnan(t).all())
    assert z.shape == (0, 5)


def test_restored_on_exit_and_on_error():
    before = _originals()
    with poison.poisoned():
        assert poison.is_active() and torch.empty is not before[0][2]
    assert _originals() == before and not poison.is_active()
    with pytest.raises(ValueError), poison.poisoned():
        raise ValueError("inside")
    assert _originals() == before and not poison.is_active()
    # Tensor.new_empty is inherited from TensorBase: no shadowing attribute is left behind
    assert "new_empty" not in vars(torch.Tensor)


def test_reentrant():
    before = _originals()
    with poison.poisoned():
        with poison.poisoned():
            pass
        assert bool(torch.isnan(torch.empty(2)).all()), "inner exit must not unpatch"
    assert _originals() == before


def test_threads_entering_and_leaving():
    before = _originals()
    errors = []
    barrier = threading.Barrier(4)

    def work():
        try:
            barrier.wait()
            for _ in range(50):
                with poison.poisoned():
                    assert bool(torch.isnan(torch.empty(4)).all())
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert _originals() == before and not poison.is_active()


def test_disabled_is_a_no_op():
    before = _originals()
    poison.set_enabled(False)
    try:
        with poison.poisoned():
            assert not poison.is_active() and _originals() == before
        with poison.poisoned(enabled=True):
            assert poison.is_active()
    finally:
        poison.set_enabled(True)
    assert _originals() == before


def test_run_check_poisons_the_implementation_and_its_backward():
    """The forward and the autograd backward the check drives both allocate poisoned."""
    seen = {}

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen["forward"] = bool(torch.isnan(torch.empty(2)).all())
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            seen["backward"] = bool(torch.isnan(g.new_empty(2)).all())
            return g

    def check(target, case):
        x = torch.ones(3, requires_grad=True)
        torch.autograd.grad(Probe.apply(x).sum(), x)

    check.__name__ = "probe"
    with record.silenced():
        run_check(check, Target("probe"), SdpaCase())
    assert seen == {"forward": True, "backward": True}
    assert not poison.is_active()



def test_sdpa_unwritten_rows_caught_by_forward_check():
    target = load("attention_oracle.controls.sdpa_broken:UnwrittenRows")
    assert sdpa_broken.CONTROLS["UnwrittenRows"] == "forward_agreement"
    text = caught_message(sdpa_checks.forward_agreement, target, sdpa_strategy("forward_agreement", DTYPES))
    assert "sdpa.forward_agreement" in text and "UnwrittenRows" in text
    assert "NaN/Inf where the gold is finite" in text and "impl=nan" in text


def test_dsa_unwritten_rows_caught_by_forward_check():
    target = load("attention_oracle.controls.dsa_broken:UnwrittenRows", torch.device("cpu"))
    assert dsa_broken.CONTROLS["UnwrittenRows"] == "forward_agreement"
    text = caught_message(dsa_checks.forward_agreement, target,
                   dsa_strategy("forward_agreement", DTYPES, rope=True))
    assert "dsa.forward_agreement" in text and "UnwrittenRows" in text
    assert "NaN/Inf where the gold is finite" in text
