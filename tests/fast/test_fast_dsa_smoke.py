"""Quick correctness checks of fast/dsa.py and fast/index.py against a naive torch gather.

The reference here is deliberately tiny and independent of oracle/: gold is the gather math
in float64, lp the same math in the kernel's dtype (fp32 softmax) beside the oracle's standard
algorithms in that dtype (the rule's lp ensemble and its floor's magnitudes), and the agreement rule of
docs/CONTRACT.md "5. The agreement rule" decides. On a CPU-only machine the kernels run under Triton's interpreter
(fp32/fp16 only: the interpreter computes bf16 wrongly); on a GPU bf16 is checked too.
"""
import contextlib
import math
import os

import pytest
import torch
import triton
import triton.language as tl

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import attention_oracle.fast.dsa as fdsa  # noqa: E402
from attention_oracle.checks.dsa.checks import lp_references  # noqa: E402
from attention_oracle.fast.index import offset_gather_kv_indices  # noqa: E402
from attention_oracle.fast.kernels.dsa_common import _bf16_value  # noqa: E402
from attention_oracle.judge import agreement
from attention_oracle.oracle.dsa import dsa_reference  # noqa: E402
from tests.fast.tf32x3_emulation import emulated_tf32x3  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


# ----------------------------------------------------------------------------- reference

def naive_dsa(q, qr, kv, kr, idx, topk_length, scale):
    """Gather attention in the dtype of q (softmax in fp32); returns (out, lse)."""
    T, H, _ = q.shape
    S, K = kv.shape[0], idx.shape[1]
    valid = (idx >= 0) & (idx < S)
    if topk_length is not None:
        valid &= torch.arange(K, device=idx.device)[None, :] < topk_length[:, None]
    rows = torch.where(valid, idx, 0).long()
    keys = kv[rows]  # [T, K, Dl]
    s = torch.einsum("thd,tkd->thk", q, keys)
    if qr is not None:
        s = s + torch.einsum("thd,tkd->thk", qr, kr[rows])
    s = s.float() * scale if q.dtype != torch.float64 else s * scale
    mask = valid[:, None, :].expand(T, H, K)
    nonempty = valid.any(-1)[:, None, None]
    s = torch.where(mask, s, float("-inf"))
    s = torch.where(nonempty, s, 0.0)  # keeps softmax finite on empty rows (masked below)
    p = torch.softmax(s, -1) * mask
    lse = torch.where(nonempty[..., 0], torch.logsumexp(s, -1), float("-inf"))
    out = torch.einsum("thk,tkd->thd", p.to(q.dtype), keys)
    return out, lse.float()


def grads_of(fn, inputs, dout):
    inputs = [x.detach().requires_grad_(True) for x in inputs]
    out, lse = fn(*inputs)
    grads = torch.autograd.grad(out, inputs, dout.to(out.dtype), allow_unused=True)
    return out.detach(), lse.detach(), [g if g is not None else torch.zeros_like(x)
                                        for g, x in zip(grads, inputs)]


def assert_agrees(name, impl, gold, lp, dtype, k, magnitude):
    """The suite's agreement rule (``agreement.assert_agrees``, docs/agreement-rule.md): ``lp``
    one tensor or {algorithm: tensor}, the floor 4 eps(dtype) times ``magnitude`` (the oracle's
    sum of absolute terms behind an element; it matters where a result cancels to 0, as dq
    of a single-key row)."""
    impl = impl.double().cpu()
    assert torch.equal(torch.isfinite(impl), torch.isfinite(gold.cpu())), f"{name}: non-finite pattern differs"
    lp = {a: t.cpu() for a, t in lp.items()} if isinstance(lp, dict) else lp.cpu()
    agreement.assert_agrees(impl, gold.double().cpu(), lp, check="smoke.fast_dsa", impl="fast",
                            name=name, dtype=dtype, gradient=k == 3, magnitude=magnitude,
                            repro="pytest tests/test_fast_dsa_smoke.py")


def oracle_terms(base, idx, topk_length, scale, dout, dtype):
    """The oracle's lp runs (its standard algorithms in ``dtype``, ``dsa.checks.lp_references``)
    and its float64 magnitudes, under this file's names: out, lse, grad0.. (the inputs' order)."""
    rope = len(base) == 4
    args = list(base) if rope else [base[0], None, base[1], None]
    args = [None if t is None else t.detach() for t in args]
    kw = dict(topk_length=topk_length, softmax_scale=scale)
    gold = dsa_reference(*[None if t is None else t.double() for t in args], idx, dout.double(), **kw)
    runs = lp_references(*[None if t is None else t.to(dtype) for t in args], idx, dout.to(dtype),
                         compute_dtype=dtype, **kw)
    names = (["dq_latent", "dq_rope", "dkv_latent", "dk_rope"] if rope else ["dq_latent", "dkv_latent"])
    ours = ["out", "lse"] + [f"grad{i}" for i in range(len(names))]
    theirs = ["out", "lse"] + names
    lp = {o: {a: r[t] for a, r in runs.items()} for o, t in zip(ours, theirs)}
    return lp, {o: gold["magnitude"][t] for o, t in zip(ours, theirs)}


# ----------------------------------------------------------------------------- cases

def make_case(T, H, DL, DR, S, K, dtype, seed, hole_rate=0.3, with_len=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, DL, generator=g)
    qr = torch.randn(T, H, DR, generator=g) if DR else None
    kv = torch.randn(S, DL, generator=g)
    kr = torch.randn(S, DR, generator=g) if DR else None
    idx = torch.randint(0, S, (T, K), generator=g)
    holes = torch.rand(T, K, generator=g) < hole_rate
    idx = torch.where(holes, torch.randint(-3, 0, (T, K), generator=g), idx)
    idx[::3, ::4] = S + 2  # out of range: invalid
    if T > 1 and K > 1:
        idx[1, 1] = idx[1, 0] = 0  # duplicates count twice
        idx[0] = -1  # an empty row
    topk_length = torch.randint(0, K + 2, (T,), generator=g) if with_len else None
    dout = torch.randn(T, H, DL, generator=g)
    to = lambda x: None if x is None else x.to(DEVICE)  # noqa: E731
    return dict(q=to(q), qr=to(qr), kv=to(kv), kr=to(kr), idx=to(idx.int()),
                topk_length=to(topk_length.int()) if with_len else None, dout=to(dout),
                dtype=dtype, scale=1.0 / math.sqrt(DL + DR) * 1.3)


def check_case(c, idx=None, dout_layout=None, packed=False):
    dtype, scale, tl_ = c["dtype"], c["scale"], c["topk_length"]
    idx = c["idx"] if idx is None else idx
    rope = c["qr"] is not None
    base = [c["q"], c["qr"], c["kv"], c["kr"]] if rope else [c["q"], c["kv"]]

    def ref(*xs):
        if rope:
            return naive_dsa(xs[0], xs[1], xs[2], xs[3], idx, tl_, scale)
        return naive_dsa(xs[0], None, xs[1], None, idx, tl_, scale)

    def fast_fn(*xs):
        if rope:
            return fdsa.dsa_sparse_attention(*xs, idx, topk_length=tl_, softmax_scale=scale,
                                             return_lse=True)
        return fdsa.dsa_sparse_attention_nope(*xs, idx, topk_length=tl_, softmax_scale=scale,
                                              return_lse=True)

    gold = grads_of(ref, [x.double() for x in base], c["dout"].double())
    lp = grads_of(ref, [x.to(dtype) for x in base], c["dout"])
    inputs = [x.to(dtype) for x in base]
    if packed and rope:  # trainer layouts: key rows in one [S, 576]-like buffer, q_rope a slice
        T, H, DL = inputs[0].shape
        DR = inputs[1].shape[2]
        buf = torch.zeros(inputs[2].shape[0], DL + DR + 5, dtype=dtype, device=DEVICE)
        buf[:, :DL], buf[:, DL:DL + DR] = inputs[2], inputs[3]
        qbuf = torch.zeros(T, H, DR + 7, dtype=dtype, device=DEVICE)
        qbuf[:, :, 7:] = inputs[1]
        inputs = [inputs[0], qbuf[:, :, 7:], buf[:, :DL], buf[:, DL:DL + DR]]
    dout = c["dout"].to(dtype)
    if dout_layout == "head_major":
        dout = dout.transpose(0, 1).contiguous().transpose(0, 1)
    elif dout_layout == "stride0":
        dout = dout[:1, :1, :].expand_as(dout)
    dout_before = dout.clone()
    leaves = [x.detach().requires_grad_(True) for x in inputs]
    out, lse = fast_fn(*leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    assert torch.equal(dout, dout_before), "dout was modified"
    if dout_layout == "stride0":  # the reference saw the materialised broadcast
        gold = grads_of(ref, [x.double() for x in base], dout.double())
        lp = grads_of(ref, [x.to(dtype) for x in base], dout)
    assert out.dtype == dtype and lse.dtype == torch.float32
    ens, mag = oracle_terms(base, idx, tl_, scale, dout.to(c["dout"].dtype), dtype)
    assert_agrees("out", out, gold[0], {"naive-autograd": lp[0], **ens["out"]}, dtype, 2, mag["out"])
    assert_agrees("lse", lse, gold[1], {"naive-autograd": lp[1], **ens["lse"]}, dtype, 2, mag["lse"])
    for i, (gi, gg, gl) in enumerate(zip(grads, gold[2], lp[2])):
        name = f"grad{i}"
        assert_agrees(name, gi, gg, {"naive-autograd": gl, **ens[name]}, dtype, 3, mag[name])
    return out, lse, grads


def assert_empty_rows_exact(c, out, lse, grads):
    """Contract: an empty row gives out 0, lse -inf, dq 0 exactly; unnamed key rows get 0."""
    S, K = c["kv"].shape[0], c["idx"].shape[1]
    valid = (c["idx"] >= 0) & (c["idx"] < S)
    if c["topk_length"] is not None:
        valid &= torch.arange(K, device=DEVICE)[None, :] < c["topk_length"][:, None]
    empty = ~valid.any(-1)
    assert (out[empty] == 0).all() and (lse[empty] == float("-inf")).all()
    assert (grads[0][empty] == 0).all()
    named = torch.zeros(S, dtype=torch.bool, device=DEVICE)
    named[c["idx"][valid].long()] = True
    assert (grads[-1 if c["qr"] is None else 2][~named] == 0).all()


# ----------------------------------------------------------------------------- tests

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rope", [False, True])
def test_small_shapes_agree(dtype, rope):
    c = make_case(T=5, H=3, DL=40, DR=24 if rope else 0, S=23, K=37, dtype=dtype, seed=1,
                  with_len=rope)
    out, lse, grads = check_case(c)
    assert_empty_rows_exact(c, out, lse, grads)


@pytest.mark.parametrize("rope", [False, True])
def test_int64_topk_length_past_int32(rope):
    """int64 lengths past int32 with int32 indices (the 32-bit slot count's inputs): 2**32 + 3
    is every slot, -(2**32) + K none, 2**31 every slot; narrowed before the clamp they were 3
    slots, K slots and none (docs/FINDINGS.md F30)."""
    from attention_oracle.checks.dsa.edges import wide_lengths
    c = make_case(T=6, H=3, DL=40, DR=24 if rope else 0, S=23, K=37, dtype=torch.float32, seed=5,
                  with_len=True)
    c["topk_length"] = wide_lengths(c["topk_length"], 6, 37)
    assert c["topk_length"].dtype == torch.int64 and c["topk_length"].max() > 2 ** 31
    out, lse, grads = check_case(c)
    assert_empty_rows_exact(c, out, lse, grads)


@pytest.mark.parametrize("rope", [False, True])
def test_strided_topk_length_and_indices(rope):
    """topk_length as a stride-2 column and K-major indices: the kernels read the lengths by
    their data pointer, so a strided one is copied first (docs/FINDINGS.md F34)."""
    from attention_oracle.checks.dsa.edges import strided_indices
    from attention_oracle.checks.index.edges import column
    c = make_case(T=6, H=3, DL=40, DR=24 if rope else 0, S=23, K=37, dtype=torch.float32, seed=6,
                  with_len=True)
    c["topk_length"] = column(c["topk_length"])
    assert c["topk_length"].stride() == (2,)
    check_case(c, idx=strided_indices(c["idx"])["transposed"])


def run_alone(script, *args, allocation=None):
    """Run the Python source ``script`` (with ``args``) in a fresh process from the repository
    root, so that a fault (a segfault, an illegal address) fails the calling test alone. Exit
    status 3 is the script saying the machine refused ``allocation``: a skip, where named."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", script, *args], cwd=root, capture_output=True,
                       text=True, timeout=600)
    if r.returncode == 3 and allocation:
        pytest.skip(f"this machine refuses {allocation}: {r.stdout.strip()}")
    assert r.returncode == 0, f"exit {r.returncode}: {r.stdout[-1000:]} {r.stderr[-2000:]}"


HEAD_OFFSETS_PAST_INT32 = """
import sys
import torch
from attention_oracle import fast
from attention_oracle.oracle import dsa as odsa
T, H, D, S, K = 1, 128, 16, 8, 4
device = sys.argv[1]
g = torch.Generator().manual_seed(0)
stride_h = 2 ** 24 + 2 ** 23  # 127 heads of it pass 2**31 elements

def head_major(values):
    try:  # 4.3 GB, untouched but the values' pages on the CPU
        buf = torch.empty((H - 1) * stride_h + D, dtype=torch.float16, device=device)
    except (RuntimeError, MemoryError) as exc:
        print("allocation refused:", exc)
        sys.exit(3)
    view = torch.as_strided(buf, (T, H, D), (D, stride_h, 1))
    view.copy_(values)
    return view

vals = torch.randn(T, H, D, generator=g).half()
dvals = torch.randn(T, H, D, generator=g).half()
q = head_major(vals.to(device)).requires_grad_()
dout = head_major(dvals.to(device))
kv = torch.randn(S, D, generator=g).half().to(device).requires_grad_()
idx = torch.randint(0, S, (T, K), generator=g, dtype=torch.int32).to(device)
out = fast.dsa_sparse_attention_nope(q, kv, idx)
gq, gk = torch.autograd.grad(out, (q, kv), dout)
vq = vals.double().requires_grad_()
vk = kv.detach().cpu().double().requires_grad_()
ref = odsa.dsa_sparse_attention_nope(vq, vk, idx.cpu())
rq, rk = torch.autograd.grad(ref, (vq, vk), dvals.double())
errs = [float((a.detach().cpu().double() - b.detach()).abs().max())
        for a, b in ((out, ref), (gq, rq), (gk, rk))]
print("max |fast - float64| of out, dq, dkv:", errs)
sys.exit(0 if max(errs) < 0.05 else 1)
"""


def test_head_offsets_past_int32():
    """Head-major q and dout (H 128, head stride 1.5 * 2**24 elements): head 127's offset passes
    2**31, which the kernels' int32 head offsets wrapped (a read 4 GB before the tensor: a
    segfault under the interpreter, an illegal address on the GPU; docs/FINDINGS.md F35). Run in
    a subprocess, so that a fault fails this test alone."""
    run_alone(HEAD_OFFSETS_PAST_INT32, DEVICE, allocation="a 4.3 GB virtual allocation")


CHANNEL_OFFSETS_PAST_INT32 = """
import sys
import torch
from attention_oracle import fast
from attention_oracle.oracle import dsa as odsa
T, H, D, S, K = 1, 2, 5, 6, 4
device = sys.argv[1]
stride_d = 2 ** 29 + 16  # channel 4's offset passes 2**31 elements

def channel_major(values):
    try:  # up to 8.6 GB, untouched but the values' pages on the CPU
        buf = torch.empty((D - 1) * stride_d + values.numel() // D, dtype=values.dtype,
                          device=device)
    except (RuntimeError, MemoryError) as exc:
        print("allocation refused:", exc)
        sys.exit(3)
    inner = values.shape[1] if values.dim() == 3 else 1
    strides = ((inner, 1) if values.dim() == 3 else (1,)) + (stride_d,)
    view = torch.as_strided(buf, values.shape, strides)
    view.copy_(values)
    return view

errs = {}
for dtype in (torch.float16, torch.float32):
    for which in ("q", "kv", "dout"):
        g = torch.Generator().manual_seed(0)
        vals = {"q": torch.randn(T, H, D, generator=g), "kv": torch.randn(S, D, generator=g),
                "dout": torch.randn(T, H, D, generator=g)}
        idx = torch.randint(0, S, (T, K), generator=g, dtype=torch.int32).to(device)
        ins = {n: (channel_major if n == which else torch.Tensor.clone)(v.to(dtype).to(device))
               for n, v in vals.items()}
        q, kv = ins["q"].requires_grad_(), ins["kv"].requires_grad_()
        out = fast.dsa_sparse_attention_nope(q, kv, idx)
        gq, gk = torch.autograd.grad(out, (q, kv), ins["dout"])
        ref = [vals[n].to(dtype).double().requires_grad_() for n in ("q", "kv")]
        rout = odsa.dsa_sparse_attention_nope(*ref, idx.cpu())
        rq, rk = torch.autograd.grad(rout, ref, vals["dout"].to(dtype).double())
        errs[f"{dtype} {which}"] = max(float((a.detach().cpu().double() - b.detach()).abs().max())
                                       for a, b in ((out, rout), (gq, rq), (gk, rk)))
        del q, kv, ins, out, gq, gk
print("max |fast - float64| of out, dq, dkv:", errs)
sys.exit(0 if max(errs.values()) < 0.05 else 1)
"""


def test_channel_offsets_past_int32():
    """Channel-major q, kv and dout (D 5, channel stride 2**29 + 16 elements; a dout whose
    layout puts the channels outermost, of 2**31 elements or more, is such a view): channel 4's
    offset passes 2**31, which the kernels formed in int32 (a read 4 GB before the tensor: a
    segfault under the interpreter; docs/FINDINGS.md F40). Run in a subprocess, so that a fault
    fails this test alone."""
    run_alone(CHANNEL_OFFSETS_PAST_INT32, DEVICE, allocation="an 8.6 GB virtual allocation")


def test_indices_whose_slot_offsets_pass_int32_are_copied():
    """The kernels form slot * stride in int32: K-major indices of T >= 2**31 / K tokens are
    copied contiguous first (docs/FINDINGS.md F35); others pass through as they are."""
    wide = torch.empty_strided((3, 2048), (1, 2 ** 21), device="meta", dtype=torch.int32)
    assert fdsa.slot_offsets_fit(wide).stride() == (2048, 1)
    narrow = torch.empty_strided((3, 2048), (1, 2 ** 20), device="meta", dtype=torch.int32)
    assert fdsa.slot_offsets_fit(narrow) is narrow


def test_index_preparation_reads_strided_lengths_and_segment_starts():
    """topk_length, cu_seqlens_q and cu_seqlens_k as stride-2 columns (F34): the same rows."""
    gen = torch.Generator().manual_seed(7)
    local = torch.randint(-1, 9, (10, 12), generator=gen, dtype=torch.int32).to(DEVICE)
    lengths = torch.randint(0, 13, (10,), generator=gen, dtype=torch.int32).to(DEVICE)
    cu_q = torch.tensor([0, 4, 10], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 9, 18], dtype=torch.int32, device=DEVICE)
    column = torch.stack([lengths, torch.zeros_like(lengths)], dim=1)[:, 0]

    def strided(cu):
        return torch.stack([cu, torch.full_like(cu, 3)], dim=1)[:, 0]
    for compact in (False, True):
        want = offset_gather_kv_indices(local, cu_q, cu_k, topk_length=lengths, compact=compact,
                                        return_topk_length=True)
        got = offset_gather_kv_indices(local, strided(cu_q), strided(cu_k), topk_length=column,
                                       compact=compact, return_topk_length=True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("layout", ["head_major", "stride0"])
def test_strided_dout_and_packed_keys(layout):
    c = make_case(T=4, H=17, DL=32, DR=16, S=19, K=20, dtype=torch.float32, seed=2)
    check_case(c, dout_layout=layout, packed=True)


def test_tiny_dims_and_int64_indices():
    c = make_case(T=3, H=1, DL=1, DR=1, S=1, K=1, dtype=torch.float32, seed=3, hole_rate=0.0)
    check_case(c, idx=c["idx"].long())


def test_wide_latent_uses_chunked_path():
    c = make_case(T=2, H=2, DL=520, DR=8, S=9, K=18, dtype=torch.float32, seed=4)
    check_case(c)


@pytest.mark.parametrize("rope", [False, True])
def test_double_backward_is_refused(rope):
    """The backward's kernels are not differentiable: gradients taken with create_graph=True
    and differentiated again (a gradient penalty in the loss) must raise, as the oracle's do,
    instead of leaving the penalty's share out of the result (docs/FINDINGS.md F41)."""
    c = make_case(T=3, H=2, DL=16, DR=8 if rope else 0, S=7, K=5, dtype=torch.float32, seed=9)
    ins = [c["q"], c["qr"], c["kv"], c["kr"]] if rope else [c["q"], c["kv"]]
    leaves = [x.detach().requires_grad_(True) for x in ins]
    fn = fdsa.dsa_sparse_attention if rope else fdsa.dsa_sparse_attention_nope
    out = fn(*leaves, c["idx"], softmax_scale=c["scale"])
    grads = torch.autograd.grad(out, leaves, c["dout"], create_graph=True)
    loss = (out * c["dout"]).sum() + sum((g ** 2).sum() for g in grads)
    with pytest.raises(NotImplementedError, match="differentiate twice"):
        torch.autograd.grad(loss, leaves, retain_graph=True)
    with pytest.raises(NotImplementedError, match="differentiate twice"):
        loss.backward()
    # a plain second backward of the same graph (retain_graph) gives the same gradients
    out = fn(*leaves, c["idx"], softmax_scale=c["scale"])
    first = torch.autograd.grad(out, leaves, c["dout"], retain_graph=True)
    second = torch.autograd.grad(out, leaves, c["dout"])
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def _neg_bit_view(x):
    """A tensor equal to ``x`` whose storage holds ``-x`` (PyTorch's negative bit, what
    ``c.conj().imag`` of a complex tensor gives)."""
    view = torch._neg_view(-x)
    assert view.is_neg() and torch.equal(view, x)
    return view


@pytest.mark.parametrize("rope", [False, True])
def test_negative_bit_inputs_read_as_their_values(rope):
    """q, q_rope, kv, k_rope, indices, topk_length and dout with the negative bit give what the
    same values without it give, bit for bit (docs/FINDINGS.md F46: the kernels read the
    storage, which holds the negated values); the varlen path's index inputs and an out buffer
    of index preparation too."""
    c = make_case(T=5, H=3, DL=32, DR=8 if rope else 0, S=23, K=19, dtype=torch.float32, seed=31,
                  with_len=True)
    names = ("q", "qr", "kv", "kr") if rope else ("q", "kv")

    def run(view):
        leaves = [c[n].clone().requires_grad_() for n in names]
        inputs = [view(x) for x in leaves]
        idx, tl_ = view(c["idx"]), view(c["topk_length"])
        if rope:
            out, lse = fdsa.dsa_sparse_attention(*inputs, idx, topk_length=tl_,
                                                 softmax_scale=c["scale"], return_lse=True)
        else:
            out, lse = fdsa.dsa_sparse_attention_nope(*inputs, idx, topk_length=tl_,
                                                      softmax_scale=c["scale"], return_lse=True)
        return (out, lse) + torch.autograd.grad(out, leaves, view(c["dout"]))

    for name, got, want in zip(("out", "lse", "dq", "dkv", "dq_rope", "dk_rope"),
                               run(_neg_bit_view), run(lambda x: x)):
        assert torch.equal(got, want), name

    S, T = 23, 5
    idx, cuq, cuk = c["idx"].clamp(min=-1) % S, torch.tensor([0, 2, T]), torch.tensor([0, 9, S])
    idx, cuq, cuk = (x.to(device=DEVICE, dtype=torch.int32) for x in (idx, cuq, cuk))
    want = offset_gather_kv_indices(idx, cuq, cuk, causal=True, compact=True)
    got = offset_gather_kv_indices(*(_neg_bit_view(x) for x in (idx, cuq, cuk)), causal=True,
                                   compact=True)
    assert torch.equal(got, want)
    out = _neg_bit_view(torch.zeros_like(want))
    assert offset_gather_kv_indices(idx, cuq, cuk, causal=True, compact=True, out=out) is out
    assert torch.equal(out, want)


def test_zero_tokens():
    q = torch.randn(0, 4, 16, device=DEVICE, requires_grad=True)
    kv = torch.randn(5, 16, device=DEVICE, requires_grad=True)
    out, lse = fdsa.dsa_sparse_attention_nope(q, kv, torch.zeros(0, 3, dtype=torch.int32,
                                              device=DEVICE), return_lse=True)
    assert out.shape == (0, 4, 16) and lse.shape == (0, 4)
    dq, dkv = torch.autograd.grad(out, [q, kv], torch.zeros_like(out))
    assert dq.shape == q.shape and (dkv == 0).all()


def test_compacted_rows_equal_holey_rows():
    c = make_case(T=6, H=4, DL=32, DR=16, S=30, K=24, dtype=torch.float32, seed=5, hole_rate=0.6)
    cu = torch.tensor([0, c["q"].shape[0]], dtype=torch.int32, device=DEVICE)
    cuk = torch.tensor([0, c["kv"].shape[0]], dtype=torch.int32, device=DEVICE)
    rows, lengths = offset_gather_kv_indices(c["idx"], cu, cuk, compact=True,
                                             return_topk_length=True)
    holey = fdsa.dsa_sparse_attention(c["q"], c["qr"], c["kv"], c["kr"], c["idx"],
                                      softmax_scale=c["scale"])
    compact = fdsa.dsa_sparse_attention(c["q"], c["qr"], c["kv"], c["kr"], rows,
                                        topk_length=lengths, softmax_scale=c["scale"])
    torch.testing.assert_close(compact, holey, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_scale_beyond_float32_is_refused_by_name(dtype):
    """A finite softmax_scale beyond float32's range reaches the kernels as inf (out NaN on the
    CPU) and an int past float's range raised OverflowError naming nothing (docs/FINDINGS.md
    F44): fast refuses the first, the shared validation the second, naming softmax_scale. The
    largest scale fast takes still runs."""
    q = torch.randn(2, 2, 8, device=DEVICE, dtype=dtype)
    kv = torch.randn(4, 8, device=DEVICE, dtype=dtype)
    idx = torch.zeros(2, 3, dtype=torch.int32, device=DEVICE)
    for scale in (1e39, -3e38, 2.4e38):
        with pytest.raises(NotImplementedError, match="softmax_scale"):
            fdsa.dsa_sparse_attention_nope(q, kv, idx, softmax_scale=scale)
    with pytest.raises(ValueError, match="softmax_scale"):
        fdsa.dsa_sparse_attention_nope(q, kv, idx, softmax_scale=10 ** 400)
    with pytest.raises(ValueError, match="softmax_scale"):
        fdsa.dsa_sparse_attention(q, q, kv, kv, idx, softmax_scale=-(10 ** 400))
    biggest = torch.finfo(torch.float32).max / 1.4426950408889634 * (1 - 1e-6)
    out = fdsa.dsa_sparse_attention_nope(q * 0, kv, idx, softmax_scale=biggest)
    torch.testing.assert_close(out, kv[:1].expand_as(out))  # zero scores; every slot names row 0


def test_bad_inputs_are_named():
    q = torch.randn(2, 2, 8, device=DEVICE)
    kv = torch.randn(4, 8, device=DEVICE)
    idx = torch.zeros(2, 3, dtype=torch.int32, device=DEVICE)
    with pytest.raises(TypeError, match="indices"):
        fdsa.dsa_sparse_attention_nope(q, kv, idx.float())
    with pytest.raises(ValueError, match="kv"):
        fdsa.dsa_sparse_attention_nope(q, torch.randn(4, 9, device=DEVICE), idx)
    with pytest.raises(TypeError, match="kv"):
        fdsa.dsa_sparse_attention_nope(q, kv.half(), idx)
    with pytest.raises(NotImplementedError, match="q"):
        fdsa.dsa_sparse_attention_nope(q.double(), kv.double(), idx)
    with pytest.raises(ValueError, match="topk_length"):
        fdsa.dsa_sparse_attention_nope(q, kv, idx, topk_length=idx)


# ----------------------------------------------------------------------------- index

def naive_offset(idx, cuq, cuk, causal, compact, topk_length):
    T, K = idx.shape
    out = torch.full((T, K), -1, dtype=torch.int64)
    lengths = torch.zeros(T, dtype=torch.int32)
    for d in range(len(cuq) - 1):
        sk, sq = cuk[d + 1] - cuk[d], cuq[d + 1] - cuq[d]
        for t in range(cuq[d], cuq[d + 1]):
            pos = sk - sq + t - cuq[d]
            lim = K if topk_length is None else max(0, min(K, int(topk_length[t])))
            kept = [(s, int(idx[t, s]) + cuk[d]) for s in range(lim)
                    if 0 <= idx[t, s] < sk and (not causal or idx[t, s] <= pos)]
            for i, (s, row) in enumerate(kept):
                out[t, i if compact else s] = row
            lengths[t] = len(kept) if compact else (kept[-1][0] + 1 if kept else 0)
    return out, lengths


def test_index_preparation_writes_in_place_only_into_its_own_view():
    """fast writes its result straight into ``out`` only where out is exactly the index
    tensor (start, strides and dtype): an int32 out laid over int64 indices with equal element
    strides, or an out sharing memory with cu_seqlens or topk_length, goes through the scratch
    buffer (on CUDA the programs run at once, so a row written early would be read late)."""
    from attention_oracle.fast.index import _needs_scratch
    T, K = 4, 8
    base = torch.zeros(T, 2 * K, dtype=torch.int64)
    idx = base[:, :K]
    over = torch.as_strided(base.view(torch.int32), (T, K), (2 * K, 1))
    assert over.data_ptr() == idx.data_ptr() and over.stride() == idx.stride()
    assert _needs_scratch(over, idx, False, K, (None, None, None))
    own = torch.zeros(T, K, dtype=torch.int32)
    assert not _needs_scratch(own, own, False, K, (None, None, None))
    buf = torch.zeros(T * K + T + 2, dtype=torch.int32)
    out, lengths, cu = buf[:T * K].view(T, K), buf[T * K:T * K + T], buf[-2:]
    assert _needs_scratch(out, own, False, K, (cu, cu, None))
    assert _needs_scratch(out, own, False, K, (None, None, lengths))
    assert not _needs_scratch(own, torch.zeros(T, K, dtype=torch.int32), False, K, (cu, cu, lengths))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("K", [7, 4100])
def test_offset_gather_matches_naive(causal, compact, K):
    g = torch.Generator().manual_seed(K + 2 * causal + compact)
    sq = [3, 0, 5, 1, 4]
    sk = [s + e for s, e in zip(sq, [2, 3, 0, 6, 1])]
    cuq = [0] + torch.tensor(sq).cumsum(0).tolist()
    cuk = [0] + torch.tensor(sk).cumsum(0).tolist()
    T = cuq[-1]
    idx = torch.randint(-2, 9, (T, K), generator=g, dtype=torch.int32)
    topk_length = torch.randint(-1, K + 2, (T,), generator=g, dtype=torch.int32)
    for tl_ in [None, topk_length]:
        out = torch.full((T, K), 77, dtype=torch.int32, device=DEVICE)
        res, lengths = offset_gather_kv_indices(
            idx.to(DEVICE).t().contiguous().t(), torch.tensor(cuq, dtype=torch.int32, device=DEVICE),
            torch.tensor(cuk, dtype=torch.int32, device=DEVICE), causal=causal, compact=compact,
            topk_length=None if tl_ is None else tl_.to(DEVICE), out=out, return_topk_length=True)
        ref, ref_len = naive_offset(idx, cuq, cuk, causal, compact, tl_)
        assert res is out
        assert res.dtype == torch.int32
        assert torch.equal(res.cpu().long(), ref) and torch.equal(lengths.cpu(), ref_len)


def test_call_signature_keys_what_validation_and_the_plan_read():
    """fast.index._signature: equal for a repeat of a call; different for another shape,
    stride, dtype, layout, flag or setting (a sparse COO tensor's strides are all zeros, as a
    dense one's broadcast along every dim: F82); None (the validating path every time) for a
    negative-bit view, a flag that is not a bool or a non-tensor."""
    from attention_oracle.fast import index
    idx = torch.zeros(4, 6, dtype=torch.int32)
    cu = torch.tensor([0, 4], dtype=torch.int32)

    def sig(local=idx, cu_q=cu, lengths=None, causal=True, compact=False, key_rows=None):
        return index._signature(local, cu_q, cu, lengths, causal, compact, key_rows, None)
    base = sig()
    assert base is not None and sig(idx.clone(), cu.clone()) == base
    others = [sig(torch.zeros(4, 7, dtype=torch.int32)), sig(idx.t().contiguous().t()),
              sig(idx.long()), sig(cu_q=cu.long()), sig(causal=False), sig(compact=True),
              sig(lengths=torch.ones(4, dtype=torch.int32)), sig(key_rows=9)]
    assert all(o is not None and o != base for o in others)
    previous = index.set_num_warps(8)
    try:
        assert sig() != base
    finally:
        index.set_num_warps(previous)
    assert sig() == base
    broadcast = torch.zeros(1, 1, dtype=torch.int32).expand(4, 6)
    assert sig(broadcast) != sig(torch.zeros(4, 6, dtype=torch.int32).to_sparse())
    for refused in (sig(torch._neg_view(idx)), sig(causal=1), sig(compact=0.0),
                    sig([[0] * 6] * 4), sig(key_rows=9.0)):
        assert refused is None


@pytest.mark.skipif(DEVICE != "cuda", reason="kept calls serve CUDA calls alone (the "
                    "interpreter takes the validating path every time)")
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("starts_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("K", [7, 4100])
def test_kept_calls_agree_with_naive(index_dtype, starts_dtype, K):
    """A repeated call signature takes its kept call (fast.index._CALLS: rows and lengths from
    one buffer, launched by addresses): every call equal to the naive rows, with and without
    topk_length, causal and compacted or not; then a view of the same signature 4 bytes off
    16-byte alignment (another specialization: launched with the aligned one's kernel, its
    vector loads would fault or read the wrong rows)."""
    from attention_oracle.fast import index
    g = torch.Generator().manual_seed(K + 3)
    cuq, cuk = [0, 3, 3, 8, 9], [0, 5, 8, 14, 16]
    T = cuq[-1]
    idx = torch.randint(-2, 9, (T, K), generator=g, dtype=torch.int32)
    topk_length = torch.randint(-1, K + 2, (T,), generator=g, dtype=torch.int32)
    cu_q = torch.tensor(cuq, dtype=starts_dtype, device=DEVICE)
    cu_k = torch.tensor(cuk, dtype=starts_dtype, device=DEVICE)
    shifted = torch.empty(T * K + 1, dtype=index_dtype, device=DEVICE)
    shifted[1:] = idx.to(DEVICE).flatten().to(index_dtype)
    for causal, compact, lengths in ((False, False, None), (True, True, None),
                                     (True, False, topk_length), (False, True, topk_length)):
        ref = naive_offset(idx, cuq, cuk, causal, compact, lengths)
        on_device = None if lengths is None else lengths.to(DEVICE)
        aligned = idx.to(index_dtype).to(DEVICE)
        for local in (aligned, aligned, aligned, shifted[1:].view(T, K)):
            rows, counts = offset_gather_kv_indices(local, cu_q, cu_k, causal=causal,
                                                    compact=compact, topk_length=on_device,
                                                    return_topk_length=True)
            assert rows.dtype == torch.int32 and rows.shape == (T, K) and rows.is_contiguous()
            assert torch.equal(rows.cpu().long(), ref[0]) and torch.equal(counts.cpu(), ref[1])
        assert index._signature(aligned, cu_q, cu_k, on_device, causal, compact, None,
                                None) in index._CALLS, "the repeated signature kept no call"


def test_varlen_equals_offset_then_global():
    g = torch.Generator().manual_seed(9)
    cuq = torch.tensor([0, 3, 3, 7], dtype=torch.int32, device=DEVICE)
    cuk = torch.tensor([0, 5, 6, 13], dtype=torch.int32, device=DEVICE)
    T, H, D, K = 7, 3, 24, 9
    q = torch.randn(T, H, D, generator=g).to(DEVICE)
    kv = torch.randn(13, D, generator=g).to(DEVICE)
    local = torch.randint(-1, 8, (T, K), generator=g, dtype=torch.int32).to(DEVICE)
    got = fdsa.dsa_sparse_attention_nope_varlen(q, kv, local, cuq, cuk, causal=True,
                                                softmax_scale=0.3)
    rows = offset_gather_kv_indices(local, cuq, cuk, causal=True)
    want = fdsa.dsa_sparse_attention_nope(q, kv, rows, softmax_scale=0.3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("K", [6, 4100])
def test_offset_gather_in_place(K):
    g = torch.Generator().manual_seed(11)
    cuq = torch.tensor([0, 4, 9], dtype=torch.int32, device=DEVICE)
    cuk = torch.tensor([0, 6, 12], dtype=torch.int32, device=DEVICE)
    idx = torch.randint(-1, 7, (9, K), generator=g, dtype=torch.int32).to(DEVICE)
    for compact in [False, True]:
        want = offset_gather_kv_indices(idx, cuq, cuk, causal=True, compact=compact)
        buf = idx.clone()
        got = offset_gather_kv_indices(buf, cuq, cuk, causal=True, compact=compact, out=buf)
        assert got is buf and torch.equal(got, want)


def test_chunked_configs_agree():
    """The chunked tiles (the GPU's fallback when one tile does not fit) on small dims."""
    chunked = fdsa.KernelConfig(16, 16, 16, 32, 4, 1)
    fdsa.set_configs(forward=chunked, backward=chunked)
    try:
        c = make_case(T=4, H=5, DL=40, DR=8, S=13, K=21, dtype=torch.float32, seed=6)
        check_case(c, dout_layout="head_major")
    finally:
        fdsa.set_configs()


@pytest.mark.parametrize("tile", ["one", "chunked"])
def test_transposed_dkv_agrees(tile):
    """Backward with dkv^T = q^T dS + dO^T P, one tile and chunked."""
    cfg = (fdsa.KernelConfig(16, 16, 64, 64, 4, 1, True) if tile == "one"
           else fdsa.KernelConfig(16, 16, 16, 32, 4, 1, True))
    fdsa.set_configs(backward=cfg)
    try:
        c = make_case(T=4, H=5, DL=40, DR=8, S=13, K=21, dtype=torch.float32, seed=7)
        check_case(c, dout_layout="head_major")
        c = make_case(T=3, H=2, DL=24, DR=0, S=9, K=12, dtype=torch.float16, seed=8)
        check_case(c)
    finally:
        fdsa.set_configs()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_split_scores_and_halves_agree(dtype):
    """The 16-bit variants behind ``split_scores`` (score dots through chain_break) and
    ``halves`` (backward latent in two gathered halves): DL 40 = two chunks of 32 (halves
    path), DL 24 = one chunk (halves falls back to the chunked path), and one tile; forward
    split mode 2 (latent and rope score dots, then one branch), with and without rope."""
    cases = [(fdsa.KernelConfig(16, 16, 64, 64, 4, 1, split_scores=True),
              fdsa.KernelConfig(16, 16, 16, 32, 4, 1, True, split_scores=True, halves=True)),
             (fdsa.KernelConfig(16, 16, 16, 32, 4, 1, split_scores=True),
              fdsa.KernelConfig(16, 16, 64, 64, 4, 1, True, split_scores=True)),
             (fdsa.KernelConfig(16, 16, 64, 64, 4, 1, split_scores=2), None)]
    try:
        for fwd, bwd in cases:
            fdsa.set_configs(forward=fwd, backward=bwd)
            c = make_case(T=4, H=5, DL=40, DR=8, S=13, K=21, dtype=dtype, seed=12, with_len=True)
            check_case(c, dout_layout="head_major")
            c = make_case(T=3, H=2, DL=24, DR=0, S=9, K=12, dtype=dtype, seed=13)
            check_case(c)
    finally:
        fdsa.set_configs()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("dl,dr", [(40, 8), (64, 16)])
def test_lean_switches_agree(dtype, dl, dr):
    """The switches ``int32_rows`` (both kernels), ``no_zero_trip`` (forward), ``token_major``,
    ``rope_owner`` (backward) and ``even_d``: H 20 in blocks of 16 and the latent in two chunks
    of 32 (halves path) give four programs per token in the token-major grid, of which only
    chunk 0 computes the rope gradients; empty rows (row 0, topk_length 0) make the
    no-zero-trip forward run one all-invalid block. DL 40 leaves even_d off (a chunk runs past
    the width), DL 64 with DR 16 turns it on. Then NoPE through the one-tile path."""
    fwd = fdsa.KernelConfig(16, 16, 64, 64, 4, 1, split_scores=True, int32_rows=True,
                            no_zero_trip=True, even_d=True)
    bwd = fdsa.KernelConfig(16, 16, 16, 32, 4, 1, True, split_scores=True, halves=True,
                            int32_rows=True, token_major=True, rope_owner=True, even_d=True)
    try:
        fdsa.set_configs(forward=fwd, backward=bwd)
        c = make_case(T=5, H=20, DL=dl, DR=dr, S=13, K=21, dtype=dtype, seed=14, with_len=True)
        c["topk_length"][2] = 0
        out, lse, grads = check_case(c, dout_layout="head_major", packed=True)
        assert_empty_rows_exact(c, out, lse, grads)
        fdsa.set_configs(forward=fwd, backward=fdsa.KernelConfig(16, 16, 64, 64, 4, 1, True,
                                                                  int32_rows=True,
                                                                  token_major=True))
        c = make_case(T=3, H=2, DL=24, DR=0, S=9, K=12, dtype=dtype, seed=15)
        check_case(c)
    finally:
        fdsa.set_configs()


def test_even_d_only_where_tiles_divide():
    """``_even_d``: every latent tile divides Dl and the rope tile is Dr (or no rope)."""
    assert fdsa._even_d(512, 64, 512, 512, block_dr=64)
    assert fdsa._even_d(64, 0, 16, 32, block_dr=16)
    assert not fdsa._even_d(40, 8, 16, 32, block_dr=8)
    assert not fdsa._even_d(512, 60, 512, 512, block_dr=64)
    assert not fdsa._even_d(64, 0, 16, 32, block_dr=16, rope=True)  # a zero-width rope part


ZERO_WIDTH_ROPE_EVEN_D = """
import sys
import torch
import attention_oracle.fast.dsa as fdsa
from tests.fast.test_fast_dsa_smoke import DEVICE, assert_empty_rows_exact, check_case, make_case
fwd = fdsa.KernelConfig(16, 16, 64, 64, 4, 1, even_d=True)
bwd = fdsa.KernelConfig(16, 16, 32, 32, 4, 1, True, int32_rows=True, token_major=True,
                        rope_owner=True, even_d=True)
fdsa.set_configs(forward=fwd, backward=bwd)
for mode in ("acc64", "tf32x3"):
    fdsa.set_fp32_mode(mode)
    for dtype in (torch.float16, torch.float32):
        c = make_case(T=4, H=3, DL=64, DR=0, S=9, K=12, dtype=dtype, seed=16)
        c["qr"] = torch.zeros(4, 3, 0, device=DEVICE)
        c["kr"] = torch.zeros(9, 0, device=DEVICE)
        out, lse, grads = check_case(c)
        assert_empty_rows_exact(c, out, lse, grads)
        print(mode, dtype, "agrees", flush=True)
"""


def test_even_d_tiles_with_a_zero_width_rope_part():
    """RoPE with Dr = 0 under ``even_d`` tiles (64-wide latent tiles that divide Dl 64): the
    rope tile (16 wide) does not divide 0, yet ``_even_d`` took Dr 0 for "no rope" and the
    kernels gathered 16 rope columns under the slot mask alone, from k_rope's data pointer,
    which torch gives as 0 for a tensor of no elements (a segfault under the interpreter;
    docs/FINDINGS.md F43). In a subprocess, so that a fault fails this test alone."""
    run_alone(ZERO_WIDTH_ROPE_EVEN_D)


def test_int32_rows_only_where_offsets_fit():
    """``_int32_rows``: int32 indices and element offsets below 2**31 only (meta tensors stand
    in for large packed [S, 576] key buffers)."""
    idx32 = torch.zeros(2, 4, dtype=torch.int32)
    kv = torch.empty(1000, 576, device="meta")
    assert fdsa._int32_rows(idx32, kv[:, :512], kv[:, 512:], 512, 64)
    assert not fdsa._int32_rows(idx32.long(), kv[:, :512], kv[:, 512:], 512, 64)
    big = torch.empty(2 ** 31 // 576 + 1, 576, device="meta")
    assert not fdsa._int32_rows(idx32, big[:, :512], big[:, 512:], 512, 64)
    assert fdsa._int32_rows(idx32, big[:-3, :512], None, 512, 0)


@contextlib.contextmanager
def fp32_mode(mode):
    """fast.dsa's fp32 path pinned to ``mode`` inside the block (the run's own mode may be
    either: $ATTENTION_ORACLE_FAST_DSA_FP32)."""
    previous = fdsa.set_fp32_mode(mode)
    try:
        yield
    finally:
        fdsa.set_fp32_mode(previous)


@pytest.fixture
def acc64_mode():
    with fp32_mode("acc64"):
        yield


@pytest.mark.usefixtures("acc64_mode")
@pytest.mark.parametrize("split", ["one_piece", "chunked"])
def test_fp32_acc64_agrees(split):
    """The fp32 path with ``acc64`` (every product of the slot loop an fp64 dot, fp64
    accumulators for out, dq and dkv): the latent as one fp64 score piece and one value tile,
    and pieces / value chunks narrower than the latent (several programs per token, as the
    GPU's configs)."""
    cfg = (fdsa.KernelConfig(16, 16, 64, 64, 4, 1, acc64=True) if split == "one_piece"
           else fdsa.KernelConfig(16, 16, 16, 16, 4, 1, acc64=True))
    fdsa.set_configs(forward=cfg, backward=cfg)
    try:
        c = make_case(T=6, H=5, DL=40, DR=8, S=29, K=45, dtype=torch.float32, seed=21,
                      with_len=True)
        out, lse, grads = check_case(c, dout_layout="head_major")
        assert_empty_rows_exact(c, out, lse, grads)
        c = make_case(T=3, H=2, DL=24, DR=0, S=9, K=12, dtype=torch.float32, seed=22)
        check_case(c)
    finally:
        fdsa.set_configs()


# ----------------------------------------------------------------------------- fp32 tf32x3

def _tf32x3_cases():
    """(case, dout layout) pairs: rope with lengths and holes, head-major dout; NoPE."""
    return [(make_case(T=6, H=5, DL=40, DR=8, S=29, K=45, dtype=torch.float32, seed=21,
                       with_len=True), "head_major"),
            (make_case(T=3, H=2, DL=24, DR=0, S=9, K=12, dtype=torch.float32, seed=22), None)]


_TF32X3_TILES = {"one_piece": fdsa.KernelConfig(16, 16, 64, 64, 4, 1),
                 "chunked": fdsa.KernelConfig(16, 16, 16, 16, 4, 1)}


@pytest.mark.parametrize("mode", ["tf32x3", "tf32x3_exp2"])
@pytest.mark.parametrize("split", ["one_piece", "chunked"])
def test_fp32_tf32x3_agrees(split, mode):
    """fp32 in the "tf32x3" modes (fast.dsa.set_fp32_mode: 3xTF32 dots, natural-unit or exp2
    softmax) against the oracle under the agreement rule, one tile and chunked tiles
    (several programs per token, as the GPU's configs). Under the interpreter the dots are
    emulated as the GPU computes them (``emulated_tf32x3``), so the arithmetic is checked
    too; on a GPU the tensor cores run it."""
    cfg = _TF32X3_TILES[split]
    with fp32_mode(mode), (emulated_tf32x3() if INTERPRETED else contextlib.nullcontext()):
        fdsa.set_configs(forward=cfg, backward=cfg)
        try:
            for c, layout in _tf32x3_cases():
                out, lse, grads = check_case(c, dout_layout=layout)
                assert_empty_rows_exact(c, out, lse, grads)
        finally:
            fdsa.set_configs()


@pytest.mark.skipif(not INTERPRETED, reason="plants the bug in the interpreter's dots")
def test_fp32_tf32x3_dropped_term_is_caught():
    """Negative control of test_fp32_tf32x3_agrees: the same kernels and cases with one of
    3xTF32's cross terms dropped (big_a.small_b, an error of ~2^-11 relative per product,
    between TF32 and 3xTF32) must fail the agreement rule."""
    with fp32_mode("tf32x3"), emulated_tf32x3(drop_cross_term=True):
        fdsa.set_configs(forward=_TF32X3_TILES["chunked"], backward=_TF32X3_TILES["chunked"])
        try:
            c, layout = _tf32x3_cases()[0]
            with pytest.raises(agreement.OracleMismatch, match="ratio"):
                check_case(c, dout_layout=layout)
        finally:
            fdsa.set_configs()


# ----------------------------------------------------------------------------- fp32 bf16x6

# (config, scratch elements per token pass): the CPU default; a slot block and latent pieces
# narrower than the rows (several blocks, pieces and value / dq chunks per token); the same
# in passes of two tokens of the first case (H 5, K 45: the scratch reused across passes)
_BF16X6_TILES = {"default": (None, None),
                 "chunked": (fdsa.KernelConfig(16, 16, 16, 16, 4, 1), None),
                 "passes": (fdsa.KernelConfig(16, 16, 16, 16, 4, 1), 5 * 45 * 2)}


@contextlib.contextmanager
def _bf16x6_tiles(split):
    cfg, scratch = _BF16X6_TILES[split]
    saved = fdsa._SCRATCH_ELEMENTS
    fdsa.set_configs(forward=cfg, backward=cfg)
    if scratch is not None:
        fdsa._SCRATCH_ELEMENTS = scratch
    try:
        yield
    finally:
        fdsa._SCRATCH_ELEMENTS = saved
        fdsa.set_configs()


FP32_DEFAULT_AND_ACC64 = ["bf16x6", "acc64"]


@pytest.mark.parametrize("split", list(_BF16X6_TILES))
def test_fp32_bf16x6_agrees(split):
    """fp32 in the "bf16x6" mode (split-bf16 products, the naive algorithm in scores / P.V and
    dS / dq launches through a scratch buffer) against the oracle under the agreement rule,
    empty rows exact; rope with lengths, holes, duplicates and a head-major dout, and NoPE.
    Under the interpreter the part products are fp32 dots of the same bf16 values."""
    with fp32_mode("bf16x6"), _bf16x6_tiles(split):
        for c, layout in _tf32x3_cases():
            out, lse, grads = check_case(c, dout_layout=layout)
            assert_empty_rows_exact(c, out, lse, grads)


@pytest.mark.parametrize("mode", FP32_DEFAULT_AND_ACC64)
def test_fp32_tiny_magnitudes_agree(mode):
    """fp32 inputs near the bottom of the exponent range (the suite's tiny regime: values
    pushed off zero, times 2**-118, all normal): out, lse and every gradient agree with the
    oracle (docs/FINDINGS.md F45). "acc64" is the control that never splits."""
    from attention_oracle.checks.dsa.cases import TINY_MAGNITUDE, _tiny
    with fp32_mode(mode):
        for c, layout in _tf32x3_cases():
            c = {**c, **{n: None if c[n] is None else _tiny(c[n], TINY_MAGNITUDE)
                         for n in ("q", "qr", "kv", "kr")}}
            check_case(c, dout_layout=layout)


@triton.jit
def _unscaled_split(x, BF16: tl.constexpr):
    """The split before F45: each part at its own size (x2 about 2**-16 |x|), rounded exactly
    (dsa_common._bf16_value); a planted bug for the tiny regime, interpreter only."""
    x0 = _bf16_value(x)
    x1 = _bf16_value(x - x0)
    return x0, x1, _bf16_value(x - x0 - x1)


@triton.jit
def _unscaled_dot6(a0, a1, a2, b0, b1, b2, zero, BF16: tl.constexpr):
    acc = tl.dot(a0, b2, zero, input_precision="ieee")
    acc = tl.dot(a1, b1, acc, input_precision="ieee")
    acc = tl.dot(a2, b0, acc, input_precision="ieee")
    acc = tl.dot(a0, b1, acc, input_precision="ieee")
    acc = tl.dot(a1, b0, acc, input_precision="ieee")
    return tl.dot(a0, b0, acc, input_precision="ieee")


def _unscaled_key_parts(kv, k_rope):
    rows = kv if k_rope is None else torch.cat([kv, k_rope], dim=1)
    parts = torch.empty((3,) + rows.shape, dtype=torch.bfloat16, device=kv.device)
    parts[0] = rows
    rest = rows - parts[0].float()
    parts[1] = rest
    parts[2] = rest - parts[1].float()
    return parts


@pytest.mark.skipif(not INTERPRETED, reason="plants the bug in the interpreted kernels")
def test_fp32_tiny_magnitudes_catch_the_unscaled_split(monkeypatch):
    """Negative control of test_fp32_tiny_magnitudes_agree: the split before F45 (parts at
    their own sizes, correctly rounded: x2 loses its bits below 2**-133) fails the rule on the
    tiny regime's values and passes on plain ones."""
    from attention_oracle.checks.dsa.cases import TINY_MAGNITUDE, _tiny
    from attention_oracle.fast.kernels import dsa_bwd, dsa_common, dsa_fwd

    for module in (dsa_fwd, dsa_bwd, dsa_common):
        monkeypatch.setattr(module, "split3", _unscaled_split)
        monkeypatch.setattr(module, "dot6", _unscaled_dot6)
    monkeypatch.setattr(fdsa, "_key_parts", _unscaled_key_parts)
    with fp32_mode("bf16x6"):
        c, layout = _tf32x3_cases()[0]
        check_case(c, dout_layout=layout)
        tiny = {**c, **{n: _tiny(c[n], TINY_MAGNITUDE) for n in ("q", "qr", "kv", "kr")}}
        with pytest.raises(agreement.OracleMismatch, match="ratio"):
            check_case(tiny, dout_layout=layout)


@pytest.mark.parametrize("exponent", [-126, -120, -118, -112, -100, 0, 60, 126])
def test_key_parts_split_exactly_at_every_exponent(exponent):
    """The host's split of the key rows (the kernels' dsa_common.split3 in torch): x == x0 +
    x1 2**-8 + x2 2**-16 exactly for normal values at every exponent, the smallest included
    (F45: with each part unscaled the lowest fell below bf16's smallest normal from 2**-110
    on). Checked in torch, whose conversions round subnormals correctly; the interpreter's
    do not."""
    g = torch.Generator().manual_seed(5)
    x = (1 + torch.rand(64, 40, generator=g)) * torch.where(torch.rand(64, 40, generator=g) < 0.5, -1.0, 1.0)
    x = (x * 2.0 ** exponent).to(DEVICE)
    parts = fdsa._key_parts(x, x[:, :8]).double()
    rebuilt = parts[0] + parts[1] * 2.0 ** -8 + parts[2] * 2.0 ** -16
    assert torch.equal(rebuilt, torch.cat([x, x[:, :8]], 1).double())


def test_fp32_bf16x6_passes_equal_one_pass():
    """Token passes (a scratch smaller than the whole problem) change nothing: the outputs and
    dq bitwise equal to one pass (dkv within fp64 atomics' reordering)."""
    c = make_case(T=6, H=5, DL=40, DR=8, S=29, K=45, dtype=torch.float32, seed=23,
                  with_len=True)
    args = (c["q"], c["qr"], c["kv"], c["kr"], c["idx"])
    res = {}
    with fp32_mode("bf16x6"):
        for split in ("chunked", "passes"):
            with _bf16x6_tiles(split):
                leaves = [x.detach().requires_grad_(True) for x in args[:4]]
                out, lse = fdsa.dsa_sparse_attention(*leaves, args[4], topk_length=c["topk_length"],
                                                     softmax_scale=c["scale"], return_lse=True)
                res[split] = (out, lse) + torch.autograd.grad(out, leaves, c["dout"])
    for name, a, b in zip(("out", "lse", "dq", "dq_rope"), res["chunked"], res["passes"]):
        assert torch.equal(a, b), name
    for a, b in zip(res["chunked"][4:], res["passes"][4:]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@triton.jit
def _two_part_split(x, BF16: tl.constexpr):
    """dsa_common.split3 with the third part dropped (a planted bug; interpreter only)."""
    x0 = x.to(tl.bfloat16).to(tl.float32)
    x1 = ((x - x0) * 256.0).to(tl.bfloat16).to(tl.float32)
    return x0, x1, x1 * 0.0


@pytest.mark.skipif(not INTERPRETED, reason="plants the bug in the interpreted kernels")
def test_fp32_bf16x6_two_part_split_is_caught(monkeypatch):
    """Negative control of test_fp32_bf16x6_agrees: the same launches with the third bf16 part
    of every split of q, dO, P and dS dropped (a = a0 + a1, 16 significant bits: ~2^-17
    relative per operand; the key rows' parts come from the host) must fail the agreement
    rule."""
    from attention_oracle.fast.kernels import dsa_bwd, dsa_fwd

    for module in (dsa_fwd, dsa_bwd):
        monkeypatch.setattr(module, "split3", _two_part_split)
    with fp32_mode("bf16x6"), _bf16x6_tiles("chunked"):
        c, layout = _tf32x3_cases()[0]
        with pytest.raises(agreement.OracleMismatch, match="ratio"):
            check_case(c, dout_layout=layout)


def _gpu_candidates():
    if DEVICE != "cuda":
        return []
    from benchmarks.dsa import BWD_CANDIDATES, FWD_CANDIDATES
    return ([("forward", c) for c in FWD_CANDIDATES] + [("backward", c) for c in BWD_CANDIDATES]
            + [("default", None)])


@pytest.mark.skipif(DEVICE != "cuda", reason="production tiles need a GPU")
@pytest.mark.parametrize("kind,cfg", _gpu_candidates())
def test_production_geometry_bf16(kind, cfg):
    """H=64, 512+64/512, K=2048, bf16, trainer layouts, under every benchmarked tile config."""
    fdsa.set_configs(**({kind: cfg} if cfg is not None else {}))
    try:
        c = make_case(T=24, H=64, DL=512, DR=64, S=3000, K=2048, dtype=torch.bfloat16, seed=10,
                      hole_rate=0.3, with_len=True)
        out, lse, grads = check_case(c, dout_layout="head_major", packed=True)
        assert_empty_rows_exact(c, out, lse, grads)
    finally:
        fdsa.set_configs()


def _gpu_fp32_candidates():
    """(fp32 mode, kind, config): every benchmarked fp32 config in its mode, and the defaults."""
    if DEVICE != "cuda":
        return []
    from benchmarks.dsa import (
        BF16X6_CANDIDATES,
        FP32_BWD_CANDIDATES,
        FP32_FWD_CANDIDATES,
        FP32_OLD,
        TF32X3_BWD_CANDIDATES,
        TF32X3_FWD_CANDIDATES,
    )
    return ([("acc64", "forward", c) for c in FP32_FWD_CANDIDATES]
            + [("acc64", "backward", c) for c in FP32_BWD_CANDIDATES]
            + [("acc64", "both", FP32_OLD), ("acc64", "default", None)]
            + [("tf32x3", "forward", c) for c in TF32X3_FWD_CANDIDATES]
            + [("tf32x3", "backward", c) for c in TF32X3_BWD_CANDIDATES]
            + [("tf32x3", "default", None), ("tf32x3_exp2", "default", None),
               ("bf16x6", "default", None)]
            + [("bf16x6", "both", c) for c in BF16X6_CANDIDATES])


@pytest.mark.skipif(DEVICE != "cuda", reason="production tiles need a GPU")
@pytest.mark.parametrize("mode,kind,cfg", _gpu_fp32_candidates())
def test_production_geometry_fp32(mode, kind, cfg):
    """H=64, 512+64/512, K=2048, fp32, trainer layouts, under every benchmarked fp32 config
    in its fp32 mode."""
    kw = {} if cfg is None else {"forward": cfg, "backward": cfg} if kind == "both" else {kind: cfg}
    fdsa.set_configs(**kw)
    try:
        with fp32_mode(mode):
            c = make_case(T=24, H=64, DL=512, DR=64, S=3000, K=2048, dtype=torch.float32,
                          seed=11, hole_rate=0.3, with_len=True)
            out, lse, grads = check_case(c, dout_layout="head_major", packed=True)
            assert_empty_rows_exact(c, out, lse, grads)
    finally:
        fdsa.set_configs()


def test_no_keys_or_no_slots():
    """S = 0 (all documents empty) or K = 0: every row is empty, gradients zero."""
    for S, K in [(0, 3), (4, 0)]:
        q = torch.randn(3, 2, 8, device=DEVICE, requires_grad=True)
        kv = torch.randn(S, 8, device=DEVICE, requires_grad=True)
        idx = torch.full((3, K), -1, dtype=torch.int32, device=DEVICE)
        out, lse = fdsa.dsa_sparse_attention_nope(q, kv, idx, return_lse=True)
        assert (out == 0).all() and (lse == float("-inf")).all()
        dq, dkv = torch.autograd.grad(out, [q, kv], torch.ones_like(out))
        assert (dq == 0).all() and dkv.shape == kv.shape and (dkv == 0).all()


@pytest.mark.parametrize("S,K", [(0, 3), (4, 0)])
def test_no_keys_or_no_slots_rope(S, K):
    """RoPE with S = 0 or K = 0: the kernel does not run, and dq_rope must still be zeros.

    A [T, H, Dr] block full of NaN is freed just before the backward, so an uninitialised
    dq_rope (torch.empty) would likely reuse it (the allocator's choice: without the fix this
    failed on the CPU with values ~1e15 or NaN)."""
    T, H, DL, DR = 3, 2, 8, 4
    ins = [torch.randn(T, H, DL, device=DEVICE), torch.randn(T, H, DR, device=DEVICE),
           torch.randn(S, DL, device=DEVICE), torch.randn(S, DR, device=DEVICE)]
    ins = [x.requires_grad_(True) for x in ins]
    idx = torch.zeros((T, K), dtype=torch.int32, device=DEVICE)
    out, lse = fdsa.dsa_sparse_attention(*ins, idx, softmax_scale=0.5, return_lse=True)
    assert (out == 0).all() and (lse == float("-inf")).all()
    junk = torch.full((T, H, DR), float("nan"), device=DEVICE)
    del junk
    grads = torch.autograd.grad(out, ins, torch.ones_like(out))
    for g, x in zip(grads, ins):
        assert g.shape == x.shape and (g == 0).all()


@pytest.mark.usefixtures("acc64_mode")
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_fp32_scores_in_natural_units(rope, scale):
    """fp32 scores are dot * scale, rounded once (docs/FINDINGS.md F6): with small-integer inputs and
    an exact scale every score is exact in fp32, so a row with one valid slot must give
    lse == its score and out == the key row, bit for bit. Kept in base 2 (dot * fl(scale*log2e),
    then lse2 * ln2) the lse is off by an ulp or more: that version failed this test."""
    g = torch.Generator().manual_seed(7)
    T, H, DL, DR, S, K = 8, 3, 24, 8 if rope else 0, 11, 5

    def ints(*shape):
        return torch.randint(-3, 4, shape, generator=g).float().to(DEVICE)

    q, kv = ints(T, H, DL), ints(S, DL)
    qr, kr = (ints(T, H, DR), ints(S, DR)) if rope else (None, None)
    idx = torch.full((T, K), -1, dtype=torch.int32)
    key = torch.randint(0, S, (T,), generator=g)
    idx[torch.arange(T), torch.arange(T) % K] = key.to(torch.int32)
    idx = idx.to(DEVICE)
    if rope:
        out, lse = fdsa.dsa_sparse_attention(q, qr, kv, kr, idx, softmax_scale=scale,
                                             return_lse=True)
    else:
        out, lse = fdsa.dsa_sparse_attention_nope(q, kv, idx, softmax_scale=scale, return_lse=True)
    rows = key.to(DEVICE)
    score = torch.einsum("thd,thd->th", q.double(), kv[rows][:, None, :].double())
    if rope:
        score = score + torch.einsum("thd,thd->th", qr.double(), kr[rows][:, None, :].double())
    score = score * scale
    assert score.abs().max() > 4  # large enough that a log2e round trip moves it
    assert torch.equal(lse.double(), score), (lse.double() - score).abs().max()
    assert torch.equal(out, kv[rows][:, None, :].expand(T, H, DL))


@pytest.mark.usefixtures("acc64_mode")
@pytest.mark.parametrize("rope", [False, True])
def test_fp32_score_dot_rounded_once(rope):
    """fp32 scores come from an fp64-accumulated dot rounded once (docs/FINDINGS.md F6,
    F17): a score whose fp32 partial sums cancel (2^25 + 1 - 2^25, exact 1) must
    give lse == 1 * scale with one valid slot per row. An fp32 dot rounds 2^25 + 1 to 2^25 and
    returns 0 (main's kernel, rope case: lse 0, every row fails). Backward: with one slot,
    P = 1 and dS = P (dP - Delta) = 0 exactly in exact arithmetic, so dq must be exactly 0."""
    T, H, DL, S, K = 4, 2, 16, 5, 3
    big = float(2 ** 25)
    q = torch.zeros(T, H, DL)
    kv = torch.ones(S, DL)
    q[..., 0], q[..., 1] = big, 1.0
    if rope:
        qr, kr = torch.zeros(T, H, 16), torch.ones(S, 16)
        qr[..., 3] = -big
    else:
        q[..., 2] = -big
    idx = torch.full((T, K), -1, dtype=torch.int32)
    idx[torch.arange(T), torch.arange(T) % K] = (torch.arange(T) % S).to(torch.int32)
    q, kv, idx = q.to(DEVICE).requires_grad_(), kv.to(DEVICE), idx.to(DEVICE)
    scale = 0.5
    if rope:
        qr, kr = qr.to(DEVICE).requires_grad_(), kr.to(DEVICE)
        out, lse = fdsa.dsa_sparse_attention(q, qr, kv, kr, idx, softmax_scale=scale,
                                             return_lse=True)
    else:
        out, lse = fdsa.dsa_sparse_attention_nope(q, kv, idx, softmax_scale=scale,
                                                  return_lse=True)
    assert torch.equal(lse, torch.full_like(lse, scale)), lse
    assert torch.equal(out, torch.ones_like(out))
    dout = torch.randint(-3, 4, out.shape, generator=torch.Generator().manual_seed(3)).float()
    out.backward(dout.to(DEVICE))
    assert torch.equal(q.grad, torch.zeros_like(q)), q.grad.abs().max()


# ----------------------------------------------------------------------------- native dot chains

def _compiled_irs(script, source: str) -> dict:
    """Run ``source`` (a script compiling kernels for sm_90 without a GPU and printing a JSON
    dict of their IRs on its last line) in a fresh interpreter, outside Triton's interpreter."""
    import json
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the current default, stated (no warning)
    script.write_text(source)  # @triton.jit reads its source from a file
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                       cwd=root, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


_TTIR_SCRIPT = r'''
import inspect
import json, sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attention_oracle.fast.kernels.dsa_bwd import (
    dsa_bwd_kernel, dsa_fp32_bwd_dq_kernel, dsa_fp32_bwd_scores_kernel)
from attention_oracle.fast.kernels.dsa_fwd import (
    dsa_fp32_pv_kernel, dsa_fp32_scores_kernel, dsa_fwd_kernel)


@triton.jit
def folded_control(a_ptr, b_ptr, o_ptr, n, B: tl.constexpr):
    """Negative control: acc + tl.dot(a, b) in a loop, which Triton folds into the dot."""
    offs = tl.arange(0, B)
    acc = tl.zeros([B, B], dtype=tl.float32)
    for i in range(0, n):
        a = tl.load(a_ptr + i * B * B + offs[:, None] * B + offs[None, :])
        b = tl.load(b_ptr + offs[:, None] * B + offs[None, :])
        acc = acc + tl.dot(a, b, input_precision="ieee")
    tl.store(o_ptr + offs[:, None] * B + offs[None, :], acc)


def ttir(kernel, consts, floats=(), pointers=None):
    consts = {**{p.name: p.default for p in kernel.params
                 if p.is_constexpr and p.default is not inspect.Parameter.empty}, **consts}
    sig = {}
    for name in kernel.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in (pointers or {}):
            sig[name] = pointers[name]
        elif name.endswith("_ptr"):
            sig[name] = "*i32" if name in ("idx_ptr", "len_ptr") else "*fp32"
        else:
            sig[name] = "fp32" if name in floats else "i32"
    src = ASTSource(fn=kernel, signature=sig,
                    constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=4, num_stages=1))
    return compiled.asm["ttir"]


common = dict(HAS_ROPE=True, HAS_LEN=True, ONE_TILE=True, BLOCK_H=16, BLOCK_K=32, BLOCK_D=16,
              BLOCK_DR=16, PRECISION="ieee", FP32_TC=0)
fwd = dict(common, BLOCK_DV=16, PDL=False, SPLIT_S=0)
bwd = dict(common, BLOCK_DC=16, DKV_T=False, SPLIT_S=False, HALVES=False)
floats = ("scale", "scale_log2")
split = dict(HAS_LEN=True, BLOCK_H=64, BF16=True)  # the "bf16x6" launches, 64-head tiles
parts = dict(kvp_ptr="*bf16", krp_ptr="*bf16", bl_ptr="*fp64", delta_ptr="*fp64",
             dkv_ptr="*fp64", dkr_ptr="*fp64")
print(json.dumps({
    "bf16x6_scores": ttir(dsa_fp32_scores_kernel, dict(split, HAS_ROPE=True, BLOCK_N=64,
                          BLOCK_D=64, BLOCK_DR=64), floats, parts),
    "bf16x6_pv": ttir(dsa_fp32_pv_kernel, dict(split, BLOCK_K=64, BLOCK_N=64, BLOCK_DV=128),
                      floats, parts),
    "bf16x6_bwd_scores": ttir(dsa_fp32_bwd_scores_kernel, dict(split, HAS_ROPE=True, BLOCK_N=64,
                              BLOCK_D=64, BLOCK_DR=64), floats, parts),
    "bf16x6_dq": ttir(dsa_fp32_bwd_dq_kernel, dict(split, HAS_ROPE=True, BLOCK_K=64,
                      BLOCK_DC=128, BLOCK_DR=64), floats, parts),
    "control": ttir(folded_control, dict(B=16)),
    "fwd": ttir(dsa_fwd_kernel, dict(fwd, ACC64=False), floats),
    "bwd": ttir(dsa_bwd_kernel, dict(bwd, ACC64=False), floats),
    "fwd_acc64": ttir(dsa_fwd_kernel, dict(fwd, ACC64=True), floats),
    "bwd_acc64": ttir(dsa_bwd_kernel, dict(bwd, ACC64=True), floats),
    "fwd_tc": ttir(dsa_fwd_kernel, dict(fwd, ACC64=False, FP32_TC=1, PRECISION="tf32x3"), floats),
    "bwd_tc": ttir(dsa_bwd_kernel, dict(bwd, ACC64=False, FP32_TC=1, PRECISION="tf32x3"), floats),
    "fwd_tc2": ttir(dsa_fwd_kernel, dict(fwd, ACC64=False, FP32_TC=2, PRECISION="tf32x3"), floats),
    "bwd_tc2": ttir(dsa_bwd_kernel, dict(bwd, ACC64=False, FP32_TC=2, PRECISION="tf32x3"), floats),
}))
'''


def _loop_carried_f32_dots(ttir):
    """Names of values yielded by an scf loop that are fp32 tt.dot results (a dot chained
    through a loop-carried accumulator)."""
    import re
    defs = {}
    for line in ttir.splitlines():
        m = re.match(r"\s*(%[\w.]+) = (\S+) .*", line)
        if m:
            defs[m.group(1)] = line
    chained = []
    for line in ttir.splitlines():
        if "scf.yield" not in line:
            continue
        for name in re.findall(r"%[\w.]+", line.split(":")[0]):
            d = defs.get(name, "")
            if " tt.dot " in d and re.search(r"-> tensor<[\dx]+xf32>", d):
                chained.append(d.strip())
    return chained


def test_fp32_block_dots_not_folded(tmp_path):
    """fp32 P.V (forward) and dS.K (backward, dq and dq_rope) must be summed per slot block and
    added to the accumulator, not chained through it: Triton's combine pass turns
    ``acc * alpha + tl.dot(p, v)`` into ``tl.dot(p, v, acc * alpha)`` natively, so the fp32
    accumulator became ONE sequential FMA chain over all slots of a row (docs/FINDINGS.md F17:
    `index.compacted_attention` K = 2048, 1536 duplicate slots of one key, out error 4.46e-05,
    ratio 22). The interpreter does not fold, so this compiles the kernels for sm_90 (no GPU
    needed) and reads the TTIR: the acc64 kernels, and the tf32x3 ones (``_tc``: their dots are
    still one tt.dot each in TTIR), and the bf16x6 launches, whose latent-piece loops must add
    each piece's part products to the running score too (dsa_common.dot6: chained through it
    on the tensor cores, the H200 failed the rule). Negative control: a plain ``acc + tl.dot``
    loop is flagged."""
    irs = _compiled_irs(tmp_path / "dsa_ttir.py", _TTIR_SCRIPT)
    assert _loop_carried_f32_dots(irs["control"]), "control: the fold was not detected"
    for name in ("fwd", "bwd", "fwd_acc64", "bwd_acc64", "fwd_tc", "bwd_tc", "fwd_tc2", "bwd_tc2",
                 "bf16x6_scores", "bf16x6_pv", "bf16x6_bwd_scores", "bf16x6_dq"):
        assert not _loop_carried_f32_dots(irs[name]), (name, _loop_carried_f32_dots(irs[name]))


_UNIT_SIZES_SCRIPT = r'''
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attention_oracle.fast.kernels.dsa_bwd import (
    dsa_fp32_bwd_dq_kernel, dsa_fp32_bwd_scores_kernel, dsa_fp32_delta_kernel)
from attention_oracle.fast.kernels.dsa_fwd import dsa_fp32_pv_kernel, dsa_fp32_scores_kernel

ONES = dict(H=1, S=1, K=1, NB=1, DR=1, stride_ik=1, stride_qd=1, stride_qrd=1, stride_od=1,
            stride_dod=1)
PTRS = dict(kvp_ptr="*bf16", krp_ptr="*bf16", idx_ptr="*i32", len_ptr="*i32", bl_ptr="*fp64",
            delta_ptr="*fp64", dkv_ptr="*fp64", dkr_ptr="*fp64")
split = dict(HAS_LEN=True, BLOCK_H=16, BF16=True, I32=True)
kernels = {
    "scores": (dsa_fp32_scores_kernel, dict(split, HAS_ROPE=True, BLOCK_N=16, BLOCK_D=16,
                                            BLOCK_DR=16)),
    "pv": (dsa_fp32_pv_kernel, dict(split, BLOCK_K=16, BLOCK_N=16, BLOCK_DV=16)),
    "delta": (dsa_fp32_delta_kernel, dict(BLOCK_H=16, BLOCK_D=16)),
    "bwd_scores": (dsa_fp32_bwd_scores_kernel, dict(split, HAS_ROPE=True, BLOCK_N=16,
                                                    BLOCK_D=16, BLOCK_DR=16)),
    "dq": (dsa_fp32_bwd_dq_kernel, dict(split, HAS_ROPE=True, BLOCK_K=16, BLOCK_DC=16,
                                        BLOCK_DR=16)),
}
done = {}
for name, (kernel, consts) in kernels.items():
    consts = dict(consts, **{k: v for k, v in ONES.items() if k in kernel.arg_names})
    sig = {a: "constexpr" if a in consts else PTRS.get(a, "*fp32") if a.endswith("_ptr")
           else "fp32" if a == "scale" else "i32" for a in kernel.arg_names}
    src = ASTSource(fn=kernel, signature=sig,
                    constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    done[name] = True
print(json.dumps(done))
'''


def test_bf16x6_kernels_compile_with_unit_sizes(tmp_path):
    """On the GPU Triton passes an integer argument equal to 1 as a constant: the "bf16x6"
    launches must compile with S, K, H, the block count and Dr equal to 1 (``S.to(tl.int64)``
    of a constant failed the H200's conformance run on S = 1 cases). Compiled for sm_90
    without a GPU; the interpreter never sees such constants."""
    done = _compiled_irs(tmp_path / "dsa_unit_sizes.py", _UNIT_SIZES_SCRIPT)
    assert set(done) == {"scores", "pv", "delta", "bwd_scores", "dq"}


# ----------------------------------------------------------------------------- score dot layouts

_TTGIR_SCRIPT = r'''
import inspect
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attention_oracle.fast.kernels.dsa_bwd import dsa_bwd_kernel
from attention_oracle.fast.kernels.dsa_fwd import dsa_fwd_kernel


def ttgir(kernel, consts):
    consts = {**{p.name: p.default for p in kernel.params
                 if p.is_constexpr and p.default is not inspect.Parameter.empty}, **consts}
    sig = {}
    for name in kernel.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = {"idx_ptr": "*i32", "len_ptr": "*i32", "lse_ptr": "*fp32",
                         "dkv_ptr": "*fp32", "dkr_ptr": "*fp32"}.get(name, "*bf16")
        else:
            sig[name] = "fp32" if name in ("scale", "scale_log2") else "i32"
    src = ASTSource(fn=kernel, signature=sig,
                    constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=8, num_stages=1))
    return compiled.asm["ttgir"]


# 64 heads and 8 warps, as in production, on small latent tiles (layouts depend on M and warps)
common = dict(HAS_ROPE=True, HAS_LEN=True, BLOCK_H=64, BLOCK_K=32, BLOCK_DR=16, PRECISION="tf32",
              ACC64=False, FP32_TC=0)
fwd = dict(common, ONE_TILE=True, BLOCK_D=64, BLOCK_DV=64, PDL=False)
bwd = dict(common, ONE_TILE=False, BLOCK_D=16, BLOCK_DC=32, DKV_T=True, HALVES=True)
print(json.dumps({
    "fwd_split": ttgir(dsa_fwd_kernel, dict(fwd, SPLIT_S=1)),
    "fwd_split2": ttgir(dsa_fwd_kernel, dict(fwd, SPLIT_S=2)),
    "fwd_control": ttgir(dsa_fwd_kernel, dict(fwd, SPLIT_S=0)),
    "bwd_split": ttgir(dsa_bwd_kernel, dict(bwd, SPLIT_S=True)),
    "bwd_control": ttgir(dsa_bwd_kernel, dict(bwd, SPLIT_S=False)),
}))
'''


def _score_dot_warps(ttgir, m=64, n=32):
    """warpsPerCTA of every MMA whose result is an [m, n] fp32 tile (the score / dP dots)."""
    import re
    layouts = dict(re.findall(r"^(#mma\d*) = .*warpsPerCTA = \[(\d+, \d+)\]", ttgir, re.M))
    return [layouts[lay] for lay in
            re.findall(rf"warp_group_dot .*-> tensor<{m}x{n}xf32, (#mma\d*)>", ttgir)]


def test_split_scores_unchain_score_dots(tmp_path):
    """``split_scores`` must give the score dots warpsPerCTA [4, 2] (each warpgroup its own slot
    columns) with 64 heads and 8 warps. Without it Triton lays a dot whose result reaches
    another dot out as [8, 1]: 128 rows of warps for 64 heads, so both warpgroups compute the
    whole score tile (docs/DESIGN.md "11. fast DSA (Triton)": forward 208 -> 277 TFLOP/s on the
    H200). The speed only, never the values, depends on this; a Triton that looked through
    the branch would fail here first. Compiles for sm_90 without a GPU; the control (no
    split) must show [8, 1]."""
    irs = _compiled_irs(tmp_path / "dsa_ttgir.py", _TTGIR_SCRIPT)
    for name in ("fwd_control", "bwd_control"):
        assert "8, 1" in _score_dot_warps(irs[name]), (name, _score_dot_warps(irs[name]))
    for name in ("fwd_split", "fwd_split2", "bwd_split"):
        warps = _score_dot_warps(irs[name])
        assert warps and set(warps) == {"4, 2"}, (name, warps)


# ----------------------------------------------------------------------------- wgmma pipelining

_PTXAS_SCRIPT = r'''
import dataclasses
import json
from attention_oracle.fast import dsa as fdsa
from attention_oracle.fast.kernels import dsa_probe

cfg = fdsa.candidate_configs(64, 512, backward=False, device_type="cuda")[0]
numbers = (cfg.block_h, cfg.block_k, cfg.block_d, cfg.block_dv, cfg.num_warps, cfg.num_stages,
           int(cfg.dkv_transposed), int(cfg.split_scores))
switches = [f.name for f in dataclasses.fields(cfg)
            if f.name in dsa_probe._SWITCHES and getattr(cfg, f.name)]
result = {}
for name, sw in (("default", switches), ("control", [s for s in switches if s != "no_zero_trip"])):
    asm = dsa_probe.compile_for_sm90("fwd", numbers, asm=True, switches=sw)[-1]
    messages, counts = dsa_probe.loop_counts(asm["ptx"])
    result[name] = dict(messages=messages, counts=counts)
print(json.dumps(result))
'''


def _serialised(compiled):
    """ptxas's wgmma serialisation: its warning C7515 and a WARPGROUP wait per HGMMA."""
    counts = compiled["counts"]
    return ("C7515" in compiled["messages"]
            or counts.get("WARPGROUP", 0) >= counts.get("HGMMA", 0) > 0)


def test_default_forward_wgmma_pipelined(tmp_path):
    """The default 16-bit GPU forward (64 heads, Dl 512, split scores, 2 stages) must keep its
    wgmma pipelined. With a slot loop that may run zero times, the ptxas of Triton 3.8 (CI's)
    serialises every wgmma of the kernel (warning C7515: an accumulator defined by moves on the
    loop's bypass path while the P.V dot is in flight across iterations), one WARPGROUP wait per
    HGMMA in the loop (docs/DESIGN.md "11. fast DSA (Triton)", docs/FINDINGS.md F19). Compiles for sm_90a without a
    GPU, with Triton's ptxas. The control (the default without ``no_zero_trip``) shows the
    serialisation under Triton 3.8; Triton 3.6's ptxas (the H200 machine's) pipelines both,
    so there the control is only reported."""
    if dsa_probe_ptxas() is None:
        pytest.skip("no ptxas in this Triton")
    irs = _compiled_irs(tmp_path / "dsa_ptxas.py", _PTXAS_SCRIPT)
    control, default = irs["control"], irs["default"]
    assert not _serialised(default), (default["messages"], default["counts"])
    if _serialised(control):
        return
    import triton
    assert triton.__version__.startswith("3.6"), (
        f"Triton {triton.__version__}: the control was not serialised, so this test cannot "
        f"tell a serialised default from a pipelined one: {control['counts']}")


def dsa_probe_ptxas():
    from attention_oracle.fast.kernels import dsa_probe
    return dsa_probe._bin("ptxas-blackwell", "ptxas")


# ----------------------------------------------------------------------------- slot order

def slot_order_reference(idx, topk_length, S, concurrency):
    """fast.dsa.slot_order in torch: valid slots ascending from the pivot key
    lo + (hi - lo + 1) (t mod C) // C, the keys below it after."""
    T, K = idx.shape
    valid = (idx >= 0) & (idx < S)
    if topk_length is not None:
        valid &= torch.arange(K, device=idx.device)[None, :] < topk_length[:, None].long()
    out = torch.full((T, K), -1, dtype=torch.int32)
    n = valid.sum(1)
    for t in range(T):
        keys = idx[t][valid[t]].long().sort().values.cpu()
        if len(keys):
            lo, hi = int(keys[0]), int(keys[-1])
            pivot = lo + (hi - lo + 1) * (t % concurrency) // concurrency
            keys = torch.cat([keys[keys >= pivot], keys[keys < pivot]])
        out[t, :int(n[t])] = keys.int()
    return out, n.int().cpu()


def slot_order_runs_reference(idx, topk_length, S, concurrency):
    """fast.dsa.slot_order's "runs" form in torch: with the pivot's keys (rel = key - pivot
    mod 2**30), the row padded to a power of two P >= 2 and L = max(1, P / 64) samples, sample
    l holding slots l, l + L, ...: each sample ascending by rel, invalid slots last, written
    rank-major (position r * L + l), -1 where a sample has no r-th valid slot; the length the
    end of the last valid one."""
    T, K = idx.shape
    valid = (idx >= 0) & (idx < S)
    if topk_length is not None:
        valid &= torch.arange(K, device=idx.device)[None, :] < topk_length[:, None].long()
    idx, valid = idx.long().cpu(), valid.cpu()
    P = max(2, 1 << (K - 1).bit_length())
    L = max(1, P // 64)
    out = torch.full((T, K), -1, dtype=torch.int32)
    n = torch.zeros(T, dtype=torch.int32)
    for t in range(T):
        if not valid[t].any():
            continue
        keys = idx[t][valid[t]]
        lo, hi = int(keys.min()), int(keys.max())
        pivot = lo + (hi - lo + 1) * (t % concurrency) // concurrency
        rel = torch.full((P,), 1 << 40, dtype=torch.long)
        rel[:K] = torch.where(valid[t], (idx[t] - pivot) % (1 << 30), 1 << 40)
        ranked = rel.reshape(P // L, L).sort(dim=0).values.reshape(-1)[:K]  # [r, l] flattened
        ok = ranked < (1 << 30)
        out[t] = torch.where(ok, (ranked + pivot) % (1 << 30), -1).int()
        n[t] = int(ok.nonzero().max()) + 1
    return out, n


# a full-size row (2048 slots, and a padded 4096-slot sort) takes minutes in the interpreter;
# 200 slots (a 256-key sort) puts three register stages before the loop form's lane stages
@pytest.mark.parametrize("K", [1, 37, 64, 200] + ([2048, 3000] if DEVICE == "cuda" else []))
@pytest.mark.parametrize("with_len", [False, True])
@pytest.mark.parametrize("form", fdsa.ORDER_FORMS)
def test_slot_order_sorts_and_rotates_valid_slots(K, with_len, form, monkeypatch):
    """Holes (-1, -3), keys past S, duplicates, lengths past K and 0, an int64 K-major view;
    each form of the ordering kernel."""
    monkeypatch.setattr(fdsa, "ORDER_CONCURRENCY", 3)
    c = make_case(T=7, H=1, DL=8, DR=0, S=29, K=K, dtype=torch.float32, seed=K, hole_rate=0.4,
                  with_len=with_len)
    idx = c["idx"].long().t().contiguous().t()  # strides (1, T)
    rows, lengths = fdsa.slot_order(idx, c["topk_length"], 29, form=form)
    reference = slot_order_runs_reference if form == "runs" else slot_order_reference
    want, want_n = reference(idx, c["topk_length"], 29, 3)
    assert torch.equal(lengths.cpu(), want_n)
    assert torch.equal(rows.cpu(), want), f"rows {rows.cpu()} != {want}"


@pytest.mark.parametrize("K", [200, 300] + ([2048, 3000] if DEVICE == "cuda" else []))
def test_slot_order_runs_keep_compacted_rows_compact(K, monkeypatch):
    """Rows whose valid slots come first (index preparation's compacted rows) stay so in the
    "runs" form: the same valid keys first, -1 after, the same lengths."""
    monkeypatch.setattr(fdsa, "ORDER_CONCURRENCY", 5)
    g = torch.Generator().manual_seed(K)
    T, S = 9, 5000
    idx = torch.randint(0, S, (T, K), generator=g, dtype=torch.int32).to(DEVICE)
    n = torch.randint(0, K + 1, (T,), generator=g, dtype=torch.int32)
    n[0], n[1] = 0, K
    rows, lengths = fdsa.slot_order(idx, n.to(DEVICE), S, form="runs")
    rows, lengths = rows.cpu(), lengths.cpu()
    assert torch.equal(lengths, n)
    for t in range(T):
        m = int(n[t])
        assert (rows[t, m:] == -1).all(), t
        assert torch.equal(rows[t, :m].sort().values, idx[t, :m].cpu().sort().values), t


def test_slot_order_refuses_keys_past_its_wrap():
    """The ordering sorts keys as (key - pivot) mod 2**30: more keys is a ValueError naming S,
    and such calls keep their rows; an unknown form is a ValueError naming form."""
    idx = torch.zeros(2, 4, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="S"):
        fdsa.slot_order(idx, None, fdsa.ORDER_MAX_S + 1)
    with pytest.raises(ValueError, match="form"):
        fdsa.slot_order(idx, None, 8, form="bubble")
    previous = fdsa.set_slot_order("backward")
    try:
        big = torch.zeros(fdsa.ORDER_MIN_SLOTS // 2048, 2048, dtype=torch.int32)
        kv = torch.zeros(1, 8).expand(fdsa.ORDER_MAX_S + 1, 8)  # no memory
        assert not fdsa._orders("backward", big, kv, None)
    finally:
        fdsa.set_slot_order(previous)


@pytest.fixture
def order_settings():
    """Restores the slot order and both steps' forms after a test that sets them."""
    previous = (fdsa.set_slot_order("on"), fdsa.set_slot_order_form("loop"),
                fdsa.set_slot_order_form("loop", step="backward"))
    yield
    fdsa.set_slot_order(previous[0])
    fdsa.set_slot_order_form(previous[1])
    fdsa.set_slot_order_form(previous[2], step="backward")


@pytest.mark.parametrize("order,form,backward_form,K", [
    ("on", "network", "loop", 37), ("backward", "network", "network", 37),
    ("on", "runs", "runs", 100), ("backward", "runs", "runs", 100), ("on", "runs", "loop", 100)])
def test_ordered_slots_agree(order, form, backward_form, K, monkeypatch, order_settings):
    """The forward and backward with their rows put in the slot order (every call here: the
    size floors at 0, three programs a rotation) against float64, empty rows exact; the
    "runs" form on rows of two samples, so rows with holes keep holes inside their length;
    the backward ordering the forward's "runs" rows again."""
    monkeypatch.setattr(fdsa, "ORDER_MIN_SLOTS", 0)
    monkeypatch.setattr(fdsa, "ORDER_MIN_KEY_BYTES", 0)
    monkeypatch.setattr(fdsa, "ORDER_CONCURRENCY", 3)
    fdsa.set_slot_order(order)
    fdsa.set_slot_order_form(form)
    fdsa.set_slot_order_form(backward_form, step="backward")
    c = make_case(T=7, H=3, DL=40, DR=24, S=23, K=K, dtype=torch.float32, seed=3, with_len=True)
    out, lse, grads = check_case(c)
    assert_empty_rows_exact(c, out, lse, grads)


def orderings_launched(monkeypatch):
    """The forms of the ordering launches from here on, in order (every call ordered: the
    size floors at 0)."""
    monkeypatch.setattr(fdsa, "ORDER_MIN_SLOTS", 0)
    monkeypatch.setattr(fdsa, "ORDER_MIN_KEY_BYTES", 0)
    launched, ordering = [], fdsa.slot_order

    def spy(indices, topk_length, S, num_warps=None, form=None):
        launched.append(form or fdsa.settings()["slot_order_form"])
        return ordering(indices, topk_length, S, num_warps=num_warps, form=form)

    monkeypatch.setattr(fdsa, "slot_order", spy)
    return launched


@pytest.mark.parametrize("order,form,backward_form,change,orderings", [
    ("on", "runs", "loop", None, [("forward", "loop")]),  # a call with a backward: its form
    ("on", "loop", "runs", None, [("forward", "runs")]),
    ("on", "runs", "loop", "network", [("forward", "loop")]),  # the same rows: kept
    ("on", "runs", "loop", "runs", [("forward", "loop"), ("backward", "runs")]),
    ("on", "loop", "runs", "loop", [("forward", "runs"), ("backward", "loop")]),
    ("backward", "runs", "loop", None, [("backward", "loop")]),
    ("off", "runs", "loop", None, [])])
def test_backward_orders_rows_once_in_its_form(order, form, backward_form, change, orderings,
                                               monkeypatch, order_settings):
    """Which step launches the ordering, in which form: a call that records a backward orders
    its rows once, in the backward's form; the backward orders them again only where the
    setting changed to another order between the steps (``change``)."""
    launched = orderings_launched(monkeypatch)
    fdsa.set_slot_order(order)
    fdsa.set_slot_order_form(form)
    fdsa.set_slot_order_form(backward_form, step="backward")
    c = make_case(T=5, H=2, DL=16, DR=0, S=19, K=40, dtype=torch.float32, seed=1)
    q, kv = (c[n].clone().requires_grad_() for n in ("q", "kv"))
    out = fdsa.dsa_sparse_attention_nope(q, kv, c["idx"])
    before = len(launched)
    if change:
        fdsa.set_slot_order_form(change, step="backward")
    out.sum().backward()
    steps = ["forward"] * before + ["backward"] * (len(launched) - before)
    assert list(zip(steps, launched)) == orderings
    with pytest.raises(ValueError, match="step"):
        fdsa.set_slot_order_form("loop", step="both")


@pytest.mark.parametrize("form", ["runs", "loop"])
def test_calls_without_backward_order_in_the_forward_form(form, monkeypatch, order_settings):
    """Under "on" a call that records no backward (no grad, or no input that needs one) orders
    its rows in the forward's form."""
    launched = orderings_launched(monkeypatch)
    fdsa.set_slot_order_form(form)
    fdsa.set_slot_order_form("network", step="backward")
    c = make_case(T=5, H=2, DL=16, DR=0, S=19, K=40, dtype=torch.float32, seed=1)
    fdsa.dsa_sparse_attention_nope(c["q"], c["kv"], c["idx"])
    with torch.no_grad():
        fdsa.dsa_sparse_attention_nope(c["q"].clone().requires_grad_(), c["kv"], c["idx"])
    assert launched == [form, form]


def test_slot_order_floors():
    """Calls below ORDER_MIN_SLOTS slots, with rows past ORDER_MAX_K, or whose key rows fit
    ORDER_MIN_KEY_BYTES keep their rows; the others are ordered where the setting says."""
    kv, kr = torch.zeros(10, 8), torch.zeros(10, 2)
    big = torch.zeros(fdsa.ORDER_MIN_SLOTS // 2048, 2048, dtype=torch.int32)
    previous = fdsa.set_slot_order("backward")
    try:
        assert not fdsa._orders("forward", big, kv, kr)
        assert fdsa._orders("backward", big, kv, kr)  # the CPU: no L2 to fit
        assert not fdsa._orders("backward", torch.zeros(4, 8, dtype=torch.int32), kv, kr)
        assert not fdsa._orders("backward", torch.zeros(1 << 12, fdsa.ORDER_MAX_K + 1), kv, kr)
        fdsa.set_slot_order("on")
        assert fdsa._orders("forward", big, kv, kr)
        fdsa.ORDER_MIN_KEY_BYTES, floor = 10 * 40, fdsa.ORDER_MIN_KEY_BYTES
        try:  # 10 rows of 8 + 2 fp32 channels: 400 bytes, not past 400
            assert not fdsa._orders("forward", big, kv, kr)
            assert fdsa._orders("forward", big, torch.zeros(11, 8), kr)
        finally:
            fdsa.ORDER_MIN_KEY_BYTES = floor
    finally:
        fdsa.set_slot_order(previous)


def test_slot_order_defaults():
    """"on"; both steps' rows in the "loop" form."""
    assert fdsa.ORDERS == ("off", "backward", "on")
    if "ATTENTION_ORACLE_FAST_DSA_ORDER" not in os.environ:
        assert fdsa.settings()["slot_order"] == "on"
    if "ATTENTION_ORACLE_FAST_DSA_ORDER_FORM" not in os.environ:
        assert fdsa.settings()["slot_order_form"] == "loop"
    if "ATTENTION_ORACLE_FAST_DSA_BACKWARD_ORDER_FORM" not in os.environ:
        assert fdsa.settings()["backward_slot_order_form"] == "loop"
