"""Timing helpers shared by ``benchmarks.sdpa`` and ``benchmarks.dsa``.

Two methods, reported side by side because they disagree (FACTS.md, "Timing method matters"):

- ``queued_ms``: ``triton.testing.do_bench`` (L2 flushed between runs, launches queued without
  a sync: the device time when the host keeps ahead);
- ``synced_ms``: CUDA events around each call and a sync after it, as a step-by-step loop sees
  it (host launch overhead and launch gaps included).

``alternated`` times several implementations of one thing in rounds, each round in the
reverse order of the last, and gives every ratio as the median over rounds of the ratio within
a round: on a card whose clock moves with its power and heat, the same kernel timed once after
another read 585 to 698 TFLOP/s in one run (docs/FINDINGS.md F85), so a ratio of two single
timings taken one after the other carries that drift.

``host_us`` is the host time per call at a tiny shape: N calls queued back to back, one sync,
wall time over N (the device finishes each call long before the host has issued the next).
On a CPU-only machine every method falls back to wall-clock timing (a dry run of the logic).
"""
import json
import os
import time

import torch


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def queued_ms(fn, rep_ms=40, warmup_ms=10):
    """Median ms of fn() by triton.testing.do_bench (wall clock on CPU)."""
    if not torch.cuda.is_available():
        return synced_ms(fn, 3, warmup=1)
    import triton.testing
    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def synced_ms(fn, reps=20, warmup=2):
    """Median ms of fn() with CUDA events around each call and a sync after each."""
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(reps):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def alternated(fns, rounds=3, rep_ms=40, synced_reps=15):
    """{name: {"queued"|"synced": {"ms": median over rounds, "each_ms": per round}}} of the
    callables ``fns`` ({name: fn}), timed by both methods in ``rounds`` rounds, in the order
    of ``fns`` in even rounds and the reverse in odd ones."""
    names = list(fns)
    each = {name: {"queued": [], "synced": []} for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            each[name]["queued"].append(queued_ms(fns[name], rep_ms=rep_ms,
                                                  warmup_ms=max(5, rep_ms // 4)))
            each[name]["synced"].append(synced_ms(fns[name], synced_reps))
    return {name: {method: {"ms": _median(ms), "each_ms": ms} for method, ms in by.items()}
            for name, by in each.items()}


def paired_ratio(timed, name, ref, method):
    """Median over rounds of ``ref``'s time over ``name``'s within each round of
    :func:`alternated` (> 1: ``name`` faster); NaN where a time is missing."""
    a, b = timed[name][method]["each_ms"], timed[ref][method]["each_ms"]
    ratios = [y / x for x, y in zip(a, b) if x and x > 0 and y and y > 0]
    return _median(ratios) if ratios else float("nan")


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])) if n else float("nan")


def host_us(fn, calls=200, rounds=5, issue=None):
    """Host microseconds per call: ``calls`` calls queued, one sync; the best of ``rounds``.
    With a dict ``issue``, ``issue["us"]`` gets the best time per call before that sync (equal
    to the result when the host, not the device, is the bound)."""
    fn()
    _sync()
    best = best_issue = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        _sync()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        best_issue = min(best_issue, (t1 - t0) / calls * 1e6)
    if issue is not None:
        issue["us"] = best_issue
    return best


def paired_host_ratios(fn, ref, pairs, calls=200):
    """``fn``'s host time per call over ``ref``'s (:func:`host_us`, one round each), timed in
    turn ``pairs`` times, the one timed first alternating from pair to pair (a cost the first
    of two pays, or a drift of the host within a pair, falls on each side equally often; a
    noisy host moves both figures of a pair alike): median, min, max and every ratio."""
    ratios = []
    for i in range(pairs):
        if i % 2:
            r = host_us(ref, calls=calls, rounds=1)
            f = host_us(fn, calls=calls, rounds=1)
        else:
            f = host_us(fn, calls=calls, rounds=1)
            r = host_us(ref, calls=calls, rounds=1)
        ratios.append(f / r)
    ratios.sort()
    return {"median": _median(ratios), "min": ratios[0], "max": ratios[-1], "ratios": ratios}


def tflops(flop, ms):
    return flop / (ms * 1e-3) / 1e12 if ms and ms > 0 else float("nan")


def fast_settings():
    """fast's process-wide options now (its defaults unless the environment or a setter
    changed them): what a benchmark's JSON records beside its figures, so that a figure says
    which backend and mode it measured (benchmarks.targets reads the fp32 modes from it)."""
    from attention_oracle.fast import dsa, sdpa
    return {"sdpa": sdpa.settings(), "dsa": dsa.settings()}


def tuned_tiles(names=("dkdv", "dq")):
    """The Triton SDPA autotuners' picks so far, per kernel of ``names`` ("fwd", "dkdv", "dq";
    the backward's by default): {tuning key: config} (a tuned tile can differ between runs: a
    benchmark's JSON records which one it timed)."""
    from attention_oracle.fast.kernels import sdpa_bwd, sdpa_fwd
    kernels = {"fwd": sdpa_fwd.sdpa_fwd_kernel, "dkdv": sdpa_bwd.sdpa_bwd_dkdv_kernel,
               "dq": sdpa_bwd.sdpa_bwd_dq_kernel}
    return {name: {str(key): str(config) for key, config in kernels[name].cache.items()}
            for name in names}


def write_json(path, obj):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=1, default=str)


def plot_panels(path, panels, xlabel="sequence length", ylabel="TFLOP/s", logx=True):
    """One PNG of several panels: ``panels`` maps a title to {label: [(x, y), ...]}.

    Returns the path, or a note saying why no plot was drawn (the JSON holds the numbers)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001 - a missing matplotlib must not lose the numbers
        return f"no plot ({exc!r})"
    n = max(len(panels), 1)
    cols = min(n, 4)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, (title, series) in zip(axes.flat, panels.items()):
        for label, pts in series.items():
            pts = sorted(p for p in pts if p[1] == p[1])
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_title(title, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
