"""Where an fp32 SDPA kernel's forward error comes from: P's relative error as a function of the
score, read off the kernel itself.

    python -m benchmarks.fp32_probe --impl torch-efficient [--out FILE]

Two keys per query, q = (x, 0, ...), k0 = (1, 0, ...), k1 = 0, v0 = e0, v1 = e1: then out[0] = P0
= sigmoid(x * scale) and out[1] = P1, computed by the kernel with no rounding in P.V (the
values are 0 and 1). The row max is max(s, 0): x > 0 puts it on key 0. For s over [-40, 40],
at the scales 0.25 and 0.3, it prints P's relative error in units of u = 2^-24 against |s|,
binned: a kernel that rounds the exponent's argument at the score's magnitude shows an error
growing with |s|; an approximate exp2 a constant of a few u. ``--impl lp:ALGORITHM`` runs an
lp member of the rule's ensemble through the same probe.
"""
from __future__ import annotations

import argparse
import json

import torch

from attention_oracle.judge.targets import load

from .timing import write_json

U = 2.0 ** -24


class _Member:
    """An lp member of the rule's ensemble (``lp:ALGORITHM``) run through the same probe."""

    def __init__(self, algorithm):
        self.algorithm = algorithm

    def call(self, fn, q, k, v, **kw):
        from attention_oracle.oracle.sdpa import sdpa_reference
        return sdpa_reference(q, k, v, compute_dtype=torch.float32, algorithm=self.algorithm, **kw)["out"]


def p_error(impl: str, n: int = 65536, smax: float = 40.0, E: int = 16, scale: float = 0.25,
            device: str = "cuda") -> dict:
    target = _Member(impl[3:]) if impl.startswith("lp:") else load(impl)
    s = torch.linspace(-smax, smax, n, dtype=torch.float64)
    x = (s / scale).to(torch.float32)
    s_exact = x.double() * scale
    q = torch.zeros(n, 1, 1, E, dtype=torch.float32)
    q[:, 0, 0, 0] = x
    k = torch.zeros(n, 1, 2, E, dtype=torch.float32)
    k[:, 0, 0, 0] = 1.0
    v = torch.zeros(n, 1, 2, E, dtype=torch.float32)
    v[:, 0, 0, 0] = 1.0
    v[:, 0, 1, 1] = 1.0
    out = target.call("scaled_dot_product_attention", q.to(device), k.to(device), v.to(device),
                      scale=scale).double().cpu()
    p0 = torch.sigmoid(s_exact)
    p1 = torch.sigmoid(-s_exact)
    rel0 = ((out[:, 0, 0, 0] - p0).abs() / p0) / U
    rel1 = ((out[:, 0, 0, 1] - p1).abs() / p1) / U
    # the smaller of the two is the non-max key: its P = exp(-|s|) / (1 + exp(-|s|))
    small = torch.where(s_exact > 0, rel1, rel0)
    big = torch.where(s_exact > 0, rel0, rel1)
    bins = {}
    edges = [0, 0.5, 1, 2, 4, 8, 16, 24, 32, 40]
    for lo, hi in zip(edges, edges[1:]):
        sel = (s_exact.abs() >= lo) & (s_exact.abs() < hi)
        if sel.any():
            bins[f"{lo}-{hi}"] = {"small_key_max_u": float(small[sel].max()),
                                  "small_key_mean_u": float(small[sel].mean()),
                                  "max_key_max_u": float(big[sel].max())}
    return {"impl": impl, "E": E, "scale": scale, "bins": bins}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", action="append", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    res = []
    for impl in args.impl:
        for scale in (0.25, 0.3):
            try:
                res.append(p_error(impl, scale=scale, device=args.device))
            except Exception as exc:  # a backend refusing the shape: say so and go on
                res.append({"impl": impl, "scale": scale, "error": repr(exc)[:200]})
    print(json.dumps(res, indent=1))
    if args.out:
        write_json(args.out, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
