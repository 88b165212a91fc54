"""The inference forward (``no_grad``) and the training forward (inputs requiring grad) of
fast and cuDNN, timed in alternation over rounds: whether a gap between the two phases, as a
benchmark timing each implementation once after another read it (``benchmarks.sdpa`` before
its alternated rounds, docs/FINDINGS.md F85), belongs to the kernels or to the order and the
clocks.

    python -m benchmarks.sdpa_phases [--dims 128] [--lengths 16384] [--causal 0]
                                     [--rounds 5] [--out out/sdpa_phases.json]

bf16, H 32, B = 16384 / L (``benchmarks.sdpa``'s geometry). Each round times fast fwd, fast
fwd_train, cuDNN fwd, cuDNN fwd_train in that order, then the next round the reverse order,
each by both methods of ``benchmarks.timing`` (``timing.alternated``). Prints each round's
TFLOP/s and the medians over rounds, queued (synced).
"""
import argparse
import itertools
import statistics

from .sdpa import IMPLS, flops, fwd_fn, fwd_train_fn, make_inputs
from .timing import alternated, tflops, write_json

CASES = [("fast", "fwd"), ("fast", "fwd_train"), ("cudnn", "fwd"), ("cudnn", "fwd_train")]
PHASE_FNS = {"fwd": fwd_fn, "fwd_train": fwd_train_fn}


def one_point(L, D, causal, rounds):
    B, H = 16384 // L, 32
    (q, k, v), _ = make_inputs(B, H, L, D)
    fl = flops(B, H, L, L, D, causal, False)
    fns = {case: PHASE_FNS[case[1]](IMPLS[case[0]], q, k, v, causal) for case in CASES}
    for fn in fns.values():
        fn()
    timed = alternated(fns, rounds, synced_reps=20)
    got = {case: [(tflops(fl, mq), tflops(fl, ms)) for mq, ms in
                  zip(timed[case]["queued"]["each_ms"], timed[case]["synced"]["each_ms"])]
           for case in CASES}
    for r in range(rounds):
        order = CASES if r % 2 == 0 else CASES[::-1]
        print(f"D {D} L {L} causal {int(causal)} round {r}: " + ", ".join(
            f"{c[0]} {c[1]} {got[c][r][0]:.0f} ({got[c][r][1]:.0f})" for c in order), flush=True)
    row = {"D": D, "L": L, "causal": causal, "rounds": rounds}
    for case in CASES:
        mq = statistics.median(t[0] for t in got[case])
        ms = statistics.median(t[1] for t in got[case])
        row[f"{case[0]}_{case[1]}"] = {"queued": mq, "synced": ms, "each": got[case]}
    for phase in ("fwd", "fwd_train"):
        f, c = row[f"fast_{phase}"], row[f"cudnn_{phase}"]
        print(f"  median {phase}: fast {f['queued']:.0f} ({f['synced']:.0f}), cudnn "
              f"{c['queued']:.0f} ({c['synced']:.0f}), x cudnn {f['queued'] / c['queued']:.3f} "
              f"({f['synced'] / c['synced']:.3f})", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dims", default="128")
    ap.add_argument("--lengths", default="16384")
    ap.add_argument("--causal", default="0")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="out/sdpa_phases.json")
    a = ap.parse_args(argv)
    rows = [one_point(L, D, bool(c), a.rounds)
            for D, L, c in itertools.product([int(x) for x in a.dims.split(",")],
                                             [int(x) for x in a.lengths.split(",")],
                                             [int(x) for x in a.causal.split(",")])]
    write_json(a.out, rows)


if __name__ == "__main__":
    main()
