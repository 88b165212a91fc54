"""Calibration report: how far correct kernels stay below the agreement rule's bound, and how
far above it each negative control lands.

    python -m attention_oracle.tools.calibrate [--examples N] [--out DIR] ...
    attention-oracle calibrate [same options]

For every area (``sdpa``, ``dsa``, ``index``), check, DSA variant (NoPE, RoPE) and dtype it
draws N cases (a derandomized Hypothesis run that only collects the cases: deterministic, the
same cases for every implementation) and runs each check on:

- every correct built-in available here (``oracle``, ``fast``, ``torch``, ``torch-*``): the
  ratio err / allowed of every output (0 for an exact match, inf for a failed exact
  convention, NaN where the gold is finite, or an error) is recorded. Target: the worst ratio
  per implementation and dtype <= 0.5 (docs/CONTRACT.md "5. The agreement rule": correct kernels pass with room).
  Examples in a known failure class (``known_failures``) are reported apart;
- every negative control (``attention_oracle/controls/*_broken.py``) on the check meant to
  catch it: the control's ratio is the largest over its examples. Target >= 2 in every dtype;
  a control no example catches (ratio <= 1) is a failure of the suite.

Checks run with poisoned allocations, as in the suite (``--no-poison`` to compare). Examples
run round-robin (example 1 of every group, then example 2, ...), so ``--budget-s`` cuts every
group's last examples evenly; what was cut is printed and written. Under Triton's CPU
interpreter fast gets ``--fast-examples`` (default 2) cases per group. Output:
``DIR/calibration.json`` (every example's ratios, per-group and per-target summaries),
``DIR/calibration.txt`` (the tables; both rewritten after every round, so a run cut short still
leaves them) and
``DIR/calibration.png`` (histogram of log10 ratios). Exit status 1 when a target is missed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass

import torch

from attention_oracle.checks import catalogue
from attention_oracle.controls import dsa_broken, index_broken, sdpa_broken
from attention_oracle.judge import profiles
from attention_oracle.judge.case import DTYPES as NAMED
from attention_oracle.judge.targets import load
from attention_oracle.run import known_failures
from attention_oracle.tools.collect import CaseBook, Group, Stopped, collect, stop_on_sigterm

CORRECT_BUILTINS = ("oracle", "fast", "torch", "torch-math", "torch-flash", "torch-efficient",
                    "torch-cudnn", "torch-flex")
AREAS = ("sdpa", "dsa", "index")
DTYPES = ("float32", "float16", "bfloat16")
CORRECT_TARGET = 0.5
CONTROL_TARGET = 2.0
FAST_INTERPRETED_EXAMPLES = 2
CONTROL_EXAMPLES = 40  # as profiles.control_settings: a control is searched for, not sampled
LOG_ZERO, LOG_INF = -4.0, 4.0  # where exact zeros and infinities sit on the histogram


# ----------------------------------------------------------------------------- what to run


def _controls(areas) -> list[tuple[str, str, str, str]]:
    """(area, target name, label, check) of every negative control and the check it must fail."""
    out = []
    if "sdpa" in areas:
        out += [("sdpa", f"attention_oracle.controls.sdpa_broken:{c}", f"sdpa_broken:{c}", k)
                for c, k in sorted(sdpa_broken.CONTROLS.items())]
    if "dsa" in areas:
        pairs = sorted(dsa_broken.CONTROLS.items()) + list(dsa_broken.MORE_CONTROLS)
        out += [("dsa", f"attention_oracle.controls.dsa_broken:{c}", f"dsa_broken:{c}", k) for c, k in pairs]
    if "index" in areas:
        pairs = sorted(index_broken.CONTROLS.items()) + list(index_broken.MORE_CONTROLS)
        for c, k in pairs:
            where = c if ":" in c else f"index_broken:{c}"
            out.append(("index", f"attention_oracle.controls.{where}", where, k))
    return out


def _function(area: str, check: str, variant: str) -> str:
    """The public function a check's cases call (to skip a target that does not offer it)."""
    return catalogue.check(f"{area}.{check}").function(variant)


def _varlen(check: str) -> bool:
    return check.startswith("varlen_")  # the DSA checks of the _varlen forms


def _unsupported(area: str, check: str, variant: str, caps) -> str:
    """Why the target's declared capabilities exclude this check ('' if they do not)."""
    return catalogue.check(f"{area}.{check}").unsupported(caps, variant)


def _dtypes_for(area: str, check: str, dtypes: list) -> list:
    """Index checks judge integer outputs whatever the attention dtype: they run in the first
    dtype only (``compacted_attention`` attends, and runs in every dtype)."""
    if area == "index" and check != "compacted_attention":
        return dtypes[:1]
    return dtypes


def _variants(area: str, kind: str) -> tuple[str, ...]:
    if area != "dsa":
        return ("",)
    return ("rope",) if kind == "control" else ("nope", "rope")  # controls: as their meta test


# ----------------------------------------------------------------------------- the plan


@dataclass
class Plan:
    groups: list
    skipped: list            # {"impl", "area", "check", "dtype", "reason"}


def build_plan(a, device) -> Plan:

    dtypes = [NAMED[d] for d in a.dtypes]
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    groups, skipped = [], []
    book = CaseBook()
    cases_for = book.cases

    def skip(impl, area, check, dtype, reason):
        skipped.append({"impl": impl, "area": area, "check": check, "dtype": dtype, "reason": reason})

    wanted = [n for n in a.impl if n != "controls"] if a.impl else list(CORRECT_BUILTINS)
    for name in wanted:
        target = load(name, device)
        if target.unavailable:
            skip(name, "*", "*", "*", f"unavailable: {target.unavailable}")
            continue
        n = a.examples
        if name == "fast" and interpreted:
            n = min(n, a.fast_examples)
        n = a.examples_for.get(name, n)
        for area in a.area:
            for check in catalogue.checks(area):
                if known_failures.reason(name, f"{area}.{check}", device):
                    skip(name, area, check, "*", "known failure (whole check), not run: " +
                         known_failures.reason(name, f"{area}.{check}", device))
                    continue
                for variant in _variants(area, "correct"):
                    fn = _function(area, check, variant)
                    if not target.offers(fn):
                        skip(name, area, check, "*", f"does not offer {fn}")
                        continue
                    for dt in _dtypes_for(area, check, dtypes):
                        dname = str(dt).replace("torch.", "")
                        if dt not in target.dtypes:
                            why = " (Triton's interpreter computes bf16 wrongly)" if name == "fast" else ""
                            skip(name, area, check, dname, f"{dname} not among its dtypes{why}")
                            continue
                        caps = target.capabilities.narrowed(dtypes=(dt,))
                        why = _unsupported(area, check, variant, caps)
                        if why:
                            where = f"{check}[{variant}]" if variant else check
                            skip(name, area, where, dname, f"declares {why}")
                            continue
                        groups.append(Group("correct", name, name, area, check, variant, dname,
                                            cases_for(area, check, variant, caps, n)))
    if not a.impl or "controls" in a.impl or a.controls:
        for area, name, label, check in _controls(a.area):
            if a.control and label not in a.control and label.split(":")[-1] not in a.control:
                continue
            target = load(name, device)
            if target.unavailable:
                skip(label, area, check, "*", f"unavailable: {target.unavailable}")
                continue
            for variant in _variants(area, "control"):
                for dt in _dtypes_for(area, check, dtypes):
                    caps = target.capabilities.narrowed(dtypes=(dt,))
                    groups.append(Group("control", name, label, area, check, variant,
                                        str(dt).replace("torch.", ""),
                                        cases_for(area, check, variant, caps, a.control_examples)))
    # checks that may fault a device run last: a broken CUDA context ends the calibration
    groups.sort(key=lambda g: g.check == "misaligned_inputs")
    return Plan(groups, skipped)


# ----------------------------------------------------------------------------- summaries


def _fmt(r) -> str:
    if r is None:
        return "-"
    return "inf" if math.isinf(r) else f"{r:.3g}"


def _jsonable(x):
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_jsonable(v) for v in x]
    return x


def summarize(plan: Plan) -> dict:
    correct = defaultdict(lambda: {"examples": 0, "refused": 0, "worst": 0.0, "at": "", "case": "",
                                   "failed": 0, "errors": 0})
    known = defaultdict(lambda: {"examples": 0, "worst": 0.0, "reason": ""})
    controls, groups, cut = [], [], []
    for g in plan.groups:
        run = [e for e in g.examples if e["outcome"] != "refused"]
        judged = [e for e in run if not e["known"]]
        worst = max(judged, key=lambda e: e["ratio"], default=None)
        groups.append({"kind": g.kind, "impl": g.label, "check": g.check_name, "dtype": g.dtype,
                       "planned": len(g.cases), "run": len(g.examples),
                       "refused": len(g.examples) - len(run), "known": len(run) - len(judged),
                       "worst": worst["ratio"] if worst else None,
                       "worst_outputs": worst["outputs"] if worst else {}})
        if len(g.examples) < len(g.cases):
            cut.append({"impl": g.label, "check": g.check_name, "dtype": g.dtype,
                        "run": len(g.examples), "planned": len(g.cases)})
        if g.kind == "control":
            caught = [e for e in run if e["ratio"] > 1.0]
            controls.append({"control": g.label, "check": g.check_name, "dtype": g.dtype,
                             "examples": len(run), "caught": len(caught),
                             "cut": len(g.examples) < len(g.cases),
                             "refused": len(g.examples) - len(run),
                             "errors": sum(e["outcome"] == "error" for e in run),
                             "ratio": worst["ratio"] if worst else None,
                             "case": worst["case"] if worst else ""})
            continue
        for e in run:
            if e["known"]:
                k = known[(g.label, g.check_name, g.dtype)]
                k["examples"] += 1
                k["worst"] = max(k["worst"], e["ratio"])
                k["reason"] = e["known"]
        row = correct[(g.label, g.dtype)]
        row["examples"] += len(judged)
        row["refused"] += len(g.examples) - len(run)
        row["failed"] += sum(e["outcome"] == "failed" for e in judged)
        row["errors"] += sum(e["outcome"] == "error" for e in judged)
        if worst and worst["ratio"] >= row["worst"]:
            at = max(worst["outputs"], key=worst["outputs"].get, default="*")
            row.update(worst=worst["ratio"], at=f"{g.check_name}:{at}", case=worst["case"])
    correct_rows = [{"impl": i, "dtype": d, **r,
                     "meets_target": r["examples"] == 0 or r["worst"] <= CORRECT_TARGET}
                    for (i, d), r in sorted(correct.items())]
    for c in controls:
        c["meets_target"] = c["ratio"] is not None and c["ratio"] >= CONTROL_TARGET and not c["errors"]
    known_rows = [{"impl": i, "check": c, "dtype": d, **r} for (i, c, d), r in sorted(known.items())]
    return {"correct": correct_rows, "known": known_rows, "controls": controls, "groups": groups,
            "cut": cut}


def render(summary: dict, skipped: list, meta: dict) -> str:
    lines = [f"calibration: device {meta['device']}, torch {meta['torch']}, poison "
             f"{'on' if meta['poison'] else 'off'}, {meta['examples']} examples per group "
             f"(controls {meta['control_examples']}, fast interpreted {meta['fast_examples']}), "
             f"{meta['elapsed_s']} s"]
    lines += ["", f"Correct implementations: worst ratio per implementation and dtype "
                  f"(target <= {CORRECT_TARGET})"]
    rows = [("implementation", "dtype", "examples", "worst", "where", "verdict")]
    for r in summary["correct"]:
        verdict = ("none judged" if not r["examples"] else "ok" if r["meets_target"]
                   else "FAILS" if r["worst"] > 1 else "MISSED")
        rows.append((r["impl"], r["dtype"], str(r["examples"]), _fmt(r["worst"]), r["at"], verdict))
    lines += _table(rows)
    if summary["known"]:
        lines += ["", "Known failure classes (apart from the above; docs/FINDINGS.md)"]
        rows = [("implementation", "check", "dtype", "examples", "worst", "reason")]
        rows += [(k["impl"], k["check"], k["dtype"], str(k["examples"]), _fmt(k["worst"]),
                  k["reason"][:70]) for k in summary["known"]]
        lines += _table(rows)
    lines += ["", f"Negative controls: the ratio at which each was caught (target >= {CONTROL_TARGET})"]
    rows = [("control", "check", "dtype", "caught", "ratio", "verdict")]
    for c in summary["controls"]:
        verdict = ("ok" if c["meets_target"] else "not run (cut)" if not c["examples"]
                   else f"not caught in {c['examples']} (cut)" if not c["caught"] and c["cut"]
                   else "NOT CAUGHT" if not c["caught"] else "MISSED")
        if c["errors"]:
            verdict += f" ({c['errors']} errors)"
        rows.append((c["control"], c["check"], c["dtype"], f"{c['caught']}/{c['examples']}",
                     _fmt(c["ratio"]), verdict))
    lines += _table(rows)
    if summary["cut"]:
        lines += ["", f"Cut ({meta['stopped']}): {len(summary['cut'])} groups ran fewer examples "
                      f"than planned"]
        lines += [f"  {c['impl']} {c['check']} {c['dtype']}: {c['run']}/{c['planned']}"
                  for c in summary["cut"][:40]]
        if len(summary["cut"]) > 40:
            lines.append(f"  ... and {len(summary['cut']) - 40} more (calibration.json, 'cut')")
    if skipped:
        lines += ["", "Not run"]
        seen = set()
        for s in skipped:
            key = (s["impl"], s["reason"])
            if key in seen:
                continue
            seen.add(key)
            lines.append(f"  {s['impl']} {s['area']}.{s['check']} {s['dtype']}: {s['reason'][:150]}")
    return "\n".join(lines)


def _table(rows) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = ["  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    out.insert(1, "  " + "  ".join("-" * w for w in widths))
    return out


def _log10(r: float) -> float:
    if r == 0:
        return LOG_ZERO
    if math.isinf(r):
        return LOG_INF
    return min(max(math.log10(r), LOG_ZERO), LOG_INF)


def plot(plan: Plan, summary: dict, path: str) -> None:
    """Histogram of log10 ratios: every example of a correct implementation (its worst output)
    and every control (the ratio it was caught at); lines at 0.5, 1 and 2."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    correct = [_log10(e["ratio"]) for g in plan.groups if g.kind == "correct"
               for e in g.examples if e["ratio"] is not None and not e["known"]]
    controls = [_log10(c["ratio"]) for c in summary["controls"] if c["ratio"] is not None]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bins = [LOG_ZERO + 0.1 * i for i in range(int((LOG_INF - LOG_ZERO) / 0.1) + 2)]
    ax.hist(correct, bins=bins, alpha=0.6, label=f"correct implementations, per example ({len(correct)})")
    ax.hist(controls, bins=bins, alpha=0.6, label=f"negative controls, caught at ({len(controls)})")
    for x, style in ((CORRECT_TARGET, ":"), (1.0, "-"), (CONTROL_TARGET, "--")):
        ax.axvline(math.log10(x), color="k", linestyle=style, linewidth=1)
    ax.set_xlabel(f"log10(error / allowed)   (exact 0 shown at {LOG_ZERO:g}, inf at {LOG_INF:g})")
    ax.set_ylabel("count")
    ax.set_yscale("log")
    ax.set_title("agreement-rule calibration: lines at 0.5 (correct target), 1 (bound), 2 (control target)")
    ax.legend(loc="upper center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- command line


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _name_count(text: str) -> tuple[str, int]:
    name, sep, n = text.partition("=")
    if not sep or not name.strip() or not n.strip().isdigit() or int(n) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME=N with N >= 1, got {text!r}")
    return name.strip(), int(n)


def parse(argv):
    p = argparse.ArgumentParser(prog="attention-oracle calibrate", description=(
        "Calibration report: how far correct kernels stay below the agreement rule's bound, and how "
        "far above it each negative control lands (JSON, and a PNG of the ratios)."))
    p.add_argument("--examples", type=int, default=12, help="cases per (implementation, check, dtype)")
    p.add_argument("--control-examples", type=int, default=CONTROL_EXAMPLES,
                   help="cases per (control, check, dtype); the meta tests search up to 40")
    p.add_argument("--fast-examples", type=int, default=FAST_INTERPRETED_EXAMPLES,
                   help="cases per group for fast under Triton's CPU interpreter")
    p.add_argument("--examples-for", type=_name_count, action="append", default=[],
                   metavar="NAME=N", help="cases per group for one implementation (repeatable), "
                   "e.g. torch-flex=2 (flex compiles per shape on CUDA) or fast=4")
    p.add_argument("--dtypes", type=_csv, default=list(DTYPES), help="comma-separated")
    p.add_argument("--impl", type=_csv, action="extend", default=[],
                   help="correct implementations (comma-separated, repeatable; 'controls' adds the "
                        "negative controls); default: every built-in and every control")
    p.add_argument("--controls", action="store_true", help="with --impl: run the controls too")
    p.add_argument("--control", type=_csv, action="extend", default=[],
                   help="only these controls (class names, e.g. WrongScale, or module:class, "
                        "e.g. index_broken:CausalOffByOne)")
    p.add_argument("--area", type=_csv, default=list(AREAS), help="sdpa,dsa,index")
    p.add_argument("--budget-s", type=float, default=None, help="stop starting examples after this")
    p.add_argument("--out", default="calibration", help="directory for calibration.json and .png")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--sizes", choices=("small", "large"), default=None,
                   help="problem sizes drawn (default: large on CUDA, small on the CPU)")
    p.add_argument("--no-poison", action="store_true", help="leave new tensors uninitialised")
    p.add_argument("--no-png", action="store_true", help="JSON only")
    a = p.parse_args(argv)
    for d in a.dtypes:
        if d not in DTYPES:
            p.error(f"--dtypes: unknown dtype {d!r}; expected some of {DTYPES}")
    for area in a.area:
        if area not in AREAS:
            p.error(f"--area: unknown area {area!r}; expected some of {AREAS}")
    a.examples_for = dict(a.examples_for)
    if a.examples < 1 or a.control_examples < 1 or a.fast_examples < 0:
        p.error("--examples and --control-examples must be >= 1, --fast-examples >= 0")
    return a


def _meta(a, device, large: bool, status: dict) -> dict:
    import triton
    return {"device": str(torch.cuda.get_device_name(device) if device.type == "cuda" else device),
            "torch": torch.__version__, "triton": triton.__version__,
            "interpreter": os.environ.get("TRITON_INTERPRET") == "1", "poison": not a.no_poison,
            "examples": a.examples, "control_examples": a.control_examples,
            "fast_examples": a.fast_examples, "examples_for": a.examples_for, "dtypes": a.dtypes,
            "areas": a.area, "sizes": "large" if large else "small", "budget_s": a.budget_s,
            "targets": {"correct_max": CORRECT_TARGET, "control_min": CONTROL_TARGET}, **status}


def write_report(plan: Plan, meta: dict, out: str, png: bool) -> tuple[dict, str]:
    """Summarize what has run so far; write DIR/calibration.json, DIR/calibration.txt (the
    tables) and, with ``png``, DIR/calibration.png. Returns the summary and the tables' text."""
    summary = summarize(plan)
    text = render(summary, plan.skipped, meta)
    os.makedirs(out, exist_ok=True)
    examples = [{"kind": g.kind, "impl": g.label, "check": g.check_name, "dtype": g.dtype, **e}
                for g in plan.groups for e in g.examples]
    for e in examples:  # keep the file readable: the case only where something happened
        if e["outcome"] == "passed" and (e["ratio"] or 0) <= CORRECT_TARGET and e["kind"] == "correct":
            e.pop("case")
    with open(os.path.join(out, "calibration.json"), "w") as f:
        json.dump(_jsonable({"meta": meta, **summary, "skipped": plan.skipped, "examples": examples}),
                  f, indent=1)
    with open(os.path.join(out, "calibration.txt"), "w") as f:
        f.write(text + "\n")
    if png:
        plot(plan, summary, os.path.join(out, "calibration.png"))
    return summary, text


def main(argv=None) -> int:
    start = time.monotonic()  # the budget counts from here: drawing the cases is part of it
    a = parse(sys.argv[1:] if argv is None else argv)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu" and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before fast's kernels are imported (FACTS.md)
    previous = (profiles.name(), profiles.size())
    large = (a.sizes or ("large" if device.type == "cuda" else "small")) == "large"
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    profiles.activate("gpu" if large else "dev", on_gpu=large)
    try:
        with stop_on_sigterm():
            plan = build_plan(a, device)
        print(f"calibrate: {len(plan.groups)} groups, {sum(len(g.cases) for g in plan.groups)} "
              f"examples planned on {device} ({time.monotonic() - start:.0f} s to draw them)",
              flush=True)

        def partial(rounds: int) -> None:
            status = {"elapsed_s": round(time.monotonic() - start, 1), "rounds": rounds,
                      "stopped": "in progress"}
            write_report(plan, _meta(a, device, large, status), a.out, png=False)

        status = collect(plan.groups, device, budget_s=a.budget_s, start=start,
                         use_poison=not a.no_poison, after_round=partial, log=log)
    except Stopped as exc:
        log(f"calibrate: stopped by {exc} while drawing the cases; nothing to report")
        return 1
    finally:
        profiles.activate(previous[0], on_gpu=previous[1] == "large")
    meta = _meta(a, device, large, status)
    summary, text = write_report(plan, meta, a.out, png=False)
    print(text, flush=True)
    if not a.no_png:
        try:
            plot(plan, summary, os.path.join(a.out, "calibration.png"))
        except Exception as exc:  # the tables are written: a plotting problem must not lose them
            log(f"calibrate: calibration.png not written: {type(exc).__name__}: {exc}")
    print(f"written: {os.path.join(a.out, 'calibration.json')}, calibration.txt"
          + ("" if a.no_png else ", calibration.png"))
    missed = ([r for r in summary["correct"] if not r["meets_target"]]
              + [c for c in summary["controls"] if not c["meets_target"]])
    if missed or status["stopped"].startswith("CUDA"):
        print(f"calibrate: {len(missed)} target(s) missed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
