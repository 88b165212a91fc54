"""Known disagreements of third-party backends with the oracle: findings, not widened rules.

Each entry is (implementation, check, device type) -> the reason, with its evidence in
NOTES.md ("Findings"). A listed test runs as a non-strict xfail: it still runs and is
reported in the table's xfail column.
"""
from __future__ import annotations

KNOWN: dict[tuple[str, str, str], str] = {}


def reason(impl: str, check: str, device) -> str:
    return KNOWN.get((impl, check, getattr(device, "type", str(device))), "")
