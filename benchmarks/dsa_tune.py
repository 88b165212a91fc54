"""Tile-config candidates of the fast DSA kernels, measured side by side in one GPU run.

    python -m benchmarks.dsa_tune [--problems doc_16384,packed_glm_a] [--jobs 14]
                                  [--nope] [--out out/dsa_tune.json]

Geometry and layouts as ``benchmarks.dsa`` (bf16, H 64, 512 + 64 / 512, top-k 2048, q_rope a
channel slice, packed [S, 576] keys, head-major dout). For every candidate in ``FORWARD`` /
``BACKWARD`` (the first of each is the current default) and every problem:

- time, both methods of ``benchmarks.timing`` (queued: do_bench; synced: events and a sync
  around each call), through the launchers ``fast.dsa._forward`` / ``_backward`` with the
  config forced (TFLOP/s over valid slots, FLOPs as ``benchmarks.dsa``);
- the largest difference from the current default's outputs on the same inputs (out, lse;
  dq, dq_rope, dkv, dk_rope), relative to the largest magnitude of the default's result;
- the error against a float64 gather on a slice of ``SLICE`` query tokens (the candidate run
  on that sub-problem alone), beside the default's error on the same slice: a candidate
  is ``ok`` when each error is at most 1.25x the default's plus 1/8 bf16 ulp of the
  magnitude.

``--jobs N`` first compiles every candidate in N parallel processes (Triton's file cache is
shared), so the timed part does not compile. ``--nope`` adds ``benchmarks.dsa.nope_rows`` (the
NoPE compaction rows) with the default configs. The JSON is rewritten after every section.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

import attention_oracle.fast.dsa as fdsa

from . import dsa as B
from .timing import queued_ms, synced_ms

C = fdsa.KernelConfig  # block_h, block_k, block_d, block_dv, num_warps, num_stages, dkv_transposed
FORWARD = {  # the forward candidates (their figures: docs/DESIGN.md "11. fast DSA (Triton)")
    "default": None,
    "s7_default": C(64, 64, 512, 512, 8, 2, split_scores=1),
    "one64_s2": C(64, 64, 512, 512, 8, 2),
    "split64_s2": C(64, 64, 512, 512, 8, 2, split_scores=1),
    "split64_s2_m2": C(64, 64, 512, 512, 8, 2, split_scores=2),
    "split64_s1": C(64, 64, 512, 512, 8, 1, split_scores=1),
    "split32_s2": C(64, 32, 512, 512, 8, 2, split_scores=1),
    "split32_s3": C(64, 32, 512, 512, 8, 3, split_scores=1),
    "split64_w16": C(64, 64, 512, 512, 16, 2, split_scores=1),
    "split128_s1": C(64, 128, 512, 512, 8, 1, split_scores=1),
    # (docs/DESIGN.md "11. fast DSA (Triton)", docs/FINDINGS.md F19): no zero-trip loop (wgmma pipelined
    # instead of serialised), 32-bit index math
    "nzt64_s2": C(64, 64, 512, 512, 8, 2, split_scores=1, no_zero_trip=True),
    "nzt64_s2_i32": C(64, 64, 512, 512, 8, 2, split_scores=1, no_zero_trip=True, int32_rows=True),
    "nzt64_s3_i32": C(64, 64, 512, 512, 8, 3, split_scores=1, no_zero_trip=True, int32_rows=True),
    "nzt64_s2_m2_i32": C(64, 64, 512, 512, 8, 2, split_scores=2, no_zero_trip=True,
                         int32_rows=True),
    "nzt32_s2_i32": C(64, 32, 512, 512, 8, 2, split_scores=1, no_zero_trip=True, int32_rows=True),
    "nzt32_s3_i32": C(64, 32, 512, 512, 8, 3, split_scores=1, no_zero_trip=True, int32_rows=True),
    "nzt64_s2_i32_ed": C(64, 64, 512, 512, 8, 2, split_scores=1, no_zero_trip=True,
                         int32_rows=True, even_d=True),
}
BACKWARD = {
    "default": None,
    "chunk256_s3": C(64, 32, 64, 256, 8, 3, True),
    "chunk256_s3_split": C(64, 32, 64, 256, 8, 3, True, split_scores=True),
    "halves_k16_s2": C(64, 16, 64, 256, 8, 2, True, split_scores=True, halves=True),
    "halves_k16_s3": C(64, 16, 64, 256, 8, 3, True, split_scores=True, halves=True),
    "halves_k32_s1": C(64, 32, 64, 256, 8, 1, True, split_scores=True, halves=True),
    "halves_k64_s1": C(64, 64, 64, 256, 8, 1, True, split_scores=True, halves=True),
    # 32-bit index math, adjacent programs of one token, rope gradients in chunk 0 only
    "k64_i32": C(64, 64, 64, 256, 8, 1, True, split_scores=True, halves=True, int32_rows=True),
    "k64_tm": C(64, 64, 64, 256, 8, 1, True, split_scores=True, halves=True, token_major=True),
    "k64_ro": C(64, 64, 64, 256, 8, 1, True, split_scores=True, halves=True, rope_owner=True),
    "k64_tm_ro": C(64, 64, 64, 256, 8, 1, True, split_scores=True, halves=True, token_major=True,
                   rope_owner=True),
    "k64_i32_tm_ro": C(64, 64, 64, 256, 8, 1, True, split_scores=True, halves=True,
                       int32_rows=True, token_major=True, rope_owner=True),
    "k64_i32_ro": C(64, 64, 64, 256, 8, 1, True, split_scores=True, halves=True, int32_rows=True,
                    rope_owner=True),
    "k64_i32_tm_ro_ed": C(64, 64, 64, 256, 8, 1, True, split_scores=True, halves=True,
                          int32_rows=True, token_major=True, rope_owner=True, even_d=True),
}
SLICE = 128  # query tokens of the float64 check
BF16_EPS = 2.0 ** -8


def problem(name, gen):
    if name not in B.GEOMETRY:
        raise SystemExit(f"unknown problem {name}")
    return B.named_problem(name, gen)


def inputs(p, t0=0, t1=None):
    """(q, q_rope, kv, k_rope, rows, lengths, dout) of tokens [t0, t1)."""
    sl = slice(t0, t1)
    return (p["q_latent"][sl], p["q_rope"][sl], p["kv_latent"], p["k_rope"], p["rows"][sl],
            p["lengths"][sl], p["dout"][sl])


def run_forward(x, cfg):
    q, qr, kv, kr, rows, lengths, _ = x
    return fdsa._forward(q, qr, kv, kr, rows, lengths, B.SCALE, cfg)


def run_backward(x, out, lse, cfg):
    q, qr, kv, kr, rows, lengths, dout = x
    return fdsa._backward(q, qr, kv, kr, rows, lengths, out, lse, dout, B.SCALE, cfg)


def gold(x, chunk=32):
    """float64 gather attention and its gradients on a (small) sub-problem."""
    q, qr, kv, kr, rows, lengths, dout = x
    leaves = [t.detach().double().requires_grad_(True) for t in (q, qr, kv, kr)]
    gq, gqr, gkv, gkr = leaves
    K = rows.shape[1]
    valid = (rows >= 0) & (torch.arange(K, device=rows.device)[None, :] < lengths[:, None].long())
    r = torch.where(valid, rows, 0).long()
    outs, lses = [], []
    for c0 in range(0, q.shape[0], chunk):
        c = slice(c0, c0 + chunk)
        keys, kro = gkv[r[c]], gkr[r[c]]
        s = (torch.einsum("thd,tkd->thk", gq[c], keys) + torch.einsum("thd,tkd->thk", gqr[c], kro))
        s = (s * B.SCALE).masked_fill(~valid[c][:, None, :], float("-inf"))
        lse = torch.logsumexp(s, -1)
        p_ = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        outs.append(torch.einsum("thk,tkd->thd", p_, keys))
        lses.append(lse)
    out = torch.cat(outs)
    grads = torch.autograd.grad(out, leaves, dout.double())
    return out.detach(), torch.cat(lses).detach(), grads


def max_rel(a, b):
    """max|a - b| / max|b| (finite parts; inf where the non-finite patterns differ)."""
    a, b = a.double(), b.double()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(fa, fb):
        return float("inf")
    scale = b[fb].abs().max().item() if fb.any() else 1.0
    return ((a[fa] - b[fb]).abs().max().item() / max(scale, 1e-30)) if fa.any() else 0.0


def check_against_gold(x, cfg_f, cfg_b):
    """Relative errors vs float64 on the sub-problem x: out, lse, dq, dq_rope, dkv, dk_rope."""
    g_out, g_lse, g_grads = gold(x)
    out, lse = run_forward(x, cfg_f)
    res = dict(out=max_rel(out, g_out), lse=max_rel(lse, g_lse))
    if cfg_b is not False:
        grads = run_backward(x, out, lse, cfg_b)
        for name, a, b in zip(("dq", "dq_rope", "dkv", "dk_rope"), grads, g_grads):
            res[name] = max_rel(a, b)
    return res


def judge(cand, default):
    """ok iff every error <= 1.25 x the default's + 1/8 bf16 ulp (relative to the magnitude)."""
    return all(cand[k] <= 1.25 * default[k] + BF16_EPS / 8 for k in default)


def time_both(fn, rep_ms, reps):
    return queued_ms(fn, rep_ms=rep_ms), synced_ms(fn, reps, warmup=1)


def measure(p, reps):
    x = inputs(p)
    t_mid = p["T"] // 2
    xs = inputs(p, t_mid, t_mid + SLICE)
    v = p["valid"]
    ref_out, ref_lse = run_forward(x, None)
    ref_grads = run_backward(x, ref_out, ref_lse, None)
    gold_default = check_against_gold(xs, None, None)
    rows = dict(T=p["T"], S=p["S"], valid_slots=v, gold_default=gold_default,
                forward={}, backward={})
    for name, cfg in FORWARD.items():
        try:
            out, lse = run_forward(x, cfg)
            r = dict(diff_out=max_rel(out, ref_out), diff_lse=max_rel(lse, ref_lse))
            r["gold"] = check_against_gold(xs, cfg, False)
            r["ok"] = judge(r["gold"], {k: gold_default[k] for k in ("out", "lse")})
            del out, lse
            qd, sy = time_both(lambda: run_forward(x, cfg), 60, reps)
            r.update(queued_ms=qd, synced_ms=sy, queued_tflops=B.tflops(B.FWD_FLOP * v, qd),
                     synced_tflops=B.tflops(B.FWD_FLOP * v, sy))
        except Exception as e:  # noqa: BLE001  (a config the GPU refuses is recorded)
            r = dict(error=repr(e)[:400])
        rows["forward"][name] = r
        print(f"  fwd {name:14s} {_fmt(r)}", flush=True)
    for name, cfg in BACKWARD.items():
        try:
            grads = run_backward(x, ref_out, ref_lse, cfg)
            r = {f"diff_{n}": max_rel(a, b) for n, a, b in
                 zip(("dq", "dq_rope", "dkv", "dk_rope"), grads, ref_grads)}
            del grads
            g = check_against_gold(xs, None, cfg)
            r["gold"] = g
            r["ok"] = judge(g, gold_default)
            qd, sy = time_both(lambda: run_backward(x, ref_out, ref_lse, cfg), 250, reps)
            r.update(queued_ms=qd, synced_ms=sy, queued_tflops=B.tflops(B.BWD_FLOP * v, qd),
                     synced_tflops=B.tflops(B.BWD_FLOP * v, sy))
        except Exception as e:  # noqa: BLE001
            r = dict(error=repr(e)[:400])
        rows["backward"][name] = r
        print(f"  bwd {name:18s} {_fmt(r)}", flush=True)
    return rows


def _fmt(r):
    if "error" in r:
        return "error " + r["error"][:200]
    diffs = max(v for k, v in r.items() if k.startswith("diff_"))
    return (f"queued {r['queued_tflops']:6.1f} synced {r['synced_tflops']:6.1f} TFLOP/s "
            f"({r['queued_ms']:.2f} / {r['synced_ms']:.2f} ms), max diff vs default {diffs:.2e}, "
            f"ok {r['ok']}")


# ----------------------------------------------------------------------------- precompile

def warm(kind, name):
    """Runs one candidate on small problems with the specialisations of the timed ones (key
    rows a multiple of 16 or not), so its kernels land in Triton's cache."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    if kind == "nope":  # benchmarks.dsa.nope_rows' kernels (no rope, contiguous inputs)
        p = B.nope_problem("warm", [0, 256], B.nope_gap_local(256, gen), gen)
        B.measure_nope(p, 1)
        torch.cuda.synchronize()
        return
    for cu_k in ([0, 256], [0, 16384 + 5]):
        p = B.make_problem("warm", [0, 64], cu_k, gen)
        x = inputs(p)
        cfg_f = FORWARD[name] if kind == "fwd" else None
        out, lse = run_forward(x, cfg_f)
        run_backward(x, out, lse, BACKWARD[name] if kind == "bwd" else None)
    torch.cuda.synchronize()


def precompile(jobs, nope):
    t0 = time.time()
    tasks = [("fwd", n) for n in FORWARD] + [("bwd", n) for n in BACKWARD if n != "default"]
    tasks += [("nope", "default")] if nope else []
    procs, failures = [], {}
    while tasks or procs:
        while tasks and len(procs) < jobs:
            kind, name = tasks.pop(0)
            procs.append(((kind, name), subprocess.Popen(
                [sys.executable, "-m", "benchmarks.dsa_tune", "--_warm", f"{kind}:{name}",
                 "--only", ",".join(list(FORWARD) + list(BACKWARD))],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
        time.sleep(0.2)
        for item in list(procs):
            task, proc = item
            if proc.poll() is not None:
                procs.remove(item)
                if proc.returncode != 0:
                    failures[":".join(task)] = proc.stderr.read().decode()[-600:]
    print(f"precompiled in {time.time() - t0:.1f}s, failures: {list(failures)}", flush=True)
    return dict(seconds=time.time() - t0, failures=failures)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", default="doc_16384,packed_glm_a")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=0, help="parallel precompile processes")
    ap.add_argument("--nope", action="store_true", help="also benchmarks.dsa.nope_rows")
    ap.add_argument("--out", default="out/dsa_tune.json")
    ap.add_argument("--_warm", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--only", default="",
                    help="comma-separated candidate names to keep (defaults always kept)")
    args = ap.parse_args()
    if args.only:
        keep = set(args.only.split(",")) | {"default"}
        for table in (FORWARD, BACKWARD):
            for name in [n for n in table if n not in keep]:
                del table[name]
    if args._warm:
        warm(*args._warm.split(":"))
        return
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.dsa_tune needs a CUDA device")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    results = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                   triton=__import__("triton").__version__,
                   forward_candidates={k: v and v.__dict__ for k, v in FORWARD.items()},
                   backward_candidates={k: v and v.__dict__ for k, v in BACKWARD.items()})

    def save():
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=str)

    if args.jobs:
        results["precompile"] = precompile(args.jobs, args.nope)
        save()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name in filter(None, args.problems.split(",")):
        t0 = time.time()
        print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)
        p = problem(name, gen)
        results[name] = measure(p, args.reps)
        results[name]["seconds"] = time.time() - t0
        del p
        torch.cuda.empty_cache()
        save()
    if args.nope:
        try:
            results["nope_rows"] = B.nope_rows(gen, 3)
        except Exception as e:  # noqa: BLE001
            results["nope_rows"] = dict(error=repr(e)[:500])
        save()
        B.print_table({"nope_rows": results["nope_rows"]})
    print_summary(results)


def print_summary(results):
    for name, r in results.items():
        if not isinstance(r, dict) or "forward" not in r:
            continue
        print(f"\n{name} (T {r['T']}, valid {r['valid_slots']}); gold default {r['gold_default']}")
        for kind in ("forward", "backward"):
            for cand, c in r[kind].items():
                print(f"  {kind[:3]} {cand:18s} {_fmt(c)}")


if __name__ == "__main__":
    main()
