"""Known disagreements of third-party backends with the oracle: findings, not widened rules.

Two scopes, each entry with its evidence in NOTES.md ("Findings"):

- ``KNOWN``: (implementation, check, device type) -> reason. The whole test runs as a non-strict
  xfail (conftest), reported in the table's xfail column. For checks that exist to expose one
  failure (misaligned inputs).
- ``KNOWN_CASES``: a finding confined to a class of inputs (a predicate on the case). An example
  of that class that fails the check is counted in the table's "known" column instead of failing
  the test; every other example of the same test is still checked. The check still runs and
  still reports a mismatch in the class: an implementation that does not fail there is fine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from attention_oracle.run import user_known

_MISALIGNED = ("PyTorch's fused CUDA backends fault or raise on legal strides that are not "
               "16-byte aligned (CUDA 'misaligned address', 'key is not correctly aligned "
               "(strideM)', 'cutlassF: no kernel found'): NOTES.md, Findings, F1")

_MIN_BIAS_ROWS_BWD = ("A flash backward that recomputes P from its float32 lse breaks down on rows "
                      "whose every key carries a finfo.min bias (Hugging Face padding): fl(min + "
                      "log(l)) = min absorbs log(l), so P = 1 per key instead of 1/l (dq 297 where "
                      "|gold| is 62; PyTorch's CPU flash; torch-math passes, and fast since it keeps m and log l apart): "
                      "NOTES.md, Findings, F11")

_VALUE_ROWS_UNCHECKED = ("PyTorch's CPU flash backend (torch's default on the CPU for rank-4 inputs) "
                         "returns a result for a value with more rows than the key (S 9 against "
                         "8) where the math backend raises: not even the result of value[:8] "
                         "(max difference 2.8; torch 2.14.1): NOTES.md, Findings, F12")

_CUDNN_MASKED_ROWS = ("cuDNN SDPA does not give 0 for a fully masked query row (out 1.04 where "
                      "the contract's value is 0, dq nonzero; H200, torch 2.11): NOTES.md, "
                      "Findings, F2")

_FLEX_FP32 = ("FlexAttention's compiled Triton kernel exceeds the rule in its fp32 forward (out "
              "4.1x the ensemble rule's bound on F8's shapes, 5.63x at E 256 under the naive-only "
              "rule; its gradients pass, worst 0.90; H200, torch 2.11): its scores carry the "
              "rounding of sequential fp32 dot chains, as fast's did before its F5 fix: NOTES.md, "
              "Findings, F8")

_CUDNN_DOUT_PLAN_REUSE = ("PyTorch's cuDNN SDPA backward reuses the plan it built for the first "
                          "dout layout it saw for a shape: a later call on the same shapes with "
                          "dout of other strides gets a wrong dq (relative error 1.1-1.6, either "
                          "order; each layout alone is right; H200, torch 2.11, cuDNN 9.19; "
                          "torch's default dispatch picks cuDNN there too): NOTES.md, Findings, F9")

_FINITE_MIN_READ_AS_MASKED = (
    "PyTorch's CUDA EFFICIENT_ATTENTION (fp32, bf16) and cuDNN (bf16) return out = 0 for a query "
    "row whose every key carries the dtype's finite minimum (Hugging Face padding, "
    "torch.finfo(dtype).min), where the math backend and the contract give that row's softmax "
    "(torch's default dispatch takes those backends; fp16's -65504 is unaffected; H200, torch "
    "2.11; python -m benchmarks.finfo_min_rows): NOTES.md, Findings, F10")

KNOWN: dict[tuple[str, str, str], str] = {
    ("torch", "sdpa.misaligned_inputs", "cuda"): _MISALIGNED,
    ("torch-flash", "sdpa.misaligned_inputs", "cuda"): _MISALIGNED,
    ("torch-efficient", "sdpa.misaligned_inputs", "cuda"): _MISALIGNED,
    ("torch-cudnn", "sdpa.misaligned_inputs", "cuda"): _MISALIGNED,
}


@dataclass(frozen=True)
class KnownCase:
    impls: tuple[str, ...]
    checks: tuple[str, ...]
    devices: tuple[str, ...]
    applies: Callable[[object], bool]
    reason: str

    def matches(self, impl: str, check: str, device: str, case) -> bool:
        return (impl in self.impls and check in self.checks and device in self.devices
                and bool(self.applies(case)))


def _fp32(case) -> bool:
    return getattr(case, "dtype", None) == "float32"


def _has_fully_masked_rows(case) -> bool:
    return getattr(case, "empty_rows", 0) > 0


def _finite_minimum_rows(case) -> bool:
    """Masks that can leave a row whose every key holds the dtype's finite minimum (fp16's
    minimum, -65504, is read correctly)."""
    mask = getattr(case, "mask", "none")
    return (getattr(case, "dtype", None) in ("float32", "bfloat16")
            and mask.startswith(("finfo_min", "mixed_inf")))


def _finfo_min_rows(case) -> bool:
    return str(getattr(case, "mask", "")).startswith("finfo_min")


def _sixteen_bit_strided_dout(case) -> bool:
    return getattr(case, "dtype", None) in ("float16", "bfloat16") and getattr(
        case, "layout_dout", "contiguous") != "contiguous"


# F3 (PyTorch's math backend prescaling q and k) and F4 (PyTorch's CPU flash backward, P
# recomputed from the stored lse) are no known failures since the rule's lp ensemble holds
# those algorithms (prescaled, flash): NOTES.md, F3 and F4. F7 was re-judged on the H200; F8
# (CUDA) awaits it; both classes are CUDA-only and hide nothing on the CPU.
_BACKWARD_CHECKS = ("sdpa.gradient_agreement", "sdpa.strided_dout", "sdpa.misaligned_inputs",
                    "sdpa.rank3_equals_rank4")

KNOWN_CASES: tuple[KnownCase, ...] = (
    KnownCase(("torch-flash", "torch"), _BACKWARD_CHECKS, ("cpu",), _finfo_min_rows,
              _MIN_BIAS_ROWS_BWD),
    KnownCase(("torch-flash", "torch"), ("sdpa.mismatched_value_rows",), ("cpu",),
              lambda case: True, _VALUE_ROWS_UNCHECKED),
    KnownCase(("torch-cudnn",), ("sdpa.forward_agreement", "sdpa.gradient_agreement",
                                 "sdpa.strided_dout", "sdpa.rank3_equals_rank4"),
              ("cuda",), _has_fully_masked_rows, _CUDNN_MASKED_ROWS),
    KnownCase(("torch-efficient", "torch-cudnn", "torch"),
              ("sdpa.forward_agreement", "sdpa.gradient_agreement", "sdpa.strided_dout",
               "sdpa.rank3_equals_rank4", "sdpa.fully_masked_rows"),
              ("cuda",), _finite_minimum_rows, _FINITE_MIN_READ_AS_MASKED),
    KnownCase(("torch-flex",), ("sdpa.forward_agreement",), ("cuda",), _fp32, _FLEX_FP32),
    # strided_dout runs the strided and the contiguous dout on the same shapes, in one process
    KnownCase(("torch-cudnn", "torch"), ("sdpa.strided_dout",), ("cuda",),
              _sixteen_bit_strided_dout, _CUDNN_DOUT_PLAN_REUSE),
)


def _device_type(device) -> str:
    return getattr(device, "type", str(device))


def reason(impl: str, check: str, device) -> str:
    """The reason a whole test is a known failure ('' if it is not)."""
    return KNOWN.get((impl, check, _device_type(device)), "")


def case_reason(impl: str, check: str, device, case) -> str:
    """The reason a failure of ``check`` on this case is known ('' if it is not)."""
    dev = _device_type(device)
    for entry in KNOWN_CASES:
        if entry.matches(impl, check, dev, case):
            return entry.reason
    return user_known.case_reason(impl, check, dev, case)  # the user's --known-failures file
