"""Every Gluon kernel compiles for sm_90a with the installed Triton, on any machine
(fast/kernels/gluon_probe.py): CI's Triton (3.8) is not the H200 machines' (3.6), and a
Gluon API that changed between them (``thread_barrier``, renamed ``barrier`` in 3.8) once left
every Gluon kernel uncompilable under CI's pin while the device runs passed
(docs/FINDINGS.md F32). Each variant must fit the H200's shared memory and issue the wgmma
forms its design names (the transposed operands of the backward products); register and spill
counts differ between Triton releases and are only reported (``python -m
attention_oracle.fast.kernels.gluon_probe``). The probe runs in a fresh interpreter outside
Triton's CPU interpreter, which the suite's own tests run under on a machine without a GPU."""
import json
import os
import subprocess
import sys

import pytest

from attention_oracle.fast.kernels import dsa_probe, gluon_probe

needs_gluon = pytest.mark.skipif(
    not gluon_probe.GLUON_AVAILABLE or dsa_probe._bin("ptxas-blackwell", "ptxas") is None,
    reason="this Triton has no Gluon or bundles no ptxas")

# per variant, wgmma forms (gluon_probe.wgmma_forms) its products must show
EXPECTED_FORMS = {
    # scores (K-major Q and K from shared memory), P.V (P from registers, V N-major)
    "dsa_fwd": {"m64n64k16 A smem trans 00", "m64n256k16 A regs trans 1"},
    "dsa_fwd_nope": {"m64n64k16 A smem trans 00", "m64n256k16 A regs trans 1"},
    "dsa_fwd_prefetch": {"m64n64k16 A smem trans 00", "m64n256k16 A regs trans 1"},
    # S^T and dP^T (00), dq^T = K^T dS^T (both transposed), key gradients dS^T Q (B N-major)
    "dsa_bwd": {"m64n32k16 A smem trans 00", "m64n32k16 A smem trans 11",
                "m64n64k16 A smem trans 01"},
    "dsa_bwd_nope": {"m64n32k16 A smem trans 00", "m64n32k16 A smem trans 11",
                     "m64n64k16 A smem trans 01"},
    "dsa_bwd_prefetch": {"m64n32k16 A smem trans 00", "m64n32k16 A smem trans 11",
                         "m64n64k16 A smem trans 01"},
    "sdpa_fwd_d64": {"m64n128k16 A smem trans 00", "m64n64k16 A regs trans 1"},
    "sdpa_fwd_d128": {"m64n128k16 A smem trans 00", "m64n128k16 A regs trans 1"},
    "sdpa_fwd_d128_causal": {"m64n128k16 A smem trans 00", "m64n128k16 A regs trans 1"},
    "sdpa_fwd_d128_bool_mask": {"m64n128k16 A smem trans 00", "m64n128k16 A regs trans 1"},
    "sdpa_fwd_d256_causal": {"m64n64k16 A smem trans 00", "m64n256k16 A regs trans 1"},
    "sdpa_fwd_d128_persistent": {"m64n128k16 A smem trans 00", "m64n128k16 A regs trans 1"},
    "sdpa_fwd_d64_causal_persistent": {"m64n128k16 A smem trans 00",
                                       "m64n64k16 A regs trans 1"},
    "sdpa_fwd_d64_add_mask": {"m64n128k16 A smem trans 00", "m64n64k16 A regs trans 1"},
    "sdpa_fwd_d64_causal_persistent_pingpong": {"m64n128k16 A smem trans 00",
                                                "m64n64k16 A regs trans 1"},
    "sdpa_fwd_d128_persistent_pingpong": {"m64n128k16 A smem trans 00",
                                          "m64n128k16 A regs trans 1"},
    # the causal diagonal's half tile adds 64-key scores (m64n64 from shared memory)
    "sdpa_fwd_d64_causal_persistent_half": {"m64n128k16 A smem trans 00",
                                            "m64n64k16 A smem trans 00",
                                            "m64n64k16 A regs trans 1"},
    "sdpa_fwd_d128_causal_persistent_half": {"m64n128k16 A smem trans 00",
                                             "m64n64k16 A smem trans 00",
                                             "m64n128k16 A regs trans 1"},
    "sdpa_fwd_d64_causal_persistent_pingpong_half": {"m64n128k16 A smem trans 00",
                                                     "m64n64k16 A smem trans 00",
                                                     "m64n64k16 A regs trans 1"},
    "sdpa_fwd_d128_pingpong": {"m64n128k16 A smem trans 00", "m64n128k16 A regs trans 1"},
    "sdpa_fwd_d128_causal_pingpong": {"m64n128k16 A smem trans 00",
                                      "m64n128k16 A regs trans 1"},
    "sdpa_fwd_d64_three": {"m64n128k16 A smem trans 00", "m64n64k16 A regs trans 1"},
    "sdpa_fwd_d64_three_causal_pingpong": {"m64n128k16 A smem trans 00",
                                           "m64n64k16 A regs trans 1"},
    # S^T, dP^T (00); dV, dK from register P^T, dS^T; dQ = dS K (dS^T and K transposed)
    "sdpa_bwd_d64": {"m64n64k16 A smem trans 00", "m64n64k16 A regs trans 1",
                     "m64n64k16 A smem trans 11"},
    "sdpa_bwd_d128": {"m64n64k16 A smem trans 00", "m64n128k16 A regs trans 1",
                      "m64n64k16 A smem trans 11"},
    "sdpa_bwd_d128_causal": {"m64n64k16 A smem trans 00", "m64n128k16 A regs trans 1",
                             "m64n64k16 A smem trans 11"},
    "sdpa_bwd_d128_bool_mask": {"m64n64k16 A smem trans 00", "m64n128k16 A regs trans 1",
                                "m64n64k16 A smem trans 11"},
    "sdpa_bwd_d64_add_mask": {"m64n64k16 A smem trans 00", "m64n64k16 A regs trans 1",
                              "m64n64k16 A smem trans 11"},
    "sdpa_bwd_d64_tma": {"m64n64k16 A smem trans 00", "m64n64k16 A regs trans 1",
                           "m64n64k16 A smem trans 11"},
    "sdpa_bwd_d128_tma": {"m64n64k16 A smem trans 00", "m64n128k16 A regs trans 1",
                            "m64n64k16 A smem trans 11"},
    "sdpa_bwd_d128_causal_split_tma": {"m64n64k16 A smem trans 00", "m64n128k16 A regs trans 1",
                                    "m64n64k16 A smem trans 11"},
    "sdpa_bwd_d64_tma_deferred": {"m64n64k16 A smem trans 00", "m64n64k16 A regs trans 1",
                                  "m64n64k16 A smem trans 11"},
    "sdpa_bwd_d128_tma_deferred": {"m64n64k16 A smem trans 00", "m64n128k16 A regs trans 1",
                                   "m64n64k16 A smem trans 11"},
    "sdpa_bwd_d128_causal_tma_deferred": {"m64n64k16 A smem trans 00",
                                          "m64n128k16 A regs trans 1",
                                          "m64n64k16 A smem trans 11"},
    # fp32 "tf32x3" dK/dV: S^T, dP^T from K and V's halves in shared memory (K-major, as tf32
    # wgmma reads every operand: no transpose flags); dV, dK in column halves from register
    # P^T, dS^T
    "sdpa_bwd_fp32_d64": {"m64n16k8 A smem trans ", "m64n32k8 A regs trans "},
    "sdpa_bwd_fp32_d128": {"m64n16k8 A smem trans ", "m64n64k8 A regs trans "},
    "sdpa_bwd_fp32_d128_causal": {"m64n16k8 A smem trans ", "m64n64k8 A regs trans "},
}


def _fresh_python(args, timeout, first=None):
    """Python with ``args`` in a fresh interpreter outside Triton's CPU interpreter (which the
    suite's own tests run under on a machine without a GPU), from the repository root;
    ``first``: a folder put ahead of it on the path (another Triton)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (first, root, env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=root, timeout=timeout)


@pytest.fixture(scope="module")
def probed():
    """gluon_probe --json over every variant, in a fresh interpreter without TRITON_INTERPRET."""
    r = _fresh_python(["-m", "attention_oracle.fast.kernels.gluon_probe", "--json"], 900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# a folder holding the device's Triton (`pip install --target DIR triton==3.6.0`), whose Gluon
# builds what CI's Triton builds only most of the time (docs/FINDINGS.md F94)
DEVICE_TRITON = os.environ.get("ATTENTION_ORACLE_DEVICE_TRITON", "")


@pytest.mark.skipif(not DEVICE_TRITON, reason="set ATTENTION_ORACLE_DEVICE_TRITON to a folder "
                    "holding the device's Triton (pip install --target DIR triton==3.6.0) to "
                    "build every Gluon variant under it too")
def test_every_variant_builds_under_the_device_triton():
    """The probe's every variant under the Triton in ATTENTION_ORACLE_DEVICE_TRITON: it builds
    and fits the H200's shared memory (the half-diagonal forms built under 3.8 and not under
    3.6, which turned the device's Gluon forward off: F94)."""
    r = _fresh_python(["-c", "import triton; print(triton.__version__)"], 120, DEVICE_TRITON)
    assert r.returncode == 0, r.stderr[-2000:]
    version = r.stdout.strip()
    r = _fresh_python(["-m", "attention_oracle.fast.kernels.gluon_probe", "--json"], 1800,
                      DEVICE_TRITON)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(results) == set(EXPECTED_FORMS), set(results) ^ set(EXPECTED_FORMS)
    failed = {name: res["error"][:300] for name, res in results.items() if "error" in res}
    assert not failed, f"under Triton {version}: {failed}"
    large = {name: res["shared"] for name, res in results.items()
             if res["shared"] > gluon_probe.SHARED_LIMIT}
    assert not large, f"under Triton {version}, bytes of shared memory: {large}"


@needs_gluon
def test_the_probe_refuses_an_unnamed_constexpr():
    """A constexpr argument the probe does not name would compile as a runtime integer, its
    default ignored, and the figures would be another kernel's (docs/FINDINGS.md F92: the
    persistent forward's default compiled with its half-tile code in): the probe refuses it."""
    r = _fresh_python(["-c",
        "from attention_oracle.fast.kernels import gluon_probe as gp, sdpa_fwd_gluon as g\n"
        "try:\n"
        "    gp._compile(g.sdpa_fwd_gluon_ws_persistent_kernel, {}, dict(CAUSAL=True, "
        "BLOCK_M=128, BLOCK_N=128, HEAD_D=64, STAGES=2, num_warps=4, PINGPONG=False), [])\n"
        "except ValueError as exc:\n"
        "    print('refused:', exc)\n"], 300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused:" in r.stdout and "HALF_DIAG" in r.stdout, r.stdout


@needs_gluon
def test_every_variant_is_checked(probed):
    assert set(probed) == set(EXPECTED_FORMS)


@needs_gluon
@pytest.mark.parametrize("name", sorted(EXPECTED_FORMS))
def test_gluon_kernel_compiles_for_sm90(name, probed):
    result = probed[name]
    assert "error" not in result, f"{name}: {result.get('error')}"
    shared, forms = result["shared"], result["forms"]
    assert shared <= gluon_probe.SHARED_LIMIT, f"{name}: {shared} B of shared memory"
    missing = EXPECTED_FORMS[name] - set(forms)
    assert not missing, f"{name}: no {sorted(missing)} among {forms}"


@needs_gluon
@pytest.mark.parametrize("name", sorted(n for n in EXPECTED_FORMS if n.endswith("_tma")
                                        or n.endswith("_tma_deferred")))
def test_dq_reductions_wait_only_where_the_schedule_says(name, probed):
    """The SDPA backward's dQ TMA reductions: under "tma" (and "split_tma") each is waited for
    at once, the tile being Triton's own (the control); under "tma_deferred" none is, the wait
    moving to the consumer's next dQ product and the program's end (sdpa_bwd_gluon.SCHEDULES),
    one of each a consumer."""
    reductions, waited, waits = probed[name]["tma_reductions"]
    assert reductions > 0, f"{name}: no TMA reduction in the PTX"
    if name.endswith("_deferred"):
        assert (waited, waits) == (0, 2 * reductions), (name, reductions, waited, waits)
    else:
        assert waited == reductions, (name, reductions, waited)


def mismatched_waits(source):
    """(line, targets, deps) of each ``a, b = warpgroup_mma_wait(n, deps=(...))`` in ``source``
    whose targets do not match its deps one for one: Triton's code generator (3.6 and 3.8)
    unpacks a tuple into fewer names without an error where Python raises (docs/FINDINGS.md
    F33), so a dropped or shifted accumulator would compile."""
    import ast
    bad = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        deps = [k.value for k in node.value.keywords if k.arg == "deps"]
        if name != "warpgroup_mma_wait" or not deps or not isinstance(deps[0], ast.Tuple):
            continue
        target = node.targets[0]
        names = len(target.elts) if isinstance(target, ast.Tuple) else 1
        if names != len(deps[0].elts) and not (names == 1 and len(deps[0].elts) == 1):
            bad.append((node.lineno, names, len(deps[0].elts)))
    return bad


def test_every_wgmma_wait_unpacks_each_dependency():
    """Over every Gluon kernel module; the control is the form an early SDPA backward had."""
    control = "dv, dk = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op))\n"
    assert mismatched_waits(control) == [(1, 2, 4)]
    kernels = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "attention_oracle", "fast", "kernels")
    for name in sorted(os.listdir(kernels)):
        if name.endswith("_gluon.py"):
            with open(os.path.join(kernels, name)) as f:
                assert not mismatched_waits(f.read()), name


@needs_gluon
@pytest.mark.parametrize("name", sorted(n for n in EXPECTED_FORMS if n.startswith("dsa")))
def test_only_the_prefetch_variants_ask_the_l2(name, probed):
    """PREFETCH 0 (the default) leaves no prefetch in the DSA kernels (the producers take it as
    an int32 the compiler folds); the prefetch variants issue it (docs/FINDINGS.md F75)."""
    count = probed[name]["l2_prefetches"]
    if name.endswith("_prefetch"):
        assert count > 0, f"{name}: no cp.async.bulk.prefetch.L2 in its PTX"
    else:
        assert count == 0, f"{name}: {count} L2 prefetches with PREFETCH 0"



# masked tiles' softmax as the kernels had it before F93, per warp: the Gluon forward's
# (gluon_probe --sass sdpa_fwd_d64_causal_persistent) and the Triton forward's (sdpa_probe
# --sass fwd+causal bf16 64 128,64,4,3): two compares and an AND a score, or the scale as a
# product before the exponent's difference
OLD_MASKED_TILES = (dict(FADD=132, FSEL=130, ISETP=102, FMNMX=68, FMUL=64, FFMA=2,
                         **{"MUFU.EX2": 66}),
                    dict(FADD=136, FMUL=128, FMNMX=72, ISETP=68, FSEL=68, **{"MUFU.EX2": 68}))


def lean_softmax(ops):
    """Whether a block of a tile's softmax (at least 32 exponentials a thread) compares and
    adds at most once a score, give or take 8 (the loop's own compares; the one add is the
    row sum's, the exponent's difference folded with the scale into one FFMA)."""
    ex2 = ops.get("MUFU.EX2", 0)
    return ex2 < 32 or (ops.get("ISETP", 0) <= ex2 + 8 and ops.get("FADD", 0) <= ex2 + 8)


def _heavy_softmax(blocks):
    softmax = [b for b in blocks if b[2].get("MUFU.EX2", 0) >= 32]
    assert softmax, "no block with a tile's exponentials"
    return [(hex(addr), n, ops) for addr, n, ops in softmax if not lean_softmax(ops)]


@needs_gluon
@pytest.mark.parametrize("name", ["sdpa_fwd_d64_causal_persistent", "sdpa_fwd_d128_causal",
                                  "sdpa_fwd_d64_causal_persistent_half", "sdpa_fwd_d64"])
def test_a_masked_tile_compares_once_a_score(name):
    """The causal and bound masks cost one compare and one select a score, the scale folded as
    on a free tile (docs/FINDINGS.md F93): the machine code of each tile's softmax, free or
    masked, read by nvdisasm. The controls are the masked tiles the kernels had before."""
    assert not any(lean_softmax(ops) for ops in OLD_MASKED_TILES)
    r = _fresh_python(["-m", "attention_oracle.fast.kernels.gluon_probe", "--sass", name,
                       "--json"], 600)
    assert r.returncode == 0, r.stderr[-3000:]
    heavy = _heavy_softmax(json.loads(r.stdout.strip().splitlines()[-1]))
    assert not heavy, f"{name}: softmax blocks past one compare or add a score: {heavy}"


@needs_gluon
@pytest.mark.parametrize("head_dim, config", [(64, "128,64,4,3"), (128, "128,64,8,2")])
def test_a_masked_tile_of_the_triton_forward_compares_once_a_score(head_dim, config):
    """The same of the Triton forward's causal tiles (its bf16 tiles of the H200's tuning)."""
    r = _fresh_python(["-m", "attention_oracle.fast.kernels.sdpa_probe", "--sass", "--json",
                       "fwd+causal", "bf16", str(head_dim), config], 600)
    assert r.returncode == 0, r.stderr[-3000:]
    heavy = _heavy_softmax(json.loads(r.stdout.strip().splitlines()[-1]))
    assert not heavy, f"D {head_dim} {config}: softmax blocks past one compare or add a score: {heavy}"
