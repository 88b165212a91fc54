"""The direct launcher (attention_oracle/fast/launch.py) on a stand-in compiled kernel.

CPU-only checks of its logic: which launches go through Triton's ``JITFunction.run`` and which
through the compiled kernel's own launcher, with which arguments; and that its specialization
key is at least as fine as Triton's own (``native_specialize_impl``), so two launches sharing a
key run the same compiled kernel. On a GPU, ``ATTENTION_ORACLE_FAST_LAUNCH=check`` runs the
real kernels with every direct launch checked against Triton's choice.
"""
import itertools
import types
import warnings

import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from attention_oracle.fast import launch
from attention_oracle.fast.launch import (
    BoundLaunch,
    DirectLauncher,
    set_launch_mode,
    specialization_key,
)


def _kernel(X, n, scale, BLOCK: tl.constexpr, FLAG: tl.constexpr = 3):
    pass


class FakeCompiled:
    """What DirectLauncher reads of a CompiledKernel; records direct launches."""

    def __init__(self, name, log, fail=False):
        self.name, self.log, self.fail = name, log, fail
        self.function, self.packed_metadata = f"fn-{name}", f"meta-{name}"

    def run(self, *a):
        if self.fail:
            raise RuntimeError("launcher exploded")
        self.log.append(("direct", self.name, a))


def launches(log):
    """The launch path of each logged call ("warmup": Triton asked, nothing launched, is left
    out; test_first_direct_launch_is_verified_once looks at those)."""
    return [e[0] for e in log if e[0] != "warmup"]


@pytest.fixture(params=[None, 1], ids=["key", "raw+key"])
def rig(monkeypatch, request):
    """A real JITFunction whose ``run`` is replaced by a recorder, and a launcher with a stand-in
    driver (device 0, stream 77, no launch hooks)."""
    jit = JITFunction(_kernel)
    log, compiled = [], {}

    def run(*args, grid, warmup, **kwargs):
        try:
            spec = specialization_key(args)
        except launch.Unkeyable:
            spec = tuple(map(repr, args))
        key = (spec, tuple(sorted(kwargs.items())))
        kernel = compiled.setdefault(key, FakeCompiled(str(len(compiled)), log))
        log.append(("warmup" if warmup else "triton", kernel.name, args, grid))
        return kernel

    monkeypatch.setattr(jit, "run", run, raising=False)
    launcher = DirectLauncher(jit, n_tensors=request.param)
    launcher.driver = object()
    launcher.device_of = lambda: 0
    launcher.stream = lambda device: 77
    launcher.knobs = types.SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    previous = set_launch_mode("direct")
    yield launcher, log, compiled
    set_launch_mode(previous)


def test_second_launch_is_direct_with_every_parameter(rig):
    launcher, log, _ = rig
    x = torch.empty(64)
    launcher((4, 2), (x, 17, 0.5), {"BLOCK": 32, "num_warps": 4})
    launcher((5,), (x, 17, 0.25), {"BLOCK": 32, "num_warps": 4})
    assert launches(log) == ["triton", "direct"]
    # grid padded to 3, stream, function, metadata, no launch metadata / hooks, then the
    # parameters in signature order with the constexprs (FLAG from its default)
    direct = [e for e in log if e[0] == "direct"][0][2]
    assert direct[:9] == (5, 1, 1, 77, "fn-0", "meta-0", None, None, None)
    assert direct[9] is x and direct[10:] == (17, 0.25, 32, 3)


@pytest.mark.parametrize("change", ["alignment", "dtype", "one", "div16", "int64", "constexpr",
                                    "option"])
def test_a_new_specialization_goes_through_triton(rig, change):
    launcher, log, _ = rig
    buf = torch.empty(64)
    base = dict(x=buf[:16], n=32, kw={"BLOCK": 32, "num_warps": 4})
    changed = dict(base)
    if change == "alignment":
        changed["x"] = buf[1:17]
    elif change == "dtype":
        changed["x"] = torch.empty(16, dtype=torch.float16)
    elif change == "one":
        changed["n"] = 1
    elif change == "div16":
        changed["n"] = 33
    elif change == "int64":
        changed["n"] = 2**33
    elif change == "constexpr":
        changed["kw"] = {"BLOCK": 64, "num_warps": 4}
    else:
        changed["kw"] = {"BLOCK": 32, "num_warps": 8}
    for c in (base, base, changed, changed):
        launcher((1,), (c["x"], c["n"], 1.0), c["kw"])
    assert launches(log) == ["triton", "direct", "triton", "direct"]


def test_raw_lookup_skips_the_key_and_shares_compiled_kernels(monkeypatch):
    """With n_tensors, a repeated launch is found by its raw scalars (no specialization_key),
    and new scalar values of one specialization reuse its compiled kernel without Triton."""
    log = []
    jit = JITFunction(_kernel)
    kernel = FakeCompiled("0", log)

    def run(*args, grid, warmup, **kwargs):
        log.append(("warmup" if warmup else "triton", "0", args, grid))
        return kernel

    monkeypatch.setattr(jit, "run", run, raising=False)
    launcher = DirectLauncher(jit, n_tensors=1)
    launcher.driver, launcher.device_of, launcher.stream = object(), lambda: 0, lambda d: 0
    launcher.knobs = types.SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    x = torch.empty(16)
    launcher((1,), (x, 17, 1.0), {"BLOCK": 16})
    launcher((1,), (x, 17, 1.0), {"BLOCK": 16})
    launcher((1,), (x, 19, 2.0), {"BLOCK": 16})  # same specialization, other values
    assert launches(log) == ["triton", "direct", "direct"]

    def no_key(args):
        raise AssertionError("specialization_key called on a raw hit")
    monkeypatch.setattr(launch, "specialization_key", no_key)
    launcher((1,), (x, 19, 2.0), {"BLOCK": 16})
    assert launches(log)[-1] == "direct"
    launcher((1,), (x, 19.0, 2.0), {"BLOCK": 16})  # 19.0 == 19 but another type: not a raw hit
    assert launches(log)[-1] == "triton"


def test_first_direct_launch_is_verified_once(rig):
    """Outside check mode, Triton is asked (warmup=True) once per compiled kernel; a mismatch
    there sends the launcher to Triton's path with a warning."""
    launcher, log, compiled = rig
    x = torch.empty(16)
    for _ in range(4):
        launcher((1,), (x, 16, 1.0), {"BLOCK": 16})
    assert [e[0] for e in log] == ["triton", "warmup", "direct", "direct", "direct"]
    launcher((1,), (x, 32, 1.0), {"BLOCK": 64})  # another kernel: Triton now says "other"
    for key in list(compiled):
        compiled[key] = FakeCompiled("other", log)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        launcher((1,), (x, 32, 1.0), {"BLOCK": 64})
    assert any("another compiled kernel" in str(w.message) for w in caught)
    assert launches(log)[-1] == "triton" and not launcher.usable


def test_check_mode_raises_on_a_different_kernel(rig):
    launcher, log, compiled = rig
    x = torch.empty(16)
    set_launch_mode("check")
    launcher((1,), (x, 16, 1.0), {"BLOCK": 16})
    launcher((1,), (x, 16, 1.0), {"BLOCK": 16})
    assert [e[0] for e in log] == ["triton", "warmup", "direct"]
    for key in compiled:  # Triton now picks another compiled kernel for the same arguments
        compiled[key] = FakeCompiled("other", log)
    with pytest.raises(RuntimeError, match="another compiled kernel"):
        launcher((1,), (x, 16, 1.0), {"BLOCK": 16})


def test_triton_mode_hooks_and_unkeyable_arguments_take_triton_path(rig):
    launcher, log, _ = rig
    x = torch.empty(16)
    set_launch_mode("triton")
    launcher((1,), (x, 16, 1.0), {"BLOCK": 16})
    launcher((1,), (x, 16, 1.0), {"BLOCK": 16})
    set_launch_mode("direct")
    launcher.knobs.launch_enter_hook = print
    launcher((1,), (x, 16, 1.0), {"BLOCK": 16})
    launcher.knobs.launch_enter_hook = HookChain([print])
    launcher((1,), (x, 16, 1.0), {"BLOCK": 16})
    launcher.knobs.launch_enter_hook = None
    launcher((1,), (x, "not an argument Triton knows", 1.0), {"BLOCK": 16})
    assert launches(log) == ["triton"] * 5


class HookChain:
    """Triton >= 3.5's launch-hook slot: a chain, empty unless a profiler adds a hook."""

    def __init__(self, calls=()):
        self.calls = list(calls)


def test_an_empty_hook_chain_is_no_hook(rig):
    """Triton 3.6 keeps an empty HookChain in knobs.runtime.launch_enter_hook (never None): the
    direct path must still be taken (the first H200 run fell back on every launch)."""
    launcher, log, _ = rig
    launcher.knobs = types.SimpleNamespace(launch_enter_hook=HookChain(),
                                           launch_exit_hook=HookChain())
    x = torch.empty(16)
    for _ in range(3):
        launcher((1,), (x, 16, 1.0), {"BLOCK": 16})
    assert launches(log) == ["triton", "direct", "direct"]


def test_a_failing_direct_launch_falls_back_for_good(rig):
    launcher, log, compiled = rig
    x = torch.empty(16)
    launcher((1,), (x, 16, 1.0), {"BLOCK": 16})
    for kernel in compiled.values():
        kernel.fail = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        launcher((1,), (x, 16, 1.0), {"BLOCK": 16})
    assert any("direct launch failed" in str(w.message) for w in caught)
    launcher((1,), (x, 16, 1.0), {"BLOCK": 16})
    assert launches(log) == ["triton", "triton", "triton"] and not launcher.usable


@pytest.fixture
def bound_rig(rig, monkeypatch):
    """A BoundLaunch over the rig's launcher (one tensor, then n and scale), and a log of the
    calls that went through the launcher itself ("via launcher") rather than the bound path."""
    launcher, log, compiled = rig
    launcher.n_tensors = 1
    inner = launcher._launch

    def counted(grid, args, kwargs):
        log.append(("via launcher",))
        return inner(grid, args, kwargs)
    monkeypatch.setattr(launcher, "_launch", counted)
    return BoundLaunch(launcher, (3, 2), {"BLOCK": 32, "num_warps": 4}), launcher, log, compiled


def paths(log):
    """Per launch: "triton", "direct" (through the launcher) or "bound" (the bound path)."""
    out, via = [], False
    for e in log:
        if e[0] == "via launcher":
            via = True
        elif e[0] in ("triton", "direct"):
            out.append(e[0] if e[0] == "triton" or via else "bound")
            via = False
    return out


def test_bound_launch_is_direct_once_the_launcher_was(bound_rig):
    """Call 1 goes through Triton, call 2 directly through the launcher (verified), later ones
    with the same scalars take the bound path with the launcher's exact arguments; new scalar
    values go through the launcher once and are bound from then on."""
    bound, launcher, log, _ = bound_rig
    x = torch.empty(64)
    for n in (17, 17, 17, 19, 19):
        bound((x, n, 0.5))
    assert paths(log) == ["triton", "direct", "bound", "direct", "bound"]
    launcher((3, 2), (x, 19, 0.5), {"BLOCK": 32, "num_warps": 4})
    direct = [e for e in log if e[0] == "direct"]
    assert direct[-1][2] == direct[-2][2], "the bound path passes other arguments"


@pytest.mark.parametrize("change", ["value", "one", "alignment", "dtype", "triton_mode",
                                    "check_mode", "hook"])
def test_bound_launch_leaves_the_bound_path_on_any_change(bound_rig, change):
    """What could change the compiled kernel or the launch path (another scalar, the value 1,
    a misaligned or other-dtype tensor, another launch mode, a launch hook) goes through the
    launcher. A bound path keyed on less than it checks fails these."""
    bound, launcher, log, _ = bound_rig
    buf = torch.empty(64)
    x, n = buf[:16], 16
    for _ in range(3):
        bound((x, n, 0.5))
    assert paths(log)[-1] == "bound"
    if change == "value":
        n = 48
    elif change == "one":
        n = 1
    elif change == "alignment":
        x = buf[1:17]
    elif change == "dtype":
        x = torch.empty(16, dtype=torch.float16)
    elif change == "triton_mode":
        set_launch_mode("triton")
    elif change == "check_mode":
        set_launch_mode("check")
    else:
        launcher.knobs.launch_enter_hook = print
    del log[:]
    bound((x, n, 0.5))
    assert paths(log) and paths(log)[0] != "bound", f"{change}: the bound path was taken"


@pytest.mark.parametrize("change", [None, "alignment", "rest", "check_mode", "hook",
                                    "misaligned_binding"])
def test_bound_launch_by_addresses(bound_rig, change):
    """BoundLaunch.addresses (a caller whose tensors are validated device tensors of fixed
    dtypes): the bound path gets the addresses as ints, with the arguments the bound launch by
    tensors passes otherwise; a misaligned address, another ``rest`` object, check mode, a
    launch hook or a binding made with a misaligned tensor launches nothing (the caller then
    calls ``fixed``)."""
    bound, launcher, log, _ = bound_rig
    buf = torch.empty(64)
    x = buf[1:17] if change == "misaligned_binding" else buf[:16]
    for _ in range(3):
        bound((x, 16, 0.5))
    rest = bound.bound[1]
    by_tensor = [e for e in log if e[0] == "direct"][-1][2]
    ptr = x.data_ptr()
    if change == "alignment":
        ptr += 4
    elif change == "rest":
        rest = (16, 0.5)
    elif change == "check_mode":
        set_launch_mode("check")
    elif change == "hook":
        launcher.knobs.launch_enter_hook = print
    del log[:]
    launched = bound.addresses((ptr,), 0, rest)
    if change is None:
        assert launched and paths(log) == ["bound"]
        args = log[-1][2]
        assert args[9] == ptr and args[10:] == by_tensor[10:]
    else:
        assert not launched and not log, f"{change}: the bound path was taken"


def test_bound_launch_follows_a_failure_to_the_launcher(bound_rig):
    bound, launcher, log, compiled = bound_rig
    x = torch.empty(16)
    for _ in range(3):
        bound((x, 16, 1.0))
    for kernel in compiled.values():
        kernel.fail = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bound((x, 16, 1.0))
    assert any("direct launch failed" in str(w.message) for w in caught)
    assert paths(log)[-1] == "triton" and not launcher.usable


def test_interpreted_functions_never_launch_directly():
    assert not DirectLauncher(object()).usable


INTS = [0, 1, 2, 15, 16, 17, 32, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16,
        -2**31, -2**31 - 1, -2**31 - 16, 2**62, 2**63 - 1, 2**63, 2**63 + 16, 2**64 - 16]


def _tensors():
    buf = torch.empty(128)
    return [buf[:8], buf[1:9], buf[4:12], torch.empty(8, dtype=torch.float16),
            torch.empty(8, dtype=torch.bfloat16), torch.empty(8, dtype=torch.uint8)[1:],
            torch.empty(8, dtype=torch.int32)]


def _triton_specialization(a, specialize=True):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    return native_specialize_impl(BaseBackend, a, False, specialize, True)


def test_key_is_at_least_as_fine_as_tritons():
    """Equal keys imply equal Triton specializations (pairs of ints, of tensors, and mixed
    types: floats, bools, None)."""
    values = INTS + _tensors() + [0.5, 3.0, True, False, None]
    for a, b in itertools.combinations(values, 2):
        if specialization_key((a,)) == specialization_key((b,)):
            for spec in (True, False):
                assert _triton_specialization(a, spec) == _triton_specialization(b, spec), (a, b)


def _descriptors():
    """Gluon TMA descriptors (host objects) over CPU tensors: other bases, shapes and strides
    (not specialized on), other dtypes, block shapes and layouts (specialized on)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    buf = torch.zeros(4096, dtype=torch.bfloat16)
    out = []
    for dtype, gl_dtype in ((torch.bfloat16, gl.bfloat16), (torch.float16, gl.float16)):
        for block in ([64, 64], [128, 64], [64, 128]):
            layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype)
            for base, shape in ((buf.to(dtype), [16, 256]), (buf[8:].to(dtype), [8, 128])):
                out.append(TensorDescriptor(base, shape, [shape[1], 1], block, layout))
    return out


def test_descriptor_key_is_at_least_as_fine_as_tritons():
    """Host tensor descriptors: equal keys imply equal Triton specializations, and every
    dtype x block shape (with its layout) gets its own key, which two bases share (a
    descriptor is no Unkeyable argument)."""
    try:
        descs = _descriptors()
    except ImportError:
        pytest.skip("this Triton has no Gluon TensorDescriptor")
    keys = {}
    for a, b in itertools.combinations(descs, 2):
        if specialization_key((a,)) == specialization_key((b,)):
            assert _triton_specialization(a) == _triton_specialization(b), (a, b)
    for d in descs:
        keys.setdefault(specialization_key((d,)), set()).add(_triton_specialization(d))
    assert len(keys) == 6 and all(len(v) == 1 for v in keys.values()), keys


def test_descriptor_key_control_detects_a_coarser_key(monkeypatch):
    """Negative control for the descriptor test: a key that forgets the block shape fails it."""
    monkeypatch.setattr(launch, "_descriptor_key", lambda a: ("tensordesc", a.base.dtype))
    monkeypatch.setattr(launch, "_DESCRIPTOR_CLASSES", set())
    with pytest.raises(AssertionError):
        test_descriptor_key_is_at_least_as_fine_as_tritons()


def test_key_control_detects_a_coarser_key(monkeypatch):
    """Negative control for the test above: a key that forgets divisibility by 16 fails it."""
    monkeypatch.setattr(launch, "_int_code", lambda a: 0 if -2**31 <= a < 2**31 else 2)
    with pytest.raises(AssertionError):
        test_key_is_at_least_as_fine_as_tritons()


ON_GPU = torch.cuda.is_available()


KINDS = ["plain", "causal", "bool", "additive", "gqa_e40", "misaligned", "strided"]
DTYPE_NAMES = ["bfloat16", "float16", "float32"]


def _sdpa_case(dtype_name, kind):
    """(q, k, v, kwargs) of one launch-specialization case: masks, causal, GQA with an odd head
    dim, a 16-byte-misaligned view, a strided (head-major) query."""
    dtype = getattr(torch, dtype_name)
    g = torch.Generator(device="cuda").manual_seed(3)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    q, k, v = rnd(2, 4, 67, 64), rnd(2, 4, 80, 64), rnd(2, 4, 80, 64)
    if kind == "causal":
        return q, k, v, {"is_causal": True}
    if kind == "bool":
        return q, k, v, {"attn_mask": rnd(67, 80) > 0}
    if kind == "additive":
        return q, k, v, {"attn_mask": rnd(2, 1, 67, 80)}
    if kind == "gqa_e40":
        kv = rnd(2, 2, 80, 40)
        return rnd(2, 4, 33, 40), kv, kv, {"enable_gqa": True}
    if kind == "misaligned":
        return rnd(2 * 4 * 67 * 64 + 1)[1:].view(2, 4, 67, 64), k, v, {}
    if kind == "strided":
        return rnd(2, 67, 4, 64).transpose(1, 2), k, v, {}
    return q, k, v, {}


def _run(fn, q, k, v, kw, dout_seed):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, **kw)
    g = torch.Generator(device="cuda").manual_seed(dout_seed)
    dout = torch.randn(out.shape, device="cuda", generator=g).to(out.dtype)
    return (out, *torch.autograd.grad(out, leaves, dout))


@pytest.mark.skipif(not ON_GPU, reason="direct launches need a CUDA device")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
def test_direct_launches_match_tritons_on_gpu(dtype_name, kind):
    """The case three times in check mode (each direct launch asks Triton which compiled kernel
    it would run), then three times in direct mode (a call plan's launches bound from the
    third call on, launch.BoundLaunch), bitwise equal to Triton's own launches; the direct
    path was taken."""
    from attention_oracle.fast import sdpa as fast
    launchers = [fast._FWD.direct, fast._DKDV.direct, fast._DQ.direct, fast._PRE]
    q, k, v, kw = _sdpa_case(dtype_name, kind)
    set_launch_mode("triton")
    try:
        expected = _run(fast.scaled_dot_product_attention, q, k, v, kw, 5)
        set_launch_mode("check")
        before = sum(la.direct_launches for la in launchers)
        for _ in range(3):
            got = _run(fast.scaled_dot_product_attention, q, k, v, kw, 5)
            for what, a, b in zip(("out", "dq", "dk", "dv"), got, expected):
                assert torch.equal(a, b), f"{what} differs from Triton's own launch"
        assert sum(la.direct_launches for la in launchers) > before, "no direct launch"
        set_launch_mode("direct")
        for _ in range(3):
            got = _run(fast.scaled_dot_product_attention, q, k, v, kw, 5)
            for what, a, b in zip(("out", "dq", "dk", "dv"), got, expected):
                assert torch.equal(a, b), f"{what} differs from Triton's own launch (direct mode)"
    finally:
        set_launch_mode("direct")


def test_installed_tritons_default_hooks_count_as_none():
    """The Triton installed here (3.8 in CI; 3.6 on the H200) leaves no launch hook set."""
    from triton import knobs
    assert not launch._installed(knobs.runtime.launch_enter_hook)
    assert not launch._installed(knobs.runtime.launch_exit_hook)
    assert launch._installed(HookChain([print])) and launch._installed(print)


def test_sdpa_launchers_declare_their_leading_tensors():
    """Each SDPA launcher's n_tensors covers exactly the kernel's tensor parameters (the
    strides follow them): a wrong count would silently send every launch to Triton's path."""
    import inspect

    from attention_oracle.fast import dsa, index
    from attention_oracle.fast import sdpa as fast
    launchers = [(d, lambda x: not x.startswith("s_"))
                 for d in (fast._FWD.direct, fast._DKDV.direct, fast._DQ.direct, fast._PRE)]
    launchers += [(d, lambda x: x.endswith("_ptr"))
                  for d in (dsa._FWD_LAUNCH, dsa._BWD_LAUNCH, index._OFFSET_LAUNCH)]
    for direct, is_pointer in launchers:
        fn = getattr(direct.jit, "fn", direct.jit)
        names = list(inspect.signature(fn).parameters)
        n = direct.n_tensors
        assert all(map(is_pointer, names[:n])) and not is_pointer(names[n]), (n, names)


@pytest.mark.skipif(not ON_GPU, reason="direct launches need a CUDA device")
@pytest.mark.parametrize("rope", [True, False], ids=["rope", "nope"])
def test_direct_dsa_and_index_launches_match_tritons_on_gpu(rope):
    """fast DSA (varlen entry: index preparation, forward, backward) three times in check mode
    against Triton's own launches: outputs, lse, index rows and dq bitwise; the key gradients
    (fp32 atomics in a free order, then rounded to bf16) to one bf16 ulp."""
    from attention_oracle.fast import dsa, index
    g = torch.Generator(device="cuda").manual_seed(4)
    T, H, S, K = 6, 16, 40, 48
    ql = torch.randn(T, H, 512, device="cuda", generator=g).to(torch.bfloat16)
    qr = torch.randn(T, H, 64, device="cuda", generator=g).to(torch.bfloat16)
    kv = torch.randn(S, 576, device="cuda", generator=g).to(torch.bfloat16)
    local = torch.randint(-2, S, (T, K), device="cuda", dtype=torch.int32, generator=g)
    cu_q = torch.tensor([0, 2, T], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, 15, S], device="cuda", dtype=torch.int32)

    def step():
        leaves = [t.detach().clone().requires_grad_() for t in ((ql, qr, kv) if rope else (ql, kv))]
        if rope:
            a, b, c = leaves
            out, lse = dsa.dsa_sparse_attention_varlen(a, b, c[:, :512], c[:, 512:], local, cu_q,
                                                       cu_k, softmax_scale=0.05, return_lse=True)
        else:
            a, c = leaves
            out, lse = dsa.dsa_sparse_attention_nope_varlen(a, c[:, :512], local, cu_q, cu_k,
                                                            softmax_scale=0.05, return_lse=True)
        rows = index.offset_gather_kv_indices(local, cu_q, cu_k, compact=True,
                                              return_topk_length=True)
        grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
        return (out, lse, *rows, grads[0]), grads[1:]

    launchers = [dsa._FWD_LAUNCH, dsa._BWD_LAUNCH, index._OFFSET_LAUNCH]
    set_launch_mode("triton")
    try:
        exact, close = step()
        set_launch_mode("check")
        before = sum(la.direct_launches for la in launchers)
        for _ in range(3):
            got_exact, got_close = step()
            for a, b in zip(got_exact, exact):
                assert torch.equal(a, b), "differs from Triton's own launch"
            for a, b in zip(got_close, close):
                torch.testing.assert_close(a.float(), b.float(), rtol=8e-3, atol=1e-3)  # 1 bf16 ulp
        assert sum(la.direct_launches for la in launchers) > before, "no direct launch"
    finally:
        set_launch_mode("direct")


def test_build_guard_falls_back_once_and_says_why():
    """A launch that fails to build (OutOfResources, CompilationError) turns its path off with
    one warning naming the error; a launch error of any other kind is not a build failure and
    propagates; a working launch returns True."""
    from triton.runtime.errors import OutOfResources
    ran = []
    guard = launch.BuildGuard("a Gluon kernel")
    assert guard(lambda *args: ran.append(args), 1, 2) and ran == [(1, 2)]
    assert guard(lambda: False) is False and guard.failure is None, "a declined call"
    with pytest.raises(ZeroDivisionError):
        guard(lambda: 1 / 0)
    assert guard.failure is None

    def too_big():
        raise OutOfResources(300000, 232448, "shared memory")

    with pytest.warns(RuntimeWarning, match="a Gluon kernel failed to build.*shared memory"):
        assert not guard(too_big)
    assert "OutOfResources" in guard.failure
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not guard(lambda *args: ran.append(args), 3)  # off: not run, no second warning
    assert ran == [(1, 2)]


def test_build_guard_takes_a_failed_lowering_pass_for_a_build_failure():
    """Triton reports a pass of its MLIR pipeline that failed (a lowering bug of one release,
    F78: Triton 3.6 on a rank-3 TMA reduction) as a RuntimeError naming PassManager::run,
    before the kernel runs: the path falls back. Any other RuntimeError (a CUDA launch error,
    say) propagates and leaves the path on."""
    guard = launch.BuildGuard("a Gluon kernel")

    def launch_error():
        raise RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        guard(launch_error)
    assert guard.failure is None

    def lowering_fails():
        raise RuntimeError("PassManager::run failed")

    with pytest.warns(RuntimeWarning, match="a Gluon kernel failed to build.*PassManager"):
        assert not guard(lowering_fails)
    assert guard.failure == "RuntimeError: PassManager::run failed"


def test_tma_descriptor_cache_keeps_equal_encodings():
    """The opt-in cache (a stand-in driver module): equal arguments (lists as tuples) return the
    first encoding, other arguments encode anew, and turning it off restores the encoder."""
    encoded = []

    def fill_tma_descriptor(ptr, swizzle, elem, dtype, block, shape, strides, padding):
        encoded.append(ptr)
        return object()

    utils = types.SimpleNamespace(fill_tma_descriptor=fill_tma_descriptor)
    assert not launch.set_tma_descriptor_cache(True, utils)
    args = (4096, 3, 2, 10, [1, 1, 1, 64, 128], [1, 1, 2, 128, 128], [1, 1, 16384, 128, 1], 0)
    first = utils.fill_tma_descriptor(*args)
    assert utils.fill_tma_descriptor(*args) is first
    other = utils.fill_tma_descriptor(8192, *args[1:])
    assert other is not first and encoded == [4096, 8192]
    assert launch.set_tma_descriptor_cache(False, utils)
    assert utils.fill_tma_descriptor is fill_tma_descriptor


# ---------------------------------------------------------------- TMA descriptors, expanded here

TMA_DTYPE_DEVICE_TO_HOST = {1: 10}  # what tma_expansion reads from the launcher's module
_TMA_META = {"swizzle": 3, "elem_size": 2, "elem_type": 1, "block_size": [1, 64, 128]}


def _tma_kernel(A, B, X, n, scale, BLOCK: tl.constexpr, FLAG: tl.constexpr = 3):
    pass


def _fill_tma_descriptor_tiled(ptr, swizzle, elem, dtype, block, shape, strides, padding):
    """A stand-in encoder: the "tensor map" is its arguments as bytes."""
    return repr((ptr, swizzle, elem, dtype, block, shape, strides, padding)).encode()


def _make_tensordesc_arg(arg, meta):
    """Triton's expansion of one descriptor (tiled, no padding): map, shape, strides."""
    tensor_map = _fill_tma_descriptor_tiled(
        arg.base.data_ptr(), meta["swizzle"], meta["elem_size"],
        TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]], meta["block_size"], list(arg.shape),
        list(arg.strides), 0)
    return [tensor_map, *arg.shape, *arg.strides]


def _addressed(args, *tensors):
    """``args`` with each of ``tensors`` replaced by its address (what the bound path passes)."""
    return tuple(next((t.data_ptr() for t in tensors if a is t), a) for a in args)


class FakeCudaLauncher:
    """Laid out as Triton's CudaLauncher: ``launch`` is a closure over the raw C launcher and
    the descriptors' metadata that expands each descriptor argument first."""

    def __init__(self, raw, metas, make=_make_tensordesc_arg):
        launcher, tensordesc_meta, make_tensordesc_arg = raw, metas, make

        def inner(*args):
            base, kernel_args = args[:9], args[9:]  # grid, stream, function, metadata, hooks
            final = []
            for i, a in enumerate(kernel_args):
                if i < len(tensordesc_meta):
                    final.extend(make_tensordesc_arg(a, tensordesc_meta[i]))
                else:
                    final.append(a)
            return launcher(*base, *final)
        self.launch = inner

    def __call__(self, grid_x, grid_y, grid_z, stream, function, *args):
        self.launch(grid_x, grid_y, grid_z, stream, function, *args)


class FakeDescriptor:
    """What the launcher reads of a host TensorDescriptor."""

    def __init__(self, fields, base):
        self.base, self.padding = base, "zero"
        self.shape, self.strides = fields["shape"], fields["strides"]
        self.block_shape, self.layout = fields["block_shape"], fields["layout"]


def _tma_fields(rows):
    return {"shape": [2, rows, 128], "strides": [rows * 128, 128, 1], "block_shape": [1, 64, 128],
            "layout": "nvmma"}


@pytest.fixture
def tma_rig(monkeypatch):
    """A TmaBoundLaunch over a real JITFunction whose ``run`` hands out compiled kernels laid
    out as Triton's (two descriptors, then a tensor and two scalars), a log of the raw
    launcher's calls and of the launches through the launcher."""
    jit = JITFunction(_tma_kernel)
    log, compiled = [], {}
    monkeypatch.setattr(launch, "TMA_DTYPE_DEVICE_TO_HOST", TMA_DTYPE_DEVICE_TO_HOST,
                        raising=False)

    def raw(*args):
        log.append(("raw", args))

    def run(*args, grid, warmup, **kwargs):
        key = (specialization_key(args), tuple(sorted(kwargs.items())))
        if key not in compiled:
            kernel = types.SimpleNamespace(function="fn", packed_metadata="meta",
                                           run=FakeCudaLauncher(raw, [_TMA_META, _TMA_META]))
            compiled[key] = kernel
        if not warmup:
            log.append(("triton", args))
            compiled[key].run(*grid, 1, 77, "fn", "meta", None, None, None, *args)
        return compiled[key]

    monkeypatch.setattr(jit, "run", run, raising=False)
    launcher = DirectLauncher(jit)
    launcher.driver = object()
    launcher.device_of = lambda: 0
    launcher.stream = lambda device: 77
    launcher.knobs = types.SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    utils = types.SimpleNamespace(fill_tma_descriptor_tiled=_fill_tma_descriptor_tiled)
    bound = launch.TmaBoundLaunch(launcher, (3, 2), {"BLOCK": 32}, (_tma_fields(64),
                                                                    _tma_fields(96)),
                                  FakeDescriptor, utils=utils)
    # tma_expansion reads the encoder's dtype table from the launcher's module: this one
    monkeypatch.setattr(FakeCudaLauncher, "__module__", __name__)
    previous = set_launch_mode("direct")
    yield bound, launcher, log
    set_launch_mode(previous)


def test_tma_bound_launch_expands_the_descriptors_as_triton_does(tma_rig):
    """Call 1 goes through Triton, call 2 directly through the launcher (whose wrapper expands
    the descriptors), later ones on the bound path: the raw launcher gets the same expanded
    arguments from both (tensor maps of the new bases, shapes, strides, then the tensor and
    the scalars in place)."""
    bound, launcher, log = tma_rig
    a, b, x = torch.empty(2, 64, 128), torch.empty(2, 96, 128), torch.empty(16)
    rest = (7, 0.5)
    for _ in range(4):
        bound.fixed((a, b), (x, ), rest)
    assert bound.failure is None and bound.bound is not None
    raws = [e[1] for e in log if e[0] == "raw"]
    assert [e[0] for e in log].count("triton") == 1 and len(raws) == 4
    assert launcher.direct_launches == 3
    assert _addressed(raws[1], x) == raws[2] == raws[3], "the bound path passes other arguments"
    a2, x2 = torch.empty(2, 64, 128), torch.empty(16)
    bound.fixed((a2, b), (x2, ), rest)
    mine = [e[1] for e in log if e[0] == "raw"][-1]
    expected = (3, 2, 1, 77, "fn", "meta", None, None, None,
                *_make_tensordesc_arg(FakeDescriptor(_tma_fields(64), a2), _TMA_META),
                *_make_tensordesc_arg(FakeDescriptor(_tma_fields(96), b), _TMA_META),
                x2.data_ptr(), 7, 0.5)
    assert mine[:len(expected)] == expected
    assert mine[len(expected):] == (32, 3), "the constexprs after the arguments"


def test_tma_bound_launch_puts_tensors_in_their_slots(tma_rig):
    bound, _, log = tma_rig
    bound.tensor_slots = (1, )
    a, b, x = torch.empty(2, 64, 128), torch.empty(2, 96, 128), torch.empty(16)
    for _ in range(3):
        bound.fixed((a, b), (x, ), (7, 0.5))
    raws = [e[1] for e in log if e[0] == "raw"]
    assert raws[-1][-5:-2] == (7, x.data_ptr(), 0.5) and raws[-1][:-5] == raws[-2][:-5]


def test_typed_tma_bound_launch_checks_keys_only_at_new_addresses(tma_rig):
    """Told its caller's tensors keep their dtypes (``typed``), a launch on the last launch's
    addresses reuses its arguments without comparing keys; at a new address a tensor of
    another dtype still leaves the bound path."""
    bound, launcher, log = tma_rig
    bound.typed = True
    a, b, x = torch.empty(2, 64, 128), torch.empty(2, 96, 128), torch.empty(16)
    for _ in range(3):
        bound.fixed((a, b), (x, ), (7, 0.5))
    kept, launches = bound.last, launcher.direct_launches
    bound.fixed((a, b), (x, ), (7, 0.5))
    assert bound.last is kept and launcher.direct_launches == launches + 1
    x2 = torch.empty(16, dtype=torch.int32)
    bound.fixed((a, b), (x2, ), (7, 0.5))
    assert [e[0] for e in log].count("triton") == 2, "a new dtype at a new address was bound"


def test_tma_bound_launch_keeps_the_arguments_of_the_last_addresses(tma_rig):
    """A call on the addresses of the call before launches with the very argument tuple it
    made; a tensor at a new address gets its own (its address in place), and a tensor of
    another dtype at a kept address leaves the bound path."""
    bound, launcher, log = tma_rig
    a, b, x = torch.empty(2, 64, 128), torch.empty(2, 96, 128), torch.empty(16)
    for _ in range(3):
        bound.fixed((a, b), (x, ), (7, 0.5))
    kept = bound.last
    bound.fixed((a, b), (x.view(4, 4), ), (7, 0.5))  # another tensor, the same addresses
    assert bound.last is kept
    x2 = torch.empty(16)
    bound.fixed((a, b), (x2, ), (7, 0.5))
    raws = [e[1] for e in log if e[0] == "raw"]
    assert bound.last is not kept and raws[-1][-5:-2] == (x2.data_ptr(), 7, 0.5)
    launches = launcher.direct_launches
    bound.fixed((a, b), (x2.view(torch.int32), ), (7, 0.5))
    assert [e[0] for e in log].count("triton") == 2 and launcher.direct_launches == launches, (
        "a tensor of another dtype took the bound path")


@pytest.mark.parametrize("change", ["encoder", "layout"])
def test_tma_bound_launch_refuses_an_expansion_unlike_tritons(tma_rig, change):
    """An encoder whose maps differ from Triton's, or a launcher without the expected closure,
    is never bound: every call goes through the launcher (the reason is kept)."""
    bound, launcher, log = tma_rig
    if change == "encoder":
        bound.utils = types.SimpleNamespace(
            fill_tma_descriptor_tiled=lambda *args: _fill_tma_descriptor_tiled(*args) + b"!")
    else:
        original = launcher.jit.run

        def unwrapped(*args, **kwargs):
            kernel = original(*args, **kwargs)
            kernel.run.launch = lambda *a: log.append(("raw", a))
            return kernel
        launcher.jit.run = unwrapped
    a, b, x = torch.empty(2, 64, 128), torch.empty(2, 96, 128), torch.empty(16)
    for _ in range(4):
        bound.fixed((a, b), (x, ), (7, 0.5))
    assert bound.bound is None and bound.failure
    assert launcher.direct_launches == 3  # through the launcher's own path, never bound


@pytest.mark.parametrize("change", ["rest", "dtype", "alignment", "triton_mode", "hook"])
def test_tma_bound_launch_leaves_the_bound_path_on_any_change(tma_rig, change):
    """Another ``rest`` object, a tensor of another dtype or alignment (not a base: a
    misaligned base launches nothing, below), Triton's launch mode or a launch hook: the
    call goes through the launcher."""
    bound, launcher, log = tma_rig
    buf = torch.empty(2 * 64 * 128 + 1)
    a, b, x = buf[:2 * 64 * 128].view(2, 64, 128), torch.empty(2, 96, 128), torch.empty(16)
    rest = (7, 0.5)
    for _ in range(3):
        bound.fixed((a, b), (x, ), rest)
    before = launcher.direct_launches
    calls = []
    inner = launcher._launch
    launcher._launch = lambda *args: calls.append(1) or inner(*args)
    if change == "rest":
        rest = tuple([7, 0.5])  # equal values, another object: the launcher decides
    elif change == "dtype":
        x = torch.empty(16, dtype=torch.float16)
    elif change == "alignment":
        x = torch.empty(17)[1:]
    elif change == "triton_mode":
        set_launch_mode("triton")
    else:
        launcher.knobs.launch_enter_hook = print
    assert bound.fixed((a, b), (x, ), rest)
    assert calls, f"{change}: the bound path was taken"
    assert launcher.direct_launches <= before + 1


@pytest.mark.parametrize("when", ["unbound", "bound"])
def test_tma_bound_launch_declines_a_misaligned_base(tma_rig, when):
    """A base 4 bytes past a 16-byte boundary (TMA needs 16) launches nothing, neither bound
    nor through the launcher, and ``fixed`` returns False (the caller runs another kernel);
    before the call site is bound and after, and an aligned call after it is bound again. A
    misaligned tensor after the bases is not a base: it only leaves the bound path."""
    bound, launcher, log = tma_rig
    buf = torch.empty(2 * 64 * 128 + 1)
    a, b, x = buf[:2 * 64 * 128].view(2, 64, 128), torch.empty(2, 96, 128), torch.empty(16)
    rest = (7, 0.5)
    for _ in range(3 if when == "bound" else 0):
        assert bound.fixed((a, b), (x, ), rest)
    before = len(log)
    assert bound.fixed((buf[1:].view(2, 64, 128), b), (x, ), rest) is False
    assert len(log) == before, "a misaligned base was launched"
    assert bound.fixed((a, b), (x, ), rest) and len(log) > before
    assert bound.fixed((a, b), (torch.empty(17)[1:], ), rest)


def test_tma_bound_launch_encodes_each_address_once(tma_rig):
    """On the bound path a descriptor's map is encoded once per base address (a map is a
    function of the address and the fixed fields alone): a repeated address reuses it, a new
    one is encoded, and the raw launcher gets the map of the call's own address."""
    bound, _, log = tma_rig
    encoded = []

    def counting(ptr, *args):
        encoded.append(ptr)
        return _fill_tma_descriptor_tiled(ptr, *args)
    bound.utils = types.SimpleNamespace(fill_tma_descriptor_tiled=counting)
    a, b, x = torch.empty(2, 64, 128), torch.empty(2, 96, 128), torch.empty(16)
    rest = (7, 0.5)
    for _ in range(2):
        bound.fixed((a, b), (x, ), rest)
    assert bound.bound is not None
    del encoded[:]
    for _ in range(3):
        bound.fixed((a, b), (x, ), rest)
    assert encoded == [a.data_ptr(), b.data_ptr()]
    a2 = torch.empty(2, 64, 128)
    bound.fixed((a2, b), (x, ), rest)
    assert encoded[-1] == a2.data_ptr() and len(encoded) == 3
    raw = [e[1] for e in log if e[0] == "raw"][-1]
    assert raw[9] == _make_tensordesc_arg(FakeDescriptor(_tma_fields(64), a2), _TMA_META)[0]
