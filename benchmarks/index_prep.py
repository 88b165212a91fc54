"""Index preparation (fast.index.offset_gather_kv_indices) against a device copy of the same
bytes, both timed in the same run under both methods, per kernel variant.

    python -m benchmarks.index_prep [--out out/index_prep.json] [--warps 0,4,8,16] [--reps 50]
                                    [--pipeline 4x3,2x3] [--holes] [--host-parts]

Problems: one causal document of T = 4096 and 16384 tokens, top-k 2048, local indices as
benchmarks.dsa draws them (distinct random keys j <= pos, -1 where fewer exist), compacted
(``causal=True, compact=True, return_topk_length=True``). For each ``num_warps`` (0: the
default rule) and each ``--pipeline`` setting (programs per multiprocessor x the row loop's
``num_stages``, fast.index.set_pipeline; the first is the default's) the fast call and
``dst.copy_(src)`` of the [T, 2048] int32 rows are timed:
``synced`` (CUDA events and a sync around every call, host launch cost included; the host's
own microseconds per call in that loop are printed beside) and
``queued`` (triton do_bench, L2 flushed), and fast / copy is printed for each method (the
median of the ratios within three alternated rounds of the two, ``timing.alternated``); the
validating general path (what a signature's first call takes) is timed synced beside it. Host
microseconds per call of both at a tiny shape (T 4, top-k 64) close the table. Every variant's
output is checked equal to the default's. ``--holes`` adds, per T, the same rows with their
slots shuffled (the -1 spread through each row), which takes the kernel's prefix-sum and
scatter path instead of the in-order store.
"""
import argparse
import time

import torch

from attention_oracle.fast.index import (
    _OFFSET_LAUNCH,
    _general_rows,
    offset_gather_kv_indices,
    set_num_warps,
    set_pipeline,
)

from .dsa import causal_local_indices
from .timing import alternated, host_us, paired_ratio, write_json


def synced_with_host(fn, reps, warmup=2):
    """(median ms, median host us): the ms as timing.synced_ms measures them (CUDA events around
    each call, a sync after each), the us the host's wall time inside fn() before that sync,
    the part of the synced figure the device waits for."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times, host = [], []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        host.append((t1 - t0) * 1e6)
    times.sort()
    host.sort()
    return times[len(times) // 2], host[len(host) // 2]


def host_parts(T=4096, K=2048):
    """Where an index-preparation call's host time goes (one causal document of T tokens, top-k
    K, compacted): the whole call (a repeat: its kept call), the validating general path the
    first call of a signature takes, the signature itself, the validation
    (check_index_inputs), two allocations (torch.empty, and Tensor.new_empty), the bound launch
    alone on kept tensors (fast.launch.BoundLaunch, by tensors and by addresses), the compiled
    kernel's launcher alone with the tensors and with their addresses as ints (no pointer query
    per argument in Triton's C launcher), and a device copy of the rows; microseconds per call,
    the host's time before the sync (the device idle or not)."""
    from attention_oracle.fast.index import _CALLS, _PLANS, _signature
    from attention_oracle.validation import check_index_inputs
    gen = torch.Generator(device="cuda").manual_seed(5)
    cu = [0, T]
    local = causal_local_indices(cu, cu, gen)
    cu_t = torch.tensor(cu, dtype=torch.int32, device="cuda")

    def call():
        return offset_gather_kv_indices(local, cu_t, cu_t, causal=True, compact=True,
                                        return_topk_length=True)
    result, lengths = call()
    call()
    bound = next(plan[0] for key, plan in _PLANS.items()
                 if key[1] == T and plan[0].bound is not None)  # this T's plan
    entry, rest, _, tail, _ = bound.bound
    tensors = (local, cu_t, cu_t, lengths, result, lengths, lengths)
    ptrs = tuple(t.data_ptr() for t in tensors)
    g0, g1, g2 = bound.grid3
    stream = _OFFSET_LAUNCH.stream(_OFFSET_LAUNCH.device_of())
    dst = torch.empty_like(local)
    row = {}
    assert any(sig[0][0] == T for sig in _CALLS), "the repeat call took no kept call"

    for name, fn in (
            ("call", call),
            ("general_path", lambda: _general_rows(local, cu_t, cu_t, True, None, True, None,
                                                   None, None, None)),
            ("signature", lambda: _signature(local, cu_t, cu_t, None, True, True, None, None)),
            ("validation", lambda: check_index_inputs(local, cu_t, cu_t, None, None)),
            ("allocations", lambda: (torch.empty((T, K), dtype=torch.int32, device="cuda"),
                                     torch.empty((T, ), dtype=torch.int32, device="cuda"))),
            ("new_empty", lambda: (local.new_empty((T, K), dtype=torch.int32),
                                   local.new_empty((T, ), dtype=torch.int32))),
            ("bound_launch", lambda: bound.fixed(tensors, rest)),
            ("bound_launch_addresses", lambda: bound.addresses(ptrs, local.get_device(), rest)),
            ("compiled_launcher_tensors", lambda: entry.run(
                g0, g1, g2, stream, entry.function, entry.packed, None, None, None, *tensors,
                *tail)),
            ("compiled_launcher_ints", lambda: entry.run(
                g0, g1, g2, stream, entry.function, entry.packed, None, None, None, *ptrs,
                *tail)),
            ("copy", lambda: dst.copy_(local))):
        issue = {}
        host_us(fn, calls=100, issue=issue)
        row[name] = issue["us"]
    print(f"host us before the sync, T {T}: "
          + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
    return dict(row, T=T, K=K)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/index_prep.json")
    ap.add_argument("--warps", default="0,4,8,16")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--pipeline", default="4x3",
                    help="programs per SM x num_stages settings, comma-separated")
    ap.add_argument("--holes", action="store_true", help="also the rows with shuffled slots")
    ap.add_argument("--host-parts", action="store_true",
                    help="only where a call's host time goes (host_parts), T 4096 and 16384")
    args = ap.parse_args()
    if args.host_parts:
        write_json(args.out, [host_parts(T) for T in (4096, 16384)])
        return
    pipelines = [tuple(int(v) for v in x.split("x")) for x in args.pipeline.split(",")]
    gen = torch.Generator(device="cuda").manual_seed(5)
    res = {}
    lines = []
    problems = [(T, False) for T in (4096, 16384)]
    if args.holes:
        problems += [(T, True) for T in (4096, 16384)]
    for T, holes in problems:
        cu = [0, T]
        local = causal_local_indices(cu, cu, gen)
        if holes:  # the same slots in a random order per row
            order = torch.rand(local.shape, device=local.device, generator=gen).argsort(dim=1)
            local = local.gather(1, order)
        cu_t = torch.tensor(cu, dtype=torch.int32, device="cuda")
        src, dst = local.clone(), torch.empty_like(local)

        def copy():
            return dst.copy_(src)

        _, copy_host = synced_with_host(copy, args.reps)  # the host's us (the ms: below)
        ref = None
        variants = [(w, pipelines[0]) for w in (int(x) for x in args.warps.split(","))]
        variants += [(variants[0][0], p) for p in pipelines[1:]]
        if holes:
            variants = variants[:1]
        for w, (per_sm, stages) in variants:
            set_num_warps(w or None)
            set_pipeline(per_sm, stages)

            def fast():
                return offset_gather_kv_indices(local, cu_t, cu_t, causal=True, compact=True,
                                                return_topk_length=True)
            out = fast()
            if ref is None:
                ref = out
            same = bool(torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1]))
            _, fh = synced_with_host(fast, args.reps)
            # the times and the ratios to the copy from alternated rounds (timing.alternated,
            # F85): medians over rounds, ratios the medians of those within a round
            paired = alternated({"fast": fast, "copy": copy}, rounds=3, synced_reps=args.reps)
            fs, fq = paired["fast"]["synced"]["ms"], paired["fast"]["queued"]["ms"]
            copy_synced, copy_queued = paired["copy"]["synced"]["ms"], paired["copy"]["queued"]["ms"]
            # the validating path a signature's first call takes (the whole call before calls
            # were kept), timed beside it
            (gs, gh) = synced_with_host(lambda: _general_rows(
                local, cu_t, cu_t, True, None, True, None, None, None, None), args.reps)
            name = f"T{T}{'_holes' if holes else ''}_w{w}_p{per_sm}x{stages}"
            r = dict(T=T, holes=holes, num_warps=w, per_sm=per_sm, num_stages=stages,
                     fast_synced_us=fs * 1e3, copy_synced_us=copy_synced * 1e3,
                     fast_over_copy_synced=paired_ratio(paired, "copy", "fast", "synced"),
                     fast_queued_us=fq * 1e3, copy_queued_us=copy_queued * 1e3,
                     fast_over_copy_queued=paired_ratio(paired, "copy", "fast", "queued"),
                     fast_host_us=fh, copy_host_us=copy_host, equal_to_default=same,
                     general_synced_us=gs * 1e3, general_over_copy_synced=gs / copy_synced,
                     general_host_us=gh)
            res[name] = r
            lines.append(f"T {T:6d}{' holes' if holes else '      '} warps {w or 'default':>7} "
                         f"pipe {per_sm}x{stages}: synced fast {fs * 1e3:7.1f} us / "
                         f"copy {copy_synced * 1e3:6.1f} = {r['fast_over_copy_synced']:.2f}x; queued "
                         f"{fq * 1e3:7.1f} / {copy_queued * 1e3:6.1f} = "
                         f"{r['fast_over_copy_queued']:.2f}x (ratios paired); "
                         f"host {fh:5.1f} / {copy_host:4.1f} us; general path synced "
                         f"{gs * 1e3:7.1f} us = {gs / copy_synced:.2f}x, host {gh:5.1f} us"
                         f"{'' if same else '  OUTPUT DIFFERS'}")
        set_num_warps(None)
        set_pipeline()
    tiny = torch.randint(0, 64, (4, 64), device="cuda", dtype=torch.int32, generator=gen)
    cu_q = torch.tensor([0, 4], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, 64], device="cuda", dtype=torch.int32)
    issue = {}
    before = _OFFSET_LAUNCH.direct_launches
    res["host_us_fast_tiny"] = host_us(lambda: offset_gather_kv_indices(
        tiny, cu_q, cu_k, compact=True, return_topk_length=True), issue=issue)
    res["direct_launches_tiny"] = _OFFSET_LAUNCH.direct_launches - before  # of 1 + 5 x 200
    res["host_issue_us_fast_tiny"] = issue["us"]
    res["host_us_copy_tiny"] = host_us(lambda: tiny.clone(), issue=issue)
    res["host_issue_us_copy_tiny"] = issue["us"]
    lines.append(f"host per call, tiny: fast {res['host_us_fast_tiny']:.1f} us (issue "
                 f"{res['host_issue_us_fast_tiny']:.1f}), copy {res['host_us_copy_tiny']:.1f} us "
                 f"(issue {res['host_issue_us_copy_tiny']:.1f}); direct launches "
                 f"{res['direct_launches_tiny']} of 1001 calls")
    write_json(args.out, res)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
