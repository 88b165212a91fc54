"""Benchmark of the Triton DSA kernels (fast/dsa.py, fast/index.py) on one GPU.

    python -m benchmarks.dsa [--quick] [--out out/bench_dsa.json]

Everything is measured in one run, side by side: H=64, latent 512 + rope 64, value 512,
top-k 2048, bf16, trainer layouts (q_rope the 192:256 slice of a [T, 64, 256] buffer, key
rows packed in one [S, 576] buffer, head-major dout).

- tile configurations tried on doc_4096 (``--sweep``); the fastest forward and backward are
  used after;
- forward (inference and training) / backward / step TFLOP/s on doc_4096, doc_16384 (one
  causal document each) and packed_glm_a (FACTS.md), each timed two ways (benchmarks.timing:
  ``queued`` by do_bench, ``synced`` with events and a sync around every call); FLOPs count
  valid slots only: forward 2*H*(Dqk+Dv), backward 2*H*(3*Dqk+2*Dv) per valid slot;
- the NoPE rows (H 64, D 512, top-k 2048; ``nope_rows``): a 16k document whose rows have a
  100%-hole gap region, and 264 documents of 992 tokens (fewer where the device's memory
  holds fewer: ``nope_docs_that_fit``, the row named by its count) at 75.8% holes with a fixed tail,
  each with compaction on and off (the speedup of forward, backward and step);
- host overhead per call at a tiny shape (forward, index preparation);
- a hole sweep (0, 50, 75.8, 100 % holes) with compaction on and off;
- a plain PyTorch gather baseline (bf16 matmuls, fp32 softmax, 512-query chunks);
- index preparation against torch (stable sort + gather) and a device copy of the same bytes;
- peak backward memory with a contiguous and a head-major dout;
- fp32 (``fp32``): the same geometry and layouts in fp32, the fp32 modes of fast.dsa
  ("acc64" at its default configs; "tf32x3" and "bf16x6", the default, with their tile
  candidates swept on doc_4096, forward and backward apart, each checked against float64 on
  32 tokens; "tf32x3_exp2" at tf32x3's fastest pair), then each mode's pair on doc_4096 and
  doc_16384.

``--only fp32`` runs that section alone.

The JSON is rewritten after every section, so a run cut short keeps what it measured;
``--budget-s`` starts no new section after that many seconds. A PNG next to the JSON plots
the TFLOP/s of the sections against the query count.
"""
import argparse
import json
import math
import os
import time

import torch

import attention_oracle.fast.dsa as fdsa
from attention_oracle.fast.index import offset_gather_kv_indices, set_pdl

from .timing import alternated, fast_settings, host_us, paired_ratio, plot_panels, queued_ms, synced_ms

H, DL, DR, TOPK = 64, 512, 64, 2048
DQK, DV = DL + DR, DL
FWD_FLOP = 2 * H * (DQK + DV)
BWD_FLOP = 2 * H * (3 * DQK + 2 * DV)
SCALE = 1.0 / math.sqrt(DQK)
DEVICE = "cuda"  # a CPU dry run of the logic may set "cpu"
PACKED_GLM_A = ([0, 1777, 3532, 5655, 7765, 9888, 11998, 14121, 16231],
                [0, 1777, 58619, 60742, 128665, 130788, 198711, 200834, 268757])
# the named problems' (cu_q, cu_k): one causal document each, and packed_glm_a
GEOMETRY = {"doc_4096": ([0, 4096], [0, 4096]), "doc_16384": ([0, 16384], [0, 16384]),
            "packed_glm_a": PACKED_GLM_A}


# ----------------------------------------------------------------------------- timing

def bench_ms(fn, reps, warmup=1):
    """Median milliseconds of fn() over reps runs (CUDA events)."""
    for _ in range(warmup):
        fn()
    times = []
    if DEVICE != "cuda":
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[len(times) // 2]
    for _ in range(reps):
        start, end = (torch.cuda.Event(enable_timing=True),
                      torch.cuda.Event(enable_timing=True))
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def tflops(flop, ms):
    return flop / (ms * 1e-3) / 1e12 if ms > 0 else float("nan")


# ----------------------------------------------------------------------------- problems

def causal_local_indices(cu_q, cu_k, gen):
    """Per-document local top-k: TOPK distinct random keys j <= pos, -1 where fewer exist."""
    rows = []
    for d in range(len(cu_q) - 1):
        sq, sk = cu_q[d + 1] - cu_q[d], cu_k[d + 1] - cu_k[d]
        if sq == 0:
            continue
        pos = torch.arange(sk - sq, sk, device=DEVICE)[:, None]
        for c0 in range(0, sq, 2048):
            p = pos[c0:c0 + 2048]
            score = torch.rand(p.shape[0], sk, device=DEVICE, generator=gen)
            score = score.masked_fill(torch.arange(sk, device=DEVICE)[None, :] > p, -1.0)
            val, idx = score.topk(min(TOPK, sk), dim=1)
            idx = torch.where(val >= 0, idx, -1).int()
            if idx.shape[1] < TOPK:
                idx = torch.cat([idx, idx.new_full((idx.shape[0], TOPK - idx.shape[1]), -1)], 1)
            rows.append(idx)
    return torch.cat(rows)


def make_problem(name, cu_q, cu_k, gen, causal=True, local=None):
    T, S = cu_q[-1], cu_k[-1]
    qbuf = torch.randn(T, H, 4 * DR, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    kvbuf = torch.randn(S, DQK, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    dout = torch.randn(H, T, DV, device=DEVICE, dtype=torch.bfloat16, generator=gen).transpose(0, 1)
    cu_q_t = torch.tensor(cu_q, dtype=torch.int32, device=DEVICE)
    cu_k_t = torch.tensor(cu_k, dtype=torch.int32, device=DEVICE)
    if local is None:
        local = causal_local_indices(cu_q, cu_k, gen)
    rows, lengths = offset_gather_kv_indices(local, cu_q_t, cu_k_t, causal=causal, compact=True,
                                             return_topk_length=True)
    return dict(name=name, T=T, S=S, causal=causal,
                q_latent=torch.randn(T, H, DL, device=DEVICE, dtype=torch.bfloat16, generator=gen),
                q_rope=qbuf[:, :, 3 * DR:4 * DR], kv_latent=kvbuf[:, :DL], k_rope=kvbuf[:, DL:DQK],
                dout=dout, cu_q=cu_q_t, cu_k=cu_k_t, local=local, rows=rows, lengths=lengths,
                valid=int(lengths.sum()))


def named_problem(name, gen):
    """:func:`make_problem` of one of the named geometries (``GEOMETRY``)."""
    return make_problem(name, *GEOMETRY[name], gen)


def leaves(p):
    return [p[k].detach().requires_grad_(True) for k in ("q_latent", "q_rope", "kv_latent", "k_rope")]


def fast_forward(p, xs, rows=None, lengths=None):
    rows = p["rows"] if rows is None else rows
    lengths = p["lengths"] if lengths is None else lengths
    return fdsa.dsa_sparse_attention(*xs, rows, topk_length=lengths, softmax_scale=SCALE)


def fast_varlen_forward(p, xs):
    return fdsa.dsa_sparse_attention_varlen(*xs, p["local"], p["cu_q"], p["cu_k"],
                                            causal=p["causal"], softmax_scale=SCALE)


def _no_grad(fn):
    def run():
        with torch.no_grad():
            return fn()
    return run


def time_both(fn, reps):
    """(queued ms, synced ms) of fn()."""
    return queued_ms(fn, rep_ms=max(40, 10 * reps)), synced_ms(fn, reps, warmup=1)


def measure_fast(p, reps):
    """Forward (inference, training), backward and step timings of fast on one problem, both
    timing methods; the plain (``*_ms``) fields are the synced ones."""
    xs = leaves(p)
    out = fast_forward(p, xs)
    phases = {"fwd": _no_grad(lambda: fast_forward(p, xs)),
              "fwd_train": lambda: fast_forward(p, xs),
              "bwd": lambda: torch.autograd.grad(out, xs, p["dout"], retain_graph=True),
              "step": lambda: torch.autograd.grad(fast_varlen_forward(p, xs), xs, p["dout"])}
    flop = {"fwd": FWD_FLOP, "fwd_train": FWD_FLOP, "bwd": BWD_FLOP, "step": FWD_FLOP + BWD_FLOP}
    v = p["valid"]
    row = dict(T=p["T"], S=p["S"], valid_slots=v)
    for phase, fn in phases.items():
        queued, synced = time_both(fn, reps)
        row.update({f"{phase}_ms": synced, f"{phase}_tflops": tflops(flop[phase] * v, synced),
                    f"{phase}_queued_ms": queued,
                    f"{phase}_queued_tflops": tflops(flop[phase] * v, queued)})
    return row


# ----------------------------------------------------------------------------- NoPE rows

def nope_gap_local(T, gen):
    """A 16k causal document: slots [0, 512) and [1536, 2047) hold random keys <= pos
    (duplicates possible; -1 in slot columns past pos), slots [512, 1536) are the gap (100%
    holes), slot 2047 the query's own key. Without compaction a row runs to its last slot;
    compacted, to half of it."""
    pos = torch.arange(T, device=DEVICE)[:, None]
    picks = (torch.rand(T, TOPK - 1024, device=DEVICE, generator=gen) * (pos + 1)).long()
    picks = torch.where(torch.arange(TOPK - 1024, device=DEVICE)[None, :] <= pos, picks, -1)
    local = torch.full((T, TOPK), -1, dtype=torch.int32, device=DEVICE)
    local[:, :512] = picks[:, :512].int()
    local[:, 1536:TOPK - 1] = picks[:, 512:TOPK - 1024 - 1].int()
    local[:, TOPK - 1] = pos[:, 0].int()
    return local


def nope_docs_local(n_docs, doc, gen):
    """n_docs causal documents of ``doc`` tokens: slot s names local key s (valid iff s <= pos,
    so 75.8% of 2048 slots are holes for 992-token documents) and slot 2047 the query's own key
    (the fixed tail that keeps a holey row running to its last slot)."""
    pos = torch.arange(doc, device=DEVICE).repeat(n_docs)[:, None]
    local = torch.arange(TOPK, device=DEVICE, dtype=torch.int32)[None, :].repeat(n_docs * doc, 1)
    local[:, TOPK - 1] = pos[:, 0].int()
    return local


def nope_problem(name, cu, local, gen):
    T = cu[-1]
    cu_t = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    q = torch.randn(T, H, DL, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    kv = torch.randn(T, DL, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    dout = torch.randn(T, H, DL, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    layouts = {}
    for compact in (False, True):
        rows, lengths = offset_gather_kv_indices(local, cu_t, cu_t, causal=True, compact=compact,
                                                 return_topk_length=True)
        layouts[compact] = (rows, lengths)
    valid = int(layouts[True][1].sum())
    return dict(name=name, T=T, q=q, kv=kv, dout=dout, layouts=layouts, valid=valid,
                hole_rate=1 - valid / (T * TOPK))


def measure_nope(p, reps):
    """Forward / backward / step of the NoPE global kernel on holey and compacted rows."""
    fwd_flop, bwd_flop = 2 * H * 2 * DL, 2 * H * (3 * DL + 2 * DL)
    q, kv = (p[k].detach().requires_grad_(True) for k in ("q", "kv"))
    row = dict(T=p["T"], valid_slots=p["valid"], hole_rate=p["hole_rate"])
    for compact, (rows, lengths) in p["layouts"].items():
        tag = "compact" if compact else "holey"

        def fwd():
            return fdsa.dsa_sparse_attention_nope(q, kv, rows, topk_length=lengths,
                                                  softmax_scale=1 / math.sqrt(DL))
        out = fwd()
        phases = {"fwd": _no_grad(fwd),
                  "bwd": lambda: torch.autograd.grad(out, (q, kv), p["dout"], retain_graph=True),
                  "step": lambda: torch.autograd.grad(fwd(), (q, kv), p["dout"])}
        flop = {"fwd": fwd_flop, "bwd": bwd_flop, "step": fwd_flop + bwd_flop}
        for phase, fn in phases.items():
            queued, synced = time_both(fn, reps)
            row[f"{phase}_{tag}_ms"] = synced
            row[f"{phase}_{tag}_queued_ms"] = queued
            row[f"{phase}_{tag}_tflops"] = tflops(flop[phase] * p["valid"], synced)
    for phase in ("fwd", "bwd", "step"):
        row[f"{phase}_compaction_speedup"] = row[f"{phase}_holey_ms"] / row[f"{phase}_compact_ms"]
        row[f"{phase}_compaction_speedup_queued"] = (row[f"{phase}_holey_queued_ms"]
                                                     / row[f"{phase}_compact_queued_ms"])
    return row


def nope_docs_that_fit(doc, most=264):
    """Documents of ``doc`` tokens for the many-documents NoPE row: ``most`` (264: 16 GiB per
    [T, H, D] bf16 tensor, about 85 GiB at the peak of measure_nope, so 264 on an H200), fewer
    where the free memory holds fewer (six such tensors per token, with a fifth kept free)."""
    free, _ = torch.cuda.mem_get_info()
    per_doc = 6 * H * DL * 2 * doc
    return max(1, min(most, int(0.8 * free) // per_doc))


def nope_rows(gen, reps):
    out = {}
    p = nope_problem("nope_gap_16384", [0, 16384], nope_gap_local(16384, gen), gen)
    out["nope_gap_16384"] = measure_nope(p, reps)
    del p
    torch.cuda.empty_cache()
    doc = 992
    n = nope_docs_that_fit(doc)
    name = f"nope_{n}x{doc}"
    p = nope_problem(name, [doc * i for i in range(n + 1)], nope_docs_local(n, doc, gen), gen)
    out[name] = measure_nope(p, reps)
    del p
    torch.cuda.empty_cache()
    return out


def host_overhead(gen):
    """Host microseconds per call at a tiny shape (T 4, H 64, top-k 64): forward and index prep."""
    p = make_problem("tiny", [0, 4], [0, 64], gen, causal=False,
                     local=torch.randint(0, 64, (4, 64), device=DEVICE, dtype=torch.int32,
                                         generator=gen))
    xs = leaves(p)
    args = (p["local"], p["cu_q"], p["cu_k"])
    return dict(
        fwd_no_grad_us=host_us(_no_grad(lambda: fast_forward(p, xs))),
        fwd_train_us=host_us(lambda: fast_forward(p, xs)),
        varlen_fwd_no_grad_us=host_us(_no_grad(lambda: fast_varlen_forward(p, xs))),
        index_prep_us=host_us(lambda: offset_gather_kv_indices(*args, compact=True,
                                                               return_topk_length=True)),
        copy_us=host_us(lambda: p["local"].clone()))


def pdl_compare(p, reps):
    """Varlen forward (index preparation, then the forward) with PDL off and on, no_grad."""
    xs = leaves(p)
    fn = _no_grad(lambda: fast_varlen_forward(p, xs))
    row = dict(T=p["T"], valid_slots=p["valid"])
    outs = {}
    for on in (False, True):
        active = set_pdl(on)
        if on:
            row["pdl_active"] = active  # False where Triton lacks the GDC intrinsics
        tag = "pdl" if on else "plain"
        outs[tag] = fn()
        queued, synced = time_both(fn, reps)
        row[f"{tag}_queued_us"], row[f"{tag}_synced_us"] = queued * 1e3, synced * 1e3
        row[f"{tag}_host_us"] = host_us(fn, calls=20, rounds=3)
    set_pdl(False)
    row["same_output"] = bool(torch.equal(outs["plain"], outs["pdl"]))
    row["pdl_speedup_queued"] = row["plain_queued_us"] / row["pdl_queued_us"]
    row["pdl_speedup_synced"] = row["plain_synced_us"] / row["pdl_synced_us"]
    return row


# ----------------------------------------------------------------------------- sections

C = fdsa.KernelConfig  # (block_h, block_k, block_d, block_dv, num_warps, num_stages)
FWD_CANDIDATES = [C(64, 64, 512, 512, 8, 2, split_scores=1), C(64, 64, 512, 512, 8, 2, split_scores=2),
                  C(64, 64, 512, 512, 8, 3), C(64, 64, 512, 512, 8, 2), C(64, 32, 512, 512, 8, 3),
                  C(64, 128, 512, 512, 8, 1), C(64, 64, 512, 512, 16, 3)]
BWD_CANDIDATES = [C(64, 32, 64, 256, 8, 1, True, split_scores=True, halves=True),
                  C(64, 64, 64, 256, 8, 1, True, split_scores=True, halves=True),
                  C(64, 32, 64, 256, 8, 3, True, split_scores=True),
                  C(32, 32, 512, 512, 8, 1, True), C(32, 32, 512, 512, 8, 3, True),
                  C(32, 32, 512, 512, 8, 1), C(32, 32, 512, 512, 8, 3),
                  C(64, 32, 64, 256, 8, 1, True), C(64, 32, 64, 256, 8, 3, True),
                  C(64, 32, 64, 256, 8, 3)]
# not swept: C(64, 32, 512, 512, 8, 1, True) gave wrong dkv and an illegal address on H200


def sweep_configs(p, reps):
    """Times each candidate on p directly through the launchers; returns (table, best pair)."""
    q, qr, kv, kr = (p[k] for k in ("q_latent", "q_rope", "kv_latent", "k_rope"))
    table, best = {"forward": [], "backward": []}, {}
    for cfg in FWD_CANDIDATES:
        try:
            ms = bench_ms(lambda: fdsa._forward(q, qr, kv, kr, p["rows"], p["lengths"], SCALE, cfg), reps)
            table["forward"].append(dict(config=cfg.__dict__, ms=ms, tflops=tflops(FWD_FLOP * p["valid"], ms)))
        except Exception as e:  # a config that does not compile (shared memory) is reported
            table["forward"].append(dict(config=cfg.__dict__, error=repr(e)[:300]))
    out, lse = fdsa._forward(q, qr, kv, kr, p["rows"], p["lengths"], SCALE)
    for cfg in BWD_CANDIDATES:
        try:
            ms = bench_ms(lambda: fdsa._backward(q, qr, kv, kr, p["rows"], p["lengths"], out, lse,
                                                 p["dout"], SCALE, cfg), reps)
            table["backward"].append(dict(config=cfg.__dict__, ms=ms, tflops=tflops(BWD_FLOP * p["valid"], ms)))
        except Exception as e:
            table["backward"].append(dict(config=cfg.__dict__, error=repr(e)[:300]))
    for kind in ("forward", "backward"):
        ok = [r for r in table[kind] if "ms" in r]
        if ok:
            best[kind] = fdsa.KernelConfig(**min(ok, key=lambda r: r["ms"])["config"])
    return table, best


def hole_sweep(gen, reps, T=4096, S=8192):
    """One non-causal document, T queries over S keys, every row TOPK distinct keys."""
    full = torch.rand(T, S, device=DEVICE, generator=gen).topk(TOPK, dim=1).indices.int()
    base = make_problem("holes", [0, T], [0, S], gen, causal=False, local=full)
    xs = leaves(base)
    results = []
    for rate in (0.0, 0.5, 0.758, 1.0):
        holes = torch.rand(T, TOPK, device=DEVICE, generator=gen) < rate
        local = torch.where(holes, -1, full)
        row = dict(hole_rate=rate)
        for compact in (False, True):
            rows, lengths = offset_gather_kv_indices(local, base["cu_q"], base["cu_k"],
                                                     compact=compact, return_topk_length=True)
            ms = bench_ms(lambda: torch.autograd.grad(fast_forward(base, xs, rows, lengths), xs,
                                                      base["dout"]), reps)
            row["step_ms_compact" if compact else "step_ms_holey"] = ms
        results.append(row)
    zero = results[0]["step_ms_holey"]
    for r in results:
        r["compact_over_0pct"] = r["step_ms_compact"] / zero
        r["holey_over_0pct"] = r["step_ms_holey"] / zero
    return results


def torch_gather_attention(p, xs, chunk=512):
    """Plain PyTorch baseline: gather, bf16 matmuls, fp32 softmax, 512 queries at a time."""
    q, qr, kv, kr = xs
    outs = []
    for c0 in range(0, p["T"], chunk):
        rows = p["rows"][c0:c0 + chunk]
        valid = rows >= 0
        r = rows.clamp_min(0).long()
        keys = kv[r]
        s = torch.einsum("chd,ckd->chk", q[c0:c0 + chunk], keys)
        s = s + torch.einsum("chd,ckd->chk", qr[c0:c0 + chunk], kr[r])
        s = (s.float() * SCALE).masked_fill(~valid[:, None, :], float("-inf"))
        prob = torch.softmax(s, -1).nan_to_num(0.0)
        outs.append(torch.einsum("chk,ckd->chd", prob.to(q.dtype), keys))
    return torch.cat(outs)


def baseline(p, reps, with_step):
    xs = leaves(p)
    with torch.no_grad():
        fwd = bench_ms(lambda: torch_gather_attention(p, xs), reps)
    row = dict(fwd_ms=fwd, fwd_tflops=tflops(FWD_FLOP * p["valid"], fwd))
    if with_step:
        torch.cuda.reset_peak_memory_stats()
        step = bench_ms(lambda: torch.autograd.grad(torch_gather_attention(p, xs), xs, p["dout"]),
                        1, warmup=0)
        row.update(step_ms=step, step_tflops=tflops((FWD_FLOP + BWD_FLOP) * p["valid"], step),
                   step_peak_gib=torch.cuda.max_memory_allocated() / 2**30)
    return row


def torch_offset_gather(local, cu_q, cu_k, causal):
    """Index preparation in plain torch: validity, offsets, stable sort to compact, lengths."""
    T, K = local.shape
    tokens = torch.arange(T, device=local.device)
    doc = torch.searchsorted(cu_q[1:].long(), tokens, right=True)
    q0, k0 = cu_q.long()[doc], cu_k.long()[doc]
    seqlen_k = cu_k.long()[doc + 1] - k0
    pos = (seqlen_k - (cu_q.long()[doc + 1] - q0)) + (tokens - q0)
    j = local.long()
    valid = (j >= 0) & (j < seqlen_k[:, None])
    if causal:
        valid &= j <= pos[:, None]
    rows = torch.where(valid, j + k0[:, None], -1)
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
    return torch.gather(rows, 1, order).int(), valid.sum(1).int()


INDEX_SYNCED_CALLS = 50  # per round: a call is tens of microseconds


def index_prep(p, reps):
    """Index preparation against a device copy of the same bytes, the two timed in alternated
    rounds (``timing.alternated``, F85: ratios the medians within a round), and against torch's
    stable sort + gather."""
    args = (p["local"], p["cu_q"], p["cu_k"])

    def fast():
        return offset_gather_kv_indices(*args, causal=True, compact=True, return_topk_length=True)
    src, dst = p["local"].clone(), torch.empty_like(p["local"])
    timed = alternated({"fast": fast, "copy": lambda: dst.copy_(src)}, rounds=3,
                       synced_reps=max(reps, INDEX_SYNCED_CALLS))
    fast_ms, copy_ms = timed["fast"]["synced"]["ms"], timed["copy"]["synced"]["ms"]
    torch_ms = bench_ms(lambda: torch_offset_gather(*args, True), reps)
    a = offset_gather_kv_indices(*args, causal=True, compact=True, return_topk_length=True)
    b = torch_offset_gather(*args, True)
    return dict(T=p["T"], K=TOPK, fast_us=fast_ms * 1e3, torch_sort_us=torch_ms * 1e3,
                copy_us=copy_ms * 1e3,
                fast_over_copy=paired_ratio(timed, "copy", "fast", "synced"),
                fast_queued_us=timed["fast"]["queued"]["ms"] * 1e3,
                copy_queued_us=timed["copy"]["queued"]["ms"] * 1e3,
                fast_over_copy_queued=paired_ratio(timed, "copy", "fast", "queued"),
                torch_over_fast=torch_ms / fast_ms,
                agrees_with_torch=bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])))


def backward_memory(p):
    """Peak memory of the backward above what is live before it, per dout layout."""
    xs = leaves(p)
    out = fast_forward(p, xs)
    res = {}
    for layout, dout in (("contiguous", p["dout"].contiguous()), ("head_major", p["dout"])):
        torch.autograd.grad(out, xs, dout, retain_graph=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        grads = torch.autograd.grad(out, xs, dout, retain_graph=True)
        torch.cuda.synchronize()
        res[layout + "_extra_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
        del grads
    res["dout_mib"] = p["dout"].numel() * 2 / 2**20
    res["head_major_minus_contiguous_mib"] = res["head_major_extra_mib"] - res["contiguous_extra_mib"]
    return res


# ----------------------------------------------------------------------------- fp32

FP32_OLD = C(16, 16, 32, 64, 4, 1)  # before acc64: fp64 score dots, fp32 FMA P.V, dq and dkv
# offline sm_90a spills (python -m attention_oracle.fast.kernels.dsa_probe fwd32|bwd32 ...):
# forward at most 92 B, backward at most 756 B; the last of each list is without acc64 (fp32
# FMA products after the fp64 scores). Measured on the H200 (docs/PERFORMANCE.md "SDPA, fp32"); the sweep now times
# the acc64 defaults only.
FP32_FWD_CANDIDATES = [C(64, 16, 64, 256, 8, 2, acc64=True), C(32, 16, 64, 512, 8, 2, acc64=True),
                       C(32, 16, 64, 512, 8, 2)]
FP32_BWD_CANDIDATES = [C(32, 16, 64, 256, 8, 1, acc64=True), C(32, 16, 64, 128, 8, 2, acc64=True),
                       C(32, 16, 64, 128, 8, 1, acc64=True), C(64, 16, 64, 128, 8, 1, acc64=True),
                       C(32, 16, 64, 128, 8, 1)]
# fp32 "tf32x3" mode (fast.dsa.set_fp32_mode): offline sm_90a, Triton 3.8 (dsa_probe fwdtc|bwdtc),
# every one at 255 registers; spills forward 8-52 B, backward 52-432 B (32 heads: mma.sync).
# The 64-head forward (64, 16, 64, 256, 8, 2) (wgmma) gave relative error 3e32 on the H200
# (Triton 3.6) and was dropped.
TF32X3_FWD_CANDIDATES = [C(32, 16, 64, 512, 8, 2), C(32, 16, 64, 256, 8, 2), C(32, 32, 64, 256, 8, 2),
                         C(32, 32, 64, 256, 8, 3), C(32, 16, 32, 512, 8, 2)]
TF32X3_BWD_CANDIDATES = [C(32, 16, 64, 128, 8, 2), C(32, 16, 64, 128, 8, 1), C(32, 16, 64, 256, 8, 1),
                         C(32, 16, 64, 256, 8, 2), C(32, 16, 64, 128, 8, 1, True),
                         C(16, 16, 64, 256, 4, 1)]
# fp32 "bf16x6" mode (split-bf16 products in scores / P.V and dS / dq launches, one config per
# direction for both of its launches): offline sm_90a, Triton 3.8 (dsa_probe fwdbf|bwdbf), no
# forward spills; backward dS / dkv launch 188-288 B, dq launch 16 B
BF16X6_CANDIDATES = [C(64, 64, 64, 128, 4, 3), C(64, 64, 64, 128, 4, 2), C(64, 64, 32, 128, 4, 3)]
FP32_CHECK_TOKENS = (2000, 2032)  # rows with ~2000 valid slots in doc_4096


def _tag(cfg):
    """'block_h,block_k,block_d,block_dv,warps,stages[ T][ acc64]' of a config or its dict."""
    c = cfg if isinstance(cfg, dict) else cfg.__dict__
    return (",".join(str(c[k]) for k in ("block_h", "block_k", "block_d", "block_dv", "num_warps",
                                         "num_stages"))
            + (" T" if c["dkv_transposed"] else "") + (" acc64" if c["acc64"] else ""))


def fp32_problem(p):
    """p in fp32 with p's layouts: q_rope a slice of a [T, H, 4 Dr] buffer, key rows packed in
    one [S, Dl + Dr] buffer, head-major dout."""
    T, S = p["T"], p["S"]
    qbuf = torch.zeros(T, H, 4 * DR, device=DEVICE, dtype=torch.float32)
    qbuf[:, :, 3 * DR:] = p["q_rope"]
    kvbuf = torch.empty(S, DQK, device=DEVICE, dtype=torch.float32)
    kvbuf[:, :DL], kvbuf[:, DL:] = p["kv_latent"], p["k_rope"]
    dout = torch.empty(H, T, DV, device=DEVICE, dtype=torch.float32).transpose(0, 1)
    dout.copy_(p["dout"])
    return dict(p, q_latent=p["q_latent"].float(), q_rope=qbuf[:, :, 3 * DR:],
                kv_latent=kvbuf[:, :DL], k_rope=kvbuf[:, DL:], dout=dout)


def float64_reference(p, lo, hi):
    """(out, lse, dq_latent) of tokens lo:hi in float64 (gather, softmax, autograd over q
    only)."""
    rows, n = p["rows"][lo:hi].long(), p["lengths"][lo:hi]
    valid = (torch.arange(TOPK, device=DEVICE)[None, :] < n[:, None]) & (rows >= 0)
    rows = torch.where(valid, rows, 0)
    q = p["q_latent"][lo:hi].double().requires_grad_(True)
    kv, kr = p["kv_latent"].double()[rows], p["k_rope"].double()[rows]
    s = (torch.einsum("thd,tkd->thk", q, kv)
         + torch.einsum("thd,tkd->thk", p["q_rope"][lo:hi].double(), kr)) * SCALE
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    out = torch.einsum("thk,tkd->thd", torch.softmax(s, -1), kv)
    (dq,) = torch.autograd.grad(out, q, p["dout"][lo:hi].double())
    return out.detach(), torch.logsumexp(s, -1).detach(), dq


def rel_error(x, ref):
    """Relative Frobenius error of x against the float64 ``ref``."""
    return float((x.double() - ref).norm() / ref.norm())


def _ran_override(kind, p):
    """Whether the last launch of kind (in the current fp32 mode) ran the config put first by
    set_configs."""
    if fdsa._FP32.value == "bf16x6":  # its launches take the override as given (no fallback)
        return fdsa._OVERRIDES[kind] is not None
    key = (kind, str(p["q_latent"].device), torch.float32, fdsa._FP32.value, H, DL, DR)
    return fdsa._FITTING.get(key) == 0


def _time_fp32(fn, reps, budget_s):
    """Timings of fn (already compiled) in a budget: synced median over as many of ``reps`` calls
    as budget_s allows, queued by do_bench where 8 calls fit (its estimate and repeat runs),
    else back to back calls without a sync between (one event pair)."""
    synced_once = synced_ms(fn, 1, warmup=0)  # the sweep compiled every config measured here
    n = max(1, min(reps, int(budget_s * 1e3 / synced_once)))
    synced = synced_ms(fn, n, warmup=0) if n > 1 else synced_once
    if 8 * synced_once <= budget_s * 1e3 or DEVICE != "cuda":
        return queued_ms(fn, rep_ms=max(40, 10 * reps)), synced, "do_bench"
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n, synced, f"back_to_back_{n}"


def measure_fp32(p, fwd_cfg, bwd_cfg, reps, budget_s, phases=("fwd", "bwd", "step"),
                 mode="acc64"):
    """Forward / backward / step of fast in fp32 under these configs and fp32 mode, both
    timing methods."""
    fdsa.set_configs(forward=fwd_cfg, backward=bwd_cfg)
    previous = fdsa.set_fp32_mode(mode)
    try:
        xs = leaves(p)
        out = fast_forward(p, xs)
        fns = {"fwd": _no_grad(lambda: fast_forward(p, xs)),
               "bwd": lambda: torch.autograd.grad(out, xs, p["dout"], retain_graph=True),
               "step": lambda: torch.autograd.grad(fast_varlen_forward(p, xs), xs, p["dout"])}
        flop = {"fwd": FWD_FLOP, "bwd": BWD_FLOP, "step": FWD_FLOP + BWD_FLOP}
        v = p["valid"]
        row = dict(T=p["T"], valid_slots=v, mode=mode, forward=fwd_cfg.__dict__,
                   backward=bwd_cfg.__dict__)
        for phase in phases:
            fns[phase]()  # compiles what the sweep did not (another mode's backward, the step)
            queued, synced, method = _time_fp32(fns[phase], reps, budget_s)
            row.update({f"{phase}_ms": synced, f"{phase}_tflops": tflops(flop[phase] * v, synced),
                        f"{phase}_queued_ms": queued,
                        f"{phase}_queued_tflops": tflops(flop[phase] * v, queued),
                        f"{phase}_queued_method": method})
            print(f"fp32 {mode} T={p['T']} {_tag(fwd_cfg)} / {_tag(bwd_cfg)} {phase}: synced "
                  f"{synced:.2f} ms ({row[phase + '_tflops']:.2f} TFLOP/s), queued {queued:.2f} ms "
                  f"({row[phase + '_queued_tflops']:.2f}, {method})", flush=True)
        row["ran_configs"] = dict(forward=_ran_override("forward", p),
                                  backward=_ran_override("backward", p) if len(phases) > 1 else None)
        return row
    finally:
        fdsa.set_configs()
        fdsa.set_fp32_mode(previous)


def sweep_fp32(p, reps, mode, fwd_cands, bwd_cands):
    """Each candidate in this fp32 mode on doc_4096: synced ms of its kernel alone, and relative
    errors of out (forward) / dq_latent (backward) on FP32_CHECK_TOKENS against float64."""
    q, qr, kv, kr = (p[k] for k in ("q_latent", "q_rope", "kv_latent", "k_rope"))
    lo, hi = FP32_CHECK_TOKENS
    ref_out, _, ref_dq = float64_reference(p, lo, hi)
    table = {"forward": [], "backward": []}
    previous = fdsa.set_fp32_mode(mode)
    try:
        out, lse = fdsa._forward(q, qr, kv, kr, p["rows"], p["lengths"], SCALE)
        for kind, cands in (("forward", fwd_cands), ("backward", bwd_cands)):
            for cfg in cands:
                if kind == "forward":
                    fn = lambda: fdsa._forward(q, qr, kv, kr, p["rows"], p["lengths"], SCALE, cfg)  # noqa: E731
                else:
                    fn = lambda: fdsa._backward(q, qr, kv, kr, p["rows"], p["lengths"], out, lse,  # noqa: E731
                                                p["dout"], SCALE, cfg)
                try:
                    res = fn()
                    ms = synced_ms(fn, reps, warmup=0)
                    err = rel_error(res[0][lo:hi], ref_out if kind == "forward" else ref_dq)
                    flop = (FWD_FLOP if kind == "forward" else BWD_FLOP) * p["valid"]
                    table[kind].append(dict(config=cfg.__dict__, ms=ms, tflops=tflops(flop, ms),
                                            rel_err=err))
                except Exception as e:  # noqa: BLE001  (a config the GPU refuses is reported)
                    table[kind].append(dict(config=cfg.__dict__, error=repr(e)[:300]))
                print(f"fp32 {mode} {kind} {_tag(cfg)}: " + ", ".join(
                    f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in table[kind][-1].items() if k != "config"), flush=True)
    finally:
        fdsa.set_fp32_mode(previous)
    return table


def _fastest(rows, limit=1e-5):
    ok = [r for r in rows if "ms" in r and r["rel_err"] < limit]
    return fdsa.KernelConfig(**min(ok, key=lambda r: r["ms"])["config"]) if ok else None


FP32_SECTION_MODES = ("acc64", "tf32x3", "tf32x3_exp2", "bf16x6")


def fp32_section(p4096, gen, reps, budget_s=3.0, modes=FP32_SECTION_MODES):
    """fp32 "acc64" (its default configs) against "tf32x3" and "bf16x6" (the default mode)
    (candidates swept on doc_4096, then each mode's fastest pair) and "tf32x3_exp2" (tf32x3's
    pair), the modes in ``modes`` only: forward / backward / step on doc_4096 and doc_16384,
    both timing methods."""
    res = {}
    p = fp32_problem(p4096)
    acc64 = {k: fdsa.FP32_CONFIGS[k][0] for k in ("forward", "backward")}
    sweeps = {"acc64": ([acc64["forward"]], [acc64["backward"]]),
              "tf32x3": (TF32X3_FWD_CANDIDATES, TF32X3_BWD_CANDIDATES),
              "bf16x6": (BF16X6_CANDIDATES, BF16X6_CANDIDATES)}
    res["sweep_doc_4096"] = {m: sweep_fp32(p, reps, m, *c) for m, c in sweeps.items()
                             if m in modes or (m == "tf32x3" and "tf32x3_exp2" in modes)}
    pairs = {"acc64": acc64}
    for mode, defaults in (("tf32x3", {k: v[0] for k, v in fdsa.TF32X3_CONFIGS.items()}),
                           ("bf16x6", fdsa.BF16X6_CONFIGS)):
        if mode not in res["sweep_doc_4096"]:
            continue
        best = {k: _fastest(res["sweep_doc_4096"][mode][k]) for k in ("forward", "backward")}
        res[f"chosen_{mode}"] = {k: v.__dict__ if v else None for k, v in best.items()}
        pairs[mode] = {k: best[k] or defaults[k] for k in ("forward", "backward")}
    if "tf32x3" in pairs:
        pairs["tf32x3_exp2"] = pairs["tf32x3"]
    pairs = {m: c for m, c in pairs.items() if m in modes}
    res["doc_4096"] = {m: measure_fp32(p, c["forward"], c["backward"], reps, budget_s, mode=m)
                       for m, c in pairs.items()}
    del p
    torch.cuda.empty_cache()
    p = fp32_problem(named_problem("doc_16384", gen))
    res["doc_16384"] = {m: measure_fp32(p, c["forward"], c["backward"], reps, budget_s, mode=m)
                        for m, c in pairs.items()}
    return res


# ----------------------------------------------------------------------------- driver

def print_table(results):
    print(f"\n{'problem':14s} {'valid':>10s} | TFLOP/s synced: {'fwd':>6s} {'train':>6s} {'bwd':>6s} "
          f"{'step':>6s} | queued: {'fwd':>6s} {'train':>6s} {'bwd':>6s} {'step':>6s}")
    for name, r in results.get("fast", {}).items():
        if "error" in r:
            print(f"{name:14s} error {r['error'][:200]}")
            continue
        print(f"{name:14s} {r['valid_slots']:10d} |                 "
              + " ".join(f"{r[ph + '_tflops']:6.1f}" for ph in ("fwd", "fwd_train", "bwd", "step"))
              + " |         "
              + " ".join(f"{r[ph + '_queued_tflops']:6.1f}" for ph in ("fwd", "fwd_train", "bwd", "step")))
    for name, r in results.get("nope_rows", {}).items():
        if not isinstance(r, dict) or "fwd_compaction_speedup" not in r:
            print(f"nope {name}: {r}")
            continue
        print(f"nope {name}: holes {100 * r['hole_rate']:.1f}%, compaction speedup fwd "
              f"{r['fwd_compaction_speedup']:.2f}x bwd {r['bwd_compaction_speedup']:.2f}x step "
              f"{r['step_compaction_speedup']:.2f}x (queued {r['fwd_compaction_speedup_queued']:.2f}/"
              f"{r['bwd_compaction_speedup_queued']:.2f}/{r['step_compaction_speedup_queued']:.2f}); "
              f"compact fwd {r['fwd_compact_tflops']:.0f} bwd {r['bwd_compact_tflops']:.0f} TFLOP/s")
    for name, r in results.get("pdl", {}).items():
        if "pdl_speedup_queued" in r:
            print(f"pdl {name}: plain {r['plain_synced_us']:.1f} us synced / {r['plain_queued_us']:.1f}"
                  f" queued, pdl {r['pdl_synced_us']:.1f} / {r['pdl_queued_us']:.1f} (x"
                  f"{r['pdl_speedup_synced']:.3f} / x{r['pdl_speedup_queued']:.3f}), same output "
                  f"{r['same_output']}")
        else:
            print(f"pdl {name}: {r}")
    if "host_overhead" in results:
        print("host us per call:", results["host_overhead"])
    for name, r in results.get("torch_gather_baseline", {}).items():
        print(f"torch {name:8s} fwd {r['fwd_ms']:.2f} ms ({r['fwd_tflops']:.1f} TF/s)"
              + (f", step {r['step_ms']:.1f} ms ({r['step_tflops']:.2f} TF/s)" if "step_ms" in r else ""))
    for r in results.get("hole_sweep", []):
        print(f"holes {100 * r['hole_rate']:5.1f}%: holey {r['step_ms_holey']:.3f} ms, compact "
              f"{r['step_ms_compact']:.3f} ms ({r['compact_over_0pct']:.2f}x of 0%)")
    for r in results.get("index_prep", {}).values():
        print(f"index T={r['T']}: fast {r['fast_us']:.1f} us, copy {r['copy_us']:.1f} us "
              f"({r['fast_over_copy']:.2f}x; queued {r['fast_over_copy_queued']:.2f}x), torch "
              f"{r['torch_sort_us']:.1f} us ({r['torch_over_fast']:.1f}x slower)")
    if "backward_memory" in results:
        print("backward memory:", results["backward_memory"])
    fp32 = results.get("fp32", {})
    for mode, table in fp32.get("sweep_doc_4096", {}).items():
        for kind, rows in table.items():
            for r in rows:
                print(f"fp32 sweep {mode:6s} {kind:8s} {_tag(r['config']):26s} "
                      + (f"{r['tflops']:6.2f} TFLOP/s, rel err {r['rel_err']:.1e}" if "ms" in r
                         else r["error"][:120]))
    for name in ("doc_4096", "doc_16384"):
        for which, r in fp32.get(name, {}).items():
            print(f"fp32 {name} {which}: " + ", ".join(
                f"{ph} {r[ph + '_tflops']:.2f} / {r[ph + '_queued_tflops']:.2f}"
                for ph in ("fwd", "bwd", "step") if ph + "_ms" in r) + " TFLOP/s synced / queued")


def plot(results, path):
    """TFLOP/s of fast per problem, against the query count (both timing methods)."""
    panels = {}
    for phase in ("fwd", "fwd_train", "bwd", "step"):
        series = panels.setdefault(f"fast DSA {phase} (H64, 512+64/512, top-k 2048)", {})
        for name, r in results.get("fast", {}).items():
            if "error" in r:
                continue
            kind = "doc" if name.startswith("doc_") else name
            series.setdefault(f"{kind} synced", []).append((r["T"], r[f"{phase}_tflops"]))
            series.setdefault(f"{kind} queued", []).append((r["T"], r[f"{phase}_queued_tflops"]))
    return plot_panels(path, panels, xlabel="queries T")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer reps, a few minutes")
    ap.add_argument("--sweep", action="store_true", help="time the tile configs on doc_4096 first")
    ap.add_argument("--budget-s", type=float, default=1e9,
                    help="start no new section after this many seconds")
    ap.add_argument("--skip", default="", help="comma-separated sections to leave out")
    ap.add_argument("--only", default="", help="comma-separated sections to run, alone")
    ap.add_argument("--fp32-modes", default=",".join(FP32_SECTION_MODES),
                    help="comma-separated fp32 modes the fp32 section measures")
    ap.add_argument("--out", default="out/bench_dsa.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.dsa needs a CUDA device")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    t0 = time.time()
    skip = set(filter(None, args.skip.split(",")))
    only = set(filter(None, args.only.split(",")))
    reps = 3 if args.quick else 10
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    results = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                   triton=__import__("triton").__version__, quick=args.quick,
                   fast_settings=fast_settings(),
                   geometry=dict(H=H, Dl=DL, Dr=DR, Dv=DV, topk=TOPK, dtype="bfloat16"))

    def save(section, value):
        if section in skip or (only and section not in only) or time.time() - t0 > args.budget_s:
            results.setdefault("not_run", []).append(section)
            return
        if callable(value):  # a section that fails is recorded, the run goes on
            try:
                value = value()
            except Exception as e:  # noqa: BLE001
                value = {"error": repr(e)[:500]}
        results[section] = value
        results["wall_s"] = time.time() - t0
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"[{time.strftime('%H:%M:%S')}] {section}: done", flush=True)

    def save_entry(section, name, fn):
        """results[section][name] = fn(), or the error it raised."""
        def run():
            try:
                value = fn()
            except Exception as e:  # noqa: BLE001
                value = {"error": repr(e)[:500]}
            return {**results.get(section, {}), name: value}
        save(section, run)

    save("host_overhead", lambda: host_overhead(gen))
    problems = {"doc_4096": named_problem("doc_4096", gen)}
    if args.sweep:
        table, best = sweep_configs(problems["doc_4096"], reps)
        save("config_sweep", table)
        fdsa.set_configs(forward=best.get("forward"), backward=best.get("backward"))
        save("chosen_configs", {k: v.__dict__ for k, v in best.items()})
    save_entry("fast", "doc_4096", lambda: measure_fast(problems["doc_4096"], reps))
    save_entry("index_prep", "doc_4096", lambda: index_prep(problems["doc_4096"], reps))
    save_entry("pdl", "doc_4096", lambda: pdl_compare(problems["doc_4096"], reps))
    tiny = make_problem("doc_256", [0, 256], [0, 256], gen)
    save_entry("pdl", "doc_256", lambda: pdl_compare(tiny, reps))
    if not only or only & {"fast", "index_prep"}:  # problems only these sections use
        problems["doc_16384"] = named_problem("doc_16384", gen)
        save_entry("fast", "doc_16384", lambda: measure_fast(problems["doc_16384"], reps))
        save_entry("index_prep", "doc_16384", lambda: index_prep(problems["doc_16384"], reps))
        del problems["doc_16384"]
        problems["packed_glm_a"] = named_problem("packed_glm_a", gen)
        save_entry("fast", "packed_glm_a", lambda: measure_fast(problems["packed_glm_a"], reps))
        del problems["packed_glm_a"]
    torch.cuda.empty_cache()
    save("nope_rows", lambda: nope_rows(gen, reps))
    save("hole_sweep", lambda: hole_sweep(gen, reps))
    save("backward_memory", lambda: backward_memory(problems["doc_4096"]))
    save_entry("torch_gather_baseline", "doc_4096",
               lambda: baseline(problems["doc_4096"], reps, with_step=True))
    save("fp32", lambda: fp32_section(problems["doc_4096"], gen, reps,
                                      modes=tuple(filter(None, args.fp32_modes.split(",")))))
    save("plot", lambda: plot(results, os.path.splitext(args.out)[0] + ".png"))
    try:
        print_table(results)
    except Exception as e:  # noqa: BLE001  (a section recorded an error instead of numbers)
        print("table incomplete:", repr(e)[:300])
        print(json.dumps(results, indent=1)[:6000])


if __name__ == "__main__":
    main()
