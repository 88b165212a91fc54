"""How far two float32 summation orders of one dot product differ (the floor's accumulation term).

For random dot products of length n (standard normal terms, or their absolute values: partial
sums growing, the worst case of summation) this sums the rounded products in seven orders
(sequential, sequential with one rounding per fused multiply-add, blocks of 16 and 32,
pairwise, 8 and 32 strided lanes then a tree) and prints the largest difference between any two
orders in units of eps(float32) * sum|a b|, and that divided by sqrt(n): what FLOOR_ACC must
cover (docs/agreement-rule.md, "4. The floor").

    python -m benchmarks.summation_orders [--trials 300] [--seed 0]
"""
from __future__ import annotations

import argparse

import numpy as np

LENGTHS = (16, 64, 96, 128, 256, 512)
EPS = float(np.finfo(np.float32).eps)


def sequential(p):
    return np.cumsum(p, dtype=np.float32)[-1]


def sequential_fma(a, b):
    acc = np.float32(0)
    for x, y in zip(a.astype(np.float64), b.astype(np.float64)):
        acc = np.float32(np.float64(acc) + x * y)  # the product exact, one rounding per step
    return acc


def blocked(p, block):
    return sequential(np.array([sequential(p[i:i + block]) for i in range(0, len(p), block)],
                               dtype=np.float32))


def pairwise(p):
    return np.float32(np.sum(p, dtype=np.float32))


def strided(p, lanes):
    sums = [sequential(p[i::lanes]) for i in range(min(lanes, len(p)))]
    while len(sums) > 1:
        sums = [np.float32(sums[i] + sums[i + 1]) if i + 1 < len(sums) else sums[i]
                for i in range(0, len(sums), 2)]
    return sums[0]


def orders(a, b):
    p = (a * b).astype(np.float32)  # the rounded products
    return [sequential(p), sequential_fma(a, b), blocked(p, 16), blocked(p, 32), pairwise(p),
            strided(p, 8), strided(p, 32)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    for regime in ("gauss", "positive"):
        for n in LENGTHS:
            ratios = []
            for _ in range(args.trials):
                a = rng.standard_normal(n).astype(np.float32)
                b = rng.standard_normal(n).astype(np.float32)
                if regime == "positive":
                    a, b = np.abs(a), np.abs(b)
                sums = orders(a, b)
                spread = max(abs(float(x) - float(y)) for x in sums for y in sums)
                ratios.append(spread / (EPS * float(np.sum(np.abs(a.astype(np.float64) * b)))))
            worst = max(ratios)
            print(f"{regime:8s} n={n:4d} max spread / (eps sum|ab|) = {worst:.3f}  p99 "
                  f"{np.quantile(ratios, 0.99):.3f}  / sqrt(n) = {worst / np.sqrt(n):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
