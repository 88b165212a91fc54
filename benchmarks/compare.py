"""A/B timing of any two (or more) implementations on the same SDPA and DSA problems.

    python -m benchmarks.compare --impl A --impl B [--out out/compare.json] [--lengths 1024,4096]
                                 [--dtype bfloat16] [--reps 20] [--areas sdpa,dsa]

``A`` and ``B`` are what ``--impl`` takes in the suite: a built-in (``fast``, ``torch``,
``torch-cudnn``, ...) or ``package.module[:attr]``. Both are timed on the very same inputs, for
each length and causal or not, in three phases:

- ``forward``: the forward alone, under ``no_grad``;
- ``backward``: ``torch.autograd.grad`` of an already computed output (graph kept);
- ``step``: forward then backward, as a training step runs them.

SDPA: ``[B, H, L, D]`` with B = tokens // L (FLOPs: forward 4*B*H*L*L*D, halved when causal;
backward 2.5x, step 3.5x the forward). DSA (``dsa_sparse_attention``, RoPE): T = S = L queries and
keys, each query taking ``topk`` random keys among those it may see (j <= t when causal, any key
otherwise), int32 indices, an explicit ``softmax_scale`` (FLOPs per valid slot: forward
2*H*(Dqk + Dv), backward 2*H*(3*Dqk + 2*Dv)).

On CUDA each point is timed two ways (FACTS.md, "Timing method matters"): ``queued``
(``triton.testing.do_bench``: L2 flushed, launches queued) and ``synced`` (CUDA events around
each call, a sync after it); TFLOP/s are from ``queued``. On a CPU the sizes are small and
both are wall-clock medians (a dry run of the logic, not a benchmark). A function an
implementation does not offer, or refuses (NotImplementedError), is recorded as such.

Writes a table (stdout), the JSON (``--out``) and a PNG next to it: TFLOP/s against length,
one panel per (area, phase, causal), one line per implementation. Each point also records the
largest difference of each implementation's forward output from the first one's.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

if not torch.cuda.is_available():  # before any Triton kernel module is imported (FACTS.md)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from attention_oracle.judge.targets import Refused, load  # noqa: E402

from .timing import plot_panels, queued_ms, synced_ms, tflops, write_json  # noqa: E402

PHASES = ("forward", "backward", "step")
SDPA_FN = "scaled_dot_product_attention"
DSA_FN = "dsa_sparse_attention"


def geometry(device: torch.device, quick: bool) -> dict:
    """Problem sizes: production-like on CUDA, tiny on a CPU (or with --quick)."""
    if device.type == "cuda" and not quick:
        return {"lengths": (1024, 2048, 4096, 8192), "sdpa": {"tokens": 16384, "H": 32, "D": 128},
                "dsa": {"H": 64, "Dl": 512, "Dr": 64, "topk": 2048}, "dtype": torch.bfloat16}
    return {"lengths": (32, 64), "sdpa": {"tokens": 64, "H": 2, "D": 32},
            "dsa": {"H": 4, "Dl": 32, "Dr": 16, "topk": 16}, "dtype": torch.float32}


# ----------------------------------------------------------------------------- problems


def sdpa_problem(L: int, causal: bool, g: dict, dtype, device, seed=0) -> dict:
    B = max(1, g["tokens"] // L)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v, dout = (torch.randn(B, g["H"], L, g["D"], generator=gen).to(device=device, dtype=dtype)
                     for _ in range(4))
    fwd = 4.0 * B * g["H"] * L * L * g["D"] * (0.5 if causal else 1.0)
    return {"inputs": (q, k, v), "kwargs": {"is_causal": causal}, "dout": dout, "fn": SDPA_FN,
            "flop": {"forward": fwd, "backward": 2.5 * fwd, "step": 3.5 * fwd},
            "shape": f"B{B} H{g['H']} L{L} D{g['D']}"}


def dsa_indices(T: int, S: int, topk: int, causal: bool, gen) -> torch.Tensor:
    """[T, topk] int32: distinct random keys a query may see (j <= t when causal), -1 past them."""
    score = torch.rand(T, S, generator=gen)
    if causal:
        score = score.masked_fill(torch.arange(S)[None, :] > torch.arange(T)[:, None], -1.0)
    val, idx = score.topk(min(topk, S), dim=1)
    idx = torch.where(val >= 0, idx, torch.full_like(idx, -1)).to(torch.int32)
    if idx.shape[1] < topk:
        idx = torch.cat([idx, idx.new_full((T, topk - idx.shape[1]), -1)], 1)
    return idx


def dsa_problem(L: int, causal: bool, g: dict, dtype, device, seed=0) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    H, Dl, Dr = g["H"], g["Dl"], g["Dr"]
    q_latent = torch.randn(L, H, Dl, generator=gen)
    q_rope = torch.randn(L, H, Dr, generator=gen)
    kv_latent = torch.randn(L, Dl, generator=gen)
    k_rope = torch.randn(L, Dr, generator=gen)
    indices = dsa_indices(L, L, g["topk"], causal, gen)
    dout = torch.randn(L, H, Dl, generator=gen)
    valid = int((indices >= 0).sum())
    to = dict(device=device, dtype=dtype)
    return {"inputs": tuple(t.to(**to) for t in (q_latent, q_rope, kv_latent, k_rope)),
            "indices": indices.to(device),
            "kwargs": {"softmax_scale": 1.0 / math.sqrt(Dl + Dr)}, "dout": dout.to(**to), "fn": DSA_FN,
            "flop": {"forward": 2.0 * H * (2 * Dl + Dr) * valid,
                     "backward": 2.0 * H * (3 * (Dl + Dr) + 2 * Dl) * valid},
            "shape": f"T{L} H{H} {Dl}+{Dr}/{Dl} topk{g['topk']}"}


PROBLEMS = {"sdpa": sdpa_problem, "dsa": dsa_problem}


# ----------------------------------------------------------------------------- timing


def _call(target, p, leaves):
    args = list(leaves) + ([p["indices"]] if "indices" in p else [])
    return target.call(p["fn"], *args, **p["kwargs"])


def _leaves(p, grad: bool):
    return [t.detach().requires_grad_(grad) for t in p["inputs"]]


def phase_fns(target, p) -> dict:
    """phase -> zero-argument callable running that phase on ``target``."""
    def forward():
        with torch.no_grad():
            return _call(target, p, _leaves(p, False))

    leaves = _leaves(p, True)
    out = _call(target, p, leaves)

    def backward():
        return torch.autograd.grad(out, leaves, p["dout"], retain_graph=True)

    def step():
        xs = _leaves(p, True)
        return torch.autograd.grad(_call(target, p, xs), xs, p["dout"])

    return {"forward": forward, "backward": backward, "step": step}


def time_ms(fn, device, reps: int) -> dict:
    if device.type == "cuda":
        return {"queued": queued_ms(fn, rep_ms=max(20, 5 * reps), warmup_ms=10),
                "synced": synced_ms(fn, reps=reps, warmup=2)}
    ms = synced_ms(fn, reps=max(1, reps), warmup=1)
    return {"queued": ms, "synced": ms}


def max_diff(a, b) -> float:
    if a is None or b is None or a.shape != b.shape:
        return float("nan")
    return float((a.detach().double() - b.detach().double()).abs().max()) if a.numel() else 0.0


def measure(target, p, device, reps: int) -> tuple[dict, torch.Tensor | None]:
    """{phase: record} for one implementation on one problem, and its forward output."""
    if not target.offers(p["fn"]):
        return {ph: {"status": f"does not offer {p['fn']}"} for ph in PHASES}, None
    try:
        fns = phase_fns(target, p)
        out = fns["forward"]()
    except Refused as exc:
        return {ph: {"status": f"refused: {str(exc)[:120]}"} for ph in PHASES}, None
    except Exception as exc:  # noqa: BLE001 - a failing implementation is a row, not a crash
        return {ph: {"status": f"error: {type(exc).__name__}: {str(exc)[:120]}"} for ph in PHASES}, None
    records = {}
    flop = dict(p["flop"], step=p["flop"].get("step", p["flop"]["forward"] + p["flop"]["backward"]))
    for ph in PHASES:
        try:
            ms = time_ms(fns[ph], device, reps)
        except Exception as exc:  # noqa: BLE001
            records[ph] = {"status": f"error: {type(exc).__name__}: {str(exc)[:120]}"}
            continue
        records[ph] = {"status": "ok", "ms_queued": ms["queued"], "ms_synced": ms["synced"],
                       "tflops": tflops(flop[ph], ms["queued"])}
    return records, out


def run(names: list[str], areas: list[str], lengths, reps: int, dtype, quick: bool) -> dict:
    targets = [load(n) for n in names]
    device = targets[0].device
    g = geometry(device, quick)
    dtype = dtype or g["dtype"]
    points = []
    for area in areas:
        for L in lengths or g["lengths"]:
            for causal in (False, True):
                p = PROBLEMS[area](L, causal, g[area], dtype, device)
                first = None
                for t in targets:
                    if t.unavailable:
                        rec = {ph: {"status": f"unavailable: {t.unavailable}"} for ph in PHASES}
                        out = None
                    else:
                        rec, out = measure(t, p, device, reps)
                    first = out if first is None else first
                    for ph in PHASES:
                        points.append({"area": area, "impl": t.name, "L": L, "causal": causal,
                                       "phase": ph, "shape": p["shape"], **rec[ph],
                                       "max_diff_vs_first": max_diff(out, first)})
                del p
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return {"implementations": names, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
            "torch": torch.__version__, "points": points}


# ----------------------------------------------------------------------------- output


def table(result: dict) -> str:
    head = ("area", "phase", "causal", "L", "shape", *result["implementations"])
    rows = [head]
    keyed = {}
    for pt in result["points"]:
        keyed.setdefault((pt["area"], pt["phase"], pt["causal"], pt["L"], pt["shape"]), {})[pt["impl"]] = pt
    for (area, phase, causal, L, shape), by_impl in keyed.items():
        cells = []
        for name in result["implementations"]:
            pt = by_impl.get(name, {})
            if pt.get("status") == "ok":
                cells.append(f"{pt['tflops']:.3g} TFLOP/s ({pt['ms_queued']:.3g} ms)")
            else:
                cells.append(pt.get("status", "-")[:40])
        rows.append((area, phase, str(causal), str(L), shape, *cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot(result: dict, path: str) -> str:
    panels: dict = {}
    for pt in result["points"]:
        if pt.get("status") != "ok":
            continue
        title = f"{pt['area']} {pt['phase']}{' causal' if pt['causal'] else ''}"
        panels.setdefault(title, {}).setdefault(pt["impl"], []).append((pt["L"], pt["tflops"]))
    return plot_panels(path, panels)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", action="append", required=True, help="implementation (repeat: A, B, ...)")
    ap.add_argument("--out", default="out/compare.json", help="JSON path; the PNG goes next to it")
    ap.add_argument("--lengths", default="", help="comma-separated lengths (default by device)")
    ap.add_argument("--areas", default="sdpa,dsa")
    ap.add_argument("--dtype", default="", help="input dtype (default bfloat16 on CUDA, float32 on CPU)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="the small CPU sizes on any device")
    args = ap.parse_args(argv)
    if len(args.impl) < 2:
        ap.error("give at least two implementations (--impl A --impl B)")
    lengths = tuple(int(x) for x in args.lengths.split(",") if x) or None
    dtype = getattr(torch, args.dtype) if args.dtype else None
    result = run(args.impl, [a for a in args.areas.split(",") if a], lengths, args.reps, dtype, args.quick)
    print(table(result))
    write_json(args.out, result)
    png = plot(result, os.path.splitext(args.out)[0] + ".png")
    print(f"JSON: {args.out}\nplot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
