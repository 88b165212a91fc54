"""The Gluon warp-specialised DSA kernels against the Triton ones, in the same run.

    python -m benchmarks.dsa_gluon [--problems doc_16384,packed_glm_a] [--out out/dsa_gluon.json]
        [--kernel-file NAME=PATH ...] [--rounds N] [--backward] [--prefetch 1,2]

Geometry and layouts of ``benchmarks.dsa`` (H 64, 512 + 64 / 512, top-k 2048, bf16, trainer
layouts, compacted causal rows). Per problem: the forward (no grad) of the Triton backend and
of the Gluon one under each of its tile configs (``dsa_fwd_gluon.CONFIGS``: slots per block x
pairs in flight), timed queued (do_bench) and synced (events and a sync per call), TFLOP/s
over valid slots, each Gluon config's ratio to Triton under both methods; and every run's
outputs against float64 on the first 64 tokens (relative Frobenius error of out; lse max abs
error) so a fast wrong kernel cannot pass unnoticed.

``--kernel-file NAME=PATH`` times another version of the Gluon kernel module in the same run
(for example ``git show REV:attention_oracle/fast/kernels/dsa_fwd_gluon.py > old.py``; same
kernel signature), on the default tile, through the same entry point; ``--rounds`` repeats
every run that many times, interleaved, so that drift shows as spread rather than as a
difference between versions.

``--prefetch 1,2`` also times the default Gluon kernel (forward, or backward with
``--backward``) asking the L2 for the key rows that many slot blocks (pairs in the forward)
ahead of their gather (``PREFETCH`` of the kernel modules; 0, the default, asks nothing).

``--backward`` times the backward instead (autograd.grad of the Gluon forward's output, the
graph kept): the Triton backend and the Gluon one, queued and synced, TFLOP/s over valid slots,
the Gluon / Triton ratio under both methods, dq of the first 64 tokens against float64 and
the key gradients' relative difference between the two backends.
"""
import argparse
import importlib.util
import json
import os

import torch

import attention_oracle.fast.dsa as fdsa
from attention_oracle.fast.kernels import dsa_bwd_gluon, dsa_fwd_gluon

from .dsa import (
    BWD_FLOP,
    FWD_FLOP,
    SCALE,
    fast_forward,
    float64_reference,
    leaves,
    named_problem,
    rel_error,
    tflops,
)
from .timing import fast_settings, queued_ms, synced_ms


def load_kernel(name, path):
    """The launcher of the Gluon kernel module at `path`, imported inside fast.kernels (its
    relative imports resolve there) under a name of its own."""
    spec = importlib.util.spec_from_file_location(
        f"attention_oracle.fast.kernels._dsa_fwd_gluon_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._LAUNCH


def measure(p, reps, variants=(), prefetches=()):
    """One row: Triton, the Gluon kernel under each tile config, each of `variants`
    ((name, launcher) pairs) on the default tile, and the default tile under each of
    `prefetches` (pairs ahead)."""
    xs = [x.detach() for x in leaves(p)]
    gold_out, gold_lse, _ = float64_reference(p, 0, 64)
    row = dict(T=p["T"], S=p["S"], valid_slots=p["valid"])
    flop = FWD_FLOP * p["valid"]
    default_config, own_launch = dsa_fwd_gluon.CONFIG, dsa_fwd_gluon._LAUNCH
    tile = "{}x{}".format(*default_config)
    default_prefetch = dsa_fwd_gluon.PREFETCH
    runs = [("triton", "triton", None, own_launch, 0)] + [
        (f"gluon_{b}x{st}", "gluon", (b, st), own_launch, default_prefetch)
        for b, st in dsa_fwd_gluon.CONFIGS] + [
        (f"{v}_{tile}", "gluon", default_config, launch, default_prefetch)
        for v, launch in variants] + [
        (f"gluon_{tile}_prefetch{n}", "gluon", default_config, own_launch, n) for n in prefetches]
    for name, backend, config, launch, prefetch in runs:
        fdsa.set_forward_backend(backend)
        dsa_fwd_gluon.CONFIG = config or default_config
        dsa_fwd_gluon._LAUNCH = launch
        dsa_fwd_gluon.PREFETCH = prefetch
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
    dsa_fwd_gluon.CONFIG, dsa_fwd_gluon._LAUNCH = default_config, own_launch
    dsa_fwd_gluon.PREFETCH = default_prefetch
    return row


def measure_backward(p, reps, prefetches=()):
    """One row: the Triton backward and the Gluon one on the same forward graph, and the
    Gluon one under each of `prefetches` (blocks ahead)."""
    xs = leaves(p)
    _, _, gold_dq = float64_reference(p, 0, 64)
    row = dict(T=p["T"], S=p["S"], valid_slots=p["valid"])
    flop = BWD_FLOP * p["valid"]
    out = fast_forward(p, xs)
    grads = {}
    previous = fdsa.set_backward_backend("triton")
    default_prefetch = dsa_bwd_gluon.PREFETCH
    runs = [(b, b, default_prefetch) for b in fdsa.BWD_BACKENDS] + [
        (f"gluon_prefetch{n}", "gluon", n) for n in prefetches]
    for name, backend, prefetch in runs:
        fdsa.set_backward_backend(backend)
        dsa_bwd_gluon.PREFETCH = prefetch
        grads[name] = torch.autograd.grad(out, xs, p["dout"], retain_graph=True)

        def fn():
            return torch.autograd.grad(out, xs, p["dout"], retain_graph=True)

        queued, synced = queued_ms(fn, rep_ms=max(40, 10 * reps)), synced_ms(fn, reps)
        row[name] = dict(queued_ms=queued, synced_ms=synced,
                         queued_tflops=tflops(flop, queued), synced_tflops=tflops(flop, synced),
                         dq_rel_err=rel_error(grads[name][0][:64], gold_dq))
    dsa_bwd_gluon.PREFETCH = default_prefetch
    for name in row:
        if not name.startswith("gluon"):
            continue
        for method in ("queued", "synced"):
            row[name][f"over_triton_{method}"] = (row["triton"][f"{method}_ms"]
                                                  / row[name][f"{method}_ms"])
        for i, part in enumerate(("dq_rope", "dkv_latent", "dk_rope")):
            ref = grads["triton"][i + 1].double()
            row[name][f"{part}_vs_triton"] = rel_error(grads[name][i + 1], ref)
    fdsa.set_backward_backend(previous)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", default="doc_16384,packed_glm_a")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default="out/dsa_gluon.json")
    ap.add_argument("--kernel-file", action="append", default=[], metavar="NAME=PATH",
                    help="also time the Gluon kernel module at PATH, named NAME")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--backward", action="store_true", help="time the backward kernels")
    ap.add_argument("--prefetch", default="", help="also time the Gluon kernel with these "
                    "counts of blocks (pairs) of key rows asked of the L2 ahead, e.g. 1,2")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.dsa_gluon needs a CUDA device")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    prefetches = [int(n) for n in filter(None, args.prefetch.split(","))]
    variants = [(v, load_kernel(v, path))
                for v, path in (spec.split("=", 1) for spec in args.kernel_file)]
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                   triton=__import__("triton").__version__, fast_settings=fast_settings())
    for name in filter(None, args.problems.split(",")):
        p = named_problem(name, gen)
        for rnd in range(args.rounds):
            key = name if rnd == 0 else f"{name}_round{rnd}"
            results[key] = (measure_backward(p, args.reps, prefetches) if args.backward
                            else measure(p, args.reps, variants, prefetches))
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
            for run, r in results[key].items():
                if not isinstance(r, dict):
                    continue
                ratio = (f"; / triton {r['over_triton_queued']:.2f} "
                         f"({r['over_triton_synced']:.2f})" if "over_triton_queued" in r else "")
                errs = ", ".join(f"{k} {v:.2e}" for k, v in r.items() if "err" in k or "_vs_" in k)
                print(f"{key} {run}: TFLOP/s queued (synced) {r['queued_tflops']:.1f} "
                      f"({r['synced_tflops']:.1f}){ratio}; {errs}", flush=True)
        del p
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
