"""Known disagreements of third-party backends with the oracle: findings, not widened rules.

Each entry is (implementation, check, device type) -> the reason, with its evidence in
NOTES.md ("Findings"). A listed test runs as a non-strict xfail: it still runs and is
reported in the table's xfail column.
"""
from __future__ import annotations

_MISALIGNED = ("PyTorch's fused CUDA backends fault or raise on legal strides that are not "
               "16-byte aligned (CUDA 'misaligned address', 'key is not correctly aligned "
               "(strideM)', 'cutlassF: no kernel found'): NOTES.md, Findings, F1")

KNOWN: dict[tuple[str, str, str], str] = {
    ("torch", "sdpa.misaligned_inputs", "cuda"): _MISALIGNED,
    ("torch-flash", "sdpa.misaligned_inputs", "cuda"): _MISALIGNED,
    ("torch-efficient", "sdpa.misaligned_inputs", "cuda"): _MISALIGNED,
    ("torch-cudnn", "sdpa.misaligned_inputs", "cuda"): _MISALIGNED,
}


def reason(impl: str, check: str, device) -> str:
    return KNOWN.get((impl, check, getattr(device, "type", str(device))), "")
