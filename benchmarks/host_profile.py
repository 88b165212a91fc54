"""Where a tiny fast SDPA call's host time goes, by Python function (cProfile), per backend.

    python -m benchmarks.host_profile [--calls 300] [--top 18] [--backward]

B 1, H 1, L 128, D 64 or 128 (bf16): ``--calls`` calls of fast's forward (no_grad), or of a
forward+backward step with ``--backward``, under the "gluon" backends and the "triton" ones,
each profiled after a warm-up; prints the ``--top`` functions by their own time and the total
per call. cProfile slows Python code more than C calls, so the figures rank the parts; the
host time per call itself is ``benchmarks.sdpa_gluon --host-parts``'s.
"""
import argparse
import cProfile
import io
import pstats

import torch

from attention_oracle.fast import sdpa as fast_sdpa


def _call(x, dout, backward):
    if backward:
        fast_sdpa.scaled_dot_product_attention(x, x, x).backward(dout)
    else:
        with torch.no_grad():
            fast_sdpa.scaled_dot_product_attention(x, x, x)


def profile(backend, D, calls, top, backward):
    """The profile's text for ``calls`` calls under ``backend`` (both directions)."""
    fast_sdpa.set_forward_backend(backend)
    previous = fast_sdpa.set_backward_backend(backend)
    try:
        x = torch.randn(1, 1, 128, D, device="cuda", dtype=torch.bfloat16).requires_grad_()
        dout = torch.ones(1, 1, 128, D, device="cuda", dtype=torch.bfloat16)
        for _ in range(5):
            _call(x, dout, backward)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            _call(x, dout, backward)
        prof.disable()
        torch.cuda.synchronize()
    finally:
        fast_sdpa.set_backward_backend(previous)
        fast_sdpa.set_forward_backend("auto")
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    out.write(f"{backend} D {D} {'step' if backward else 'forward'}: "
              f"{stats.total_tt / calls * 1e6:.1f} us a call under cProfile\n")
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--dims", default="128")
    ap.add_argument("--backward", action="store_true")
    args = ap.parse_args()
    for D in (int(d) for d in args.dims.split(",")):
        for backend in ("gluon", "triton"):
            print(profile(backend, D, args.calls, args.top, args.backward), flush=True)


if __name__ == "__main__":
    main()
