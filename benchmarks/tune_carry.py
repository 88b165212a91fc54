"""Whether a Triton SDPA tile tuned on a call of a few heads is kept for a call of many
(docs/FINDINGS.md F95), in one process on a fresh Triton cache.

    python -m benchmarks.tune_carry [--first 2,3,1000] [--then 16,32,1024] [--dim 64]
                                    [--causal 1] [--json PATH]

With ``--first B,H,L``: one forward and backward of fast's Triton kernels at that shape (their
tiles tuned there), then the ``--then`` shape timed; ``--first none``: the ``--then`` shape
alone (tuned there). Prints one JSON line: the ``--then`` forward's and step's TFLOP/s
(``triton.testing.do_bench``; FLOPs 4 and 14 x B H L^2 D, halved causal) and the tiles each
kernel ran at the ``--then`` call, and which ``attention_oracle`` it timed: ``bash
benchmarks/h200.sh tunecarry`` runs both orders on this tree and, from a folder holding an
older tree's ``attention_oracle`` alone (first on the path, this tree's ``benchmarks`` after
it), on BASE's, each on a cache of its own.
Needs CUDA.
"""
import argparse
import json
import os

import torch
import triton

import attention_oracle
from attention_oracle.fast import sdpa as fast_sdpa
from benchmarks.timing import tuned_tiles


def _inputs(B, H, L, D, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=gen)
            .requires_grad_() for _ in range(4)]


def _step(q, k, v, dout, causal):
    out = fast_sdpa.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.autograd.grad(out, (q, k, v), dout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--first", default="2,3,1000")
    ap.add_argument("--then", default="16,32,1024")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    causal, D = bool(args.causal), args.dim
    fast_sdpa.set_forward_backend("triton")
    fast_sdpa.set_backward_backend("triton")
    if args.first != "none":
        B, H, L = map(int, args.first.split(","))
        q, k, v, dout = _inputs(B, H, L, D)
        _step(q, k, v, dout, causal)
        torch.cuda.synchronize()
    B, H, L = map(int, args.then.split(","))
    q, k, v, dout = _inputs(B, H, L, D, seed=1)
    flops = B * H * L * L * D * (0.5 if causal else 1.0)
    with torch.no_grad():
        fwd_ms = triton.testing.do_bench(
            lambda: fast_sdpa.scaled_dot_product_attention(q, k, v, is_causal=causal))
    step_ms = triton.testing.do_bench(lambda: _step(q, k, v, dout, causal))
    row = dict(package=os.path.dirname(os.path.abspath(attention_oracle.__file__)),
               first=args.first, then=args.then, D=D, causal=causal,
               fwd_tflops=4 * flops / fwd_ms * 1e-9, step_tflops=14 * flops / step_ms * 1e-9,
               tiles=tuned_tiles(("fwd", "dkdv", "dq")))
    print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
