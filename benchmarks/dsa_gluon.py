"""The Gluon warp-specialised DSA forward against the Triton one, in the same run.

    python -m benchmarks.dsa_gluon [--problems doc_16384,packed_glm_a] [--out out/dsa_gluon.json]

Geometry and layouts of ``benchmarks.dsa`` (H 64, 512 + 64 / 512, top-k 2048, bf16, trainer
layouts, compacted causal rows). Per problem: the forward (no grad) of the Triton backend and
of the Gluon one under each of its tile configs (``dsa_fwd_gluon.CONFIGS``: slots per block x
pairs in flight), timed queued (do_bench) and synced (events and a sync per call), TFLOP/s
over valid slots, each Gluon config's ratio to Triton under both methods; and every run's
outputs against float64 on the first 64 tokens (relative Frobenius error of out; lse max abs
error) so a fast wrong kernel cannot pass unnoticed.
"""
import argparse
import json
import os

import torch

import attention_oracle.fast.dsa as fdsa
from attention_oracle.fast.kernels import dsa_fwd_gluon

from .dsa import (
    FWD_FLOP,
    SCALE,
    fast_forward,
    float64_reference,
    leaves,
    named_problem,
    rel_error,
    tflops,
)
from .timing import queued_ms, synced_ms


def measure(p, reps):
    xs = [x.detach() for x in leaves(p)]
    gold_out, gold_lse, _ = float64_reference(p, 0, 64)
    row = dict(T=p["T"], S=p["S"], valid_slots=p["valid"])
    flop = FWD_FLOP * p["valid"]
    runs = [("triton", "triton", None)] + [
        (f"gluon_{b}x{st}", "gluon", (b, st)) for b, st in dsa_fwd_gluon.CONFIGS]
    default_config = dsa_fwd_gluon.CONFIG
    for name, backend, config in runs:
        fdsa.set_forward_backend(backend)
        dsa_fwd_gluon.CONFIG = config or default_config
        with torch.no_grad():
            out, lse = fdsa.dsa_sparse_attention(*xs, p["rows"], topk_length=p["lengths"],
                                                 softmax_scale=SCALE, return_lse=True)

            def fn():
                return fast_forward(p, xs)

            queued, synced = queued_ms(fn, rep_ms=max(40, 10 * reps)), synced_ms(fn, reps)
        err = rel_error(out[:64], gold_out)
        finite = torch.isfinite(gold_lse)
        lse_err = (lse[:64].double() - gold_lse)[finite].abs().max()
        row[name] = dict(queued_ms=queued, synced_ms=synced,
                         queued_tflops=tflops(flop, queued), synced_tflops=tflops(flop, synced),
                         out_rel_err=float(err), lse_max_err=float(lse_err))
        if config is not None:
            for method in ("queued", "synced"):
                row[name][f"over_triton_{method}"] = (row["triton"][f"{method}_ms"]
                                                      / row[name][f"{method}_ms"])
    fdsa.set_forward_backend("gluon")
    dsa_fwd_gluon.CONFIG = default_config
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", default="doc_16384,packed_glm_a")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default="out/dsa_gluon.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.dsa_gluon needs a CUDA device")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                   triton=__import__("triton").__version__)
    for name in filter(None, args.problems.split(",")):
        p = named_problem(name, gen)
        results[name] = measure(p, args.reps)
        del p
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        for run, r in results[name].items():
            if not isinstance(r, dict):
                continue
            ratio = (f"; / triton {r['over_triton_queued']:.2f} ({r['over_triton_synced']:.2f})"
                     if "over_triton_queued" in r else "")
            print(f"{name} {run}: TFLOP/s queued (synced) {r['queued_tflops']:.1f} "
                  f"({r['synced_tflops']:.1f}){ratio}; out rel err {r['out_rel_err']:.2e}, "
                  f"lse err {r['lse_max_err']:.2e}", flush=True)


if __name__ == "__main__":
    main()
