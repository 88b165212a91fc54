"""SDPA inputs with no right result (declared in the ``sdpa`` area, ``harness/registry.py``).

mismatched_value_rows: ``value`` with one more row than ``key`` (docs/CONTRACT.md "2. SDPA": key
    ``[.., S, E]`` and value ``[.., S, Ev]`` share S). No result is right: a kernel that takes S
    from one of them silently drops a value row or reads past the keys. Any exception passes (a
    clear ``ValueError`` naming the argument is what the oracle and fast raise, PyTorch's math
    backend raises a ``RuntimeError`` from its matmul); a returned result fails.
"""
from __future__ import annotations

import torch

from attention_oracle.checks.sdpa import checks as base
from attention_oracle.checks.sdpa.cases import SdpaCase, build
from attention_oracle.judge.judge import Judge
from attention_oracle.judge.registry import declare
from attention_oracle.judge.targets import ContractViolation


@declare("sdpa", beyond=True)
def mismatched_value_rows(judge: Judge, case: SdpaCase) -> None:
    """value with S + 1 rows against key's S: an error, never a result."""
    inp = build(case, judge.target.device, requires_grad=False)
    value = torch.cat([inp.v, inp.v[..., :1, :]], dim=-2)
    try:
        out = base.call(judge.target, inp, v=value)
    except ContractViolation:
        raise
    except Exception:  # noqa: BLE001 (any refusal of an input with no right result passes)
        return
    judge.true("out", False,
               f"returned a result of shape {tuple(out.shape)} for key {tuple(inp.k.shape)} and "
               f"value {tuple(value.shape)} (value has one row more than key): no result is "
               f"right; an error naming 'value' is expected")
