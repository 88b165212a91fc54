"""The speed targets of the fast kernels, judged from benchmark JSON files: one scorecard.

    python -m benchmarks.targets PATH [PATH ...] [--json out/targets.json] [--strict]

Reads every ``*.json`` under the paths (a file or a directory, searched recursively: the
``$OUT`` of ``benchmarks/h200.sh``) and recognises each benchmark's output by its content, not
its name: ``benchmarks.sdpa``, ``benchmarks.dsa``, ``benchmarks.overhead``,
``benchmarks.index_prep``, ``benchmarks.dsa_gluon [--backward]``, ``benchmarks.sdpa_gluon_bwd``
and ``benchmarks.sdpa_gluon`` (its host rows, and with ``--host-parts`` the paired median of
the Gluon call's host time over the Triton call's). Every figure it judges was measured against its
peer in the same run by the benchmark that wrote it; nothing is re-timed here.

A target has cells: one measured figure each (a problem or point, a timing method), its bound,
and whether it is met. A target is **met** when every judged cell is, **missed** when one is
not (the worst cell and its shortfall are named), and **not measured** when no file carried
any of its figures, printed as loudly as a miss: a scorecard that judged nothing has verified
nothing. Cells of an opt-in mode (a backend that is not fast's default) are shown beside the
default's with their own verdict, but only the default's cells decide the target (the default
a JSON ran under is what it recorded, ``fast_settings``, else the one named here). A section a
benchmark recorded as an error is a cell that was not measured, named with its error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, field

SDPA_FWD_LONG, SDPA_FWD_SHORT, LONG_L = 1.0, 0.9, 4096
SDPA_STEP = 0.95
DSA_FWD_TFLOPS, DSA_BWD_TFLOPS = 450.0, 200.0
DSA_PROBLEMS = ("doc_16384", "packed_glm_a")
HOST_FWD, HOST_FWDBWD = 1.2, 1.5
SDPA_FP32_STEP = 0.9
DSA_FP32_TFLOPS = 20.0
INDEX_OVER_COPY = 1.5
INDEX_T = (4096, 16384)
# fast's defaults where a JSON does not record the settings it ran under (fast.sdpa.settings(),
# fast.dsa.settings() record them since they exist)
SDPA_FP32_DEFAULT, DSA_FP32_DEFAULT = "tf32x3", "bf16x6"
SDPA_BWD_DEFAULT, DSA_BWD_DEFAULT = "triton", "gluon"
BWD_BACKENDS = ("triton", "gluon")  # the backwards the Gluon backward benchmarks time side by side


@dataclass
class Cell:
    """One figure: ``value`` against ``bound`` (``sense`` "min": value >= bound, "max": value <=
    bound); ``aside`` says why it is shown but does not decide (an opt-in mode, a timing method
    the target does not name)."""
    where: str
    method: str
    value: float | None
    bound: float
    sense: str = "min"
    source: str = ""
    aside: str = ""
    error: str = ""

    @property
    def met(self):
        if self.value is None or self.value != self.value:  # not measured, or NaN
            return None
        return self.value >= self.bound if self.sense == "min" else self.value <= self.bound

    def shortfall(self):
        """How far from the bound, as a ratio (< 1 for a miss of a "min" bound)."""
        if not self.met and self.value is not None and self.bound:
            return self.value / self.bound
        return None


@dataclass
class Target:
    name: str
    statement: str
    cells: list = field(default_factory=list)

    def judged(self):
        return [c for c in self.cells if not c.aside and c.met is not None]

    def verdict(self):
        judged = self.judged()
        if not judged:
            return "not measured"
        return "met" if all(c.met for c in judged) else "missed"

    def worst(self):
        """The judged cell furthest on the wrong side of (or closest to) its bound."""
        judged = self.judged()
        if not judged:
            return None
        return min(judged, key=lambda c: c.value / c.bound if c.sense == "min"
                   else c.bound / c.value if c.value else float("inf"))


# ----------------------------------------------------------------------------- reading

def json_files(paths):
    """Every *.json under ``paths`` (files or directories), sorted for a stable order."""
    found = []
    for path in paths:
        if os.path.isdir(path):
            for root, _, names in os.walk(path):
                found += [os.path.join(root, n) for n in names if n.endswith(".json")]
        elif path.endswith(".json"):
            found.append(path)
    return sorted(set(found))


def kind_of(data):
    """Which benchmark wrote ``data`` (None: not one this scorecard reads)."""
    if isinstance(data, list):
        if any(isinstance(r, dict) and "host_us" in r for r in data):
            return "sdpa_gluon"
        if any(isinstance(r, dict) and "call_gluon" in r for r in data):
            return "sdpa_gluon_host_parts"
        return None
    if not isinstance(data, dict):
        return None
    if "points" in data and "overhead_us" in data:
        return "sdpa"
    if "geometry" in data:
        return "dsa"
    if any(k.startswith("sdpa_pairs_") or k.startswith("sdpa_fast_") for k in data):
        return "overhead"
    if any(isinstance(v, dict) and "fast_over_copy_synced" in v for v in data.values()):
        return "index_prep"
    if isinstance(data.get("rows"), list) and any("gluon_step_over_cudnn" in r
                                                  for r in data["rows"]):
        return "sdpa_gluon_bwd"
    rows = [v for v in data.values() if isinstance(v, dict) and "triton" in v]
    if rows:
        return "dsa_gluon_bwd" if any("dq_rel_err" in r["triton"] for r in rows) else "dsa_gluon"
    return None


def load(paths):
    """[(kind, path, data)] of every recognised benchmark output under ``paths``."""
    out = []
    for path in json_files(paths):
        try:
            with open(path) as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        kind = kind_of(data)
        if kind:
            out.append((kind, path, data))
    return out


def _settings(data, area, key, default):
    """What a JSON records of fast's ``area`` setting ``key``, else the default named here."""
    return (data.get("fast_settings") or {}).get(area, {}).get(key, default)


# ----------------------------------------------------------------------------- targets

def _point_where(p):
    return f"D {p['D']} L {p['L']} {'causal' if p['causal'] else 'full'}"


def sdpa_forward(files):
    t = Target("sdpa_forward", f"SDPA bf16 forward >= {SDPA_FWD_LONG}x cuDNN at L >= 4k, "
               f">= {SDPA_FWD_SHORT}x below, both timing methods, D 64 and 128, causal and not")
    for _, path, data in _of(files, "sdpa"):
        for p in data["points"]:
            bound = SDPA_FWD_LONG if p["L"] >= LONG_L else SDPA_FWD_SHORT
            _ratio_cells(t, p.get("fwd"), _point_where(p), bound, path)
    return t


def sdpa_step(files):
    t = Target("sdpa_step", f"SDPA bf16 step (forward+backward) >= {SDPA_STEP}x cuDNN, both "
               "timing methods")
    for _, path, data in _of(files, "sdpa"):
        for p in data["points"]:
            _ratio_cells(t, p.get("fwdbwd"), _point_where(p), SDPA_STEP, path)
    for _, path, data in _of(files, "sdpa_gluon_bwd"):
        chosen = _settings(data, "sdpa", "backward_backend", SDPA_BWD_DEFAULT)
        auto_dims = _settings(data, "sdpa", "auto_bwd_head_dims", [])
        for r in data["rows"]:
            where = f"D {r['D']} L {r['L']} {'causal' if r['causal'] else 'full'}"
            # what the run's backend gave the row ("auto": the Gluon backward where it takes
            # the call, else the Triton one); older runs: "auto" by head dim alone
            default = r.get("default_backward") or (
                ("gluon" if r["D"] in auto_dims else "triton") if chosen == "auto" else chosen)
            for backend in BWD_BACKENDS:
                ratios = r.get(f"{backend}_step_over_cudnn")
                for i, method in enumerate(("queued", "synced")):
                    t.cells.append(Cell(where, method, ratios[i] if ratios else None, SDPA_STEP,
                                        source=path, aside=_not_default(backend, default)))
    return t


def _not_default(backend, default):
    """A backward backend's cells decide only where it was fast's default in that run."""
    return "" if backend == default else f"{backend} backward (not the default)"


def _ratio_cells(t, phase, where, bound, path):
    for method in ("queued", "synced"):
        value = phase.get(f"{method}_x_cudnn") if phase else None
        t.cells.append(Cell(where, method, value, bound, source=path,
                            error="" if phase else "phase not timed"))


def sdpa_ws_default(files):
    t = Target("sdpa_ws_default", "the warp-specialised (Gluon) SDPA forward is fast's default "
               "at every benchmarked bf16 point, with a host cost per call <= the Triton path's")
    for _, path, data in _of(files, "sdpa"):
        for p in data["points"]:
            t.cells.append(Cell(_point_where(p), "kernel", float(p.get("fast_forward") == "gluon"),
                                1.0, source=path))
    for _, path, data in _of(files, "sdpa_gluon"):
        for r in (r["host_us"] for r in data if "host_us" in r):
            where = f"host per call, L 128 D {r['D']}"
            t.cells.append(Cell(where, "gluon / triton", r["gluon"] / r["triton"], 1.0, "max",
                                source=path))
            if "gluon_tma_cache" in r:
                t.cells.append(Cell(where, "gluon / triton", r["gluon_tma_cache"] / r["triton"],
                                    1.0, "max", source=path, aside="opt-in TMA descriptor cache"))
    for _, path, data in _of(files, "sdpa_gluon_host_parts"):
        for r in data:  # --host-parts: the two calls timed in turn, the median of their ratio
            if isinstance(r, dict) and "paired_gluon_over_triton" in r:
                t.cells.append(Cell(f"host per call, L 128 D {r['D']}", "paired gluon / triton",
                                    r["paired_gluon_over_triton"], 1.0, "max", source=path))
    return t


def dsa_speed(files, phase, bound):
    name = {"fwd": "forward", "bwd": "backward"}[phase]
    t = Target(f"dsa_{name}", f"DSA bf16 {name} >= {bound:.0f} TFLOP/s on "
               f"{' and '.join(DSA_PROBLEMS)}, both timing methods")
    for _, path, data in _of(files, "dsa"):
        fast = data.get("fast", {})
        for problem in DSA_PROBLEMS:
            row = fast.get(problem)
            error = "" if row else "not run"
            if isinstance(row, dict) and "error" in row:
                row, error = None, row["error"][:200]
            for method, key in (("queued", f"{phase}_queued_tflops"), ("synced", f"{phase}_tflops")):
                t.cells.append(Cell(problem, method, row.get(key) if row else None, bound,
                                    source=path, error=error))
    if phase == "bwd":
        for _, path, data in _of(files, "dsa_gluon_bwd"):
            default = _settings(data, "dsa", "backward_backend", DSA_BWD_DEFAULT)
            for problem in DSA_PROBLEMS:
                for backend in BWD_BACKENDS:
                    row = data.get(problem, {}).get(backend)
                    for method in ("queued", "synced"):
                        t.cells.append(Cell(f"{problem} ({backend})", method,
                                            row.get(f"{method}_tflops") if row else None, bound,
                                            source=path, aside=_not_default(backend, default)))
    return t


def host_overhead(files):
    t = Target("host_overhead", f"host time per call at a tiny shape, paired medians fast / torch: "
               f"forward <= {HOST_FWD}x, forward+backward <= {HOST_FWDBWD}x")
    for _, path, data in _of(files, "overhead"):
        for phase, bound in (("fwd", HOST_FWD), ("fwdbwd", HOST_FWDBWD)):
            pairs = data.get(f"sdpa_pairs_{phase}")
            if pairs:
                t.cells.append(Cell(f"SDPA {phase}", f"median of {len(pairs['ratios'])} pairs",
                                    pairs["median"], bound, "max", source=path))
    return t


def sdpa_fp32(files):
    t = Target("sdpa_fp32_step", f"SDPA fp32 forward+backward >= {SDPA_FP32_STEP}x torch's fp32 "
               "default, fast's default fp32 mode, both timing methods")
    for _, path, data in _of(files, "sdpa"):
        mode = _settings(data, "sdpa", "fp32_mode", SDPA_FP32_DEFAULT)
        for r in data.get("fp32", []):
            where = f"B {r['B']} H {r['H']} L {r['L']} D {r['D']} " + \
                ("causal" if r["causal"] else "full")
            for method, tag in (("queued", ""), ("synced", "_synced")):
                fast = r.get(f"fwdbwd_fast_{mode}{tag}_tflops")
                torch_ = r[f"fwdbwd_torch_default{tag}_tflops"]
                # the ratio within alternated rounds where the run recorded it
                ratio = r.get(f"fwdbwd_{mode}{tag}_ratio")
                if ratio is None and fast is not None:
                    ratio = fast / torch_
                t.cells.append(Cell(f"{where} ({mode})", method, ratio, SDPA_FP32_STEP,
                                    source=path, error="" if fast is not None else f"{mode} not run"))
    return t


def dsa_fp32(files):
    t = Target("dsa_fp32", f"DSA fp32 forward and backward >= {DSA_FP32_TFLOPS:.0f} TFLOP/s, "
               "fast's default fp32 mode, both timing methods")
    for _, path, data in _of(files, "dsa"):
        section = data.get("fp32")
        if not isinstance(section, dict) or "error" in section:
            continue
        mode = _settings(data, "dsa", "fp32_mode", DSA_FP32_DEFAULT)
        for problem in ("doc_4096", "doc_16384"):
            row = section.get(problem, {}).get(mode)
            for phase in ("fwd", "bwd"):
                for method, key in (("queued", f"{phase}_queued_tflops"), ("synced", f"{phase}_tflops")):
                    t.cells.append(Cell(f"{problem} {phase} ({mode})", method,
                                        row.get(key) if row else None, DSA_FP32_TFLOPS,
                                        source=path))
    return t


def index_prep(files):
    t = Target("index_prep", f"varlen index preparation <= {INDEX_OVER_COPY}x a device copy of the "
               "same bytes, synced, T 4k and 16k (queued shown beside)")
    for _, path, data in _of(files, "dsa"):
        for problem, row in (data.get("index_prep") or {}).items():
            if isinstance(row, dict) and "error" in row:
                t.cells.append(Cell(problem, "synced", None, INDEX_OVER_COPY, "max", source=path,
                                    error=row["error"][:200]))
            elif isinstance(row, dict) and "fast_over_copy" in row:
                _index_cells(t, f"T {row['T']}", row["fast_over_copy"],
                             row.get("fast_over_copy_queued"), path)
    for _, path, data in _of(files, "index_prep"):
        for row in data.values():
            default = (isinstance(row, dict) and "fast_over_copy_synced" in row
                       and not row["holes"] and row["num_warps"] == 0)
            if default and row["T"] in INDEX_T:
                _index_cells(t, f"T {row['T']}", row["fast_over_copy_synced"],
                             row["fast_over_copy_queued"], path)
    return t


def _index_cells(t, where, synced, queued, path):
    t.cells.append(Cell(where, "synced", synced, INDEX_OVER_COPY, "max", source=path))
    if queued is not None:
        t.cells.append(Cell(where, "queued", queued, INDEX_OVER_COPY, "max", source=path,
                            aside="the target is synced"))


def _of(files, kind):
    return [f for f in files if f[0] == kind]


def scorecard(files):
    """Every target, judged from ``files`` (:func:`load`)."""
    return [sdpa_forward(files), sdpa_step(files), sdpa_ws_default(files),
            dsa_speed(files, "fwd", DSA_FWD_TFLOPS), dsa_speed(files, "bwd", DSA_BWD_TFLOPS),
            host_overhead(files), sdpa_fp32(files), dsa_fp32(files), index_prep(files)]


# ----------------------------------------------------------------------------- report

def _fmt(x):
    return "-" if x is None else f"{x:.3g}"


def report(targets):
    """The scorecard as text: a verdict line per target, then its cells."""
    lines = []
    for t in targets:
        verdict = t.verdict()
        worst = t.worst()
        tail = ""
        if verdict == "missed":
            tail = f": worst {worst.where} {worst.method} {_fmt(worst.value)} against {worst.bound:g}"
        elif verdict == "not measured":
            tail = ": NOTHING JUDGED (no benchmark output carried it)"
        lines.append(f"{verdict.upper():13} {t.name}{tail}")
        lines.append(f"{'':13} {t.statement}")
        for c in t.cells:
            mark = {True: "ok", False: "MISS", None: "not measured"}[c.met]
            extra = f" [not judged: {c.aside}]" if c.aside else ""
            extra += f" ({c.error})" if c.error else ""
            sign = ">=" if c.sense == "min" else "<="
            lines.append(f"{'':15}{c.where:38} {c.method:20} {_fmt(c.value):>8} {sign} "
                         f"{c.bound:<5g} {mark}{extra}")
    judged = sum(bool(t.judged()) for t in targets)
    met = sum(t.verdict() == "met" for t in targets)
    lines.append(f"targets: {met} met, {judged - met} missed, {len(targets) - judged} not measured")
    return "\n".join(lines)


def as_json(targets, files):
    return {"sources": sorted({p for _, p, _ in files}),
            "devices": sorted({d["device"] for _, _, d in files
                               if isinstance(d, dict) and "device" in d}),
            "targets": [{"name": t.name, "statement": t.statement, "verdict": t.verdict(),
                         "cells": [dict(asdict(c), met=c.met) for c in t.cells]}
                        for t in targets]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="benchmark JSON files or directories of them")
    ap.add_argument("--json", default=None, help="also write the scorecard here")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 unless every target is met (a missed or unmeasured one fails)")
    args = ap.parse_args(argv)
    missing = [p for p in args.paths if not os.path.exists(p)]
    if missing:
        ap.error(f"no such file or directory: {', '.join(missing)}")
    files = load(args.paths)
    targets = scorecard(files)
    print(f"{len(files)} benchmark outputs read: "
          + ", ".join(f"{k} {os.path.relpath(p)}" for k, p, _ in files))
    print(report(targets))
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(as_json(targets, files), fh, indent=1)
    return int(args.strict and any(t.verdict() != "met" for t in targets))


if __name__ == "__main__":
    sys.exit(main())
