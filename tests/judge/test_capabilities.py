"""Capability declarations: parsed from the namespace, narrow the strategies to supported cases,
and the report lists what they declared away."""
import pytest
import torch
from hypothesis import given, settings

from attention_oracle.checks.dsa import cases as dsa_cases
from attention_oracle.checks.sdpa import cases as sdpa_cases
from attention_oracle.checks.sdpa import checks as sdpa_checks
from attention_oracle.judge import capabilities, profiles, record
from attention_oracle.judge.capabilities import Capabilities
from attention_oracle.judge.targets import Target, load
from attention_oracle.run.runner import run_property

NARROW = "attention_oracle.controls.narrow:NarrowKernel"
UNDECLARED = "attention_oracle.controls.narrow:UndeclaredNarrowKernel"


def test_declaration_parsed_from_namespace():
    caps = load(NARROW).capabilities
    assert caps.dtypes == (torch.float16, torch.bfloat16)
    assert caps.max_head_dim == 128 and caps.masks == ("none",)
    assert load(UNDECLARED).capabilities == Capabilities()


def test_declaration_errors_name_the_field():
    with pytest.raises(ValueError, match="unknown field"):
        Capabilities.from_declaration({"dtype": ("float16",)})
    with pytest.raises(ValueError, match="masks"):
        Capabilities(masks=("additive",))
    with pytest.raises(ValueError, match="int32"):
        Capabilities(index_dtypes=("int64",))


def test_per_function_overrides_and_dtypes_argument():
    class Ns:
        CAPABILITIES = {"dtypes": ("float16",),
                        "functions": {"dsa_sparse_attention": {"head_dims": (512,), "heads": (64,)}}}
    target = Target("ns", Ns(), dtypes=(torch.float16, torch.float32))
    assert target.dtypes == (torch.float16,)
    dsa = target.capabilities.for_function("dsa_sparse_attention")
    assert dsa.head_dims == (512,) and dsa.heads == (64,) and dsa.dtypes == (torch.float16,)
    assert target.capabilities.for_function("scaled_dot_product_attention").head_dims is None


@settings(max_examples=60, database=None)
@given(case=sdpa_cases.strategy_for("forward_agreement", load(NARROW)))
def test_sdpa_draws_only_declared_cases(case):
    assert case.dtype in ("float16", "bfloat16")
    assert max(case.E, case.Ev) <= 128 and case.mask == "none"


@settings(max_examples=30, database=None)
@given(case=dsa_cases.strategy_for("forward_agreement", Capabilities(
    dtypes=("bfloat16",), heads=(64, 128), head_dims=(512,), rope_dims=(64,)), rope=True))
def test_dsa_draws_declared_geometry(case):
    """A production-only DSA kernel (H 64/128, 512 + 64, bf16) gets exactly that geometry."""
    assert (case.H in (64, 128), case.Dl, case.Dr, case.dtype) == (True, 512, 64, "bfloat16")


def test_checks_needing_what_is_declared_away_are_skipped_with_the_reason():
    narrow = load(NARROW)
    assert "masks" in sdpa_cases.unsupported("fully_masked_rows", narrow)
    assert sdpa_cases.unsupported("forward_agreement", narrow) == ""
    assert "ranks" in sdpa_cases.unsupported("rank3_equals_rank4", Capabilities(ranks=(4,)))
    assert dsa_cases.unsupported("default_scale", Capabilities(), rope=True)
    assert not dsa_cases.unsupported("default_scale", Capabilities(default_scale=True), rope=True)


def _examples(name: str, check: str) -> tuple[int, int]:
    """(examples run, examples refused) of one conformance search on the named target."""
    target = load(name)
    sink, token = record.open_sink()
    try:
        run_property(sdpa_checks.CHECKS[check], target, sdpa_cases.strategy_for(check, target),
                     function=sdpa_checks.FN, settings_=profiles.control_settings(max_examples=12))
    except pytest.skip.Exception:
        pass
    finally:
        record.close_sink(token)
    return sink.examples, sink.refused


def test_narrow_kernel_spends_its_examples_on_supported_cases():
    examples, refused = _examples(NARROW, "forward_agreement")
    assert examples >= 12 and refused == 0
    examples, refused = _examples(UNDECLARED, "forward_agreement")
    assert refused > examples // 2  # without the declaration most examples are refused


def test_report_lists_what_was_declared_away():
    away = capabilities.not_verified_report(load, [NARROW, UNDECLARED, "oracle"])
    assert set(away) == {NARROW}
    (line,) = capabilities.report_lines(away)
    assert line == (f"not verified (declared unsupported by {NARROW}): float32 "
                    f"(scaled_dot_product_attention); head dims > 128 (scaled_dot_product_attention); "
                    f"boolean masks (scaled_dot_product_attention); additive masks "
                    f"(scaled_dot_product_attention)")


@settings(max_examples=20, database=None)
@given(case=sdpa_cases.strategy_for("gradient_agreement", Capabilities(heads=(32,), l_le_s=True,
                                                                       causal="only", ranks=(4,))))
def test_sdpa_declared_heads_beyond_the_profile_and_causal_only(case):
    assert case.hq == 32 and case.L <= case.S and case.causal and case.mask == "none"
    assert case.rank == 4


def test_same_head_dims_and_causal_square_narrow_the_sdpa_draws():
    """PyTorch's CUDA flash limits: E == Ev, and is_causal only with L == S."""
    caps = Capabilities(same_head_dims=True, causal_square=True, dtypes=("float16",))
    drawn = []

    @settings(max_examples=60, derandomize=True, database=None, deadline=None)
    @given(sdpa_cases.sdpa_cases(caps))
    def draw(case):
        drawn.append(case)

    draw()
    assert drawn and all(c.E == c.Ev for c in drawn)
    assert any(c.causal for c in drawn) and all(c.L == c.S for c in drawn if c.causal)
    assert {"E != Ev", "is_causal=True with L != S"} <= set(caps.not_verified())


def test_determinism_is_checked_only_where_declared():
    """Bitwise determinism is beyond the contract (atomics in FlashAttention-2, cuDNN and
    EFFICIENT backwards): an undeclared implementation is not judged on it."""
    assert sdpa_cases.unsupported("determinism", Capabilities()) == "determinism not declared"
    assert sdpa_cases.unsupported("determinism", Capabilities(deterministic=True)) == ""
    assert sdpa_cases.unsupported("determinism", Capabilities(deterministic_on_request=True)) == ""
    assert load("oracle").capabilities.deterministic
    fast = load("fast").capabilities  # "auto" backward: atomics unless deterministic mode is on
    assert fast.deterministic or fast.deterministic_on_request
    assert load("torch-math", torch.device("cpu")).capabilities.deterministic


def test_masks_without_none_draw_no_causal_case():
    """A declaration whose masks leave out "none", causal allowed: every case has a mask (is_causal
    takes none), and drawing never fails."""
    @settings(max_examples=30, database=None)
    @given(case=sdpa_cases.sdpa_cases(Capabilities(masks=("bool", "float"))))
    def draw(case):
        assert case.mask != "none" and not case.causal
    draw()
