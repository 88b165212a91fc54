"""One profiled launch per workload, for Nsight Compute: what limits fast's kernels against
their peers: a target missed is stated with what limits it, measured.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \\
        --section LaunchStats python -m benchmarks.profile_kernels [--only NAME,...]

Each workload runs twice untimed (compilation, autotuning, caches), then once between
``cudaProfilerStart`` and ``cudaProfilerStop``, so ncu sees only that call's kernels. Without
ncu the script just runs them. Workloads (bf16 unless named):
sdpa_fwd_fast / sdpa_fwd_cudnn (B 4, H 32, L 4096, D 128), sdpa_fwd_fast_d64 /
sdpa_fwd_cudnn_d64 (the same at D 64: fast's default there is the Triton forward), sdpa_fwd_fast_1k_causal /
sdpa_fwd_cudnn_1k_causal (B 16, H 32, L 1024, D 128, causal; fast's default there is the Gluon
forward), sdpa_fwd_gluon_persistent_1k_causal (the same under the Gluon forward's persistent
config, kept for the workloads after it), sdpa_fwd_fast_1k_causal_d64 /
sdpa_fwd_cudnn_1k_causal_d64 and sdpa_bwd_1k_causal_d64_fast / sdpa_bwd_1k_causal_d64_cudnn
(the causal L 1k rows at D 64: the forward's and the step's largest gaps),
sdpa_fwd_gluon_pingpong_1k_causal_d64 (the D 64 forward under the persistent ping-pong config,
kept for the workloads after it), sdpa_bwd_fast / sdpa_bwd_cudnn
(the backward of the same), sdpa_bwd_fast_atomic / sdpa_bwd_fast_atomic_element (fast's backward
under those dQ modes, ``set_dq_mode``), dsa_fwd_fast / dsa_bwd_fast (doc_16384, H 64, 512 + 64, top-k 2048;
the default forward, Gluon on sm_90), dsa_fwd_fast_triton (the Triton forward; the backend stays
"triton" for the workloads after it), dsa_fwd_fast_packed / dsa_bwd_fast_packed (the default forward and backward on packed_glm_a),
sdpa_bwd_gluon / dsa_bwd_gluon (the Gluon backwards, ``set_backward_backend("gluon")``, on the
sdpa_bwd / dsa_bwd workloads: opt-in for SDPA, DSA's default), dsa_bwd_triton (the Triton DSA
backward on the dsa_bwd workload),
sdpa_fp32_fwd_{accurate,tf32x3} / sdpa_fp32_bwd_{accurate,tf32x3} / sdpa_fp32_bwd_torch
(fp32, B 2, H 16, L 2048, D 128).
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_oracle.fast import sdpa as fast_sdpa


def _profiled(fn):
    fn()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def _inputs(B, H, L, D, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(B, H, L, D, device="cuda", dtype=dtype, generator=g) for _ in range(4)]


def _sdpa(impl, backward, dtype=torch.bfloat16, shape=(4, 32, 4096, 128), causal=False):
    q, k, v, dout = _inputs(*shape, dtype)
    leaves = [t.requires_grad_(backward) for t in (q, k, v)]

    def forward():
        if impl == "cudnn":
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(*leaves, is_causal=causal)
        if impl == "torch":
            return F.scaled_dot_product_attention(*leaves, is_causal=causal)
        return fast_sdpa.scaled_dot_product_attention(*leaves, is_causal=causal)

    if not backward:
        def run():
            with torch.no_grad():
                forward()
        return run
    out = forward()  # the profiled call is the backward alone

    def run_backward():
        torch.autograd.grad(out, leaves, dout, retain_graph=True)
    return run_backward


def _dsa(backward, forward_backend=None, problem="doc_16384"):
    from attention_oracle.fast import dsa as fast_dsa
    from benchmarks import dsa as bench
    if forward_backend is not None:
        fast_dsa.set_forward_backend(forward_backend)
    gen = torch.Generator(device="cuda").manual_seed(0)
    p = bench.named_problem(problem, gen)
    xs = bench.leaves(p)
    if not backward:
        def run():
            with torch.no_grad():
                bench.fast_forward(p, xs)
        return run
    out = bench.fast_forward(p, xs)

    def run_backward():
        torch.autograd.grad(out, xs, p["dout"], retain_graph=True)
    return run_backward


def _backward_on(module, backend, make):
    """The workload ``make()`` with ``module``'s backward backend ``backend`` during its calls."""
    run = make()

    def run_on():
        previous = module.set_backward_backend(backend)
        try:
            run()
        finally:
            module.set_backward_backend(previous)
    return run_on


def _dsa_module():
    from attention_oracle.fast import dsa as fast_dsa
    return fast_dsa


FP32 = dict(dtype=torch.float32, shape=(2, 16, 2048, 128))
def _persistent_forward():
    """The Gluon forward under its persistent config (``sdpa_fwd_gluon.PERSISTENT``), kept for
    the workloads after it."""
    from attention_oracle.fast.kernels import sdpa_fwd_gluon
    sdpa_fwd_gluon.CONFIG = (128, 128, 2, 4, sdpa_fwd_gluon.PERSISTENT)
    return _sdpa("fast", False, shape=SHORT, causal=True)


SHORT = (16, 32, 1024, 128)  # the causal L 1k rows: B 16, H 32, D 128
SHORT_64 = (16, 32, 1024, 64)  # the same at D 64


def _persistent_pingpong_forward():
    """The Gluon forward under its persistent ping-pong config
    (``sdpa_fwd_gluon.PERSISTENT_PINGPONG``) at D 64, kept for the workloads after it."""
    from attention_oracle.fast.kernels import sdpa_fwd_gluon
    sdpa_fwd_gluon.CONFIG = (128, 128, 2, 4, sdpa_fwd_gluon.PERSISTENT_PINGPONG)
    return _sdpa("fast", False, shape=SHORT_64, causal=True)


WORKLOADS = {
    "sdpa_fwd_fast": lambda: _sdpa("fast", False),
    "sdpa_fwd_cudnn": lambda: _sdpa("cudnn", False),
    "sdpa_fwd_fast_d64": lambda: _sdpa("fast", False, shape=(4, 32, 4096, 64)),
    "sdpa_fwd_cudnn_d64": lambda: _sdpa("cudnn", False, shape=(4, 32, 4096, 64)),
    "sdpa_fwd_fast_1k_causal": lambda: _sdpa("fast", False, shape=SHORT, causal=True),
    "sdpa_fwd_cudnn_1k_causal": lambda: _sdpa("cudnn", False, shape=SHORT, causal=True),
    "sdpa_fwd_gluon_persistent_1k_causal": _persistent_forward,
    "sdpa_fwd_fast_1k_causal_d64": lambda: _sdpa("fast", False, shape=SHORT_64, causal=True),
    "sdpa_fwd_cudnn_1k_causal_d64": lambda: _sdpa("cudnn", False, shape=SHORT_64, causal=True),
    "sdpa_fwd_gluon_pingpong_1k_causal_d64": _persistent_pingpong_forward,
    "sdpa_bwd_1k_causal_d64_fast": lambda: _sdpa("fast", True, shape=SHORT_64, causal=True),
    "sdpa_bwd_1k_causal_d64_cudnn": lambda: _sdpa("cudnn", True, shape=SHORT_64, causal=True),
    "sdpa_bwd_fast": lambda: _sdpa("fast", True),
    "sdpa_bwd_cudnn": lambda: _sdpa("cudnn", True),
    "sdpa_bwd_fast_atomic": lambda: _sdpa("fast", True),
    "sdpa_bwd_fast_atomic_element": lambda: _sdpa("fast", True),
    "dsa_fwd_fast": lambda: _dsa(False),
    "dsa_fwd_fast_triton": lambda: _dsa(False, "triton"),
    "dsa_fwd_fast_packed": lambda: _dsa(False, problem="packed_glm_a"),
    "dsa_bwd_fast": lambda: _dsa(True),
    "dsa_bwd_fast_packed": lambda: _dsa(True, problem="packed_glm_a"),
    "sdpa_bwd_gluon": lambda: _backward_on(fast_sdpa, "gluon", lambda: _sdpa("fast", True)),
    "dsa_bwd_gluon": lambda: _backward_on(_dsa_module(), "gluon", lambda: _dsa(True)),
    "dsa_bwd_triton": lambda: _backward_on(_dsa_module(), "triton", lambda: _dsa(True)),
    "sdpa_fp32_fwd_accurate": lambda: _sdpa("fast", False, **FP32),
    "sdpa_fp32_fwd_tf32x3": lambda: _sdpa("fast", False, **FP32),
    "sdpa_fp32_fwd_torch": lambda: _sdpa("torch", False, **FP32),
    "sdpa_fp32_bwd_accurate": lambda: _sdpa("fast", True, **FP32),
    "sdpa_fp32_bwd_tf32x3": lambda: _sdpa("fast", True, **FP32),
    "sdpa_fp32_bwd_torch": lambda: _sdpa("torch", True, **FP32),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(WORKLOADS))
    args = ap.parse_args(argv)
    for name in args.only.split(","):
        # the fp32 mode is the name's suffix, set before a backward workload's forward
        mode = name.rsplit("_", 1)[1] if name.startswith("sdpa_fp32_") else None
        previous = fast_sdpa.set_fp32_mode(mode) if mode in fast_sdpa.FP32_MODES else None
        # and the dQ mode likewise, after "sdpa_bwd_fast_"
        dq_mode = name[len("sdpa_bwd_fast_"):] if name.startswith("sdpa_bwd_fast_") else "kernel"
        previous_dq = fast_sdpa.set_dq_mode(dq_mode)
        try:
            run = WORKLOADS[name]()
            print(f"== workload {name}", flush=True)
            _profiled(run)
        finally:
            fast_sdpa.set_dq_mode(previous_dq)
            if previous:
                fast_sdpa.set_fp32_mode(previous)


if __name__ == "__main__":
    main()
