"""The shared input validation (attention_oracle/validation.py): one table of bad inputs run
against the oracle's and fast's entry points alike, PyTorch's SDPA broadcasting followed by both,
and the negative controls showing the table catches an implementation that skips a check.

Every row of a table names the function, the inputs (one defect each), the exception class and
the argument the message must name. Both implementations must refuse the row with that class and
name the argument; a row that runs, or raises something else, fails with what happened.
"""
import inspect
import math
import os
import re

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import attention_oracle.fast as fast  # noqa: E402
import attention_oracle.fast.dsa as fast_dsa  # noqa: E402
import attention_oracle.fast.index as fast_index  # noqa: E402
import attention_oracle.fast.sdpa as fast_sdpa  # noqa: E402
import attention_oracle.oracle as oracle  # noqa: E402
from attention_oracle import validation  # noqa: E402
from attention_oracle.oracle.sdpa import sdpa_reference  # noqa: E402

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
DEVICE = "cuda" if ON_GPU else "cpu"
IMPLS = {"oracle": oracle, "fast": fast}


def _randn(*shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(sum(shape) + len(shape))
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).to(DEVICE)


def _ints(*values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


# ----------------------------------------------------------------------------- the tables
# each builder returns (args, kwargs) with one defect

def _sdpa(q=(1, 2, 8, 16), k=(1, 2, 6, 16), v=(1, 2, 6, 16), **kwargs):
    return [_randn(*s) if isinstance(s, tuple) else s for s in (q, k, v)], kwargs


def _bool_mask(*shape):
    return torch.ones(*shape, dtype=torch.bool, device=DEVICE)


def _grad_mask():
    return torch.zeros(8, 6, device=DEVICE, requires_grad=True)


SDPA_ROWS = [
    # (id, builder, error, argument)
    ("query_not_tensor", lambda: _sdpa(q=[[0.0]]), TypeError, "query"),
    ("query_sparse", lambda: _sdpa(q=_randn(1, 2, 8, 16).to_sparse()), TypeError, "query"),
    ("value_nested", lambda: _sdpa(v=torch.nested.nested_tensor([_randn(2, 6, 16)])), TypeError,
     "value"),
    ("key_integer", lambda: _sdpa(k=torch.ones(1, 2, 6, 16, dtype=torch.int32, device=DEVICE)),
     TypeError, "key"),
    ("value_other_dtype", lambda: _sdpa(v=_randn(1, 2, 6, 16, dtype=torch.float16)), TypeError, "value"),
    ("query_rank2", lambda: _sdpa(q=(8, 16)), ValueError, "query"),
    ("key_head_dim", lambda: _sdpa(k=(1, 2, 6, 8)), ValueError, "key"),
    ("value_rows", lambda: _sdpa(v=(1, 2, 5, 16)), ValueError, "value"),
    ("batch_no_broadcast", lambda: _sdpa(q=(2, 2, 8, 16), k=(3, 2, 6, 16), v=(3, 2, 6, 16)),
     ValueError, "key"),
    ("value_batch_no_broadcast", lambda: _sdpa(q=(2, 2, 8, 16), k=(2, 2, 6, 16), v=(3, 2, 6, 16)),
     ValueError, "value"),
    ("heads_no_broadcast", lambda: _sdpa(k=(1, 3, 6, 16), v=(1, 3, 6, 16)), ValueError, "key"),
    ("gqa_not_multiple", lambda: _sdpa(q=(1, 3, 8, 16), enable_gqa=True), ValueError, "key"),
    ("gqa_value_not_multiple", lambda: _sdpa(q=(1, 4, 8, 16), v=(1, 3, 6, 16), enable_gqa=True),
     ValueError, "value"),
    ("gqa_zero_heads", lambda: _sdpa(k=(1, 0, 6, 16), v=(1, 0, 6, 16), enable_gqa=True),
     ValueError, "key"),
    ("dropout", lambda: _sdpa(dropout_p=0.1), NotImplementedError, "dropout_p"),
    ("dropout_type", lambda: _sdpa(dropout_p="0"), TypeError, "dropout_p"),
    ("is_causal_type", lambda: _sdpa(is_causal=1), TypeError, "is_causal"),
    ("enable_gqa_type", lambda: _sdpa(enable_gqa="yes"), TypeError, "enable_gqa"),
    ("scale_nan", lambda: _sdpa(scale=math.nan), ValueError, "scale"),
    ("scale_type", lambda: _sdpa(scale="0.5"), TypeError, "scale"),
    ("scale_int_past_float", lambda: _sdpa(scale=10 ** 400), ValueError, "scale"),
    ("mask_not_tensor", lambda: _sdpa(attn_mask=[[True]]), TypeError, "attn_mask"),
    ("mask_integer", lambda: _sdpa(attn_mask=torch.ones(8, 6, dtype=torch.int32, device=DEVICE)),
     TypeError, "attn_mask"),
    ("mask_other_float", lambda: _sdpa(attn_mask=torch.zeros(8, 6, dtype=torch.float16, device=DEVICE)),
     TypeError, "attn_mask"),
    ("mask_shape", lambda: _sdpa(attn_mask=_bool_mask(3, 6)), ValueError, "attn_mask"),
    ("mask_rank_above_target", lambda: _sdpa(attn_mask=_bool_mask(2, 1, 2, 8, 6)), ValueError, "attn_mask"),
    ("mask_and_causal", lambda: _sdpa(attn_mask=_bool_mask(8, 6), is_causal=True), ValueError, "attn_mask"),
    ("mask_requires_grad", lambda: _sdpa(attn_mask=_grad_mask()), NotImplementedError, "attn_mask"),
    ("key_other_device", lambda: _sdpa(k=torch.zeros(1, 2, 6, 16, device="meta")), ValueError, "key"),
    ("mask_other_device", lambda: _sdpa(attn_mask=torch.ones(8, 6, dtype=torch.bool, device="meta")),
     ValueError, "attn_mask"),
]

T, H, D, DR, S, K = 5, 2, 8, 4, 7, 3


def _idx(t=T, k=K):
    return torch.randint(0, S, (t, k), generator=torch.Generator().manual_seed(1),
                         dtype=torch.int32).to(DEVICE)


def _nope(q=(T, H, D), kv=(S, D), indices=None, **kwargs):
    q, kv = (_randn(*s) if isinstance(s, tuple) else s for s in (q, kv))
    return [q, kv, _idx() if indices is None else indices], kwargs


def _rope(q_latent=(T, H, D), q_rope=(T, H, DR), kv_latent=(S, D), k_rope=(S, DR), indices=None, **kwargs):
    ts = [_randn(*s) if isinstance(s, tuple) else s for s in (q_latent, q_rope, kv_latent, k_rope)]
    return ts + [_idx() if indices is None else indices], kwargs


DSA_ROWS = [
    ("q_not_tensor", "dsa_sparse_attention_nope", lambda: _nope(q="q"), TypeError, "q"),
    ("q_integer", "dsa_sparse_attention_nope",
     lambda: _nope(q=torch.ones(T, H, D, dtype=torch.int32, device=DEVICE)), TypeError, "q"),
    ("q_rank2", "dsa_sparse_attention_nope", lambda: _nope(q=(T, D)), ValueError, "q"),
    ("kv_channels", "dsa_sparse_attention_nope", lambda: _nope(kv=(S, D + 1)), ValueError, "kv"),
    ("kv_two_heads", "dsa_sparse_attention_nope", lambda: _nope(kv=(S, 2, D)), ValueError, "kv"),
    ("kv_other_dtype", "dsa_sparse_attention_nope", lambda: _nope(kv=_randn(S, D, dtype=torch.float16)),
     TypeError, "kv"),
    ("indices_float", "dsa_sparse_attention_nope", lambda: _nope(indices=_idx().float()), TypeError, "indices"),
    ("indices_tokens", "dsa_sparse_attention_nope", lambda: _nope(indices=_idx(t=T + 1)), ValueError, "indices"),
    ("indices_rank1", "dsa_sparse_attention_nope", lambda: _nope(indices=_idx()[:, 0]), ValueError, "indices"),
    ("topk_length_shape", "dsa_sparse_attention_nope",
     lambda: _nope(topk_length=_ints(*range(T + 1))), ValueError, "topk_length"),
    ("topk_length_float", "dsa_sparse_attention_nope",
     lambda: _nope(topk_length=torch.zeros(T, device=DEVICE)), TypeError, "topk_length"),
    ("softmax_scale_inf", "dsa_sparse_attention_nope", lambda: _nope(softmax_scale=math.inf),
     ValueError, "softmax_scale"),
    ("softmax_scale_type", "dsa_sparse_attention_nope", lambda: _nope(softmax_scale="1"),
     TypeError, "softmax_scale"),
    ("softmax_scale_int_past_float", "dsa_sparse_attention_nope",
     lambda: _nope(softmax_scale=-(10 ** 400)), ValueError, "softmax_scale"),
    ("indices_other_device", "dsa_sparse_attention_nope",
     lambda: _nope(indices=torch.zeros(T, K, dtype=torch.int32, device="meta")), ValueError, "indices"),
    ("q_rope_missing", "dsa_sparse_attention", lambda: _rope(q_rope=None), ValueError, "q_rope"),
    ("q_rope_heads", "dsa_sparse_attention", lambda: _rope(q_rope=(T, H + 1, DR)), ValueError, "q_rope"),
    ("k_rope_rows", "dsa_sparse_attention", lambda: _rope(k_rope=(S + 1, DR)), ValueError, "k_rope"),
    ("k_rope_other_dtype", "dsa_sparse_attention",
     lambda: _rope(k_rope=_randn(S, DR, dtype=torch.float16)), TypeError, "k_rope"),
    ("kv_latent_channels", "dsa_sparse_attention", lambda: _rope(kv_latent=(S, D - 1)), ValueError, "kv_latent"),
    ("q_latent_not_tensor", "dsa_sparse_attention", lambda: _rope(q_latent=1.0), TypeError, "q_latent"),
    # a zero-width latent leaves no values (fast returned an unwritten lse and dq_rope)
    ("q_latent_zero_width", "dsa_sparse_attention",
     lambda: _rope(q_latent=(T, H, 0), kv_latent=(S, 0)), ValueError, "q_latent"),
    ("q_zero_width", "dsa_sparse_attention_nope", lambda: _nope(q=(T, H, 0), kv=(S, 0)),
     ValueError, "q"),
    # the options are bools: the string "False" is true, and was taken as such
    ("return_lse_string", "dsa_sparse_attention_nope", lambda: _nope(return_lse="False"),
     TypeError, "return_lse"),
    ("return_lse_int", "dsa_sparse_attention", lambda: _rope(return_lse=1), TypeError, "return_lse"),
]

CU_Q, CU_K = (0, 2, 5), (0, 3, 7)


def _index(gather=None, cu_q=CU_Q, cu_k=CU_K, **kwargs):
    gather = _idx() if gather is None else gather
    cu = [_ints(*c) if isinstance(c, tuple) else c for c in (cu_q, cu_k)]
    return [gather] + cu, kwargs


def _varlen(kv=(S, D), gather=None, cu_q=CU_Q, cu_k=CU_K, **kwargs):
    (gather, cu_q, cu_k), _ = _index(gather, cu_q, cu_k)
    return [_randn(T, H, D), _randn(*kv) if isinstance(kv, tuple) else kv, gather, cu_q, cu_k], kwargs


INDEX_ROWS = [
    ("gather_float", "offset_gather_kv_indices", lambda: _index(gather=_idx().float()),
     TypeError, "gather_kv_indices"),
    ("gather_rank1", "offset_gather_kv_indices", lambda: _index(gather=_idx()[:, 0]),
     ValueError, "gather_kv_indices"),
    ("cu_seqlens_q_float", "offset_gather_kv_indices",
     lambda: _index(cu_q=torch.tensor([0.0, 2, 5], device=DEVICE)), TypeError, "cu_seqlens_q"),
    ("cu_seqlens_k_rank2", "offset_gather_kv_indices",
     lambda: _index(cu_k=_ints(*CU_K)[None]), ValueError, "cu_seqlens_k"),
    ("cu_seqlens_k_length", "offset_gather_kv_indices", lambda: _index(cu_k=(0, 7)), ValueError, "cu_seqlens_k"),
    ("cu_seqlens_q_empty", "offset_gather_kv_indices", lambda: _index(cu_q=(), cu_k=()),
     ValueError, "cu_seqlens_q"),
    ("topk_length_shape", "offset_gather_kv_indices",
     lambda: _index(topk_length=_ints(1, 2)), ValueError, "topk_length"),
    ("out_int64", "offset_gather_kv_indices",
     lambda: _index(out=torch.zeros(T, K, dtype=torch.int64, device=DEVICE)), TypeError, "out"),
    ("out_shape", "offset_gather_kv_indices",
     lambda: _index(out=torch.zeros(T, K + 1, dtype=torch.int32, device=DEVICE)), ValueError, "out"),
    ("out_not_tensor", "offset_gather_kv_indices", lambda: _index(out="buffer"), TypeError, "out"),
    ("cu_seqlens_k_other_device", "offset_gather_kv_indices",
     lambda: _index(cu_k=torch.tensor(CU_K, dtype=torch.int32, device="meta")), ValueError, "cu_seqlens_k"),
    ("causal_string", "offset_gather_kv_indices", lambda: _index(causal="False"), TypeError, "causal"),
    ("compact_int", "offset_gather_kv_indices", lambda: _index(compact=0), TypeError, "compact"),
    ("return_topk_length_string", "offset_gather_kv_indices",
     lambda: _index(return_topk_length="no"), TypeError, "return_topk_length"),
    ("varlen_causal_string", "dsa_sparse_attention_nope_varlen", lambda: _varlen(causal="False"),
     TypeError, "causal"),
    ("varlen_kv_not_tensor", "dsa_sparse_attention_nope_varlen", lambda: _varlen(kv=[0.0]), TypeError, "kv"),
    ("varlen_cu_seqlens_k_float", "dsa_sparse_attention_nope_varlen",
     lambda: _varlen(cu_k=torch.tensor([0.0, 3, 7], device=DEVICE)), TypeError, "cu_seqlens_k"),
]
# the values of cu_seqlens: the oracle checks them on the host, fast in its kernel (on CUDA a
# device-side assert, which ends the CUDA context: these rows run on the CPU only)
VALUE_ROWS = [
    ("cu_seqlens_q_start", "offset_gather_kv_indices", lambda: _index(cu_q=(1, 2, 5)), ValueError, "cu_seqlens_q"),
    ("cu_seqlens_k_decreasing", "offset_gather_kv_indices", lambda: _index(cu_k=(0, 8, 7)),
     ValueError, "cu_seqlens_k"),
    ("cu_seqlens_q_end", "offset_gather_kv_indices", lambda: _index(cu_q=(0, 2, 4)), ValueError, "cu_seqlens_q"),
    ("varlen_cu_seqlens_k_past_kv", "dsa_sparse_attention_nope_varlen", lambda: _varlen(cu_k=(0, 3, 9)),
     ValueError, "cu_seqlens_k"),
]

TABLE = ([(r[0], "scaled_dot_product_attention") + r[1:] for r in SDPA_ROWS] + DSA_ROWS + INDEX_ROWS
         + (VALUE_ROWS if not ON_GPU else []))


def _outcome(fn, build):
    """(exception class, message) of one call, or (None, 'ran') when it returned."""
    args, kwargs = build()
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the class is what is judged
        return type(exc), str(exc)
    return None, "ran"


def _names(message, argument):
    return re.search(rf"(?<![\w.]){re.escape(argument)}(?!\w)", message) is not None


def judge(impl_name, fn, build, error, argument):
    """Fails unless ``fn`` refuses the row with ``error`` and names ``argument`` (as a word)."""
    cls, message = _outcome(fn, build)
    assert cls is error and _names(message, argument), (
        f"{impl_name}: expected {error.__name__} naming {argument!r}, got "
        f"{'no error' if cls is None else cls.__name__}: {message}")


@pytest.mark.parametrize("row", TABLE, ids=[r[0] + "-" + r[1] for r in TABLE])
def test_bad_input_refused_alike(row):
    """Oracle and fast refuse the row with the same class, naming the argument."""
    _, function, build, error, argument = row
    for name, impl in IMPLS.items():
        judge(name, getattr(impl, function), build, error, argument)


# ----------------------------------------------------------------------------- negative controls

def _skipping(check, argument, valid):
    """``check`` that never sees ``argument`` (replaced by ``valid``): a skipped check."""
    signature = inspect.signature(check)

    def skipped(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.arguments[argument] = valid
        return check(*bound.args, **bound.kwargs)
    return skipped


CONTROLS = [
    # (module whose imported check is replaced, its name, the replacement, the function,
    #  table rows the skipped check must fail, a row of another check that must still pass)
    (fast_sdpa, "check_sdpa_inputs", _skipping(validation.check_sdpa_inputs, "attn_mask", None),
     "scaled_dot_product_attention",
     ["mask_integer", "mask_shape", "mask_and_causal", "mask_other_float"], "scale_nan"),
    (fast_dsa, "check_dsa_inputs", _skipping(validation.check_dsa_inputs, "topk_length", None),
     "dsa_sparse_attention_nope", ["topk_length_shape", "topk_length_float"], "indices_float"),
    (fast_index, "check_index_inputs", _skipping(validation.check_index_inputs, "out", None),
     "offset_gather_kv_indices", ["out_int64", "out_shape", "out_not_tensor"], "gather_float"),
]


@pytest.mark.parametrize("module,name,broken,function,rows,kept", CONTROLS, ids=[c[1] for c in CONTROLS])
def test_table_catches_a_skipped_check(monkeypatch, module, name, broken, function, rows, kept):
    """With one check skipped in fast, the rows of that check fail the table's judgement (the
    call runs on, or fails later with another error); a row of another check still passes."""
    monkeypatch.setattr(module, name, broken)
    by_id = {(r[0], r[1]): r for r in TABLE}
    for row_id in rows:
        _, _, build, error, argument = by_id[(row_id, function)]
        with pytest.raises(AssertionError, match="fast: expected"):
            judge("fast", getattr(fast, function), build, error, argument)
    _, _, build, error, argument = by_id[(kept, function)]
    judge("fast", getattr(fast, function), build, error, argument)


# ----------------------------------------------------------------------------- broadcasting

BROADCASTS = [
    # (id, query, key, value, kwargs): every one accepted by torch's math backend
    ("batch", (2, 2, 8, 16), (1, 2, 6, 16), (1, 2, 6, 16), {}),
    ("query_batch", (1, 2, 8, 16), (3, 2, 6, 16), (3, 2, 6, 16), {}),
    ("ranks_differ", (2, 2, 8, 16), (2, 6, 16), (2, 6, 16), {}),
    ("rank3_query_rank4_key", (2, 8, 16), (1, 2, 6, 16), (1, 2, 6, 16), {}),
    ("kv_one_head", (1, 4, 8, 16), (1, 1, 6, 16), (1, 1, 6, 16), {}),
    ("query_one_head", (2, 1, 8, 16), (2, 3, 6, 16), (2, 3, 6, 16), {}),
    ("value_one_head", (1, 2, 8, 16), (1, 2, 6, 16), (1, 1, 6, 16), {}),
    ("gqa_key_value_heads_differ", (1, 4, 8, 16), (1, 2, 6, 16), (1, 4, 6, 16), {"enable_gqa": True}),
    ("gqa_batch", (2, 4, 8, 16), (1, 2, 6, 16), (1, 2, 6, 16), {"enable_gqa": True}),
    ("mask_batch", (2, 2, 8, 16), (1, 2, 6, 16), (1, 2, 6, 16), {"mask": (2, 1, 8, 6)}),
    ("rank5_causal", (2, 3, 2, 8, 16), (3, 1, 6, 16), (3, 1, 6, 16), {"is_causal": True}),
    ("no_query_head", (2, 0, 8, 16), (2, 1, 6, 16), (2, 1, 6, 16), {}),
]


def _torch_math(q, k, v, **kwargs):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.MATH]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)


def _forward_backward(fn, q, k, v, dout_seed, **kwargs):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v, **kwargs)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(dout_seed),
                       dtype=torch.float64).to(out.dtype).to(out.device)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    return (out.detach(),) + grads


@pytest.mark.parametrize("case", BROADCASTS, ids=[c[0] for c in BROADCASTS])
def test_broadcasting_follows_torch(case):
    """Oracle and fast accept what torch's math backend accepts, with its output shape, and agree
    with it (float64 torch math as the reference) on out and on the gradients, which sum over the
    broadcast copies."""
    _, qs, ks, vs, kwargs = case
    kwargs = dict(kwargs)
    if "mask" in kwargs:
        kwargs["attn_mask"] = _randn(*kwargs.pop("mask"))
    q, k, v = _randn(*qs), _randn(*ks), _randn(*vs)
    wide = {n: t.double() if isinstance(t, torch.Tensor) else t for n, t in kwargs.items()}
    gold = _forward_backward(_torch_math, q.double(), k.double(), v.double(), 7, **wide)
    for name, impl in IMPLS.items():
        got = _forward_backward(impl.scaled_dot_product_attention, q, k, v, 7, **kwargs)
        for what, g, x in zip(("out", "dq", "dk", "dv"), gold, got):
            assert x.shape == g.shape, f"{name} {what}: shape {tuple(x.shape)}, torch {tuple(g.shape)}"
            err = float((x.double() - g).abs().max()) if g.numel() else 0.0
            bound = 1e-5 * max(1.0, float(g.abs().max()) if g.numel() else 0.0)
            assert err <= bound, f"{name} {what}: max error {err:.3g} > {bound:.3g} against torch's math"


def test_torch_refuses_what_the_table_refuses_as_shapes():
    """The shape rows of the SDPA table that torch's math backend also refuses (RuntimeError):
    the contract's refusals there are PyTorch's, with the argument named."""
    refused = ["key_head_dim", "value_rows", "batch_no_broadcast", "heads_no_broadcast", "gqa_not_multiple",
               "gqa_value_not_multiple", "mask_integer", "mask_other_float", "mask_shape", "mask_and_causal"]
    rows = {r[0]: r for r in SDPA_ROWS}
    for row_id in refused:
        args, kwargs = rows[row_id][1]()
        with pytest.raises(RuntimeError):
            _torch_math(*args, **kwargs)


def test_broadcast_reference_magnitudes():
    """sdpa_reference's forward magnitudes hold for broadcast operands; gradient magnitudes of a
    broadcast operand (a sum over copies) are refused by name rather than computed wrong."""
    q, k, v = _randn(2, 2, 8, 16), _randn(1, 2, 6, 16), _randn(1, 2, 6, 16)
    ref = sdpa_reference(q, k, v, magnitudes=True)
    assert ref["out"].shape == (2, 2, 8, 16) and ref["magnitude"]["out"] > 0
    with pytest.raises(NotImplementedError, match="magnitudes"):
        sdpa_reference(q, k, v, torch.ones(2, 2, 8, 16, device=DEVICE), magnitudes=True)
    # a rank-3 query against rank-4 keys adds a size-1 dim only: nothing is summed
    rank = sdpa_reference(q[0], k, v, torch.ones(1, 2, 8, 16, device=DEVICE), magnitudes=True)
    assert rank["dq"].shape == (2, 8, 16) and rank["magnitude"]["dq"] > 0
