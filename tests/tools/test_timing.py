"""benchmarks.timing's alternated rounds: each round in the reverse order of the last, and
ratios as medians of the ratios within a round (a drift that slows both sides of a round
alike leaves the ratio alone). CPU: the timing methods fall back to wall-clock timing."""
import math

from benchmarks.timing import alternated, paired_host_ratios, paired_ratio


def test_rounds_alternate_their_order():
    calls = []
    fns = {name: (lambda n=name: calls.append(n)) for name in ("a", "b", "c")}
    timed = alternated(fns, rounds=2, rep_ms=1, synced_reps=1)
    # each timing calls its fn several times in a row: keep the order of first calls per round
    order = [n for i, n in enumerate(calls) if i == 0 or calls[i - 1] != n]
    assert order[:3] == ["a", "b", "c"] and order[-3:] == ["c", "b", "a"], order
    assert set(timed) == {"a", "b", "c"}
    assert all(len(timed[n][m]["each_ms"]) == 2 for n in timed for m in ("queued", "synced"))


def test_paired_ratio_is_the_median_of_ratios_within_rounds():
    # a drift that doubles both sides in round 1: each round's ratio is 2.0
    timed = {"fast": {"queued": {"each_ms": [1.0, 2.0, 1.0]}},
             "ref": {"queued": {"each_ms": [2.0, 4.0, 2.0]}}}
    assert paired_ratio(timed, "fast", "ref", "queued") == 2.0
    # ratios of 2, 2 and 0.5: the median, not the mean (1.5) nor the ratio of sums
    timed["ref"]["queued"]["each_ms"] = [2.0, 4.0, 0.5]
    assert paired_ratio(timed, "fast", "ref", "queued") == 2.0
    timed["fast"]["queued"]["each_ms"] = [0.0, float("nan"), 0.0]
    assert math.isnan(paired_ratio(timed, "fast", "ref", "queued"))


def test_paired_host_ratios_alternate_which_is_timed_first(monkeypatch):
    """Host-time pairs: fn first in even pairs, ref first in odd ones (a cost the first of two
    pays lands on each side equally often); the median, min and max are of the ratios."""
    import benchmarks.timing as timing
    order, us = [], {"fn": iter([2.0, 2.0, 3.0, 2.0]), "ref": iter([1.0, 1.0, 1.0, 4.0])}
    monkeypatch.setattr(timing, "host_us", lambda f, calls, rounds: order.append(f()) or
                        next(us[order[-1]]))
    out = paired_host_ratios(lambda: "fn", lambda: "ref", pairs=4, calls=5)
    assert order == ["fn", "ref", "ref", "fn", "fn", "ref", "ref", "fn"], order
    assert out["ratios"] == [0.5, 2.0, 2.0, 3.0] and out["median"] == 2.0
    assert (out["min"], out["max"]) == (0.5, 3.0)


def test_tuned_tiles_name_each_backward_kernels_picks(monkeypatch):
    """A benchmark records the Triton backward's tuned tiles: each kernel's picks by key."""
    import triton

    from attention_oracle.fast.kernels import sdpa_bwd
    from benchmarks.timing import tuned_tiles

    config = triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4, num_stages=2)
    monkeypatch.setattr(sdpa_bwd.sdpa_bwd_dkdv_kernel, "cache", {("key",): config})
    monkeypatch.setattr(sdpa_bwd.sdpa_bwd_dq_kernel, "cache", {})
    tiles = tuned_tiles()
    assert tiles["dq"] == {}
    assert list(tiles["dkdv"]) == ["('key',)"] and "BLOCK_N: 64" in tiles["dkdv"]["('key',)"]
