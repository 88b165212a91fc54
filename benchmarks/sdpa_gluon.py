"""The Gluon SDPA forward beside the Triton forward and cuDNN (H200, bf16, head dim 128).

    python -m benchmarks.sdpa_gluon [--configs 128,128,2,8 128,64,3,8] [--json PATH]

For each config of the Gluon kernel (BLOCK_M, BLOCK_N, STAGES, num_warps) and each shape
(B*L = 16k tokens, H 32: L 1k, 4k, 16k; causal and not): a correctness line first (max
|gluon - triton| over the whole output, and max error of both against float64 on the first
head), then TFLOP/s of cuDNN, fast-triton and fast-gluon by both timing methods of
:mod:`benchmarks.timing` (``queued_ms``: do_bench; ``synced_ms``: events and a sync per call).
FLOPs: 4*B*H*L*S*D, halved when causal.
"""
import argparse
import json
import math

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_oracle.fast import sdpa as fast_sdpa
from attention_oracle.fast.kernels import sdpa_fwd_gluon
from benchmarks.timing import queued_ms, synced_ms, tflops

SHAPES = [(16, 32, 1024), (4, 32, 4096), (1, 32, 16384)]


def _gold_head(q, k, v, causal):
    """float64 output of batch 0, head 0."""
    q0, k0, v0 = (t[0, 0].double() for t in (q, k, v))
    s = (q0 @ k0.T) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones_like(s, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v0


def _run(backend, q, k, v, causal):
    if backend == "cudnn":
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    fast_sdpa.set_forward_backend(backend)
    return fast_sdpa.scaled_dot_product_attention(q, k, v, is_causal=causal)


def measure(cfg, B, H, L, causal, dtype=torch.bfloat16):
    sdpa_fwd_gluon.CONFIG = cfg
    gen = torch.Generator(device="cuda").manual_seed(L + causal)
    q, k, v = (torch.randn(B, H, L, 128, device="cuda", dtype=dtype, generator=gen)
               for _ in range(3))
    with torch.no_grad():
        outs = {b: _run(b, q, k, v, causal) for b in ("cudnn", "triton", "gluon")}
        gold = _gold_head(q, k, v, causal)
        row = dict(cfg=list(cfg), B=B, H=H, L=L, causal=causal,
                   gluon_vs_triton=(outs["gluon"].float() - outs["triton"].float()).abs().max().item(),
                   **{f"err64_{b}": (o[0, 0].double() - gold).abs().max().item()
                      for b, o in outs.items()})
        flop = 4 * B * H * L * L * 128 / (2 if causal else 1)
        for b in ("cudnn", "triton", "gluon"):
            fn = (lambda b=b: _run(b, q, k, v, causal))
            row[f"{b}_queued"] = tflops(flop, queued_ms(fn))
            row[f"{b}_synced"] = tflops(flop, synced_ms(fn))
    fast_sdpa.set_forward_backend("triton")
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="*", default=["128,128,2,8"])
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    shapes = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    for text in args.configs:
        cfg = tuple(int(x) for x in text.split(","))
        for B, H, L in shapes:
            for causal in (False, True):
                try:
                    row = measure(cfg, B, H, L, causal)
                except Exception as exc:  # report and go on
                    print(f"{cfg} B{B} L{L} causal={causal}: {type(exc).__name__}: "
                          f"{str(exc)[:300]}", flush=True)
                    continue
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("cfg            L      causal  | queued: cudnn triton gluon g/c | synced: cudnn triton "
          "gluon g/c | max|g-t|  err64 t/g")
    for r in rows:
        print(f"{str(tuple(r['cfg'])):14} {r['L']:6} {str(r['causal']):6} | "
              f"{r['cudnn_queued']:5.0f} {r['triton_queued']:5.0f} {r['gluon_queued']:5.0f} "
              f"{r['gluon_queued'] / r['cudnn_queued']:.2f} | "
              f"{r['cudnn_synced']:5.0f} {r['triton_synced']:5.0f} {r['gluon_synced']:5.0f} "
              f"{r['gluon_synced'] / r['cudnn_synced']:.2f} | {r['gluon_vs_triton']:.2e} "
              f"{r['err64_triton']:.1e}/{r['err64_gluon']:.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
