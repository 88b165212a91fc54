"""Where fast SDPA's backward spends host time inside autograd (CUDA tensors, tiny shapes).

    python -m benchmarks.host_threads [--out out/host_threads.json]

autograd runs the backward of CUDA tensors on its device thread, not the calling thread. This
times, per call, the body of a Python backward (perf_counter inside it) and the whole
``torch.autograd.grad`` call, for backward bodies that do: nothing; four ``torch.empty``;
three launches of a trivial Triton kernel; fast's ``_launch_bwd``; each with autograd's
device threads (the default) and with ``torch.autograd.set_multithreading_enabled(False)``
(the backward on the calling thread). Also the same bodies called on the calling thread
without autograd, and fwd+bwd calls built up from fast's bare launches to its public function
(``stack:*``, the best of three interleaved rounds) beside torch's SDPA.
"""
import argparse
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import attention_oracle.fast.sdpa as fsdpa

from .timing import write_json


@triton.jit
def _touch(X):
    tl.store(X + tl.program_id(0), 1.0)


def bodies():
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(1, 1, 1, 16, 64, device="cuda", dtype=torch.bfloat16,
                                 generator=g) for _ in range(4))
    scale = 64 ** -0.5
    out, stats = fsdpa._launch_fwd(q, k, v, None, False, scale)
    buf = torch.zeros(8, device="cuda")

    def nothing():
        return None

    def empties():
        return [torch.empty(q.shape, dtype=q.dtype, device=q.device) for _ in range(4)]

    def launches():
        for _ in range(3):
            _touch[(1,)](buf)

    def fast_bwd():
        return fsdpa._launch_bwd(dout, q, k, v, None, out, stats, False, scale)
    return {"nothing": nothing, "4_empty": empties, "3_triton_launches": launches,
            "fast_launch_bwd": fast_bwd}, q


def measure(body, x, calls=300, threads=True):
    """(us per autograd.grad call, us per backward body) over ``calls`` calls."""
    inner = [0.0]

    class Node(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, d):
            t0 = time.perf_counter()
            body()
            inner[0] += time.perf_counter() - t0
            return d

    xr = x.detach().clone().requires_grad_()
    d = torch.ones_like(xr)
    with torch.autograd.set_multithreading_enabled(threads):
        for _ in range(10):
            torch.autograd.grad(Node.apply(xr), (xr,), d)
        torch.cuda.synchronize()
        inner[0] = 0.0
        t0 = time.perf_counter()
        for _ in range(calls):
            torch.autograd.grad(Node.apply(xr), (xr,), d)
        torch.cuda.synchronize()
        total = time.perf_counter() - t0
    return total / calls * 1e6, inner[0] / calls * 1e6


def direct(body, calls=300):
    for _ in range(10):
        body()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        body()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


class _Launches(torch.autograd.Function):
    """fast's forward and backward launches on rank-5 tensors, nothing else."""

    @staticmethod
    def forward(ctx, q, k, v):
        out, stats = fsdpa._launch_fwd(q, k, v, None, False, q.shape[-1] ** -0.5)
        ctx.save_for_backward(q, k, v, out, stats)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, stats = ctx.saved_tensors
        return fsdpa._launch_bwd(dout, q, k, v, None, out, stats, False, q.shape[-1] ** -0.5)


def stack():
    """fwd+bwd calls from the bare launches up to the public function (us per call)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, dout = (torch.randn(1, 1, 16, 64, device="cuda", dtype=torch.bfloat16, generator=g)
                     for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    q5, k5, v5 = (t.detach().unsqueeze(0).requires_grad_() for t in (q, k, v))
    d5 = dout.unsqueeze(0)
    geometry = ((1,), 1, 1, (1, 1, 16, 64))
    scale = 64 ** -0.5

    def bare():
        out, stats = fsdpa._launch_fwd(q5, k5, v5, None, False, scale)
        return fsdpa._launch_bwd(d5, q5, k5, v5, None, out, stats, False, scale)

    def launches_node():
        return torch.autograd.grad(_Launches.apply(q5, k5, v5), (q5, k5, v5), d5)

    def eager_node():
        out, _ = fsdpa._EagerSdpa.apply(q, k, v, None, False, scale, geometry)
        return torch.autograd.grad(out, (q, k, v), dout)

    def public():
        return torch.autograd.grad(fsdpa.scaled_dot_product_attention(q, k, v), (q, k, v), dout)

    def torch_sdpa():
        return torch.autograd.grad(F.scaled_dot_product_attention(q, k, v), (q, k, v), dout)
    return {"bare": bare, "launches_node": launches_node, "eager_node": eager_node,
            "public": public, "torch": torch_sdpa}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/host_threads.json")
    args = ap.parse_args()
    fns, x = bodies()
    res = {}
    for rnd in range(2):
        for name, body in fns.items():
            for threads in (True, False):
                tot, inner = measure(body, x, threads=threads)
                tag = "worker" if threads else "caller"
                res[f"{name}:{tag}:grad_us:r{rnd}"] = tot
                res[f"{name}:{tag}:body_us:r{rnd}"] = inner
            res[f"{name}:no_autograd_us:r{rnd}"] = direct(body)
    calls = stack()
    for _ in range(3):
        for name, fn in calls.items():
            for threads in (True, False):
                with torch.autograd.set_multithreading_enabled(threads):
                    us = direct(fn)
                key = f"stack:{name}:{'worker' if threads else 'caller'}"
                res[key] = min(res.get(key, float("inf")), us)
    write_json(args.out, res)
    for name, us in res.items():
        print(f"{name:44s} {us:8.1f}")


if __name__ == "__main__":
    main()
