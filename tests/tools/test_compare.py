"""``python -m benchmarks.compare``: the logic on CPU at tiny sizes (numbers mean nothing here).

Two implementations on the same problems, every phase of each area recorded, a function one of
them lacks recorded as not offered, and the JSON and PNG written."""
import json

from benchmarks import compare


def test_two_implementations_side_by_side(tmp_path, capsys):
    out = tmp_path / "cmp.json"
    rc = compare.main(["--impl", "oracle", "--impl", "torch-math", "--quick", "--lengths", "16",
                       "--reps", "1", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    by = {(p["area"], p["impl"], p["phase"], p["causal"]): p for p in result["points"]}
    for impl in ("oracle", "torch-math"):
        for phase in compare.PHASES:
            for causal in (False, True):
                point = by[("sdpa", impl, phase, causal)]
                assert point["status"] == "ok" and point["tflops"] > 0, point
    assert by[("sdpa", "torch-math", "forward", False)]["max_diff_vs_first"] < 1e-5
    assert by[("dsa", "oracle", "step", True)]["status"] == "ok"
    assert by[("dsa", "torch-math", "forward", False)]["status"] == "does not offer dsa_sparse_attention"
    assert (tmp_path / "cmp.png").exists()
    assert "TFLOP/s" in capsys.readouterr().out


def test_causal_dsa_indices_only_see_earlier_keys():
    import torch
    idx = compare.dsa_indices(9, 9, 4, True, torch.Generator().manual_seed(0))
    t = torch.arange(9)[:, None].expand_as(idx)
    assert idx.dtype == torch.int32 and bool(((idx == -1) | ((idx >= 0) & (idx <= t))).all())
    assert int((idx[0] >= 0).sum()) == 1 and int((idx[8] >= 0).sum()) == 4
