"""Error maps: |impl - gold| of a failing output over its last two dims, as a PNG, and the pattern
of its failing coordinates in words.

The map is the slice an :class:`~attention_oracle.judge.agreement.OracleMismatch` carries in its
``detail`` (the worst coordinate's batch and head): rows are queries (``out``, ``dq``) or keys
(``dk``, ``dv``), columns features; for ``lse`` ([*batch, H, L]) rows are heads and columns
queries. The left panel is log10 |impl - gold|, the right one the elements beyond the allowed
bound, so that a wrong tile-edge column or a wrong last row shows at a glance.

Where the PNGs go: :func:`set_directory` (the plugin's ``--oracle-artifacts DIR``; by default the
directory of ``--oracle-report``, else ``.hypothesis/artifacts``). Drawn with matplotlib's Agg
canvas directly (no pyplot, no global backend switch).
"""
from __future__ import annotations

import math
import os
import re

import torch

DEFAULT_DIRECTORY = os.path.join(".hypothesis", "artifacts")
AXES = {"out": ("query", "feature"), "dq": ("query", "feature"), "dk": ("key", "feature"),
        "dv": ("key", "feature"), "lse": ("head", "query")}
_DIRECTORY = {"path": DEFAULT_DIRECTORY}


def set_directory(path: str) -> None:
    """Where :func:`write` puts the maps (created on first use)."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"error map directory must be a non-empty path, got {path!r}")
    _DIRECTORY["path"] = path


def directory() -> str:
    return _DIRECTORY["path"]


def axes(output: str) -> tuple[str, str]:
    """(row name, column name) of an output's last two dims."""
    return AXES.get(output, ("row", "col"))


def failing(error: torch.Tensor, allowed: float) -> torch.Tensor:
    """Bool map of the elements beyond ``allowed`` (any nonzero one when ``allowed`` is 0)."""
    return error > allowed if allowed > 0 else error != 0


def _describe(indices: list[int], n: int) -> str:
    """One axis' failing indices, normalised: all, first, last, one index, a run, or scattered."""
    if not indices:
        return "none"
    if len(indices) == n:
        return "all"
    if indices == [n - 1]:
        return "last"
    if indices == [0]:
        return "first"
    if len(indices) == 1:
        return f"{indices[0]} only"
    if indices == list(range(indices[0], n)):
        return f"from {indices[0]} on"
    if indices == list(range(0, indices[-1] + 1)):
        return f"up to {indices[-1]}"
    return "scattered"


def pattern(detail: dict) -> str:
    """The failing coordinates of ``detail``'s map in words, independent of its size ("query
    rows: last; feature cols: all", "key rows: 64 only; ..."), or '' without a map."""
    error = detail.get("error") if detail else None
    if error is None or error.dim() != 2:
        return ""
    bad = failing(error, detail.get("allowed", 0.0))
    rows = [int(i) for i in torch.nonzero(bad.any(1)).flatten()]
    cols = [int(i) for i in torch.nonzero(bad.any(0)).flatten()]
    r, c = axes(detail.get("output", ""))
    return f"{r} rows: {_describe(rows, error.shape[0])}; {c} cols: {_describe(cols, error.shape[1])}"


def file_name(impl: str, check: str, output: str) -> str:
    """``errormap-<check>-<output>-<impl>.png`` with every character outside [A-Za-z0-9._-] as '_'."""
    raw = f"errormap-{check}-{output}-{impl}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", raw)[:200] + ".png"


def _figure(detail: dict, title: str):
    # matplotlib is imported here, not with the module: it costs ~0.9 s, and every pytest
    # process (each xdist worker) loads this module while few ever draw a map
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    error = detail["error"].numpy()
    bad = failing(detail["error"], detail.get("allowed", 0.0)).numpy()
    rows, cols = error.shape
    fig = Figure(figsize=(min(14.0, max(8.0, 3.0 + 0.12 * cols)), min(10.0, max(4.0, 2.5 + 0.05 * rows))),
                 layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    finite_max = float(error.max()) if error.size else 0.0
    floor = max(finite_max * 1e-12, 1e-300)
    img = left.imshow([[math.log10(max(float(x), floor)) for x in row] for row in error],
                      aspect="auto", interpolation="nearest", cmap="viridis")
    fig.colorbar(img, ax=left, label="log10 |impl - gold|")
    right.imshow(bad, aspect="auto", interpolation="nearest", cmap="Reds", vmin=0, vmax=1)
    r, c = axes(detail.get("output", ""))
    for ax, what in ((left, "|impl - gold|"), (right, f"beyond allowed {detail.get('allowed', 0.0):.3e}")):
        ax.set_xlabel(c)
        ax.set_ylabel(r)
        ax.set_title(what, fontsize=9)
    at = detail.get("at", ())
    if len(at) >= 2:
        left.plot([at[-1]], [at[-2]], marker="x", color="red")
    fig.suptitle(title, fontsize=9)
    return fig


def write(detail: dict, title: str = "") -> str:
    """Write the PNG map of ``detail`` (an OracleMismatch's) into :func:`directory`; its path, or
    '' when the failure has no map (a plain property) or the file cannot be written."""
    if not detail or detail.get("error") is None or detail["error"].dim() != 2:
        return ""
    path = os.path.join(directory(), file_name(detail["impl"], detail["check"], detail["output"]))
    impl = re.split(r"[:.]", detail["impl"])[-1]
    head = f"{impl} {detail['check']} {detail['output']} at {tuple(detail.get('slice', ()))}"
    try:
        os.makedirs(directory(), exist_ok=True)
        _figure(detail, f"{head}\n{title}" if title else head).savefig(path, dpi=80)
    except OSError:
        return ""
    return os.path.abspath(path)
