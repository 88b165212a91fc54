"""benchmarks.timing's alternated rounds: each round in the reverse order of the last, and
ratios as medians of the ratios within a round (a drift that slows both sides of a round
alike leaves the ratio alone). CPU: the timing methods fall back to wall-clock timing."""
import math

from benchmarks.timing import alternated, paired_ratio


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
