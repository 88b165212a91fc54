"""The calibration tools' case collection (``tools/collect.py``): round-robin under a
budget, SIGTERM keeping what ran; and the narrow flash declaration
(``judge/adapters/torch_flash_narrow.py``) drawing only what it declares."""
import os
import signal
import time

import torch

from attention_oracle.checks import catalogue
from attention_oracle.checks.sdpa.cases import unsupported
from attention_oracle.judge.targets import load
from attention_oracle.tools import collect

NARROW = "attention_oracle.judge.adapters.torch_flash_narrow:NarrowFlash"


def _groups(n_groups=3, n_cases=10):
    return [collect.Group("correct", f"g{i}", f"g{i}", "sdpa", "forward_agreement", "", "float32",
                          list(range(n_cases)), target=object()) for i in range(n_groups)]


def _judge(seconds=0.0, on_call=None):
    calls = []

    def judge(check, target, case, name, poison):
        calls.append(case)
        if on_call:
            on_call(len(calls))
        time.sleep(seconds)
        return {"outcome": "passed", "ratio": 0.0, "seconds": seconds}
    return judge, calls


def test_round_robin_cut_evenly_by_the_budget():
    groups = _groups()
    judge, _ = _judge(seconds=0.02)
    rounds = []
    status = collect.collect(groups, torch.device("cpu"), budget_s=0.25, judge=judge,
                             after_round=rounds.append, log=lambda m: None)
    counts = [len(g.examples) for g in groups]
    assert 0 < min(counts) < 10 and max(counts) - min(counts) <= 1, counts
    assert status["stopped"].startswith("budget") and rounds == list(range(1, status["rounds"] + 1))


def test_sigterm_stops_and_keeps_what_ran():
    groups = _groups()
    judge, calls = _judge(on_call=lambda n: n == 5 and os.kill(os.getpid(), signal.SIGTERM))
    before = signal.getsignal(signal.SIGTERM)
    status = collect.collect(groups, torch.device("cpu"), judge=judge, log=lambda m: None)
    assert "signal" in status["stopped"] and len(calls) == 5
    assert sum(len(g.examples) for g in groups) == 4  # the example in flight is dropped
    assert signal.getsignal(signal.SIGTERM) is before
    collect._SIGNALLED.clear()


def test_every_case_runs_without_a_budget():
    groups = _groups(2, 3)
    judge, calls = _judge()
    status = collect.collect(groups, torch.device("cpu"), judge=judge, log=lambda m: None)
    assert status["stopped"] == "" and len(calls) == 6 and status["rounds"] == 3


def test_narrow_flash_declaration_loads():
    target = load(NARROW, torch.device("cpu"))
    caps = target.capabilities
    assert not target.unavailable and target.offers("scaled_dot_product_attention")
    assert caps.dtypes == (torch.float16, torch.bfloat16) and caps.masks == ("none",)
    assert caps.ranks == (4,) and "misaligned" not in caps.layouts
    assert all(d % 8 == 0 and d <= 256 for d in caps.head_dims)
    for check in ("rank3_equals_rank4", "fully_masked_rows", "misaligned_inputs"):
        assert unsupported(check, caps), check


def test_narrow_flash_draws_only_declared_cases():
    caps = load(NARROW, torch.device("cpu")).capabilities
    for check in catalogue.checks("sdpa"):
        if unsupported(check, caps):
            continue
        for case in collect.draw_cases(catalogue.strategy(f"sdpa.{check}", caps), 30):
            assert case.dtype in ("float16", "bfloat16") and case.mask == "none", case
            assert case.rank == 4 and case.E % 8 == 0 and case.Ev % 8 == 0 and max(case.E, case.Ev) <= 256
            assert "misaligned" not in (case.layout_q, case.layout_k, case.layout_v)


def test_narrow_flash_judged_or_refused_on_cpu():
    """PyTorch's CPU flash backend runs fp16/bf16 (torch 2.14): every drawn example passes or is
    refused, and only for what the declaration cannot say (E != Ev)."""
    target = load(NARROW, torch.device("cpu"))
    caps = target.capabilities.narrowed(dtypes=(torch.float16,))
    check = catalogue.checks("sdpa")["forward_agreement"]
    examples = [(c, collect.run_example(check, target, c, "sdpa.forward_agreement"))
                for c in collect.draw_cases(catalogue.strategy("sdpa.forward_agreement", caps), 8)]
    assert all(e["outcome"] in ("passed", "refused") for _, e in examples), examples
    assert all(c.E != c.Ev for c, e in examples if e["outcome"] == "refused")
    assert any(e["outcome"] == "passed" for _, e in examples)
