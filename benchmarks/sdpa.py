"""Benchmark the Triton SDPA (fast/sdpa.py) against PyTorch's SDPA backends on one GPU.

    python -m benchmarks.sdpa [--quick] [--out out/bench_sdpa.json] [--lengths 1024,4096]
                              [--dims 64,128] [--heads 32] [--tokens 16384] [--precompile 12]
                              [--budget-s 300]

In one run, on the same bf16 inputs ``[B, H, L, D]`` (B = tokens // L), side by side: fast
(its default forward backend; the JSON's ``fast_forward`` says which kernel it ran, Gluon or
Triton),
cuDNN (``CUDNN_ATTENTION``), FA2 (``FLASH_ATTENTION``) and the default dispatch (timed only
when it picks another backend than cuDNN; the JSON records its choice), causal and not, for
three phases: the inference forward (``no_grad``), the training forward (inputs requiring
grad, the forward alone) and forward+backward. Each is timed two ways (benchmarks.timing):
``queued`` (do_bench: L2 flushed, launches queued) and ``synced`` (CUDA events and a sync
around every call, as a step-by-step loop sees it). FLOPs: forward 4*B*H*L*S*D (halved when
causal), forward+backward 3.5x that. Then the host overhead per call at a tiny shape, fp32
(fast vs torch's fp32 default), rank-3 ``[H, L, D]`` inputs and the backward's peak memory
with a head-major vs a contiguous ``dout``. A PNG next to the JSON plots TFLOP/s against
length. Each point also records the largest difference of fast's outputs and gradients from
cuDNN's (and FA2's from cuDNN's, for scale).

``--precompile N`` first compiles every autotune config of the swept kernel variants in N
parallel processes (they share Triton's file cache), so the timed run only tunes.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_oracle.fast.kernels import sdpa_fwd_gluon
from attention_oracle.fast.sdpa import (
    DQ_MODES,
    FP32_MODES,
    set_backward_backend,
    set_dq_mode,
    set_fp32_mode,
)
from attention_oracle.fast.sdpa import scaled_dot_product_attention as fast_sdpa
from attention_oracle.oracle.sdpa import sdpa_reference

from .timing import alternated, fast_settings, host_us, paired_ratio, plot_panels, queued_ms, tuned_tiles, write_json

N_FORCED_CONFIGS = 4  # the most configs any kernel keeps after pruning (bf16, D <= 128)
N_FORCED_ATOMIC = 8  # the same with the atomic-dQ mode's own dK/dV tiles


def flops(B, H, L, S, D, causal, backward):
    f = 4.0 * B * H * L * S * D * (0.5 if causal else 1.0)
    return f * (3.5 if backward else 1.0)


def bench_ms(fn, rep):
    return queued_ms(fn, rep_ms=rep, warmup_ms=max(5, rep // 4))


def torch_default(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def torch_cudnn(q, k, v, causal):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def torch_flash(q, k, v, causal):
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def fast(q, k, v, causal):
    return fast_sdpa(q, k, v, is_causal=causal)


def _fast_under_dq_mode(name, doc):
    """An impl that calls fast like :func:`fast`; :func:`fwdbwd_fn` runs it, forward and
    backward, under the dQ mode ``ATOMIC_IMPLS`` gives it (forward+backward only: the forward
    is fast's own)."""
    def impl(q, k, v, causal):
        return fast_sdpa(q, k, v, is_causal=causal)
    impl.__name__ = impl.__qualname__ = name
    impl.__doc__ = doc
    return impl


fast_atomic_dq = _fast_under_dq_mode(
    "fast_atomic_dq", 'fast under set_dq_mode("atomic") (its TMA-reduce variant on sm_90)')
fast_atomic_dq_element = _fast_under_dq_mode(
    "fast_atomic_dq_element", "fast_atomic_dq with per-element atomics in place of the TMA reduce")
# impl -> the dQ mode it runs under (attention_oracle.fast.sdpa.set_dq_mode)
ATOMIC_IMPLS = {fast_atomic_dq: "atomic", fast_atomic_dq_element: "atomic_element"}


IMPLS = {"fast": fast, "cudnn": torch_cudnn, "flash": torch_flash}


def atomic_impls():
    return {impl.__name__: impl for impl in ATOMIC_IMPLS}
PHASES = ("fwd", "fwd_train", "fwdbwd")


def make_inputs(B, H, L, D, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, dout = (torch.randn(B, H, L, D, device="cuda", dtype=dtype, generator=g)
                     for _ in range(4))
    return [t.requires_grad_() for t in (q, k, v)], dout


def fwd_fn(impl, q, k, v, causal):
    def run():
        with torch.no_grad():
            return impl(q, k, v, causal)
    return run


def fwd_train_fn(impl, q, k, v, causal):
    def run():
        return impl(q, k, v, causal)
    return run


def fwdbwd_fn(impl, q, k, v, dout, causal):
    if impl in ATOMIC_IMPLS:
        def run():
            previous = set_dq_mode(ATOMIC_IMPLS[impl])
            try:
                out = impl(q, k, v, causal)
                return torch.autograd.grad(out, (q, k, v), dout)
            finally:
                set_dq_mode(previous)
        return run

    def run():
        out = impl(q, k, v, causal)
        return torch.autograd.grad(out, (q, k, v), dout)
    return run


def phase_fn(phase, impl, q, k, v, dout, causal):
    if phase == "fwd":
        return fwd_fn(impl, q, k, v, causal)
    if phase == "fwd_train":
        return fwd_train_fn(impl, q, k, v, causal)
    return fwdbwd_fn(impl, q, k, v, dout, causal)


def max_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


def compare(q, k, v, dout, causal, atomic_dq=False):
    """Largest |fast - cudnn| and |flash - cudnn| (and with ``atomic_dq`` the atomic-dQ mode's)
    for out, dq, dk, dv."""
    res = {}
    outs = {}
    impls = {**IMPLS, **(atomic_impls() if atomic_dq else {})}
    for name, impl in impls.items():
        grads = fwdbwd_fn(impl, q, k, v, dout, causal)()
        with torch.no_grad():
            outs[name] = (impl(q, k, v, causal), *grads)
    for name in [n for n in impls if n != "cudnn"]:
        res[name + "_vs_cudnn"] = {t: max_diff(a, b) for t, a, b in
                                   zip(("out", "dq", "dk", "dv"), outs[name], outs["cudnn"])}
    return res


def fast_forward_kernel(q, k, v, causal):
    """The forward kernel fast's current backend runs for this call: "gluon" (the call went
    through ``sdpa_fwd_gluon.launch``) or "triton"."""
    calls = []
    launch = sdpa_fwd_gluon.launch

    def counted(*args):
        calls.append(1)
        return launch(*args)

    sdpa_fwd_gluon.launch = counted
    try:
        with torch.no_grad():
            fast(q, k, v, causal)
    finally:
        sdpa_fwd_gluon.launch = launch
    return "gluon" if calls else "triton"


def bench_point(B, H, L, D, causal, rep, backward, synced_reps, atomic_dq=False, rounds=3):
    """One (L, D, causal) point: every impl, phase and timing method on the same inputs, the
    impls of a phase in ``rounds`` alternated rounds (``timing.alternated``: times are medians
    over rounds, ratios medians of the ratios within a round); with ``atomic_dq``
    forward+backward also as ``fast_atomic_dq``."""
    (q, k, v), dout = make_inputs(B, H, L, D)
    default = torch._fused_sdp_choice(q, k, v, is_causal=causal)
    point = {"B": B, "H": H, "L": L, "S": L, "D": D, "causal": causal,
             "default_backend": int(default), "default_backend_name": str(SDPBackend(default)),
             "fast_forward": fast_forward_kernel(q, k, v, causal)}
    impls = dict(IMPLS)
    if SDPBackend(default) != SDPBackend.CUDNN_ATTENTION:
        impls["default"] = torch_default
    point["check"] = compare(q, k, v, dout, causal, atomic_dq)
    for phase in PHASES:
        if phase == "fwdbwd" and not backward:
            continue
        fl = flops(B, H, L, L, D, causal, phase == "fwdbwd")
        timed = dict(impls)
        if atomic_dq and phase == "fwdbwd":
            timed.update(atomic_impls())
        res = alternated({name: phase_fn(phase, impl, q, k, v, dout, causal)
                          for name, impl in timed.items()}, rounds, rep, synced_reps)
        for by in res.values():
            for t in by.values():
                t["tflops"] = fl / t["ms"] / 1e9
        for method in ("queued", "synced"):
            for ref in ("cudnn", "flash"):
                res[f"{method}_x_{ref}"] = paired_ratio(res, "fast", ref, method)
            for name in atomic_impls():
                if name in res:
                    res[f"{method}_{name[5:]}_x_cudnn"] = paired_ratio(res, name, "cudnn", method)
        point[phase] = res
    del q, k, v, dout
    torch.cuda.empty_cache()
    return point


def bench_overhead(dtype=torch.bfloat16):
    """Host microseconds per call at a tiny shape (B 1, H 1, L 16, D 64): fast vs torch."""
    (q, k, v), dout = make_inputs(1, 1, 16, 64, seed=3, dtype=dtype)
    rows = {}
    for name, impl in (("fast", fast), ("torch_default", torch_default)):
        rows[name] = {phase: host_us(phase_fn(phase, impl, q, k, v, dout, False))
                      for phase in PHASES}
    rows["fast_over_torch"] = {ph: rows["fast"][ph] / rows["torch_default"][ph] for ph in PHASES}
    return rows


def fp32_errors(impl, q, k, v, dout, causal, gold):
    """max |x - gold| / max |gold| of out, dq, dk, dv (``gold`` from float64 inputs)."""
    got = (impl(q, k, v, causal),) + torch.autograd.grad(impl(q, k, v, causal), (q, k, v), dout)
    return {name: ((x.double() - g).abs().max() / g.abs().max()).item()
            for name, x, g in zip(("out", "dq", "dk", "dv"), got, gold)}


def fp32_gold(q, k, v, dout, causal):
    """out, dq, dk, dv of the suite's float64 oracle (``oracle.sdpa.sdpa_reference``)."""
    gold = sdpa_reference(q.detach(), k.detach(), v.detach(), dout, is_causal=causal)
    return gold["out"], gold["dq"], gold["dk"], gold["dv"]


def bench_fp32(rep, synced_reps, B=2, H=16, L=2048, D=128, modes=FP32_MODES, rounds=3):
    """fp32: fast (each of ``modes``, fast.sdpa.set_fp32_mode) against torch's fp32 default,
    forward and forward+backward, in ``rounds`` alternated rounds (``timing.alternated``;
    ratios are the medians of the ratios within a round); fast's largest difference from
    torch's output per mode, and each one's relative error of out and the gradients against
    float64 (torch's too)."""
    (q, k, v), dout = make_inputs(B, H, L, D, seed=4, dtype=torch.float32)
    rows = []
    for causal in (False, True):
        row = {"B": B, "H": H, "L": L, "D": D, "causal": causal,
               "default_backend": int(torch._fused_sdp_choice(q, k, v, is_causal=causal))}
        gold = fp32_gold(q, k, v, dout, causal)
        row["err64_torch_default"] = fp32_errors(torch_default, q, k, v, dout, causal, gold)
        with torch.no_grad():
            ref = torch_default(q, k, v, causal)
        for mode in modes:
            with fp32_modes(mode):
                with torch.no_grad():
                    row[f"max_diff_out_{mode}"] = max_diff(fast(q, k, v, causal), ref)
                row[f"err64_{mode}"] = fp32_errors(fast, q, k, v, dout, causal, gold)
        for phase in ("fwd", "fwdbwd"):
            fl = flops(B, H, L, L, D, causal, phase == "fwdbwd")
            fns = {"torch_default": phase_fn(phase, torch_default, q, k, v, dout, causal)}
            fns.update({mode: in_fp32_mode(mode, phase_fn(phase, fast, q, k, v, dout, causal))
                        for mode in modes})
            timed = alternated(fns, rounds, rep, synced_reps)
            for name, t in timed.items():
                label = name if name == "torch_default" else f"fast_{name}"
                row[f"{phase}_{label}_tflops"] = fl / t["queued"]["ms"] / 1e9
                row[f"{phase}_{label}_synced_tflops"] = fl / t["synced"]["ms"] / 1e9
            for mode in modes:
                row[f"{phase}_{mode}_ratio"] = paired_ratio(timed, mode, "torch_default", "queued")
                row[f"{phase}_{mode}_synced_ratio"] = paired_ratio(timed, mode, "torch_default",
                                                                   "synced")
        rows.append(row)
    return rows


class fp32_modes:
    """``with fp32_modes("tf32x3+atomic"):`` fast's fp32 mode, dQ mode and backward backend of
    a bench_fp32 mode for the block: MODE, then optionally +DQ (a dQ mode) and +BACKEND ("triton"
    or "gluon": the backward backend); what is not named stays as the process has it."""

    def __init__(self, mode):
        self.fp32, *rest = mode.split("+")
        self.dq = next((x for x in rest if x in DQ_MODES), None)
        self.backend = next((x for x in rest if x in ("triton", "gluon")), None)
        unknown = [x for x in rest if x not in (self.dq, self.backend)]
        if unknown:
            raise ValueError(f"fp32 mode {mode!r}: unknown part(s) {unknown}")

    def __enter__(self):
        self.previous = (set_fp32_mode(self.fp32),
                         None if self.dq is None else set_dq_mode(self.dq),
                         None if self.backend is None else set_backward_backend(self.backend))

    def __exit__(self, *exc):
        set_fp32_mode(self.previous[0])
        if self.previous[1] is not None:
            set_dq_mode(self.previous[1])
        if self.previous[2] is not None:
            set_backward_backend(self.previous[2])


def in_fp32_mode(mode, fn):
    """fn run under :class:`fp32_modes` ``mode`` (the modes' setters cost microseconds a call,
    against milliseconds of fp32 kernels)."""
    def run():
        with fp32_modes(mode):
            return fn()
    return run


def bench_rank3(H, L, D, rep):
    """Fast on [H, L, D] vs torch's own rank-3 call (which backend it takes is recorded)."""
    rows = []
    (q4, k4, v4), dout4 = make_inputs(1, H, L, D, seed=1)
    q, k, v = (t.detach()[0].requires_grad_() for t in (q4, k4, v4))
    dout = dout4[0]
    backend = int(torch._fused_sdp_choice(q, k, v))
    for causal in (False, True):
        row = {"H": H, "L": L, "D": D, "causal": causal, "torch_backend_rank3": backend}
        with torch.no_grad():
            row["max_diff_out"] = max_diff(fast(q, k, v, causal), torch_default(q, k, v, causal))
        for phase, make in (("fwd", False), ("fwdbwd", True)):
            fl = flops(1, H, L, L, D, causal, make)
            for name, impl in (("fast", fast), ("torch_rank3", torch_default)):
                fn = fwdbwd_fn(impl, q, k, v, dout, causal) if make else fwd_fn(impl, q, k, v, causal)
                ms = bench_ms(fn, rep)
                row[f"{phase}_{name}_ms"] = ms
                row[f"{phase}_{name}_tflops"] = fl / ms / 1e9
            row[f"{phase}_speedup"] = row[f"{phase}_torch_rank3_ms"] / row[f"{phase}_fast_ms"]
        rows.append(row)
    return rows


def peak_backward_bytes(impl, q, k, v, dout, causal):
    out = impl(q, k, v, causal)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    grads = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del grads, out
    return peak


def bench_memory(B, H, L, D):
    """Backward peak memory above the forward's state: head-major vs contiguous dout."""
    (q, k, v), dout_c = make_inputs(B, H, L, D, seed=2)
    dout_hm = dout_c.transpose(1, 2).contiguous().transpose(1, 2)  # [B, H, L, D] with L*H strides
    res = {"B": B, "H": H, "L": L, "D": D}
    for name, impl in (("fast", fast), ("cudnn", torch_default)):
        for causal in (False,):
            c = peak_backward_bytes(impl, q, k, v, dout_c, causal)
            hm = peak_backward_bytes(impl, q, k, v, dout_hm, causal)
            res[name] = {"contiguous_dout_peak_bytes": c, "head_major_dout_peak_bytes": hm,
                         "ratio": hm / max(c, 1)}
    return res


# ----------------------------------------------------------------------------- precompile

def _warm_one(D, causal, atomic_dq):
    """Run fast fwd+bwd once on a small shape with the same specialisations as the sweep."""
    (q, k, v), dout = make_inputs(2, 4, 512, D)
    for impl in (fast, *ATOMIC_IMPLS) if atomic_dq else (fast,):
        fwdbwd_fn(impl, q, k, v, dout, causal)()
    torch.cuda.synchronize()


def precompile(dims, causals, jobs, atomic_dq=False):
    t0 = time.time()
    procs, failures = [], 0
    n = N_FORCED_ATOMIC if atomic_dq else N_FORCED_CONFIGS
    tasks = [(D, c, i) for D in dims for c in causals for i in range(n)]
    pending = list(tasks)
    while pending or procs:
        while pending and len(procs) < jobs:
            D, c, i = pending.pop(0)
            env = dict(os.environ, SDPA_FORCE_CONFIG=str(i))
            cmd = [sys.executable, "-m", "benchmarks.sdpa", "--_warm",
                   f"{D},{int(c)},{int(atomic_dq)}"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE))
        time.sleep(0.2)
        for p in list(procs):
            if p.poll() is not None:
                procs.remove(p)
                if p.returncode != 0:
                    failures += 1
                    print("precompile task failed:", p.stderr.read().decode()[-800:], file=sys.stderr)
    print(f"precompiled {len(tasks)} tasks in {time.time() - t0:.1f}s ({failures} failed)", flush=True)
    return {"tasks": len(tasks), "seconds": time.time() - t0, "failures": failures}


# ----------------------------------------------------------------------------- report

def print_fp32(rows, modes):
    """bench_fp32's rows: TFLOP/s queued (synced) and paired ratios to torch (synced in
    parentheses), then each one's errors against float64."""
    for r in rows:
        print(f"fp32 B{r['B']} H{r['H']} L{r['L']} D{r['D']} causal={r['causal']} TFLOP/s queued (synced): torch fwd "
              f"{r['fwd_torch_default_tflops']:.1f} ({r['fwd_torch_default_synced_tflops']:.1f})"
              f" f+b {r['fwdbwd_torch_default_tflops']:.1f} "
              f"({r['fwdbwd_torch_default_synced_tflops']:.1f}); " + "; ".join(
                  f"fast {m} fwd {r[f'fwd_fast_{m}_tflops']:.1f} "
                  f"({r[f'fwd_fast_{m}_synced_tflops']:.1f}, x{r[f'fwd_{m}_ratio']:.2f} "
                  f"(x{r[f'fwd_{m}_synced_ratio']:.2f})) "
                  f"f+b {r[f'fwdbwd_fast_{m}_tflops']:.1f} "
                  f"({r[f'fwdbwd_fast_{m}_synced_tflops']:.1f}, x{r[f'fwdbwd_{m}_ratio']:.2f} "
                  f"(x{r[f'fwdbwd_{m}_synced_ratio']:.2f})) "
                  f"maxdiff {r[f'max_diff_out_{m}']:.1e}" for m in modes),
              flush=True)
        for m in ("torch_default",) + modes:
            print(f"fp32 L{r['L']} D{r['D']} causal={r['causal']} {m} error against float64 (max abs / max |gold|): "
                  + " ".join(f"{x} {e:.2e}" for x, e in r[f"err64_{m}"].items()), flush=True)


def print_table(points):
    head = (f"{'D':>4} {'L':>6} {'causal':>6} {'phase':>9} | {'fast':>6} {'cudnn':>6} {'flash':>6} "
            f"{'x cudnn':>7} {'x flash':>7} | synced: {'fast':>6} {'cudnn':>6} {'x cudnn':>7} "
            f"{'x flash':>7}")
    print(head)
    print("-" * len(head))
    for p in points:
        print(f"fast's forward kernel at this point: {p.get('fast_forward', '?')}")
        for phase in PHASES:
            r = p.get(phase)
            if not r:
                continue
            q, s = "queued", "synced"
            print(f"{p['D']:>4} {p['L']:>6} {str(p['causal']):>6} {phase:>9} | "
                  f"{r['fast'][q]['tflops']:6.0f} {r['cudnn'][q]['tflops']:6.0f} "
                  f"{r['flash'][q]['tflops']:6.0f} {r[q + '_x_cudnn']:7.2f} {r[q + '_x_flash']:7.2f} | "
                  f"        {r['fast'][s]['tflops']:6.0f} {r['cudnn'][s]['tflops']:6.0f} "
                  f"{r[s + '_x_cudnn']:7.2f} {r[s + '_x_flash']:7.2f}", flush=True)
            for name in [n for n in atomic_impls() if n in r]:
                print(f"{name[5:]:>28}: {r[name][q]['tflops']:6.0f} TFLOP/s "
                      f"x cudnn {r[f'{q}_{name[5:]}_x_cudnn']:.2f} | synced "
                      f"{r[name][s]['tflops']:6.0f} x cudnn "
                      f"{r[f'{s}_{name[5:]}_x_cudnn']:.2f}", flush=True)


def plot(points, path):
    """TFLOP/s against L per (D, causal, phase), queued method, plus fast's synced line."""
    panels = {}
    for p in points:
        for phase in ("fwd", "fwdbwd"):
            r = p.get(phase)
            if not r:
                continue
            panel = panels.setdefault(f"D{p['D']} {'causal' if p['causal'] else 'full'} {phase}", {})
            for name in r:
                if isinstance(r[name], dict) and "queued" in r[name]:
                    panel.setdefault(name, []).append((p["L"], r[name]["queued"]["tflops"]))
            panel.setdefault("fast (synced)", []).append((p["L"], r["fast"]["synced"]["tflops"]))
    return plot_panels(path, panels)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bench_sdpa.json")
    ap.add_argument("--quick", action="store_true", help="L = 4096 only")
    ap.add_argument("--lengths", default="4096,1024,2048,8192,16384",
                    help="bf16 sweep lengths, or 'none' to skip the sweep")
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=16384, help="B = tokens // L")
    ap.add_argument("--rep", type=int, default=40, help="do_bench rep (ms)")
    ap.add_argument("--synced-reps", type=int, default=15, help="calls timed one by one")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternated rounds per phase (timing.alternated; 1: each impl once)")
    ap.add_argument("--no-bwd", action="store_true")
    ap.add_argument("--atomic-dq", action="store_true",
                    help="also time forward+backward under fast's atomic-dQ mode")
    ap.add_argument("--no-rank3", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--no-fp32", action="store_true")
    ap.add_argument("--fp32-modes", default=",".join(FP32_MODES),
                    help="fast's fp32 modes bench_fp32 times (comma-separated); MODE+DQ runs "
                         "MODE under the dQ mode DQ (set_dq_mode), e.g. tf32x3+atomic")
    ap.add_argument("--fp32-shapes", default="2,16,2048,128",
                    help="bench_fp32's problems, B,H,L,D each, separated by ';'")
    ap.add_argument("--budget-s", type=float, default=1e9,
                    help="start no new section or point after this many seconds")
    ap.add_argument("--precompile", type=int, default=0, help="parallel compile processes (0: off)")
    ap.add_argument("--_warm", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._warm:
        D, c, a = args._warm.split(",")
        _warm_one(int(D), bool(int(c)), bool(int(a)))
        return
    t0 = time.time()
    dims = [int(x) for x in args.dims.split(",")]
    causals = [bool(int(x)) for x in args.causal.split(",")]
    lengths = ([4096] if args.quick else [] if args.lengths == "none"
               else [int(x) for x in args.lengths.split(",")])
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "cudnn": torch.backends.cudnn.version(),
              "fast_settings": fast_settings(),
              "dtype": "bfloat16", "heads": args.heads, "tokens": args.tokens,
              "rep_ms": args.rep, "synced_reps": args.synced_reps, "rounds": args.rounds,
              "points": []}

    def save():
        result["wall_s"] = time.time() - t0
        write_json(args.out, result)

    def left():
        return time.time() - t0 < args.budget_s

    result["overhead_us"] = bench_overhead()
    print("host us per call (B1 H1 L16 D64 bf16):", json.dumps(result["overhead_us"]), flush=True)
    save()
    if args.precompile:
        result["precompile"] = precompile(dims, causals, args.precompile, args.atomic_dq)
    for L in lengths:
        for D in dims:
            for causal in causals:
                if not left():
                    result["truncated"] = True
                    continue
                B = max(1, args.tokens // L)
                p = bench_point(B, args.heads, L, D, causal, args.rep, not args.no_bwd,
                                args.synced_reps, args.atomic_dq, args.rounds)
                p["elapsed_s"] = time.time() - t0
                result["points"].append(p)
                print_table([p])
                save()
    if result["points"]:
        result["plot"] = plot(result["points"], os.path.splitext(args.out)[0] + ".png")
    if not args.no_fp32 and left():
        modes = tuple(args.fp32_modes.split(","))
        result["fp32"] = [
            row for shape in args.fp32_shapes.split(";") if left()
            for row in bench_fp32(args.rep, args.synced_reps, *map(int, shape.split(",")),
                                  modes=modes, rounds=args.rounds)]
        result["fp32_backward_tiles"] = tuned_tiles()
        save()
        print_fp32(result["fp32"], modes)
    if not args.no_rank3 and left():
        result["rank3"] = bench_rank3(args.heads, 4096, 128, args.rep)
        for r in result["rank3"]:
            print(f"rank3 H={r['H']} L={r['L']} D={r['D']} causal={r['causal']}: fwd x{r['fwd_speedup']:.1f} "
                  f"f+b x{r['fwdbwd_speedup']:.1f} vs torch rank-3 (backend {r['torch_backend_rank3']}),"
                  f" fast fwd {r['fwd_fast_tflops']:.0f} TFLOP/s, maxdiff {r['max_diff_out']:.1e}", flush=True)
        save()
    if not args.no_memory and left():
        result["memory"] = bench_memory(4, args.heads, 4096, 128)
        for name in ("fast", "cudnn"):
            m = result["memory"][name]
            print(f"memory {name}: bwd peak contiguous dout {m['contiguous_dout_peak_bytes'] / 2**20:.1f} MiB, "
                  f"head-major {m['head_major_dout_peak_bytes'] / 2**20:.1f} MiB, ratio {m['ratio']:.4f}")
        save()
    save()
    print(f"wrote {args.out} ({time.time() - t0:.0f}s)")


if __name__ == "__main__":
    main()
