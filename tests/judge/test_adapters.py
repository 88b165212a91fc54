"""The DSA adapters, each checked on a translated copy of the oracle.

For each foreign convention a namespace is built that emits it from the oracle's results
(lse in base 2; +inf lse on empty rows, as FlashMLA reports; no lse at all). Wrapped in its
adapter it must pass the checks; unwrapped, the same checks must fail (so the checks see the
convention and the adapter is what fixes it).
"""
import math

import pytest
import torch
from hypothesis import given

import attention_oracle.oracle.dsa  # noqa: F401  (oracle.dsa below)
from attention_oracle import oracle
from attention_oracle.checks.dsa import checks as dsa_checks
from attention_oracle.checks.dsa.cases import DsaCase, build, strategy_for
from attention_oracle.judge import profiles, record
from attention_oracle.judge.adapters.lse_base2 import DSA_FUNCTIONS, LseBase2
from attention_oracle.judge.adapters.lse_posinf_empty import LsePosinfEmpty
from attention_oracle.judge.adapters.no_lse import NoLse
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.judge.targets import Target
from attention_oracle.run.runner import run_check

DTYPES = (torch.float32, torch.float16)


class Foreign:
    """The oracle's DSA functions re-emitting (out, lse) through ``emit(out, lse, return_lse)``."""

    def __init__(self, label, emit):
        self.label, self.emit = label, emit

    def __repr__(self):
        return f"Foreign({self.label})"

    def __getattr__(self, name):
        if name not in DSA_FUNCTIONS:
            raise AttributeError(name)
        fn = getattr(oracle.dsa, name)

        def foreign(*args, return_lse=False, **kwargs):
            out, lse = fn(*args, return_lse=True, **kwargs)
            return self.emit(out, lse, return_lse)
        return foreign


def _base2(out, lse, return_lse):
    return (out, lse / math.log(2.0)) if return_lse else out


def _posinf_empty(out, lse, return_lse):
    return (out, torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)) if return_lse else out


def _out_only(out, lse, return_lse):
    return out


FOREIGN = {
    # name -> (foreign emit, adapter, the checks run)
    "lse_base2": (_base2, LseBase2, ("forward_agreement", "varlen_agreement")),
    "lse_posinf_empty": (_posinf_empty, LsePosinfEmpty, ("empty_rows", "forward_agreement")),
    "no_lse": (_out_only, NoLse, ("forward_agreement", "empty_rows")),
}


def _target(name, adapted: bool) -> Target:
    emit, adapter, _ = FOREIGN[name]
    ns = Foreign(name, emit)
    ns = adapter(ns) if adapted else ns
    return Target(f"{'adapted' if adapted else 'raw'}-{name}", ns, torch.device("cpu"), DTYPES)


def _search(check_name, target, settings_):
    check = dsa_checks.CHECKS[check_name]
    cases = strategy_for(check_name, DTYPES, rope=True)

    @settings_
    @given(case=cases)
    def search(case):
        run_check(check, target, case)
    search()


@pytest.mark.parametrize("name", sorted(FOREIGN))
def test_adapter_passes_translated_oracle(name):
    target = _target(name, adapted=True)
    for check_name in FOREIGN[name][2]:
        with record.silenced():
            _search(check_name, target, profiles.control_settings(max_examples=12))


@pytest.mark.parametrize("name", sorted(FOREIGN))
def test_check_fails_without_adapter(name):
    target = _target(name, adapted=False)
    check_name = FOREIGN[name][2][0]
    with record.silenced(), pytest.raises(OracleMismatch) as caught:
        _search(check_name, target, profiles.control_settings())
    assert f"dsa.{check_name}" in str(caught.value)


def test_no_lse_refuses_return_lse_and_passes_out_through():
    inner = Foreign("no_lse", _out_only)
    adapted = NoLse(inner)
    inp = build(DsaCase(T=3, S=5, K=4, H=2, Dl=8, Dr=4, seed=3), torch.device("cpu"))
    args = (inp.q_latent, inp.q_rope, inp.kv_latent, inp.k_rope, inp.indices)
    with pytest.raises(NotImplementedError, match="no lse"):
        adapted.dsa_sparse_attention(*args, return_lse=True)
    out = adapted.dsa_sparse_attention(*args)
    assert torch.equal(out, inner.dsa_sparse_attention(*args))


def test_adapters_offer_only_what_the_inner_namespace_offers():
    class OnlyNope:
        dsa_sparse_attention_nope = staticmethod(oracle.dsa.dsa_sparse_attention_nope)

    for adapter in (LseBase2, LsePosinfEmpty, NoLse):
        t = Target("x", adapter(OnlyNope()))
        assert t.offers("dsa_sparse_attention_nope")
        assert not t.offers("dsa_sparse_attention")
        assert not t.offers("scaled_dot_product_attention")
    assert Target("y", LseBase2(oracle.dsa)).offers("offset_gather_kv_indices")


def test_flex_refusal_is_unwrapped_from_inductor_errors():
    """On CUDA flex compiles; its "NYI" refusals arrive as InductorError(LoweringException)
    (seen on the H200, torch 2.11: E < 16). They count as unsupported; other errors do not."""
    from torch._inductor.exc import InductorError, LoweringException

    from attention_oracle.judge.adapters.torch_flex import _refusal

    try:
        try:
            raise NotImplementedError("NYI: embedding dimension must be at least 16 but got E=8")
        except NotImplementedError as nyi:
            raise LoweringException(nyi, "flex_attention", [], {}) from None
    except LoweringException as lowering:
        wrapped = InductorError(lowering, None)
    assert "NYI: embedding dimension" in _refusal(wrapped)
    assert _refusal(InductorError(RuntimeError("CUDA error: an illegal memory access"), None)) is None
    assert _refusal(ValueError("wrong shape")) is None
