"""Where the one-launch SDPA backward (``set_kernel_options(fuse_bwd=True)``) stops paying.

    python -m benchmarks.fuse_bwd [--out out/fuse_bwd.json] [--rows 16,64,128,256,512,1024,2048]

bf16, B 1, D 64, S 64 (every key in one dK/dV block, where the fused kernel can run), for
query rows per kv head L x group over ``--rows`` (group 1 and 4): forward + backward through
the public function with the fused backward and with the three launches, both timed in the same
run (synced: a synchronisation per call, host time included; queued: do_bench), and fused /
three launches printed per row count. The fused kernel walks a kv head's query rows in one
program where the dQ kernel spreads them over programs, so past some row count it loses;
``fast.sdpa.FUSE_BWD_MAX_ROWS`` is that limit. The limit is lifted during the run so that every
row count runs fused; the gradients of both paths are compared.
"""
import argparse

import torch

import attention_oracle.fast.sdpa as fsdpa

from .timing import queued_ms, synced_ms, write_json


def step(q, k, v, dout, gqa):
    out = fsdpa.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    return torch.autograd.grad(out, (q, k, v), dout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/fuse_bwd.json")
    ap.add_argument("--rows", default="16,64,128,256,512,1024,2048")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(3)
    limit = fsdpa.FUSE_BWD_MAX_ROWS
    fsdpa.FUSE_BWD_MAX_ROWS = 1 << 30
    res, lines = {}, []
    try:
        for group in (1, 4):
            for rows in (int(r) for r in args.rows.split(",")):
                L, hkv = rows // group, 2
                if L < 1:
                    continue

                def t(*shape):
                    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16,
                                       generator=gen).requires_grad_()
                q, k, v = t(1, hkv * group, L, 64), t(1, hkv, 64, 64), t(1, hkv, 64, 64)
                dout = torch.randn(1, hkv * group, L, 64, device="cuda", dtype=torch.bfloat16,
                                   generator=gen)
                got = {}
                for fuse in (True, False):
                    previous = fsdpa.set_kernel_options(fuse_bwd=fuse)
                    try:
                        grads = step(q, k, v, dout, group > 1)

                        def run():
                            return step(q, k, v, dout, group > 1)
                        got[fuse] = (synced_ms(run, 50), queued_ms(run), grads)
                    finally:
                        fsdpa.set_kernel_options(**previous)
                diff = max(float((a.float() - b.float()).abs().max())
                           for a, b in zip(got[True][2], got[False][2]))
                r = dict(group=group, rows=rows, L=L, fused_synced_us=got[True][0] * 1e3,
                         unfused_synced_us=got[False][0] * 1e3, fused_queued_us=got[True][1] * 1e3,
                         unfused_queued_us=got[False][1] * 1e3, max_grad_diff=diff)
                res[f"g{group}_r{rows}"] = r
                lines.append(f"group {group} rows {rows:5d} (L {L:5d}): synced fused "
                             f"{r['fused_synced_us']:7.1f} / three {r['unfused_synced_us']:7.1f} us = "
                             f"{r['fused_synced_us'] / r['unfused_synced_us']:.2f}; queued "
                             f"{r['fused_queued_us']:7.1f} / {r['unfused_queued_us']:7.1f} = "
                             f"{r['fused_queued_us'] / r['unfused_queued_us']:.2f}; max |dgrad| {diff:.2e}")
    finally:
        fsdpa.FUSE_BWD_MAX_ROWS = limit
    write_json(args.out, res)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
