"""The host path of fast SDPA's calls: the validation prelude runs once per call (never for a
signature seen before), and the user's ``query`` comes back at most twice to a project module
it had left.

"Places" are the Python frames of ``attention_oracle`` modules that receive the query (the
tensor itself, a view of its storage, or either inside a tuple, list or dict argument); the
modules of those frames, in call order with repeats merged, are the query's path; a "return"
is a module on that path that the query had already left. Frames of torch and Triton are not
places (their callbacks into the project are: a Triton heuristic of fast's kernels counts).
"""
import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import attention_oracle.fast.sdpa as fsdpa  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET") else "cpu"
MAX_RETURNS = 2


def query_path(fn, query):
    """(places, module path, returns) of ``query`` while ``fn()`` runs (module docstring)."""
    ptr = query.untyped_storage().data_ptr()

    def is_query(x):
        return isinstance(x, torch.Tensor) and (
            x is query or (x.device == query.device and x.untyped_storage().data_ptr() == ptr))

    def carries(x):
        if isinstance(x, dict):
            x = tuple(x.values())
        if isinstance(x, (tuple, list)):
            return any(is_query(y) for y in x)
        return is_query(x)

    places = []

    def profile(frame, event, _arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if module.startswith("attention_oracle") and any(map(carries, frame.f_locals.values())):
            places.append((module, frame.f_code.co_name))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    path = []
    for module, _ in places:
        if not path or path[-1] != module:
            path.append(module)
    returns = sum(1 for i, m in enumerate(path) if m in path[:i])
    return places, path, returns


def _operands(kind, n, requires_grad, gen):
    """q, k, v and the call's keyword arguments; ``n`` (the query length) makes the
    signature new to the call-plan cache."""
    f32 = dict(dtype=torch.float32, device="cpu", generator=gen)
    kwargs = {}
    if kind == "plain":
        q, k, v = (torch.randn(1, 2, n, 16, **f32) for _ in range(3))
    elif kind == "rank3_causal":
        q, k, v = (torch.randn(2, n, 16, **f32) for _ in range(3))
        kwargs["is_causal"] = True
    elif kind == "gqa_kv_heads_differ":  # no call plan: the general path
        q, k, v = (torch.randn(1, 4, n, 16, **f32), torch.randn(1, 2, n, 16, **f32),
                   torch.randn(1, 1, n, 16, **f32))
        kwargs["enable_gqa"] = True
    elif kind == "masked":
        q, k, v = (torch.randn(1, 2, n, 16, **f32) for _ in range(3))
        kwargs["attn_mask"] = torch.rand(n, n, generator=gen) > 0.3
    else:  # a scale of a type the plan cache does not key on: validated every call, once
        q, k, v = (torch.randn(1, 2, n, 16, **f32) for _ in range(3))
        kwargs["scale"] = _FloatLike(0.25)
    q, k, v = (t.to(DEVICE) for t in (q, k, v))
    if "attn_mask" in kwargs:
        kwargs["attn_mask"] = kwargs["attn_mask"].to(DEVICE)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v)), kwargs


class _FloatLike(float):
    """A float subclass: a valid scale the call-plan signature does not key on."""


KINDS = ["plain", "rank3_causal", "gqa_kv_heads_differ", "masked", "unkeyed_scale"]


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(20)


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("kind", KINDS)
def test_validation_runs_once_per_call(kind, requires_grad, gen, monkeypatch):
    """The contract's input checks run exactly once on a call with a new signature and at most
    once on a repeated call (never for a cached plan or an unplanned signature seen before)."""
    calls = []
    check = fsdpa.check_sdpa_inputs

    def counting(*args, **kwargs):
        calls.append(1)
        return check(*args, **kwargs)
    monkeypatch.setattr(fsdpa, "check_sdpa_inputs", counting)
    n = 17 + KINDS.index(kind) + 7 * requires_grad
    (q, k, v), kwargs = _operands(kind, n, requires_grad, gen)
    per_call = []
    for _ in range(3):
        before = len(calls)
        out = fsdpa.scaled_dot_product_attention(q, k, v, **kwargs)
        if requires_grad:
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        per_call.append(len(calls) - before)
    assert per_call[0] == 1, f"{kind}: the first call validated {per_call[0]} times"
    assert max(per_call) <= 1, f"{kind}: validations per call {per_call}"
    if kind in ("plain", "rank3_causal", "gqa_kv_heads_differ"):
        assert per_call[1:] == [0, 0], f"{kind}: a cached signature validated again {per_call}"


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("kind", KINDS)
def test_query_comes_back_at_most_twice(kind, requires_grad, gen):
    """On a first and on a repeated call the query comes back at most MAX_RETURNS times to a
    project module it had left (module docstring). The call is the forward (with grad: the
    autograd node's forward too); the backward, a call of autograd's engine, launches three
    kernels from the plan and is not counted here."""
    n = 41 + KINDS.index(kind) + 7 * requires_grad
    (q, k, v), kwargs = _operands(kind, n, requires_grad, gen)
    for call in ("first", "repeat"):
        places, path, returns = query_path(
            lambda: fsdpa.scaled_dot_product_attention(q, k, v, **kwargs), q)
        assert returns <= MAX_RETURNS, (
            f"{kind} {call}: {len(places)} places, {returns} returns: {' -> '.join(path)}")
        assert path[0] == "attention_oracle.fast.sdpa"


def test_unplanned_signature_is_cached_validated(gen):
    """A signature no plan covers (GQA with different key and value head counts) is cached
    as its validated geometry, so its repeated calls skip the prelude; its results equal a
    fresh call's."""
    (q, k, v), kwargs = _operands("gqa_kv_heads_differ", 23, False, gen)
    a = fsdpa.scaled_dot_product_attention(q, k, v, **kwargs)
    sig = fsdpa._signature(q, k, v, 0.0, False, None, True)
    entry = fsdpa._CALL_PLANS[sig]
    assert isinstance(entry, fsdpa._Unplanned) and len(entry) == 5
    b = fsdpa.scaled_dot_product_attention(q, k, v, **kwargs)
    assert torch.equal(a, b)
