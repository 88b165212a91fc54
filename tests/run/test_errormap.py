"""Error maps (run/errormap.py): the pattern of failing coordinates in words, and the PNG of
|impl - gold| over a failing output's last two dims that a failure and the bug summary name."""

import pytest
import torch

from attention_oracle.checks.sdpa import checks
from attention_oracle.checks.sdpa.cases import SdpaCase
from attention_oracle.judge import agreement
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.judge.targets import load
from attention_oracle.run import errormap


def _mismatch(x, gold) -> OracleMismatch:
    with pytest.raises(OracleMismatch) as info:
        agreement.assert_agrees(x, gold, gold, check="sdpa.forward_agreement", impl="k", name="out",
                                dtype=torch.float32, gradient=False, magnitude=1.0, repro="-")
    return info.value


def test_a_wrong_last_column_reads_as_one():
    gold = torch.randn(2, 3, 70, 16, dtype=torch.float64)
    x = gold.clone()
    x[1, 2, :, -1] += 1.0
    exc = _mismatch(x, gold)
    assert exc.detail["slice"] == (1, 2) and tuple(exc.detail["error"].shape) == (70, 16)
    assert errormap.pattern(exc.detail) == "query rows: all; feature cols: last"
    assert "[sdpa.forward_agreement] implementation=k output=out: max|impl-gold|" in str(exc)


def test_a_dropped_tile_edge_key_shows_in_the_key_gradient():
    """KeyDroppedAtTileEdge: dk of key 64 is 0; the other keys' dk move less (their softmax
    lost one term) but still beyond the bound: the map's worst row is key 64."""
    target = load("attention_oracle.controls.sdpa_broken:KeyDroppedAtTileEdge")
    case = SdpaCase(batch=(1,), L=1, S=65, E=4, Ev=4, seed=3)
    inp = checks.build(case, target.device)
    dk = checks._grads(checks.call(target, inp), inp, inp.dout.contiguous())["dk"]
    gold, lp = checks._references(inp, case, inp.dout.contiguous())
    with pytest.raises(OracleMismatch) as info:
        agreement.assert_agrees(dk, gold["dk"], {a: r["dk"] for a, r in lp.items()}, check="c", impl="k",
                                name="dk", dtype=torch.float32, gradient=True, repro="-",
                                magnitude=gold["magnitude"]["dk"],
                                acc_magnitude=gold.get("magnitude_acc", {}).get("dk", 0.0))
    detail = info.value.detail
    assert errormap.pattern(detail) == "key rows: all; feature cols: all"  # every P_j moved
    rows = detail["error"].amax(1)
    assert detail["at"][-2] == 64 and float(rows[64]) > 2 * float(rows[:64].max())


def test_the_png_is_written_where_set(tmp_path):
    gold = torch.randn(1, 9, 5, dtype=torch.float64)
    x = gold.clone()
    x[0, 4, :] = float("nan")
    exc = _mismatch(x, gold)
    errormap.set_directory(str(tmp_path / "maps"))
    try:
        path = errormap.write(exc.detail, "a title")
    finally:
        errormap.set_directory(errormap.DEFAULT_DIRECTORY)
    assert path.endswith(".png") and path.startswith(str(tmp_path))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert errormap.pattern(exc.detail) == "query rows: 4 only; feature cols: all"


def test_a_plain_property_has_no_map():
    with pytest.raises(OracleMismatch) as info:
        agreement.assert_true(False, check="c", impl="k", name="out", message="m", repro="-")
    assert info.value.detail["error"] is None and errormap.write(info.value.detail) == ""
    with pytest.raises(ValueError, match="error map directory"):
        errormap.set_directory("")
