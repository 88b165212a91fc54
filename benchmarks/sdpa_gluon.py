"""The Gluon SDPA forward beside the Triton forward and cuDNN (H200, bf16, head dims 64 and 128).

    python -m benchmarks.sdpa_gluon [--configs 128,128,2,8 128,128,2,4,1] [--shapes 0,1,2]
                                    [--causal 0,1] [--dims 128] [--mask none] [--host-parts]
                                    [--json PATH]

For each head dim, each shape (``--shapes`` indexes SHAPES: 0-2 B*L = 16k tokens, H 32, L 1k,
4k, 16k; 3-5 smaller calls, B 4 L 256 and 512, B 16 L 512; causal and not) and each config of the
Gluon kernel (BLOCK_M, BLOCK_N, STAGES, num_warps[, WS]): correctness (max |gluon - triton| over the
whole output, max error of each against float64 on the first head), then TFLOP/s of cuDNN,
fast-triton and fast-gluon by both timing methods of :mod:`benchmarks.timing` (``queued_ms``:
do_bench; ``synced_ms``: events and a sync per call), in ``--rounds`` alternated rounds (each
ratio the median of the ratios within a round).
FLOPs: 4*B*H*L*S*D, halved when causal. The host microseconds per call of both forwards at a
tiny shape (L 128) come first, per head dim. ``--mask`` times masked calls instead (never
causal, as in PyTorch): "bool" (a random boolean [B, 1, L, L] mask, 20% excluded), "padding"
(a boolean [B, 1, 1, L] key-padding mask), "add" (an additive [B, 1, L, L] one of the
inputs' dtype) or "padding_add" (the key-padding mask as an additive one: 0 or finfo.min); a
backend that refuses the mask (cuDNN may) is reported and left out.
"""
import argparse
import json
import math

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_oracle.fast import sdpa as fast_sdpa
from attention_oracle.fast.kernels import sdpa_fwd_gluon
from benchmarks.timing import alternated, host_us, paired_host_ratios, paired_ratio, tflops

SHAPES = [(16, 32, 1024), (4, 32, 4096), (1, 32, 16384),
          (4, 32, 256), (4, 32, 512), (16, 32, 512)]  # 3-5: below "auto"'s threshold


MASKS = ("none", "bool", "padding", "add", "padding_add")


def _mask(kind, B, L, dtype, gen):
    """The --mask of a [B, H, L, L] call (module docstring), or None."""
    if kind == "bool":
        return torch.rand(B, 1, L, L, device="cuda", generator=gen) > 0.2
    if kind == "padding":
        lengths = torch.tensor([L - 7 * b for b in range(B)], device="cuda").clamp(min=1)
        return (torch.arange(L, device="cuda")[None, :] < lengths[:, None])[:, None, None, :]
    if kind == "add":
        return torch.randn(B, 1, L, L, device="cuda", generator=gen).to(dtype)
    if kind == "padding_add":  # "padding" as an additive mask: 0 kept, finfo.min padded
        keep = _mask("padding", B, L, dtype, gen)
        return torch.zeros(keep.shape, dtype=dtype, device="cuda").masked_fill(
            ~keep, torch.finfo(dtype).min)
    return None


def _gold_head(q, k, v, causal, mask=None):
    """float64 output of batch 0, head 0."""
    q0, k0, v0 = (t[0, 0].double() for t in (q, k, v))
    s = (q0 @ k0.T) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones_like(s, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        m0 = mask[0, 0].expand(s.shape)
        s = s.masked_fill(~m0, float("-inf")) if m0.dtype == torch.bool else s + m0.double()
    return torch.softmax(s, -1) @ v0


def _run(backend, q, k, v, causal, mask=None):
    if backend == "cudnn":
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                    is_causal=causal)
    fast_sdpa.set_forward_backend(backend)
    return fast_sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


def _gluon(cfg, q, k, v, causal, mask):
    """fast's Gluon forward under the config ``cfg`` (the Triton forward's backend after)."""
    sdpa_fwd_gluon.CONFIG = cfg
    try:
        return _run("gluon", q, k, v, causal, mask)
    finally:
        fast_sdpa.set_forward_backend("triton")


def measure(cfgs, B, H, L, causal, D=128, dtype=torch.bfloat16, mask_kind="none", rounds=3):
    """One shape: cuDNN, fast-triton and fast-gluon per config (BLOCK_M, BLOCK_N, STAGES,
    num_warps[, WS]) timed in ``rounds`` alternated rounds (:func:`benchmarks.timing.alternated`:
    a config's ratio to a peer is the median of the ratios within a round, so the card's drift
    between rounds does not rank the configs); rows of TFLOP/s (the median over rounds) and
    ratios by both methods, and the correctness figures."""
    gen = torch.Generator(device="cuda").manual_seed(L + causal)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=dtype, generator=gen)
               for _ in range(3))
    mask = _mask(mask_kind, B, L, dtype, gen)
    flop = 4 * B * H * L * L * D / (2 if causal else 1)
    rows = []
    with torch.no_grad():
        gold = _gold_head(q, k, v, causal, mask)
        ref, fns, outs = {}, {}, {}
        for b in ("cudnn", "triton"):
            fn = (lambda b=b: _run(b, q, k, v, causal, mask))
            try:
                ref[b] = fn()
            except RuntimeError as exc:  # cuDNN may refuse a mask: report and leave it out
                print(f"{b} B{B} L{L} mask={mask_kind}: {str(exc)[:200]}", flush=True)
                continue
            fns[b] = fn
        for cfg in cfgs:
            try:
                outs[cfg] = _gluon(cfg, q, k, v, causal, mask)
            except Exception as exc:  # report and go on with the next config
                print(f"{cfg} B{B} L{L} causal={causal}: {type(exc).__name__}: "
                      f"{str(exc)[:300]}", flush=True)
                continue
            fns[cfg] = (lambda cfg=cfg: _gluon(cfg, q, k, v, causal, mask))
        timed = alternated(fns, rounds)
        for cfg, out in outs.items():
            row = dict(cfg=list(cfg), B=B, H=H, L=L, D=D, causal=causal, mask=mask_kind,
                       rounds=rounds,
                       gluon_vs_triton=(out.float() - ref["triton"].float()).abs().max().item(),
                       err64_gluon=(out[0, 0].double() - gold).abs().max().item(),
                       **{f"err64_{b}": (o[0, 0].double() - gold).abs().max().item()
                          for b, o in ref.items()})
            for m in ("queued", "synced"):
                row[f"gluon_{m}"] = tflops(flop, timed[cfg][m]["ms"])
                for b in ("cudnn", "triton"):
                    row[f"{b}_{m}"] = (tflops(flop, timed[b][m]["ms"]) if b in timed
                                       else math.nan)
                    row[f"gluon_over_{b}_{m}"] = (paired_ratio(timed, cfg, b, m) if b in timed
                                                  else math.nan)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def _config(text):
    """"BLOCK_M,BLOCK_N,STAGES,num_warps[,WS]" -> sdpa_fwd_gluon.CONFIG (WS 1: the
    warp-specialized kernel; 2: its ping-pong form, sdpa_fwd_gluon.PINGPONG; 3: its
    persistent program, sdpa_fwd_gluon.PERSISTENT; 4: that with ping-pong consumers,
    PERSISTENT_PINGPONG; 5 and 6: those two with the causal diagonal's half tile,
    PERSISTENT_HALF and PERSISTENT_PINGPONG_HALF)."""
    c = [int(x) for x in text.split(",")]
    ws = c[4] if len(c) > 4 else 0
    g = sdpa_fwd_gluon
    return (*c[:4], ws if ws == g.PINGPONG or ws in g.PERSISTENT_FORMS else bool(ws))


def host_overhead(D=128):
    """Host microseconds per forward call at a tiny shape (B 1, H 1, L 128: the device is idle
    most of the time), fast-triton and fast-gluon in turn, then fast-gluon with the opt-in
    TMA descriptor cache (``fast.launch.set_tma_descriptor_cache``)."""
    from attention_oracle.fast.launch import set_tma_descriptor_cache
    q = torch.randn(1, 1, 128, D, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        row = {b: host_us(lambda b=b: _run(b, q, q, q, False)) for b in ("triton", "gluon")}
        set_tma_descriptor_cache(True)
        try:
            row["gluon_tma_cache"] = host_us(lambda: _run("gluon", q, q, q, False))
        finally:
            set_tma_descriptor_cache(False)
    fast_sdpa.set_forward_backend("triton")
    print(f"host us per call at L 128 D {D}: triton {row['triton']:.1f}, "
          f"gluon {row['gluon']:.1f}, gluon with the TMA descriptor cache "
          f"{row['gluon_tma_cache']:.1f}", flush=True)
    return dict(row, D=D)


PAIRS = 15  # host_parts: alternated timings of the Gluon and the Triton forward calls


def host_parts(D=128):
    """Where a Gluon forward call's host time goes (B 1, H 1, L 128): the whole call, the
    kernel launch alone (sdpa_fwd_gluon.launch on kept tensors: the bound path once bound),
    the pieces of the launcher's path (the launch's arguments with the four descriptors, the
    launcher's key, the compiled kernel's own launcher with Triton expanding the descriptors),
    the bound path alone (fast.launch.TmaBoundLaunch: the descriptors expanded here, their
    maps kept per address), one map's encoding by the driver and the compiled kernel's C
    launcher alone on the bound arguments, the Triton forward's whole call, its bound launch
    (the kept call plan's) and its C launcher alone, and the median ratio of the two calls timed in turn (``PAIRS``
    pairs, each first in every other pair; their min and max beside), then a forward+backward call under the Gluon kernels and under the Triton ones;
    microseconds per call."""
    from attention_oracle.fast.launch import specialization_key
    q = torch.randn(1, 1, 128, D, device="cuda", dtype=torch.bfloat16)
    fast_sdpa.set_forward_backend("gluon")
    with torch.no_grad():
        out = _run("gluon", q, q, q, False)
        stats = torch.empty((3, 128), device="cuda", dtype=torch.float32)
        q5 = q.view(1, 1, 1, 128, D)
        plan = sdpa_fwd_gluon.plan((q5.shape,) * 3, (q5.stride(),) * 3, q.dtype, q.device,
                                   False, D ** -0.5)
        sdpa_fwd_gluon.launch(q5, q5, q5, out, stats, plan)
        prepared = sdpa_fwd_gluon._PREPARED[(plan, q.dtype, sdpa_fwd_gluon.CONFIG, q.device)]
        _, grid, _, meta, ((launcher, _, _), _), _ = prepared  # the unmasked kernel

        def descs():
            return sdpa_fwd_gluon.launch_args(prepared, q5, q5, q5, out, stats)

        args = descs()
        entry = launcher(grid, args, meta)  # this call's compiled kernel (launched directly)
        assert entry is not None, "the Gluon launch did not go direct"
        stream = launcher.stream(launcher.device_of())
        g0, g1 = grid
        row = {
            "call_gluon": host_us(lambda: _run("gluon", q, q, q, False)),
            "launch": host_us(lambda: sdpa_fwd_gluon.launch(q5, q5, q5, out, stats, plan)),
            "descriptors": host_us(descs),
            "key": host_us(lambda: specialization_key(args)),
            "compiled_launcher": host_us(lambda: entry.run(
                g0, g1, 1, stream, entry.function, entry.packed, None, None, None, *args,
                *entry.tail)),
        }
        bound = prepared[5][0]
        rest = sdpa_fwd_gluon.unmasked_rest(prepared, stats.stride(0))
        row["bound_launch"] = host_us(lambda: bound.fixed((q5, q5, q5, out), (stats, ), rest))
        if bound.bound is not None:  # one tensor map encoded by the driver (what the keeping saves)
            _, kept, encode, enc_args = bound.bound[5][0]
            row["encode_one"] = host_us(lambda: encode(q5.data_ptr(), *enc_args))
            # the compiled kernel's C launcher on the bound arguments
            row["gluon_raw_run"] = host_us(_raw_gluon_run(bound, q5, out, stats, stream))
        row["call_triton"] = host_us(lambda: _run("triton", q, q, q, False))
        row.update(_triton_parts(q, stream))
        # the two calls in turn, PAIRS times, each first in every other pair
        pairs = paired_host_ratios(lambda: _run("gluon", q, q, q, False),
                                   lambda: _run("triton", q, q, q, False), PAIRS, calls=100)
        row["paired_gluon_over_triton"] = pairs["median"]
        row["paired_min"], row["paired_max"] = pairs["min"], pairs["max"]
    row.update(_step_host(q))
    fast_sdpa.set_forward_backend("triton")
    print(f"host us, D {D}: " + ", ".join(f"{k} {v:.3f}" if k.startswith("paired") else
                                          f"{k} {v:.1f}" for k, v in row.items())
          + f"; bound path {'on' if bound.bound is not None else 'off: ' + str(bound.failure)}",
          flush=True)
    return dict(row, D=D, bound=bound.bound is not None, bound_failure=bound.failure)


def _raw_gluon_run(bound, q5, out, stats, stream):
    """A call of the bound Gluon launch's C launcher alone, on the arguments the bound path
    passes (made once)."""
    entry, _, _, run, template, maps, slots = bound.bound
    args = bound._arguments(template, maps, slots, [t.data_ptr() for t in (q5, q5, q5, out, stats)])
    g0, g1, g2 = bound.grid3
    return lambda: run(g0, g1, g2, stream, entry.function, entry.packed, None, None, None, *args)


def _triton_parts(q, stream):
    """The Triton forward's bound launch (the kept call plan's) and its C launcher alone, at
    q's shape, microseconds per call."""
    plan = fast_sdpa._call_plan(q, q, q, 0.0, False, None, False)
    bound = plan.bound[0]
    if bound is None or bound.bound is None:
        return {}
    out = torch.empty(plan.out_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=q.device)
    tensors = (q, q, q, q, out, lse)
    entry, rest, _, args, _ = bound.bound
    g0, g1, g2 = bound.grid3
    return {"triton_bound_launch": host_us(lambda: bound.fixed(tensors, rest)),
            "triton_raw_run": host_us(lambda: entry.run(
                g0, g1, g2, stream, entry.function, entry.packed, None, None, None, *tensors,
                *args))}


def _step_host(q):
    """Host microseconds of a forward+backward call at q's shape, under the Gluon forward and
    backward and under the Triton ones."""
    x = q.detach().requires_grad_()
    dout = torch.ones_like(q)
    row = {}
    for backend in ("gluon", "triton"):
        fast_sdpa.set_forward_backend(backend)
        previous = fast_sdpa.set_backward_backend(backend)
        try:
            row[f"step_{backend}"] = host_us(
                lambda: fast_sdpa.scaled_dot_product_attention(x, x, x).backward(dout))
        finally:
            fast_sdpa.set_backward_backend(previous)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="*", default=["128,128,2,8"])
    ap.add_argument("--shapes", default="0,1,2", help="indices into SHAPES")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--dims", default="128", help="head dims, comma-separated")
    ap.add_argument("--mask", default="none", choices=MASKS,
                    help="masked calls (never causal): module docstring")
    ap.add_argument("--host-parts", action="store_true",
                    help="only where the Gluon call's host time goes (host_parts)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternated rounds per shape (benchmarks.timing.alternated)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cfgs = [_config(text) for text in args.configs]
    dims = [int(d) for d in args.dims.split(",")]
    if args.host_parts:
        parts = [host_parts(D) for D in dims]
        if args.json:
            with open(args.json, "w") as f:
                json.dump(parts, f, indent=1)
        return
    hosts = [dict(host_us=host_overhead(D)) for D in dims]
    rows = []
    for D in dims:
        for i in args.shapes.split(","):
            B, H, L = SHAPES[int(i)]
            for causal in (c == "1" for c in args.causal.split(",")):
                if causal and args.mask != "none":
                    continue  # a mask excludes is_causal (as in PyTorch)
                rows += measure(cfgs, B, H, L, causal, D, mask_kind=args.mask,
                                 rounds=args.rounds)
    print("cfg            D   L      causal | queued: cudnn triton gluon g/c g/t | synced: cudnn "
          "triton gluon g/c g/t | max|g-t|  err64 t/g")
    for r in rows:
        print(f"{str(tuple(r['cfg'])):14} {r['D']:3} {r['L']:6} {str(r['causal']):6} | "
              f"{r['cudnn_queued']:5.0f} {r['triton_queued']:5.0f} {r['gluon_queued']:5.0f} "
              f"{r['gluon_over_cudnn_queued']:.2f} {r['gluon_over_triton_queued']:.2f} | "
              f"{r['cudnn_synced']:5.0f} {r['triton_synced']:5.0f} {r['gluon_synced']:5.0f} "
              f"{r['gluon_over_cudnn_synced']:.2f} {r['gluon_over_triton_synced']:.2f} | "
              f"{r['gluon_vs_triton']:.2e} "
              f"{r['err64_triton']:.1e}/{r['err64_gluon']:.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(hosts + rows, f, indent=1)


if __name__ == "__main__":
    main()
