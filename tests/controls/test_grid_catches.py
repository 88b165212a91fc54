"""The covering grid alone (no search) catches the bugs that need two or three conditions at
once, under the ``ci`` profile, and passes the oracle on the same grid.

Each control runs the grid of the check named for it (``run/grid.py``), case by case, through
``run_check`` until one fails; the oracle runs the same grid to the end.
"""
import pytest
import torch

from attention_oracle.checks import catalogue
from attention_oracle.judge import record
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.judge.targets import load
from attention_oracle.run import grid
from attention_oracle.run.runner import run_check
from tests.helpers import ci_profile  # noqa: F401 (fixture)

# (control, check, variant): each needs an intersection of conditions
CONTROLS = [
    ("sdpa_broken:LastKeyDroppedAtTailTile", "sdpa.forward_agreement", ""),
    ("sdpa_broken:NanDqOnUnderflowAtHalfTile", "sdpa.gradient_agreement", ""),
    ("sdpa_broken:KeyDroppedAtTileEdge", "sdpa.forward_agreement", ""),
    ("dsa_broken:TopkLengthTileReadsOneMore", "dsa.forward_agreement", "rope"),
    ("dsa_broken:TopkLengthTileReadsOneMore", "dsa.forward_agreement", "nope"),
    ("dsa_broken:CausalUnseenRowsSeeKeyZero", "dsa.varlen_agreement", "rope"),
    ("dsa_broken:CausalUnseenRowsSeeKeyZero", "dsa.varlen_agreement", "nope"),
    ("dsa_broken:NanAfterEmptyFirstChunk", "dsa.forward_agreement", "rope"),
    ("dsa_broken:NanAfterEmptyFirstChunk", "dsa.forward_agreement", "nope"),
    ("index_broken:CausalUnseenRowsSeeKeyZero", "index.offset_equals_oracle", ""),
]


pytestmark = pytest.mark.usefixtures("ci_profile")  # every test under the ci profile


def _first_failure(check, target, variant):
    """(grid case name, message) of the first grid case that fails, or None."""
    for name, case in grid.cases(check, target, variant):
        try:
            with record.silenced():
                run_check(check, target, case)
        except OracleMismatch as exc:
            return name, str(exc)
    return None


@pytest.mark.parametrize("control,check_name,variant", CONTROLS,
                         ids=[f"{c.split(':')[1]}-{k}-{v}" for c, k, v in CONTROLS])
def test_grid_catches_control(control, check_name, variant):
    target = load(f"attention_oracle.controls.{control}", torch.device("cpu"))
    caught = _first_failure(catalogue.check(check_name), target, variant)
    assert caught is not None, f"the {check_name} grid does not catch {control}"
    name, message = caught
    assert name.startswith(f"grid:{check_name}") and check_name in message


@pytest.mark.parametrize("check_name,variant", sorted({(k, v) for _, k, v in CONTROLS}))
def test_oracle_passes_the_same_grid(check_name, variant):
    target = load("oracle", torch.device("cpu"))
    assert _first_failure(catalogue.check(check_name), target, variant) is None
