"""The Gluon SDPA backward beside the Triton backward and cuDNN, in the same run (bf16).

    python -m benchmarks.sdpa_gluon_bwd [--shapes 0,1,2|none] [--causal 0,1] [--dims 128,64]
                                        [--schedules auto,serial,tma] [--json PATH]

For each head dim, shape (B*L = 16k tokens, H 32: L 1k, 4k, 16k) and causal flag: the backward
alone (autograd.grad of one forward's output, the graph kept) and the step (forward and
backward) of cuDNN, fast with the Triton backward and fast with the Gluon backward (the
forward is fast's default in both), TFLOP/s by both timing methods of :mod:`benchmarks.timing`
(``queued_ms``: do_bench; ``synced_ms``: events and a sync per call) and each fast backend's
ratio to cuDNN; then the largest difference of the Gluon backward's dq, dk, dv from the Triton
backward's and from cuDNN's, over the largest magnitude (so that a fast wrong kernel shows).
FLOPs: backward 10*B*H*L*S*D, step 14*B*H*L*S*D, halved when causal. ``--schedules``: the
Gluon backward under each consumer schedule ("auto" or a name in ``sdpa_bwd_gluon.SCHEDULES``)
in the same run,
the first as "gluon", each other as "gluon_<schedule>" (its ratios and its gradients' distance
from the first's). Then, per head dim, each backward's host time per call at a tiny shape (B 1,
H 2, L 128: :func:`benchmarks.timing.host_us`, the backward of one kept forward), where the
Gluon backward's five TMA descriptors show; last the Triton backward's tuned tiles (in the
JSON too: the tuner's pick can differ between runs).
"""
import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_oracle.fast import sdpa as fast_sdpa
from attention_oracle.fast.kernels import sdpa_bwd_gluon
from benchmarks.timing import fast_settings, host_us, queued_ms, synced_ms, tflops, tuned_tiles

SHAPES = [(16, 32, 1024), (4, 32, 4096), (1, 32, 16384)]


def _forward(backend, q, k, v, causal):
    """One forward whose backward is ``backend``'s: "cudnn", "triton", "gluon" (the first
    schedule) or "gluon_<schedule>"."""
    if backend == "cudnn":
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    name, _, schedule = backend.partition("_")
    if name == "gluon":
        sdpa_bwd_gluon.set_schedule(schedule or _SCHEDULES[0])
    fast_sdpa.set_backward_backend(name)
    return fast_sdpa.scaled_dot_product_attention(q, k, v, is_causal=causal)


_SCHEDULES = [sdpa_bwd_gluon._SCHEDULE.value]  # the first: "gluon" (main sets them)
_DEFAULT_BWD = fast_sdpa.settings()["backward_backend"]  # the process's, restored after a row


def _restore_defaults():
    """After a row: the process's backward backend and the run's first Gluon schedule."""
    fast_sdpa.set_backward_backend(_DEFAULT_BWD)
    sdpa_bwd_gluon.set_schedule(_SCHEDULES[0])


def _default_backward(B, H, L, D, causal):
    """The backward the process's backend gives this unmasked call: "gluon" or "triton"."""
    q_shape = (B, 1, H, L, D)
    return "gluon" if fast_sdpa.gluon_backward_takes(q_shape, q_shape, causal) else "triton"


def _backends():
    return ["cudnn", "triton", "gluon"] + [f"gluon_{s}" for s in _SCHEDULES[1:]]


def _spread(x, ref):
    return float((x.float() - ref.float()).abs().max() / ref.float().abs().max())


def measure(B, H, L, causal, D, dtype=torch.bfloat16):
    """One shape: rows of TFLOP/s (backward, step) by both methods and the differences."""
    gen = torch.Generator(device="cuda").manual_seed(L + causal + D)
    q, k, v, dout = (torch.randn(B, H, L, D, device="cuda", dtype=dtype, generator=gen)
                     for _ in range(4))
    xs = [t.requires_grad_(True) for t in (q, k, v)]
    scale = 0.5 if causal else 1.0
    flop = {"bwd": 10 * B * H * L * L * D * scale, "step": 14 * B * H * L * L * D * scale}
    row = dict(B=B, H=H, L=L, D=D, causal=causal,
               default_backward=_default_backward(B, H, L, D, causal))
    grads = {}
    for backend in _backends():
        out = _forward(backend, *xs, causal)
        grads[backend] = torch.autograd.grad(out, xs, dout, retain_graph=True)
        fns = {"bwd": lambda o=out: torch.autograd.grad(o, xs, dout, retain_graph=True),
               "step": lambda b=backend: torch.autograd.grad(_forward(b, *xs, causal), xs, dout)}
        for phase, fn in fns.items():
            queued, synced = queued_ms(fn), synced_ms(fn)
            row[f"{backend}_{phase}"] = (tflops(flop[phase], queued), tflops(flop[phase], synced))
        del out, fns
    for backend in _backends()[1:]:
        for phase in ("bwd", "step"):
            (fq, fs), (cq, cs) = row[f"{backend}_{phase}"], row[f"cudnn_{phase}"]
            row[f"{backend}_{phase}_over_cudnn"] = (fq / cq, fs / cs)
    for name, i in (("dq", 0), ("dk", 1), ("dv", 2)):
        row[f"{name}_gluon_vs_triton"] = _spread(grads["gluon"][i], grads["triton"][i])
        row[f"{name}_gluon_vs_cudnn"] = _spread(grads["gluon"][i], grads["cudnn"][i])
        row[f"{name}_triton_vs_cudnn"] = _spread(grads["triton"][i], grads["cudnn"][i])
        for backend in _backends()[3:]:
            row[f"{name}_{backend}_vs_gluon"] = _spread(grads[backend][i], grads["gluon"][i])
    _restore_defaults()
    return row


def host_row(D, dtype=torch.bfloat16):
    """Each backend's backward at B 1, H 2, L 128: host microseconds per call."""
    gen = torch.Generator(device="cuda").manual_seed(D)
    q, k, v, dout = (torch.randn(1, 2, 128, D, device="cuda", dtype=dtype, generator=gen)
                     for _ in range(4))
    xs = [t.requires_grad_(True) for t in (q, k, v)]
    row = dict(D=D, L=128)
    for backend in _backends():
        out = _forward(backend, *xs, False)
        row[f"{backend}_host_us"] = host_us(
            lambda o=out: torch.autograd.grad(o, xs, dout, retain_graph=True))
        del out
    _restore_defaults()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="0,1,2", help="indices into SHAPES, or none")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--dims", default="128,64", help="head dims, comma-separated")
    ap.add_argument("--schedules", default=None,
                    help="the Gluon backward's schedules, comma-separated (default: the "
                    "process's, $ATTENTION_ORACLE_FAST_SDPA_GLUON_BWD_SCHEDULE or auto)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.schedules:
        _SCHEDULES[:] = args.schedules.split(",")
        for name in _SCHEDULES:
            if name not in sdpa_bwd_gluon._SCHEDULE.choices:
                raise SystemExit(f"--schedules: {name!r} is not one of "
                                 f"{sdpa_bwd_gluon._SCHEDULE.choices}")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.sdpa_gluon_bwd needs a CUDA device")
    rows, host = [], []
    shapes = [] if args.shapes == "none" else list(map(int, args.shapes.split(",")))
    for D in map(int, args.dims.split(",")):
        for i in shapes:
            for causal in map(int, args.causal.split(",")):
                B, H, L = SHAPES[i]
                r = measure(B, H, L, bool(causal), D)
                rows.append(r)
                cells = "; ".join(
                    f"{b} {p} {r[f'{b}_{p}'][0]:.0f} ({r[f'{b}_{p}'][1]:.0f})"
                    + (f" x{r[f'{b}_{p}_over_cudnn'][0]:.2f} ({r[f'{b}_{p}_over_cudnn'][1]:.2f})"
                       if b != "cudnn" else "")
                    for b in _backends() for p in ("bwd", "step"))
                diffs = ", ".join(f"{k} {v:.1e}" for k, v in r.items() if "_vs_" in k)
                print(f"D {D} L {L} causal {causal}: TFLOP/s queued (synced) {cells}; {diffs}",
                      flush=True)
                _write(args.json, rows, host)
    for D in map(int, args.dims.split(",")):
        host.append(host_row(D))
        print(f"D {D} L 128 host us per backward: "
              + "; ".join(f"{b} {host[-1][f'{b}_host_us']:.1f}" for b in _backends()), flush=True)
        _write(args.json, rows, host)
    for kernel, picks in tuned_tiles().items():
        for key, config in picks.items():
            print(f"Triton backward's {kernel} tile, key {key}: {config}", flush=True)


def _write(path, rows, host):
    if path:
        with open(path, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows, host=host,
                           schedules=list(_SCHEDULES), fast_settings=fast_settings(),
                           triton_tiles=tuned_tiles()), f,
                      indent=1)


if __name__ == "__main__":
    main()
