"""``python -m benchmarks.targets``: the scorecard of the speed targets, from benchmark JSON.

The records below carry the keys the benchmarks write (benchmarks.sdpa's points and fp32 rows,
benchmarks.dsa's sections, benchmarks.overhead's pairs, benchmarks.index_prep's variants, the
Gluon backward benchmarks' rows), with made-up figures on either side of each bound."""
import json

import pytest

from benchmarks import targets


def _sdpa_point(L, D, causal, fwd, step, kernel="gluon"):
    def phase(q, s):
        return {"queued_x_cudnn": q, "synced_x_cudnn": s}
    return {"L": L, "D": D, "causal": causal, "fast_forward": kernel,
            "fwd": phase(*fwd), "fwdbwd": phase(*step)}


def _fp32_row(causal, mode, fast_q, fast_s, torch_q=40.0, torch_s=40.0):
    return {"B": 2, "H": 16, "L": 2048, "D": 128, "causal": causal,
            f"fwdbwd_fast_{mode}_tflops": fast_q, f"fwdbwd_fast_{mode}_synced_tflops": fast_s,
            "fwdbwd_torch_default_tflops": torch_q, "fwdbwd_torch_default_synced_tflops": torch_s}


def _dsa_row(fwd, bwd):
    return {"fwd_tflops": fwd[1], "fwd_queued_tflops": fwd[0],
            "bwd_tflops": bwd[1], "bwd_queued_tflops": bwd[0]}


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture
def outputs(tmp_path):
    """One output of each benchmark, as h200.sh lays them out (names do not matter)."""
    _write(tmp_path, "sdpa.json", {
        "device": "H200", "overhead_us": {}, "points": [
            _sdpa_point(1024, 128, False, (0.92, 0.91), (0.96, 0.97)),
            _sdpa_point(4096, 128, True, (1.03, 0.97), (0.96, 0.95)),
            _sdpa_point(4096, 64, False, (1.01, 1.00), (0.90, 0.97), kernel="triton")],
        "fp32": [_fp32_row(False, "tf32x3", 36.0, 33.0), _fp32_row(True, "tf32x3", 37.0, 38.0)]})
    _write(tmp_path, "dsa.json", {
        "device": "H200", "geometry": {},
        "fast": {"doc_16384": _dsa_row((500, 490), (140, 141)),
                 "packed_glm_a": _dsa_row((430, 420), (120, 121))},
        "index_prep": {"doc_4096": {"T": 4096, "fast_over_copy": 1.83,
                                    "fast_over_copy_queued": 1.19},
                       "doc_16384": {"error": "RuntimeError('boom')"}},
        "fp32": {"doc_4096": {"bf16x6": _dsa_row((38, 37), (46, 45)), "acc64": _dsa_row((14, 14), (7, 7))},
                 "doc_16384": {"bf16x6": _dsa_row((38, 38), (47, 46))}}})
    _write(tmp_path, "sub/pairs.json", {
        "sdpa_fast_fwd": 20.0,
        "sdpa_pairs_fwd": {"median": 1.02, "min": 0.9, "max": 1.1, "ratios": [0.9, 1.02, 1.1]},
        "sdpa_pairs_fwdbwd": {"median": 1.22, "min": 1.1, "max": 1.3, "ratios": [1.1, 1.22, 1.3]}})
    _write(tmp_path, "sub/index_prep.json", {
        "T16384_w0_p4x3": {"T": 16384, "holes": False, "num_warps": 0,
                           "fast_over_copy_synced": 1.47, "fast_over_copy_queued": 1.16},
        "T16384_w8_p4x3": {"T": 16384, "holes": False, "num_warps": 8,
                           "fast_over_copy_synced": 9.0, "fast_over_copy_queued": 9.0},
        "T16384_holes_w0_p4x3": {"T": 16384, "holes": True, "num_warps": 0,
                                 "fast_over_copy_synced": 9.0, "fast_over_copy_queued": 9.0}})
    _write(tmp_path, "dsabwd/dsa_gluon_bwd.json", {
        "device": "H200",
        "doc_16384": {"triton": {"queued_tflops": 140, "dq_rel_err": 1e-3},
                      "gluon": {"queued_tflops": 230, "synced_tflops": 225}},
        "packed_glm_a": {"triton": {"queued_tflops": 120, "dq_rel_err": 1e-3},
                         "gluon": {"queued_tflops": 210, "synced_tflops": 190}}})
    _write(tmp_path, "sdpabwd/sdpa_gluon_bwd.json", {"device": "H200", "rows": [
        {"D": 128, "L": 4096, "causal": False, "gluon_step_over_cudnn": [1.01, 0.99],
         "triton_step_over_cudnn": [0.96, 0.95]}]})
    _write(tmp_path, "gluon.json", [{"host_us": {"triton": 16.4, "gluon": 31.0,
                                                 "gluon_tma_cache": 15.0, "D": 128}}])
    _write(tmp_path, "gluon_host.json", [{"call_gluon": 19.5, "call_triton": 17.3,
                                          "paired_gluon_over_triton": 1.15, "D": 128}])
    _write(tmp_path, "triton_cache/kernel.json", {"name": "sdpa_fwd_kernel", "num_warps": 4})
    return targets.load([str(tmp_path)])


def _by_name(files):
    return {t.name: t for t in targets.scorecard(files)}


def test_each_benchmark_output_is_recognised_by_its_content(outputs):
    kinds = sorted(kind for kind, _, _ in outputs)
    assert kinds == ["dsa", "dsa_gluon_bwd", "index_prep", "overhead", "sdpa", "sdpa_gluon",
                     "sdpa_gluon_bwd", "sdpa_gluon_host_parts"]  # not the Triton cache's JSON


def test_a_cell_below_its_bound_misses_the_target_and_is_named(outputs):
    t = _by_name(outputs)["sdpa_forward"]
    assert t.verdict() == "missed"
    worst = t.worst()
    assert (worst.where, worst.method, worst.value, worst.bound) == (
        "D 128 L 4096 causal", "synced", 0.97, 1.0)
    short = {(c.where, c.method): c.met for c in t.cells}
    assert short[("D 128 L 1024 full", "queued")]  # 0.92 against 0.9 below 4k


def test_every_cell_at_its_bound_meets_the_target(outputs):
    t = _by_name(outputs)["dsa_fp32"]
    assert t.verdict() == "met" and len(t.judged()) == 8  # the default mode's cells only
    assert {c.where for c in t.cells} == {f"{p} {ph} (bf16x6)" for p in ("doc_4096", "doc_16384")
                                          for ph in ("fwd", "bwd")}


def test_aside_cells_are_shown_but_do_not_decide(outputs):
    named = _by_name(outputs)
    bwd = named["dsa_backward"]
    assert bwd.verdict() == "missed"  # benchmarks.dsa's default backward: 120-141
    gluon = [c for c in bwd.cells if "(gluon)" in c.where]  # the default where none is recorded
    assert not any(c.aside for c in gluon)
    assert [c.met for c in gluon] == [True, True, True, False]  # packed_glm_a synced 190
    assert all(c.aside for c in bwd.cells if "(triton)" in c.where)
    step = named["sdpa_step"]
    assert step.verdict() == "missed" and step.worst().value == 0.90
    assert [c.aside for c in step.cells if c.source.endswith("sdpa_gluon_bwd.json")] == [
        ""] * 2 + ["gluon backward (not the default)"] * 2  # the Triton backward decides
    host = named["sdpa_ws_default"]
    assert host.verdict() == "missed"
    cache = [c for c in host.cells if c.aside]
    assert len(cache) == 1 and cache[0].met  # 15.0 / 16.4 with the opt-in cache
    paired = [c for c in host.cells if c.method == "paired gluon / triton"]
    assert [(c.value, c.met) for c in paired] == [(1.15, False)]  # --host-parts' paired median


def test_max_bounds_and_paired_medians(outputs):
    t = _by_name(outputs)["host_overhead"]
    assert [(c.where, c.met) for c in t.cells] == [("SDPA fwd", True), ("SDPA fwdbwd", True)]
    assert t.verdict() == "met"


def test_index_preparation_from_both_benchmarks_default_variant_only(outputs):
    t = _by_name(outputs)["index_prep"]
    judged = {(c.where, c.value) for c in t.judged()}
    assert judged == {("T 4096", 1.83), ("T 16384", 1.47)}  # not the 8-warp or shuffled rows
    errors = [c for c in t.cells if c.error]
    assert len(errors) == 1 and "boom" in errors[0].error and errors[0].met is None
    assert t.verdict() == "missed"


def test_the_fp32_mode_the_json_ran_under_is_the_one_judged(tmp_path):
    _write(tmp_path, "sdpa.json", {"overhead_us": {}, "points": [],
                                   "fast_settings": {"sdpa": {"fp32_mode": "accurate"}},
                                   "fp32": [{**_fp32_row(False, "accurate", 24.0, 24.0),
                                             **_fp32_row(False, "tf32x3", 39.0, 39.0)}]})
    t = _by_name(targets.load([str(tmp_path)]))["sdpa_fp32_step"]
    assert t.verdict() == "missed" and {c.value for c in t.cells} == {0.6}


def test_fp32_rows_judged_by_their_paired_ratios_where_recorded(tmp_path):
    """An fp32 row timed in alternated rounds carries the median of the within-round ratios
    (benchmarks.timing.paired_ratio); that is the figure judged, not the ratio of the two
    medians of TFLOP/s (F85). A row without it is judged by its TFLOP/s."""
    paired = {**_fp32_row(True, "tf32x3", 34.0, 34.0), "fwdbwd_tf32x3_ratio": 0.91,
              "fwdbwd_tf32x3_synced_ratio": 0.92}
    _write(tmp_path, "sdpa.json", {"overhead_us": {}, "points": [],
                                   "fp32": [paired, _fp32_row(False, "tf32x3", 38.0, 36.0)]})
    t = _by_name(targets.load([str(tmp_path)]))["sdpa_fp32_step"]
    assert sorted(round(c.value, 3) for c in t.cells) == [0.9, 0.91, 0.92, 0.95]
    assert t.verdict() == "met"


def test_nothing_measured_is_said_loudly_and_fails_strict(tmp_path, capsys):
    out = tmp_path / "card.json"
    assert targets.main([str(tmp_path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("NOTHING JUDGED") == 9 and "0 met, 0 missed, 9 not measured" in text
    card = json.loads(out.read_text())
    assert {t["verdict"] for t in card["targets"]} == {"not measured"}
    assert targets.main([str(tmp_path), "--strict"]) == 1


def test_cli_writes_every_cell_with_its_verdict(outputs, tmp_path, capsys):
    out = tmp_path / "card.json"
    assert targets.main([str(tmp_path), "--json", str(out)]) == 0
    card = json.loads(out.read_text())
    verdicts = {t["name"]: t["verdict"] for t in card["targets"]}
    assert verdicts == {"sdpa_forward": "missed", "sdpa_step": "missed",
                        "sdpa_ws_default": "missed", "dsa_forward": "missed",
                        "dsa_backward": "missed", "host_overhead": "met",
                        "sdpa_fp32_step": "missed", "dsa_fp32": "met", "index_prep": "missed"}
    assert card["devices"] == ["H200"]
    assert all({"where", "method", "value", "bound", "met", "source"} <= set(c)
               for t in card["targets"] for c in t["cells"])
    assert "MISS" in capsys.readouterr().out


def test_under_the_auto_backward_each_head_dim_is_judged_on_the_backward_it_took(tmp_path):
    """fast's "auto" SDPA backward is the Gluon one at the head dims its settings name
    (``auto_bwd_head_dims``) and the Triton one elsewhere: the judged step cells follow."""
    _write(tmp_path, "sdpa_gluon_bwd.json", {
        "device": "H100", "fast_settings": {"sdpa": {"backward_backend": "auto",
                                                     "auto_bwd_head_dims": [128]}},
        "rows": [{"D": D, "L": 4096, "causal": False, "triton_step_over_cudnn": [0.8, 0.81],
                  "gluon_step_over_cudnn": [0.96, 0.97]} for D in (64, 128)]})
    t = _by_name(targets.load([str(tmp_path)]))["sdpa_step"]
    judged = {(c.where, c.value) for c in t.judged()}
    assert judged == {("D 64 L 4096 full", 0.8), ("D 64 L 4096 full", 0.81),
                      ("D 128 L 4096 full", 0.96), ("D 128 L 4096 full", 0.97)}, judged


def test_a_row_that_names_its_default_backward_is_judged_on_it(tmp_path):
    """Rows that record the backward the run's default gave them (``default_backward``: "auto"
    takes the Gluon backward from a size on) are judged on that backward, whatever the head
    dim."""
    _write(tmp_path, "sdpa_gluon_bwd.json", {
        "device": "H100", "fast_settings": {"sdpa": {"backward_backend": "auto"}},
        "rows": [{"D": 64, "L": L, "causal": False, "default_backward": default,
                  "triton_step_over_cudnn": [0.8, 0.81], "gluon_step_over_cudnn": [0.96, 0.97]}
                 for L, default in ((1024, "triton"), (4096, "gluon"))]})
    t = _by_name(targets.load([str(tmp_path)]))["sdpa_step"]
    judged = {(c.where, c.value) for c in t.judged()}
    assert judged == {("D 64 L 1024 full", 0.8), ("D 64 L 1024 full", 0.81),
                      ("D 64 L 4096 full", 0.96), ("D 64 L 4096 full", 0.97)}, judged


def test_the_backward_a_json_ran_as_default_is_the_one_judged(tmp_path):
    """A Gluon backward benchmark run while the Triton backward was the default (its
    ``fast_settings``) is judged on the Triton rows; the Gluon rows are shown beside."""
    rows = {"triton": {"queued_tflops": 130, "synced_tflops": 129, "dq_rel_err": 1e-3},
            "gluon": {"queued_tflops": 270, "synced_tflops": 264}}
    _write(tmp_path, "dsa_gluon_bwd.json", {
        "device": "H100", "fast_settings": {"dsa": {"backward_backend": "triton"}},
        "doc_16384": rows, "packed_glm_a": rows})
    t = _by_name(targets.load([str(tmp_path)]))["dsa_backward"]
    assert t.verdict() == "missed" and {c.value for c in t.judged()} == {130, 129}
    assert {c.value for c in t.cells if c.aside} == {270, 264}
