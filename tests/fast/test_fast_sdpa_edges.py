"""Edge cases of fast SDPA's host layer (fast/sdpa.py) around autograd and tensor metadata:
tensors saved for the backward that come back in another layout, gradients of gradients
forward-mode tangents, negative-bit views, the scale's range and the call plans' keys
(docs/FINDINGS.md F50-F55).

On CPU the kernels run under Triton's interpreter (small shapes)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.autograd.forward_ad as fwAD  # noqa: E402

from attention_oracle.fast.sdpa import scaled_dot_product_attention  # noqa: E402
from tests.fast.test_fast_sdpa_smoke import DEVICE, randn  # noqa: E402


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def _fused_qkv(gen, dtype=torch.float32, B=1, L=6, H=2, E=16):
    """q, k, v as head-major slices of one [B, L, H, 3E] projection (non-contiguous views, as
    a fused QKV projection gives them), and the leaf they come from."""
    qkv = randn(B, L, H, 3 * E, dtype=dtype, gen=gen).requires_grad_()
    return qkv, lambda: qkv.transpose(1, 2).split(E, -1)


def _column_major(t):
    """A saved-tensor pack hook that keeps a copy of ``t`` with its last two dims column-major
    (the values unchanged, every stride changed)."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2) if t.dim() >= 2 else t.clone()


def _grads_of(qkv, views, dout, mask, hooks):
    q, k, v = views()
    if hooks == "save_on_cpu":
        ctx = torch.autograd.graph.save_on_cpu(pin_memory=True)
    elif hooks == "column_major":
        ctx = torch.autograd.graph.saved_tensors_hooks(_column_major, lambda t: t)
    else:
        ctx = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    with ctx:
        out = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return torch.autograd.grad(out, qkv, dout)[0]


@pytest.mark.parametrize("hooks", ["save_on_cpu", "column_major"])
@pytest.mark.parametrize("masked", [False, True], ids=["cached_plan", "masked"])
def test_saved_tensors_in_another_layout(hooks, masked, gen):
    """F50: saved-tensor hooks (``save_on_cpu(pin_memory=True)`` copies each saved tensor
    contiguous) may give the backward its saved tensors in another layout than the forward's:
    the gradients equal those without hooks."""
    qkv, views = _fused_qkv(gen)
    mask = torch.rand(6, 6, generator=gen).to(DEVICE) > 0.3 if masked else None
    dout = randn(1, 2, 6, 16, dtype=torch.float32, gen=gen)
    expected = _grads_of(qkv, views, dout, mask, None)
    got = _grads_of(qkv, views, dout, mask, hooks)
    assert torch.equal(got, expected), (f"{hooks}: gradients differ by "
                                        f"{(got - expected).abs().max().item()}")


@pytest.mark.parametrize("masked", [False, True], ids=["cached_plan", "masked"])
@pytest.mark.parametrize("through", ["grad", "backward"])
def test_double_backward_is_refused(masked, through, gen):
    """F51: gradients taken with create_graph=True and differentiated again (a gradient
    penalty) raise NotImplementedError instead of entering the graph as constants; their values
    are those of an ordinary backward."""
    q, k, v = (randn(1, 2, 5, 16, dtype=torch.float32, gen=gen).requires_grad_() for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool, device=DEVICE) if masked else None
    dout = randn(1, 2, 5, 16, dtype=torch.float32, gen=gen)
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    first = torch.autograd.grad(out, (q, k, v), dout)
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    grads = torch.autograd.grad(out, (q, k, v), dout, create_graph=True)
    for name, g, expected in zip(("dq", "dk", "dv"), grads, first):
        assert torch.equal(g, expected), f"{name} differs under create_graph=True"
    loss = (out * dout).sum() + sum((g ** 2).sum() for g in grads)
    with pytest.raises(NotImplementedError, match="differentiate twice"):
        if through == "grad":
            torch.autograd.grad(loss, (q, k, v))
        else:
            loss.backward()


@pytest.mark.parametrize("planned,dual", [(True, "query"), (True, "key"), (True, "value"),
                                          (False, "query"), (False, "attn_mask")])
def test_forward_mode_tangents_are_refused(planned, dual, gen):
    """F52: an input with a forward-mode tangent (``forward_ad.make_dual``) is refused by name,
    not run as if it had none (its out carried no tangent); inputs without one still run under a
    dual level, and a dual dout (forward-over-reverse) is refused too."""
    q, k, v = (randn(1, 2, 5, 16, dtype=torch.float32, gen=gen) for _ in range(3))
    mask = None if planned else randn(5, 5, dtype=torch.float32, gen=gen)
    inputs = dict(query=q, key=k, value=v, attn_mask=mask)
    expected = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with fwAD.dual_level():
        assert torch.equal(scaled_dot_product_attention(q, k, v, attn_mask=mask), expected)
        inputs[dual] = fwAD.make_dual(inputs[dual], torch.ones_like(inputs[dual]))
        with pytest.raises(NotImplementedError, match=dual):
            scaled_dot_product_attention(**inputs)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = scaled_dot_product_attention(*leaves, attn_mask=mask)
    with fwAD.dual_level():
        dout = fwAD.make_dual(torch.ones_like(out), torch.ones_like(out))
        with pytest.raises(NotImplementedError, match="dout"):
            torch.autograd.grad(out, leaves, dout)



def _negated(x):
    """``-x`` as a view with PyTorch's negative bit (the imaginary part of a conjugated complex
    tensor): its storage holds ``x``; differentiable in ``x``."""
    view = torch.complex(torch.zeros_like(x), x).conj().imag
    assert view.is_neg()
    return view


@pytest.mark.parametrize("planned,negative", [
    *((True, name) for name in ("query", "key", "value", "dout")),
    *((False, name) for name in ("query", "key", "value", "attn_mask", "dout"))])
def test_negative_bit_views_are_read_by_value(planned, negative, gen):
    """F53: a tensor with the negative bit is attended by its values: out and gradients equal
    those for the same values without the bit (``-x``), bit for bit."""
    f32 = dict(dtype=torch.float32, gen=gen)
    leaves = {"query": randn(1, 2, 5, 16, **f32), "key": randn(1, 2, 7, 16, **f32),
              "value": randn(1, 2, 7, 8, **f32)}
    leaves = {name: t.requires_grad_() for name, t in leaves.items()}
    mask, dout = None if planned else randn(5, 7, **f32), randn(1, 2, 5, 8, **f32)

    def run(negate):
        args = {**leaves, "attn_mask": mask}
        grad_out = negate(dout) if negative == "dout" else dout
        if negative != "dout":
            args[negative] = negate(args[negative])
        out = scaled_dot_product_attention(**args)
        return (out, *torch.autograd.grad(out, tuple(leaves.values()), grad_out))

    expected = run(torch.neg)
    got = run(_negated)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, expected):
        assert torch.equal(a, b), f"{negative}: {name} differs by {(a - b).abs().max().item()}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("masked", [False, True], ids=["cached_plan", "masked"])
def test_scale_beyond_float32_is_refused_by_name(dtype, masked, gen):
    """F54: a finite scale whose product with log2(e) (the kernels' float32 argument) is past
    float32's range is refused by name, not computed with inf (NaN out); the largest scale
    taken still runs."""
    q, k, v = (randn(1, 2, 5, 16, dtype=dtype, gen=gen) for _ in range(3))
    mask = torch.zeros(5, 5, dtype=dtype, device=DEVICE) if masked else None
    for _ in range(2):  # a refusal is not cached
        with pytest.raises(NotImplementedError, match="scale"):
            scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1e39)
        with pytest.raises(NotImplementedError, match="scale"):
            scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=-3e38)
    largest = torch.finfo(torch.float32).max / 1.4426950408889634
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=largest / 2 ** 120)
    assert torch.isfinite(out).all()
    scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=largest)  # taken, not refused


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("scale", [1e-46, 1e-45, 1e-39, 2.0 ** -126],
                         ids=["zero", "least_subnormal", "subnormal", "least_normal"])
def test_a_scale_below_the_fold_weights_visible_keys_alike(dtype, scale, gen):
    """F93: a masked tile folds the scale into its exponent (a masked -inf times
    ``scale * log2 e``) only where that product is a normal fp32 number; a smaller positive
    scale (which fp32 holds as 0 or a subnormal) runs unfolded. Every score rounds to 0 there,
    so each row is the mean of the values its causal mask lets it see (11 keys: a key tile
    and a bound past it)."""
    q, k, v = (randn(1, 2, 11, 16, dtype=dtype, gen=gen) for _ in range(3))
    out = scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    seen = torch.arange(1, 12, dtype=torch.float64, device=v.device)[:, None]
    want = v.double().cumsum(-2) / seen
    err = (out.double() - want).abs().max().item()
    assert err <= 4 * torch.finfo(dtype).eps, f"scale {scale:g}: off by {err:.3g}"


@pytest.mark.parametrize("flag,value", [("is_causal", 1), ("is_causal", 1.0),
                                        ("enable_gqa", 0), ("enable_gqa", 0.0)])
def test_non_bool_flags_refused_after_a_cached_call(flag, value, gen):
    """F55: ``is_causal`` and ``enable_gqa`` must be bools (as PyTorch requires): a value equal
    to a bool (1, 0.0) is refused also after an equal call with the bool made its plan, whose
    key it matches (1 == True, hash(1) == hash(True))."""
    q, k, v = (randn(1, 2, 5, 16, dtype=torch.float32, gen=gen) for _ in range(3))
    scaled_dot_product_attention(q, k, v, **{flag: bool(value)})
    with pytest.raises(TypeError, match=flag):
        scaled_dot_product_attention(q, k, v, **{flag: value})


def test_sparse_input_refused_by_name_after_a_broadcast_call(gen):
    """F82: a sparse COO query after a call whose dense query was broadcast along every dim
    (strides all zeros, as a sparse tensor's ``stride()`` reads) is refused by name, not served
    by that call's plan (which failed reading the sparse tensor's storage)."""
    q = randn(1, 1, 1, 1, dtype=torch.float32, gen=gen).expand(2, 2, 4, 16)
    scaled_dot_product_attention(q, q, q)
    sparse = torch.zeros(2, 2, 4, 16, device=q.device).to_sparse()
    assert sparse.stride() == q.stride(), "this torch gives sparse tensors strides no more"
    with pytest.raises(TypeError, match="query"):
        scaled_dot_product_attention(sparse, q, q)

