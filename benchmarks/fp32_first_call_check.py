"""Re-runs bench_fp32's order of calls (torch's fp32 default timed first, then fast's first call)
and compares fast's first output with torch's and with float64: the check behind docs/FINDINGS.md's
open observation on call 5 (max_diff 0.0).

    python -m benchmarks.fp32_first_call_check
"""
import torch
import torch.nn.functional as F

from .sdpa import fast, make_inputs, max_diff, phase_fn, synced_ms, torch_default
from .timing import queued_ms


def main():
    (q, k, v), dout = make_inputs(2, 16, 2048, 128, seed=4, dtype=torch.float32)
    with torch.no_grad():
        ref = torch_default(q, k, v, False)
        gold = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    for phase in ("fwd", "fwdbwd"):
        fn = phase_fn(phase, torch_default, q, k, v, dout, False)
        queued_ms(fn, rep_ms=20)
        synced_ms(fn, 5)
    with torch.no_grad():
        first = fast(q, k, v, False)
        torch.cuda.synchronize()
        again = fast(q, k, v, False)
    print("first vs torch", max_diff(first, ref), "first vs gold", max_diff(first, gold),
          "again vs gold", max_diff(again, gold), "torch vs gold", max_diff(ref, gold),
          "first is finite", bool(torch.isfinite(first).all()), flush=True)


if __name__ == "__main__":
    main()
