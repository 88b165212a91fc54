"""Index preparation (fast.index.offset_gather_kv_indices) against a device copy of the same
bytes, both timed in the same run under both methods, per kernel variant.

    python -m benchmarks.index_prep [--out out/index_prep.json] [--warps 0,4,8,16] [--reps 50]

Problems: one causal document of T = 4096 and 16384 tokens, top-k 2048, local indices as
benchmarks.dsa draws them (distinct random keys j <= pos, -1 where fewer exist), compacted
(``causal=True, compact=True, return_topk_length=True``). For each ``num_warps`` (0: the
default rule) the fast call and ``dst.copy_(src)`` of the [T, 2048] int32 rows are timed:
``synced`` (CUDA events and a sync around every call, host launch cost included) and
``queued`` (triton do_bench, L2 flushed), and fast / copy is printed for each method. Host
microseconds per call of both at a tiny shape (T 4, top-k 64) close the table. Every variant's
output is checked equal to the default's.
"""
import argparse

import torch

from attention_oracle.fast.index import offset_gather_kv_indices, set_num_warps

from .dsa import causal_local_indices
from .timing import host_us, queued_ms, synced_ms, write_json


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/index_prep.json")
    ap.add_argument("--warps", default="0,4,8,16")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(5)
    res = {}
    lines = []
    for T in (4096, 16384):
        cu = [0, T]
        local = causal_local_indices(cu, cu, gen)
        cu_t = torch.tensor(cu, dtype=torch.int32, device="cuda")
        src, dst = local.clone(), torch.empty_like(local)

        def copy():
            return dst.copy_(src)

        copy_synced, copy_queued = synced_ms(copy, args.reps), queued_ms(copy)
        ref = None
        for w in (int(x) for x in args.warps.split(",")):
            set_num_warps(w or None)

            def fast():
                return offset_gather_kv_indices(local, cu_t, cu_t, causal=True, compact=True,
                                                return_topk_length=True)
            out = fast()
            if ref is None:
                ref = out
            same = bool(torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1]))
            fs, fq = synced_ms(fast, args.reps), queued_ms(fast)
            r = dict(T=T, num_warps=w, fast_synced_us=fs * 1e3, copy_synced_us=copy_synced * 1e3,
                     fast_over_copy_synced=fs / copy_synced, fast_queued_us=fq * 1e3,
                     copy_queued_us=copy_queued * 1e3, fast_over_copy_queued=fq / copy_queued,
                     equal_to_default=same)
            res[f"T{T}_w{w}"] = r
            lines.append(f"T {T:6d} warps {w or 'default':>7}: synced fast {fs * 1e3:7.1f} us / "
                         f"copy {copy_synced * 1e3:6.1f} = {fs / copy_synced:.2f}x; queued "
                         f"{fq * 1e3:7.1f} / {copy_queued * 1e3:6.1f} = {fq / copy_queued:.2f}x"
                         f"{'' if same else '  OUTPUT DIFFERS'}")
        set_num_warps(None)
    tiny = torch.randint(0, 64, (4, 64), device="cuda", dtype=torch.int32, generator=gen)
    cu_q = torch.tensor([0, 4], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, 64], device="cuda", dtype=torch.int32)
    res["host_us_fast_tiny"] = host_us(lambda: offset_gather_kv_indices(
        tiny, cu_q, cu_k, compact=True, return_topk_length=True))
    res["host_us_copy_tiny"] = host_us(lambda: tiny.clone())
    lines.append(f"host per call, tiny: fast {res['host_us_fast_tiny']:.1f} us, copy "
                 f"{res['host_us_copy_tiny']:.1f} us")
    write_json(args.out, res)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
