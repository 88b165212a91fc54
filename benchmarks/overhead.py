"""Host overhead per call of fast's entry points at tiny shapes, against torch, with a profile.

    python -m benchmarks.overhead [--out out/overhead.json] [--profile out/overhead_profile.txt]
                                  [--launch-modes direct,triton] [--pairs 15]

Host microseconds per call (benchmarks.timing.host_us: calls queued back to back, one sync)
for fast SDPA (forward no_grad, training forward, forward+backward; B 1, H 1, L 16, D 64,
bf16) beside torch's SDPA, and for fast DSA (forward, varlen forward, index preparation; T 4,
H 64, 512 + 64 / 512, top-k 64). With ``--profile``, cProfile's top functions (by own time)
of each fast entry point over 300 calls, to see where the host time goes (``sdpa_part_*``:
pieces of fast's calls timed alone, :func:`sdpa_parts`). ``--launch-modes``
measures fast once per launch mode of ``attention_oracle.fast.launch`` (``direct``: the compiled
kernels' own launchers; ``triton``: ``kernel[grid](...)``), in this order, in one process; keys
of every mode but the first carry its name (``sdpa_fast_fwd@triton``). ``--pairs N`` then times fast and torch in turn N times per SDPA
phase (200 calls each, one round; each first in every other pair: ``timing.paired_host_ratios``),
so that both see the same drift of the host, and reports the median of the N ratios fast /
torch with their range (``sdpa_pairs_<phase>``).
"""
import argparse
import cProfile
import io
import pstats

import torch
import torch.nn.functional as F

import attention_oracle.fast.dsa as fdsa
import attention_oracle.fast.sdpa as fsdpa
from attention_oracle.fast.index import offset_gather_kv_indices
from attention_oracle.fast.launch import set_launch_mode
from attention_oracle.fast.sdpa import scaled_dot_product_attention as fast_sdpa
from attention_oracle.validation import FLOAT_DTYPES, check_sdpa_inputs

from .timing import host_us, paired_host_ratios, write_json


def sdpa_calls():
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(1, 1, 16, 64, device="cuda", dtype=torch.bfloat16, generator=g)
                     for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    calls = {}
    for name, fn in (("fast", fast_sdpa), ("torch", F.scaled_dot_product_attention)):
        def fwd(fn=fn):
            with torch.no_grad():
                return fn(q, k, v)

        def fwd_train(fn=fn):
            return fn(q, k, v)

        def fwdbwd(fn=fn):
            return torch.autograd.grad(fn(q, k, v), (q, k, v), dout)
        calls.update({f"sdpa_{name}_fwd": fwd, f"sdpa_{name}_fwd_train": fwd_train,
                      f"sdpa_{name}_fwdbwd": fwdbwd})
    return {**calls, **sdpa_parts(q, k, v, dout)}


class _Noop(torch.autograd.Function):
    """A Python autograd node doing no work: the engine's and the Function's own cost."""

    @staticmethod
    def forward(ctx, q, k, v):
        return q.view_as(q)

    @staticmethod
    def backward(ctx, dout):
        return dout, dout, dout


class _Alloc(torch.autograd.Function):
    """A Python autograd node whose backward allocates four tensors, as fast's does."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return q.view_as(q)

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        out = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v, q)]
        return out[0], out[1], out[2]


def sdpa_parts(q, k, v, dout):
    """Pieces of fast's forward+backward timed alone (``sdpa_part_*``), to see where its host
    time goes: the kernels' launches without autograd or validation, the input checks, an
    autograd round trip through a Python Function that does nothing, four allocations."""
    q5, k5, v5, d5 = (t.detach().unsqueeze(0) for t in (q, k, v, dout))
    scale = q.shape[-1] ** -0.5

    def launches():
        out, stats = fsdpa._launch_fwd(q5, k5, v5, None, False, scale)
        return fsdpa._launch_bwd(d5, q5, k5, v5, None, out, stats, False, scale)

    def launches_fwd():
        return fsdpa._launch_fwd(q5, k5, v5, None, False, scale)

    def checks():
        return check_sdpa_inputs(q, k, v, None, 0.0, False, None, False, dtypes=FLOAT_DTYPES)

    def noop_fwdbwd():
        return torch.autograd.grad(_Noop.apply(q, k, v), (q, k, v), dout)

    def empties():
        return [torch.empty(q5.shape, dtype=q.dtype, device=q.device) for _ in range(4)]

    def three_empties():  # dq, dk, dv apart
        return [torch.empty(q5.shape, dtype=q.dtype, device=q.device) for _ in range(3)]

    stacked = (3,) + tuple(q5.shape)

    def empty_unbind():  # dq, dk, dv as one allocation, unbound (the call plan's, equal shapes)
        return torch.empty(stacked, dtype=q.dtype, device=q.device).unbind(0)

    def apply_python():  # a Python Function's apply (Function.apply's own steps)
        return _Noop.apply(q, k, v)

    c_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _Noop)

    def apply_c():  # the same through the C apply Function.apply ends in
        return c_apply(q, k, v)

    def views_noop_fwdbwd():  # the rank-5 views fast's eager path records, around a no-op node
        o = _Noop.apply(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)).squeeze(0)
        return torch.autograd.grad(o, (q, k, v), dout)

    def alloc_noop_fwdbwd():  # a Python backward that allocates what fast's backward does
        return torch.autograd.grad(_Alloc.apply(q, k, v), (q, k, v), dout)

    def fast_fwdbwd_unfused():  # the three-launch backward (two option switches included)
        previous = fsdpa.set_kernel_options(fuse_bwd=False)
        try:
            return torch.autograd.grad(fast_sdpa(q, k, v), (q, k, v), dout)
        finally:
            fsdpa.set_kernel_options(**previous)

    def option_switches():  # what the two switches cost alone
        fsdpa.set_kernel_options(**fsdpa.set_kernel_options(fuse_bwd=False))

    def fast_fwdbwd_one_thread():  # the backward on the calling thread, not autograd's worker
        with torch.autograd.set_multithreading_enabled(False):
            return torch.autograd.grad(fast_sdpa(q, k, v), (q, k, v), dout)

    plan = fsdpa._call_plan(q, k, v, 0.0, False, None, False)
    with torch.no_grad():
        p_out, p_lse = plan.forward(q, k, v)

    def plan_fwd():  # the call plan's forward alone: two allocations, one launch
        return plan.forward(q, k, v)

    def plan_bwd():  # the call plan's backward alone, on this thread, no autograd
        return plan.backward(dout, q, k, v, p_out, p_lse)

    def neg_bit_checks():  # the negative-bit tests a call makes on its inputs (F46, F53)
        return q.is_neg() or k.is_neg() or v.is_neg()

    def fast_fwd_then_launch_bwd():  # fast's public forward, the backward launched by hand
        with torch.no_grad():
            out, stats, _ = fsdpa._attention(q, k, v, None, 0.0, False, None, False)
        return fsdpa._launch_bwd(d5, q5, k5, v5, None, out.unsqueeze(0), stats, False, scale)
    return {"sdpa_part_launches_fwdbwd": launches, "sdpa_part_launches_fwd": launches_fwd,
            "sdpa_part_checks": checks, "sdpa_part_neg_bit_checks": neg_bit_checks,
            "sdpa_part_autograd_noop_fwdbwd": noop_fwdbwd,
            "sdpa_part_4_empty": empties, "sdpa_part_3_empty": three_empties,
            "sdpa_part_empty_unbind3": empty_unbind, "sdpa_part_apply_python": apply_python,
            "sdpa_part_apply_c": apply_c, "sdpa_part_views_noop_fwdbwd": views_noop_fwdbwd,
            "sdpa_part_alloc_noop_fwdbwd": alloc_noop_fwdbwd,
            "sdpa_part_fast_fwdbwd_one_thread": fast_fwdbwd_one_thread,
            "sdpa_part_fast_fwdbwd_unfused": fast_fwdbwd_unfused,
            "sdpa_part_option_switches": option_switches,
            "sdpa_part_fast_fwd_then_launch_bwd": fast_fwd_then_launch_bwd,
            "sdpa_part_plan_fwd": plan_fwd, "sdpa_part_plan_bwd": plan_bwd}


def dsa_calls():
    g = torch.Generator(device="cuda").manual_seed(1)
    T, H, S, K = 4, 64, 64, 64
    ql = torch.randn(T, H, 512, device="cuda", dtype=torch.bfloat16, generator=g)
    qr = torch.randn(T, H, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    kv = torch.randn(S, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    local = torch.randint(0, S, (T, K), device="cuda", dtype=torch.int32, generator=g)
    cu_q = torch.tensor([0, T], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, S], device="cuda", dtype=torch.int32)
    kl, kr = kv[:, :512], kv[:, 512:]

    def fwd():
        with torch.no_grad():
            return fdsa.dsa_sparse_attention(ql, qr, kl, kr, local, softmax_scale=0.05)

    def varlen_fwd():
        with torch.no_grad():
            return fdsa.dsa_sparse_attention_varlen(ql, qr, kl, kr, local, cu_q, cu_k,
                                                    softmax_scale=0.05)

    def index_prep():
        return offset_gather_kv_indices(local, cu_q, cu_k, compact=True, return_topk_length=True)
    return {"dsa_fast_fwd": fwd, "dsa_fast_varlen_fwd": varlen_fwd,
            "dsa_fast_index_prep": index_prep, "device_copy_tiny": lambda: local.clone()}


def profile(fn, calls=300, top=16):
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/overhead.json")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--launch-modes", default="direct",
                    help="comma-separated modes of attention_oracle.fast.launch to measure fast in")
    ap.add_argument("--areas", default="sdpa,dsa", help="sdpa, dsa or both")
    ap.add_argument("--pairs", type=int, default=0,
                    help="time fast and torch in turn this many times per SDPA phase")
    args = ap.parse_args()
    areas = args.areas.split(",")
    calls = {**(sdpa_calls() if "sdpa" in areas else {}), **(dsa_calls() if "dsa" in areas else {})}
    modes = args.launch_modes.split(",")
    res = {}
    for i, mode in enumerate(modes):
        set_launch_mode(mode)
        tag = "" if i == 0 else f"@{mode}"
        for name, fn in calls.items():
            if i == 0 or "_fast_" in name:
                issue = {}
                res[name + tag] = host_us(fn, issue=issue)
                res[f"{name}{tag}:issue"] = issue["us"]
        for phase in ("fwd", "fwd_train", "fwdbwd") if "sdpa" in areas else ():
            res[f"sdpa_fast_over_torch_{phase}{tag}"] = (res[f"sdpa_fast_{phase}{tag}"]
                                                         / res[f"sdpa_torch_{phase}"])
    set_launch_mode(modes[0])
    if args.pairs and "sdpa" in areas:
        for phase in ("fwd", "fwd_train", "fwdbwd"):
            res[f"sdpa_pairs_{phase}"] = paired_host_ratios(calls[f"sdpa_fast_{phase}"],
                                                            calls[f"sdpa_torch_{phase}"],
                                                            args.pairs)
    write_json(args.out, res)
    for name, us in res.items():
        if isinstance(us, dict):
            print(f"{name:32s} fast/torch median {us['median']:.2f} "
                  f"(min {us['min']:.2f}, max {us['max']:.2f}, {len(us['ratios'])} pairs)")
        else:
            print(f"{name:32s} {us:9.2f}" + ("" if "_over_" in name else " us"))
    if args.profile:
        with open(args.profile, "w") as fh:
            for name, fn in calls.items():
                if "_fast_" in name or "_part_launches" in name or "_part_plan" in name:
                    fh.write(f"==== {name}\n{profile(fn)}\n")


if __name__ == "__main__":
    main()
