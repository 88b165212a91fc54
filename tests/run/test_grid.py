"""The covering grid (``run/grid.py``): the same rows every time, every pair of values of any
two dimensions covered within the constraints, and nothing outside a declaration."""
import pytest
import torch

from attention_oracle.checks import catalogue
from attention_oracle.judge import profiles
from attention_oracle.judge.case import dtype_name
from attention_oracle.judge.targets import load
from attention_oracle.run import grid
from tests.helpers import ci_profile  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("ci_profile")  # every test under the ci profile


FACTORS = {"a": (1, 2, 3), "b": ("x", "y", "z"), "c": (True, False), "d": (0, 1, 2, 3)}
CONSTRAINTS = ((("a", "b"), lambda r: not (r["a"] == 1 and r["b"] == "x")),
               (("c", "d"), lambda r: r["c"] or r["d"] < 3))


def test_covering_is_deterministic():
    assert grid.covering(FACTORS, 2, CONSTRAINTS) == grid.covering(FACTORS, 2, CONSTRAINTS)


@pytest.mark.parametrize("strength", (2, 3))
def test_every_tuple_covered_within_constraints(strength):
    rows = grid.covering(FACTORS, strength, CONSTRAINTS)
    assert all(grid.allowed(r, CONSTRAINTS) for r in rows)
    assert grid.uncovered(rows, FACTORS, strength, CONSTRAINTS) == []
    assert grid.uncovered(rows, FACTORS, strength) != []  # the excluded pairs are really absent


@pytest.mark.parametrize("check_name,variant", [("sdpa.forward_agreement", ""),
                                                ("dsa.forward_agreement", "rope"),
                                                ("dsa.varlen_agreement", "nope"),
                                                ("index.offset_equals_oracle", "")])
def test_check_grid_covers_every_pair(check_name, variant):
    """A check's own grid: deterministic, and every pair of values of two dimensions that an
    allowed row holds appears in some row (checked pair by pair, not by enumerating rows)."""
    check = catalogue.check(check_name)
    target = load("oracle", torch.device("cpu"))
    spec = grid.spec(check, target, variant)
    rows = grid.covering(spec.factors, 2, spec.constraints)
    assert rows == grid.covering(spec.factors, 2, spec.constraints)
    assert [c for _, c in grid.cases(check, target, variant)] == [c for _, c in grid.cases(check, target, variant)]
    keys = list(spec.factors)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            seen = {(r[a], r[b]) for r in rows}
            for va in spec.factors[a]:
                for vb in spec.factors[b]:
                    pair = {a: va, b: vb}
                    if (va, vb) not in seen:  # only a pair no allowed row can hold may be missing
                        assert not _feasible(spec, pair), f"{check_name}: {pair} not covered"


def _feasible(spec, partial) -> bool:
    """Whether some allowed row extends ``partial`` (depth-first over the other dimensions)."""
    rest = [k for k in spec.factors if k not in partial]

    def extend(row, i):
        if not grid.allowed(row, spec.constraints):
            return False
        if i == len(rest):
            return True
        return any(extend({**row, rest[i]: v}, i + 1) for v in spec.factors[rest[i]])
    return extend(dict(partial), 0)


def test_cases_are_named_and_replayable():
    check = catalogue.check("sdpa.forward_agreement")
    named = grid.cases(check, load("oracle", torch.device("cpu")))
    assert 10 <= len(named) <= 120
    name, case = named[3]
    assert name == "grid:sdpa.forward_agreement:3"
    assert catalogue.load_case(__import__("json").loads(case.to_json())) == case
    assert "replay" in case.repro(check.full_name, "oracle")


def test_length_classes_at_tile_edges():
    """Every native length class is an L and an S of the SDPA grid (S % 64 == 63 among them)."""
    cases = [c for _, c in grid.cases(catalogue.check("sdpa.forward_agreement"), load("oracle"))]
    classes = set(profiles.grid_lengths(False))
    assert classes <= {c.L for c in cases} and classes <= {c.S for c in cases}
    assert any(c.S % 64 == 63 and c.mask == "none" and not c.causal for c in cases)


def test_narrow_declaration_gets_nothing_outside_it():
    target = load("attention_oracle.controls.narrow:NarrowKernel")
    for name in ("forward_agreement", "gradient_agreement", "strided_dout", "rank3_equals_rank4"):
        cases = [c for _, c in grid.cases(catalogue.check(f"sdpa.{name}"), target)]
        assert cases
        assert {c.dtype for c in cases} <= {"float16", "bfloat16"}
        assert all(max(c.E, c.Ev) <= 128 for c in cases)
        assert all(c.mask == "none" for c in cases)
        assert {c.dtype for c in cases} == {dtype_name(d) for d in target.capabilities.dtypes}


def test_interpreted_targets_get_small_grids():
    cases = [c for _, c in grid.cases(catalogue.check("sdpa.gradient_agreement"), load("fast"))]
    assert len(cases) <= 24 and max(max(c.L, c.S) for c in cases) <= 33
