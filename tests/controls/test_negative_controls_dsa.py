"""Negative controls for DSA and varlen index preparation: deliberately broken namespaces
(``attention_oracle/controls/dsa_broken.py``, ``attention_oracle/controls/index_broken.py``) that the checks must
catch. Each control runs the check named in its module's ``CONTROLS`` table under
``profiles.control_settings()`` (no shrinking, first failure wins) and must raise
OracleMismatch naming that check and the control.
"""
import pytest
import torch

from attention_oracle.checks.dsa import checks as dsa_checks
from attention_oracle.checks.dsa.cases import strategy_for as dsa_strategy
from attention_oracle.checks.index import checks as index_checks
from attention_oracle.checks.index.cases import strategy_for as index_strategy
from attention_oracle.controls import dsa_broken, index_broken
from attention_oracle.judge import record
from attention_oracle.judge.agreement import OracleMismatch, floor_of
from attention_oracle.judge.targets import load
from tests.helpers import caught_message

DTYPES = (torch.float32, torch.float16)
VARLEN_CHECKS = ("varlen_agreement", "varlen_isolation")


def _assert_caught(check, target, cases, check_name):
    message = caught_message(check, target, cases)
    assert check_name in message
    assert target.name in message


DSA_PAIRS = sorted(dsa_broken.CONTROLS.items()) + dsa_broken.MORE_CONTROLS
INDEX_PAIRS = sorted(index_broken.CONTROLS.items()) + index_broken.MORE_CONTROLS


@pytest.mark.parametrize("control,check_name", DSA_PAIRS, ids=[f"{c}-{k}" for c, k in DSA_PAIRS])
def test_dsa_control_is_caught(control, check_name):
    target = load(f"attention_oracle.controls.dsa_broken:{control}", torch.device("cpu"))
    assert not target.unavailable, target.unavailable
    _assert_caught(dsa_checks.CHECKS[check_name], target,
                   dsa_strategy(check_name, target.capabilities.narrowed(dtypes=DTYPES), rope=True),
                   f"dsa.{check_name}")


@pytest.mark.parametrize("control,check_name", INDEX_PAIRS, ids=[f"{c}-{k}" for c, k in INDEX_PAIRS])
def test_index_control_is_caught(control, check_name):
    where = control if ":" in control else f"index_broken:{control}"
    target = load(f"attention_oracle.controls.{where}", torch.device("cpu"))
    assert not target.unavailable, target.unavailable
    _assert_caught(index_checks.CHECKS[check_name], target, index_strategy(check_name, target.capabilities.narrowed(dtypes=(torch.float32,))),
                   f"index.{check_name}")


@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
def test_floor_catches_ten_floors_where_dq_cancels(dtype):
    """One valid slot per row: dq is 0 by cancellation and the rule's bound collapses; the
    absolute floor still catches a dq error of 10 floors and admits half a floor."""
    from attention_oracle.checks.dsa.cases import DsaCase
    from attention_oracle.judge.targets import Target

    case = DsaCase(T=6, S=9, K=1, H=2, Dl=16, Dr=8, dtype=dtype, seed=1)
    with record.silenced():
        dsa_checks.gradient_agreement(Target("half-floor", dsa_broken.DqOffByFloors(0.5, floor_of)), case)
        with pytest.raises(OracleMismatch, match="dq_latent"):
            dsa_checks.gradient_agreement(Target("ten-floors", dsa_broken.DqOffByFloors(10.0, floor_of)), case)
