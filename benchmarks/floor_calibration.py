"""The agreement rule's floor where the gradients cancel: measured against real backends.

With one visible key per query, P = 1 and dS = P (dP - Delta) = 0 exactly, so dq and dk are
rounding noise: the difference of two length-Ev dot products (dP = dO . V and Delta = dO . out)
summed in the implementation's own orders. The rule's lp ensemble does not model summation
orders, so there the floor decides (docs/agreement-rule.md, "The floor"). This prints, per
implementation, head dim and value regime, the worst ratio of the dq / dk error to

- the old floor, FLOOR_ULPS eps(dtype) magnitude (sums of absolute values of dP and Delta), and
- the floor with the accumulation term, + FLOOR_ACC eps(float32) magnitude_acc (sqrt(Ev) times
  the sums of absolute products of dP and Delta),

and the normalised noise err / (eps(float32) magnitude_acc), whose worst value calibrates
FLOOR_ACC. Regimes: "gauss" (standard normal inputs), "positive" (|normal|: dO, V and out
of one sign, partial sums growing, the worst case of summation), "scaled" (value scale 30).

    python -m benchmarks.floor_calibration [--device cuda] [--impl torch-efficient,fast]
        [--trials 20] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math

import torch

from attention_oracle.judge import agreement
from attention_oracle.judge.targets import Refused, load
from attention_oracle.oracle.sdpa import ALGORITHMS, sdpa_reference

HEAD_DIMS = (16, 64, 96, 128, 256)
REGIMES = ("gauss", "positive", "scaled")
FN = "scaled_dot_product_attention"


def problem(E: int, regime: str, gen: torch.Generator, device, dtype=torch.float32):
    """q [1, 4, 8, E], k and v [1, 4, 1, E] (one key: P = 1), dout [1, 4, 8, E]."""
    def draw(*shape):
        x = torch.randn(*shape, generator=gen, dtype=torch.float64)
        if regime == "positive":
            x = x.abs()
        if regime == "scaled":
            x = x * 30.0
        return x.to(dtype).to(device)
    return draw(1, 4, 8, E), draw(1, 4, 1, E), draw(1, 4, 1, E), draw(1, 4, 8, E)


def gradients(target, q, k, v, dout, scale):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = target.call(FN, *leaves, scale=scale)
    return dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out, leaves, dout)))


def measure(target, E, regime, trials, gen, device):
    worst = {"old": 0.0, "new": 0.0, "noise": 0.0, "lp_ratio": 0.0}
    scale = 1.0 / math.sqrt(E)
    for _ in range(trials):
        q, k, v, dout = problem(E, regime, gen, device)
        try:
            g = gradients(target, q, k, v, dout, scale)
        except Refused:
            return None
        cpu = [t.cpu() for t in (q, k, v, dout)]
        gold = sdpa_reference(*cpu, scale=scale, magnitudes=True)
        lp = {a: sdpa_reference(*cpu, scale=scale, compute_dtype=torch.float32, algorithm=a)
              for a in ALGORITHMS}
        for name in ("dq", "dk"):
            x = g[name].detach().cpu().to(torch.float64)
            err = float((x - gold[name]).abs().max())
            mag, acc = gold["magnitude"][name], gold["magnitude_acc"][name]
            old = agreement.floor_of(torch.float32, mag)
            new = agreement.floor_of(torch.float32, mag, acc)
            verdict = agreement.rule(err, {a: float((r[name].to(torch.float64) - gold[name]).abs().max())
                                           for a, r in lp.items()},
                                     0.0, mag, torch.float32, True, acc)
            worst["old"] = max(worst["old"], err / old)
            worst["new"] = max(worst["new"], err / new)
            worst["noise"] = max(worst["noise"], err / (agreement.eps(torch.float32) * acc))
            worst["lp_ratio"] = max(worst["lp_ratio"], verdict.ratio)
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--impl", default="oracle,torch-math,torch-flash,torch-efficient,fast")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)))
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    rows = []
    print(f"{'impl':16s} {'E':>4s} {'regime':9s} {'old floor':>10s} {'new floor':>10s} "
          f"{'noise/acc':>10s} {'rule':>8s}")
    for name in args.impl.split(","):
        target = load(name, device)
        if target.unavailable or not target.offers(FN):
            print(f"{name:16s} unavailable: {target.unavailable or 'no ' + FN}")
            continue
        for E in (int(e) for e in args.head_dims.split(",")):
            for regime in REGIMES:
                gen = torch.Generator().manual_seed(1000 * E + REGIMES.index(regime))
                w = measure(target, E, regime, args.trials, gen, device)
                if w is None:
                    print(f"{name:16s} {E:4d} {regime:9s} refused")
                    continue
                rows.append(dict(impl=name, E=E, regime=regime, **w))
                print(f"{name:16s} {E:4d} {regime:9s} {w['old']:10.3f} {w['new']:10.3f} "
                      f"{w['noise']:10.3f} {w['lp_ratio']:8.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "trials": args.trials, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
