"""Forward-kernel variants of fast SDPA side by side with cuDNN, one config at a time.

    python -m benchmarks.sdpa_fwd_tune [--dims 64,128] [--lengths 4096] [--jobs 14]
                                       [--out out/sdpa_fwd_tune.json]

For bf16 B 4, H 32 and each (D, causal, L), times every (variant, tile config) of the forward
kernel, where a variant is a setting of :func:`attention_oracle.fast.sdpa.set_kernel_options`
(``fold``: one FMA per score exponent; ``base``: without; ``polyN``: fold, and one exponential
of every N on the FMA units, the kernel's EXP2_POLY), and with ``--fwdbwd`` also
forward+backward through the public function (autotuned) per variant,
with both methods of ``benchmarks.timing`` (do_bench with launches queued, and synchronised
per call), beside cuDNN's forward in the same process. Each result's max difference from
cuDNN's output is printed (a broken variant shows). Configs are compiled first in ``--jobs``
processes (Triton's disk cache), then timed in this one.
"""
import argparse
import itertools
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import attention_oracle.fast.sdpa as fsdpa
from attention_oracle.fast.kernels.sdpa_common import bounds_checks

from .timing import queued_ms, synced_ms, tflops, write_json

VARIANTS = {"base": dict(fold=False), "fold": dict(fold=True)}
# kernel constexprs beyond the options: one exponential of every N on the FMA units
EXTRA = {"poly2": dict(EXP2_POLY=2), "poly4": dict(EXP2_POLY=4), "poly8": dict(EXP2_POLY=8)}
VARIANTS.update({name: dict(fold=True) for name in EXTRA})
CONFIGS = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3)]
if os.environ.get("SDPA_TUNE_CONFIGS"):  # e.g. "128,64,8,3;128,128,8,3"
    CONFIGS = [tuple(int(x) for x in c.split(",")) for c in os.environ["SDPA_TUNE_CONFIGS"].split(";")]
B, H = 4, 32


def inputs(L, D, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(3)]


def launcher(q, k, v, causal, variant, config):
    """fn() running fast's forward kernel with one tile config (as ``_launch_fwd`` does)."""
    fsdpa.set_kernel_options(**VARIANTS[variant])
    q5, k5, v5 = (t.unsqueeze(0) for t in (q, k, v))
    Z1, Z2, HQ, L, E = q5.shape
    scale = E ** -0.5
    natural = fsdpa._natural(q.dtype, E)
    kind, key, meta, sizes, grid, ints, factor, tunes = fsdpa._fwd_plan(
        q5.shape, k5.shape, v5.shape, q.dtype, None, causal, natural,
        fsdpa._precision(q.dtype, E), fsdpa.KERNEL_OPTIONS["fold"], fsdpa._section(causal))
    out = torch.empty_like(q5)
    lse = torch.empty(fsdpa._lse_state_shape(q5.shape, q.dtype, E), dtype=torch.float32,
                      device=q.device)
    args = (q5, k5, v5, q5, out, lse, *q5.stride(), *k5.stride(), *v5.stride(), 0, 0, 0, 0, 0,
            *out.stride(), lse.stride(0), *ints, scale * factor, *tunes)
    bm, bn, w, s = config
    checks = bounds_checks({"L": L, "S": k5.shape[3], "E": E, "EV": v5.shape[4], "BLOCK_M": bm,
                            "BLOCK_N": bn, "BLOCK_E": meta["BLOCK_E"],
                            "BLOCK_EV": meta["BLOCK_EV"]})
    jit = fsdpa.sdpa_fwd_kernel.fn.fn
    kw = {**meta, **checks, **EXTRA.get(variant, {}), "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}
    g = (-(-L // bm), Z1 * Z2 * HQ)

    def run():
        jit[g](*args, **kw)
        return out[0]
    return run


def warm(task):
    D, causal, L, variant, i = task
    q, k, v = inputs(L, D)
    try:
        launcher(q, k, v, causal, variant, CONFIGS[i])[0]()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - reported, the sweep goes on
        print(f"warm {task}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)


def precompile(tasks, jobs):
    t0, procs, pending = time.time(), [], list(tasks)
    while pending or procs:
        while pending and len(procs) < jobs:
            t = pending.pop(0)
            cmd = [sys.executable, "-m", "benchmarks.sdpa_fwd_tune", "--_warm", repr(t)]
            procs.append(subprocess.Popen(cmd, env=dict(os.environ)))
        time.sleep(0.2)
        procs = [p for p in procs if p.poll() is None]
    print(f"precompiled {len(tasks)} in {time.time() - t0:.1f} s", flush=True)


def fwdbwd_rows(q, k, v, causal, variants, fwd_flops):
    """Forward+backward TFLOP/s of fast (public function, autotuned) per variant and cuDNN."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)
    fl = 3.5 * fwd_flops  # 2.5x the forward's FLOPs for the backward (5 matmuls to 2)

    def step(fn):
        return lambda: torch.autograd.grad(fn(q, k, v, is_causal=causal), (q, k, v), dout)
    cq = tflops(fl, queued_ms(step(F.scaled_dot_product_attention)))
    cs = tflops(fl, synced_ms(step(F.scaled_dot_product_attention)))
    rows = []
    for variant in variants:
        fsdpa.set_kernel_options(**VARIANTS[variant])
        fn = step(fsdpa.scaled_dot_product_attention)
        fn()
        tq, ts = tflops(fl, queued_ms(fn)), tflops(fl, synced_ms(fn))
        print(f"  fwd+bwd {variant:5s}: {tq:6.1f} / {ts:6.1f}  cudnn {cq:6.1f} / {cs:6.1f}  "
              f"x cudnn {tq / cq:.3f} / {ts / cs:.3f}", flush=True)
        rows.append({"phase": "fwdbwd", "D": q.shape[-1], "causal": causal, "L": q.shape[-2],
                     "variant": variant, "queued": tq, "synced": ts, "cudnn_queued": cq,
                     "cudnn_synced": cs, "x_cudnn_queued": tq / cq, "x_cudnn_synced": ts / cs})
    fsdpa.set_kernel_options(fold=True)
    return rows


def flops(L, D, causal):
    f = 4 * B * H * L * L * D
    return f / 2 if causal else f


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--lengths", default="4096")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--fwdbwd", action="store_true", help="also time forward+backward")
    ap.add_argument("--out", default="out/sdpa_fwd_tune.json")
    ap.add_argument("--_warm", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._warm:
        warm(eval(a._warm))  # noqa: S307 - a tuple this script wrote
        return
    dims = [int(d) for d in a.dims.split(",")]
    lengths = [int(n) for n in a.lengths.split(",")]
    variants = a.variants.split(",")
    problems = list(itertools.product(dims, (False, True), lengths))
    precompile([(D, c, L, v, i) for D, c, L in problems for v in variants
                for i in range(len(CONFIGS))], a.jobs)
    rows = []
    for D, causal, L in problems:
        q, k, v = inputs(L, D)
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def cudnn():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fl = flops(L, D, causal)
        c_q, c_s = tflops(fl, queued_ms(cudnn)), tflops(fl, synced_ms(cudnn))
        print(f"D {D} causal {int(causal)} L {L}: cudnn {c_q:.0f} / {c_s:.0f} TFLOP/s "
              f"(queued / synced)", flush=True)
        for variant, cfg in itertools.product(variants, CONFIGS):
            row = {"D": D, "causal": causal, "L": L, "variant": variant, "config": cfg,
                   "cudnn_queued": c_q, "cudnn_synced": c_s}
            try:
                fn = launcher(q, k, v, causal, variant, cfg)
                err = (fn().float() - ref.float()).abs().max().item()
                tq, ts = tflops(fl, queued_ms(fn)), tflops(fl, synced_ms(fn))
                row.update(max_diff=err, queued=tq, synced=ts,
                           x_cudnn_queued=tq / c_q, x_cudnn_synced=ts / c_s)
                print(f"  {variant:9s} {cfg}: {tq:6.1f} / {ts:6.1f}  x cudnn {tq / c_q:.3f} / "
                      f"{ts / c_s:.3f}  diff {err:.2e}", flush=True)
            except Exception as exc:  # noqa: BLE001 - an unsupported variant is a result too
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                print(f"  {variant:9s} {cfg}: {row['error']}", flush=True)
            rows.append(row)
        if a.fwdbwd:
            rows.extend(fwdbwd_rows(q, k, v, causal, variants, fl))
        write_json(a.out, rows)
    fsdpa.set_kernel_options(fold=True)


if __name__ == "__main__":
    main()
