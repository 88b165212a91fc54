"""The causal launch order: fast's kernels with their heads dealt in sections against one
head's blocks after another, beside cuDNN, in the same run (bf16).

    python -m benchmarks.causal_order [--dims 64,128] [--lengths 1024,4096]
                                      [--sections 0,33554432,134217728] [--rounds 5]
                                      [--json out/causal_order.json]

For each head dim and length (B = 16384 // L, H 32, causal): the inference forward and the step
(forward and backward) of cuDNN and of fast under each ``causal_section`` of ``--sections``
(``fast.sdpa.set_kernel_options``: the bytes of re-read operands a section of heads holds,
its blocks dealt heaviest first across the section; 0: one head's blocks after another, the
order before sections), in alternated rounds (``timing.alternated``) by both timing methods.
Ratios are paired within a round (``timing.paired_ratio``): each fast variant against cuDNN,
and each against the first section given ("x first"). Every fast variant sets its option around
each call, the first one included, so they pay the same host time. Also printed: which kernels
run (at these sizes the forward is the Gluon persistent program at D 64 and 128, whose pairs
of blocks need no sections; the backward is "auto"'s: on the H200 the Triton one at D 64
L 1k, the Gluon one elsewhere), and each variant's largest difference from the first's
output and gradients (equal but for the order of dQ's additions).
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_oracle.fast import sdpa as fast_sdpa
from attention_oracle.fast.kernels.sdpa_common import TRIED_SECTION_BYTES

from .sdpa import fast_forward_kernel, make_inputs
from .timing import alternated, paired_ratio, write_json

TOKENS, HEADS = 16384, 32


def cudnn(q, k, v):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def under_section(section):
    """fast's causal call with ``causal_section`` set around it."""
    def call(q, k, v):
        previous = fast_sdpa.set_kernel_options(causal_section=section)
        try:
            return fast_sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
        finally:
            fast_sdpa.set_kernel_options(**previous)
    return call


def step_of(impl, q, k, v, dout):
    return lambda: torch.autograd.grad(impl(q, k, v), (q, k, v), dout)


def forward_of(impl, q, k, v):
    def run():
        with torch.no_grad():
            return impl(q, k, v)
    return run


def max_diffs(a, b):
    return [(x.float() - y.float()).abs().max().item() for x, y in zip(a, b)]


def bench_point(D, L, sections, rounds):
    B = TOKENS // L
    (q, k, v), dout = make_inputs(B, HEADS, L, D)
    impls = {"cudnn": cudnn, **{f"fast_{s}": under_section(s) for s in sections}}
    names = list(impls)
    first = names[1]
    point = {"B": B, "H": HEADS, "L": L, "D": D, "causal": True,
             "forward_kernel": fast_forward_kernel(q, k, v, True),
             "backward_kernel": ("gluon" if fast_sdpa.gluon_backward_takes(
                 (B, 1, HEADS, L, D), (B, 1, HEADS, L, D), True) else "triton")}
    with torch.no_grad():
        ref_out = impls[first](q, k, v)
    ref_grads = torch.autograd.grad(impls[first](q, k, v), (q, k, v), dout)
    point["max_diff_from_first"] = {}
    for name in names[2:]:
        with torch.no_grad():
            out = impls[name](q, k, v)
        grads = torch.autograd.grad(impls[name](q, k, v), (q, k, v), dout)
        point["max_diff_from_first"][name] = dict(zip(
            ("out", "dq", "dk", "dv"), max_diffs((out, *grads), (ref_out, *ref_grads))))
    flops = 4.0 * B * HEADS * L * L * D * 0.5
    for phase, make, fl in (("fwd", forward_of, flops), ("fwdbwd", step_of, 3.5 * flops)):
        fns = {name: (make(impl, q, k, v, dout) if phase == "fwdbwd" else make(impl, q, k, v))
               for name, impl in impls.items()}
        timed = alternated(fns, rounds)
        row = {}
        for name in names:
            for method in ("queued", "synced"):
                row[f"{name}_{method}_tflops"] = fl / timed[name][method]["ms"] / 1e9
                if name != "cudnn":
                    row[f"{name}_{method}_x_cudnn"] = paired_ratio(timed, name, "cudnn", method)
                    row[f"{name}_{method}_x_first"] = paired_ratio(timed, name, first, method)
        point[phase] = row
    del q, k, v, dout
    torch.cuda.empty_cache()
    return point


def report(point, sections):
    print(f"D {point['D']} L {point['L']} B {point['B']} causal: forward {point['forward_kernel']}, "
          f"backward {point['backward_kernel']}", flush=True)
    for phase in ("fwd", "fwdbwd"):
        r = point[phase]
        print(f"  {phase:6s} cudnn {r['cudnn_queued_tflops']:6.1f} ({r['cudnn_synced_tflops']:6.1f})"
              " TFLOP/s queued (synced)", flush=True)
        for s in sections:
            n = f"fast_{s}"
            print(f"  {phase:6s} section {s:>10}: {r[f'{n}_queued_tflops']:6.1f} "
                  f"({r[f'{n}_synced_tflops']:6.1f})  x cudnn {r[f'{n}_queued_x_cudnn']:.3f} "
                  f"({r[f'{n}_synced_x_cudnn']:.3f})  x first {r[f'{n}_queued_x_first']:.3f} "
                  f"({r[f'{n}_synced_x_first']:.3f})", flush=True)
    for name, diffs in point["max_diff_from_first"].items():
        print(f"  {name} max |diff| from the first: "
              + " ".join(f"{t} {d:.2e}" for t, d in diffs.items()), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--sections", default=",".join(map(str, (0, *TRIED_SECTION_BYTES))),
                    help="causal_section values, bytes (the first is the 'x first' reference)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default="out/causal_order.json")
    a = ap.parse_args(argv)
    sections = [int(s) for s in a.sections.split(",")]
    points = []
    for D in (int(d) for d in a.dims.split(",")):
        for L in (int(n) for n in a.lengths.split(",")):
            points.append(bench_point(D, L, sections, a.rounds))
            report(points[-1], sections)
            write_json(a.json, {"sections": sections, "points": points})


if __name__ == "__main__":
    main()
