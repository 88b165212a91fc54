"""How the agreement rule separates correct kernels from planted bugs, measured.

For each implementation and dtype, the SDPA (and DSA) forward and gradient checks run on the
same derandomized Hypothesis cases twice: under the rule with the lp ensemble (naive, flash,
prescaled: ``oracle/flash.py``) and under the former rule, the naive lp alone. The table gives
the worst error ratio (error over allowed; < 1 passes) and the examples that failed. Known
failure classes are not applied: every example is judged by the rule.

Implementations: the oracle's own standard algorithms run in the dtype (``algo:naive``,
``algo:flash``, ``algo:prescaled``; under the ensemble each is at most 1/k of the bound by
construction, under the naive rule they show what the former rule called a failure), the torch
CPU backends (torch-math, torch-flash, the default dispatch ``torch``, torch-flex's eager
forward), ``fast`` with ``--fast`` (Triton's interpreter on CPU, fp32/fp16 only: slow), and
the negative controls of the agreement checks (``controls/sdpa_broken.py``,
``controls/dsa_broken.py``).

Cases are drawn and judged by ``attention_oracle/tools/collect.py`` (the loop the
calibration report uses too): examples round-robin over the groups, so ``--budget-s`` cuts every
row's last examples evenly and SIGTERM still prints the rows collected. Rows give examples run
out of those planned; refusals are left out. On CUDA torch-flex gets 3 cases per check
(``--examples-for torch-flex=N``): it compiles per shape.

    python -m benchmarks.rule_calibration --examples 8          # CPU, ~20 minutes on 2 busy cores
    python -m benchmarks.rule_calibration --examples 20 --fast --json out.json
    python -m benchmarks.rule_calibration --device cuda --dtypes float32   # F7 / F8 on a GPU
    python -m benchmarks.rule_calibration --device cuda --dtypes float32 --budget-s 120 \
        --examples-for torch-flex=3 --impl torch,torch-efficient,torch-cudnn,torch-flex
    python -m benchmarks.rule_calibration --corpus             # the SDPA corpus, both rules
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from attention_oracle.checks import catalogue
from attention_oracle.judge.targets import Target, load
from attention_oracle.oracle.dsa import dsa_reference
from attention_oracle.oracle.sdpa import sdpa_reference
from attention_oracle.tools.collect import CaseBook, Group, collect, run_example

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CHECKS = ("forward_agreement", "gradient_agreement")
RULES = {"ensemble": ("naive", "flash", "prescaled"), "naive": ("naive",)}
FLEX_CUDA_EXAMPLES = 3  # flex compiles per shape on CUDA (~30 s a shape): a few shapes per check

SDPA_CONTROLS = {  # the controls whose catching check is an agreement check
    "WrongScale": "forward_agreement", "CausalOffByOne": "forward_agreement",
    "WrongGqaMapping": "forward_agreement", "KeyGradientMissesScale": "gradient_agreement",
}
DSA_CONTROLS = {"LseBase2": "forward_agreement", "MinusOneReadAsRowZero": "forward_agreement",
                "TopkLengthIgnored": "forward_agreement", "TopkLengthOffByOne": "forward_agreement",
                "GradientsForInvalidSlots": "gradient_agreement"}


# ----------------------------------------------------------------------------- the algorithms

class _SdpaAlgorithm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, kw, algorithm):
        ctx.save_for_backward(q, k, v)
        ctx.mask, ctx.kw, ctx.algorithm = mask, kw, algorithm
        r = sdpa_reference(q, k, v, attn_mask=mask, compute_dtype=q.dtype, algorithm=algorithm, **kw)
        return r["out"].to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        r = sdpa_reference(q, k, v, dout, attn_mask=ctx.mask, compute_dtype=q.dtype,
                           algorithm=ctx.algorithm, **ctx.kw)
        return r["dq"].to(q.dtype), r["dk"].to(k.dtype), r["dv"].to(v.dtype), None, None, None


class _DsaAlgorithm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ql, qr, kv, kr, idx, topk, scale, algorithm):
        ctx.save_for_backward(ql, qr, kv, kr, idx, topk)
        ctx.scale, ctx.algorithm = scale, algorithm
        r = dsa_reference(ql, qr, kv, kr, idx, topk_length=topk, softmax_scale=scale,
                          compute_dtype=ql.dtype, magnitudes=False, algorithm=algorithm)
        ctx.mark_non_differentiable(r["lse"])
        return r["out"].to(ql.dtype), r["lse"].to(torch.float32)

    @staticmethod
    def backward(ctx, dout, _dlse):
        ql, qr, kv, kr, idx, topk = ctx.saved_tensors
        r = dsa_reference(ql, qr, kv, kr, idx, dout, topk_length=topk, softmax_scale=ctx.scale,
                          compute_dtype=ql.dtype, magnitudes=False, algorithm=ctx.algorithm)
        cast = lambda x, like: None if x is None else x.reshape(like.shape).to(like.dtype)  # noqa: E731
        return (cast(r["dq_latent"], ql), cast(r["dq_rope"], qr), cast(r["dkv_latent"], kv),
                cast(r["dk_rope"], kr), None, None, None, None)


class Algorithm:
    """The oracle's ``algorithm`` run in the inputs' dtype, offered as an implementation."""

    def __init__(self, algorithm: str):
        self.algorithm = algorithm

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        kw = dict(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        return _SdpaAlgorithm.apply(query, key, value, attn_mask, kw, self.algorithm)

    def _dsa(self, ql, qr, kv, kr, idx, topk_length, softmax_scale, return_lse):
        out, lse = _DsaAlgorithm.apply(ql, qr, kv, kr, idx, topk_length, softmax_scale, self.algorithm)
        return (out, lse) if return_lse else out

    def dsa_sparse_attention_nope(self, q, kv, indices, *, topk_length=None, softmax_scale=None,
                                  return_lse=False):
        return self._dsa(q, None, kv, None, indices, topk_length, softmax_scale, return_lse)

    def dsa_sparse_attention(self, q_latent, q_rope, kv_latent, k_rope, indices, *, topk_length=None,
                             softmax_scale=None, return_lse=False):
        return self._dsa(q_latent, q_rope, kv_latent, k_rope, indices, topk_length, softmax_scale,
                         return_lse)


# ----------------------------------------------------------------------------- measuring

def judge_both(check, target, case, check_name: str, use_poison: bool) -> dict:
    """One case judged under each rule: {rule: collect.run_example(...)} (known classes are
    recorded by run_example and ignored here: every example is judged by the rule)."""
    return {rule: run_example(check, target, case, check_name, use_poison, algorithms=algs)
            for rule, algs in RULES.items()}


def tally(examples: list) -> dict:
    """Worst ratio, failures (a mismatch or an error) and examples run (refusals left out) of
    one rule's judged examples, with the first failure's message and the worst case."""
    out = {"worst": 0.0, "failed": 0, "run": 0, "first": "", "case": "", "worst_case": ""}
    for e in examples:
        if e["outcome"] == "refused":
            continue
        out["run"] += 1
        if e["outcome"] in ("failed", "error"):
            out["failed"] += 1
            if not out["first"]:
                out["first"], out["case"] = e["message"].splitlines()[0][:300], e["case"]
        if e["ratio"] > out["worst"]:
            out["worst"], out["worst_case"] = e["ratio"], e["case"]
    return out


def worst(area: str, check_name: str, target: Target, cases: list, rule: str) -> dict:
    """:func:`tally` of one check under one rule on ``cases`` (no poisoning)."""
    check = catalogue.checks(area)[check_name]
    return tally([run_example(check, target, c, f"{area}.{check_name}", False,
                              algorithms=RULES[rule]) for c in cases])


def _targets(include_fast: bool, device: str = "cpu", only=None) -> list[tuple[str, str, Target]]:
    """(area, label, target) for every implementation measured (unavailable ones left out);
    ``only``: labels to keep (``algo:*``, ``torch-*``, ``fast``, ``control:*``, or ``controls``)."""
    dev = torch.device(device)
    out = []
    for alg in RULES["ensemble"]:
        out += [("sdpa", f"algo:{alg}", Target(f"algo:{alg}", Algorithm(alg), dev)),
                ("dsa", f"algo:{alg}", Target(f"algo:{alg}", Algorithm(alg), dev))]
    for name in ("torch-math", "torch-flash", "torch-efficient", "torch-cudnn", "torch", "torch-flex"):
        t = load(name, dev)
        if not t.unavailable:
            out.append(("sdpa", name, t))
    if include_fast:
        t = load("fast", dev)
        out += [("sdpa", "fast", t), ("dsa", "fast", t)]
    for c in SDPA_CONTROLS:
        out.append(("sdpa", f"control:{c}", load(f"attention_oracle.controls.sdpa_broken:{c}", dev)))
    for c in DSA_CONTROLS:
        out.append(("dsa", f"control:{c}", load(f"attention_oracle.controls.dsa_broken:{c}", dev)))
    if only:
        keep = lambda label: label in only or ("controls" in only and label.startswith("control:"))  # noqa: E731
        out = [t for t in out if keep(t[1])]
    return out


def plan(examples: int, include_fast: bool, dtypes=tuple(DTYPES), device: str = "cpu",
         examples_for=None, only=None) -> list[Group]:
    """One group per (implementation, dtype, check): the check's first derandomized cases
    within the target's capabilities (RoPE for DSA), drawn once so both rules judge the very
    same inputs. ``examples_for``: {label: cases} overriding ``examples``."""
    book, groups = CaseBook(), []
    for area, label, target in _targets(include_fast, device, only):
        controls = SDPA_CONTROLS if area == "sdpa" else DSA_CONTROLS
        checks = (controls[label.split(":", 1)[1]],) if label.startswith("control:") else CHECKS
        n = (examples_for or {}).get(label, examples)
        variant = "rope" if area == "dsa" else ""
        for dname in dtypes:
            dtype = DTYPES[dname]
            if dtype not in target.dtypes:
                continue
            caps = target.capabilities.narrowed(dtypes=(dtype,))
            for check_name in checks:
                kind = "control" if label.startswith("control:") else "correct"
                groups.append(Group(kind, label, label, area, check_name, variant, dname,
                                    book.cases(area, check_name, variant, caps, n), target=target))
    return groups


def f8_cases() -> list:
    """SDPA cases shaped like F8's failing examples (docs/FINDINGS.md F8: torch-flex fp32 on
    CUDA): [2, 2, 1, 256] q with one kv head (GQA), S 35, Ev 24, a float mask, scale 1.0 (out
    5.63x, dq 1.83x under the naive rule); E 96, S 5, a broadcast bool mask (out 1.28x). The
    recorded seeds are lost: three seeds per shape (flex compiles once per shape)."""
    from attention_oracle.checks.sdpa.cases import SdpaCase
    shapes = [dict(batch=(2,), hq=2, hkv=1, gqa=True, L=1, S=35, E=256, Ev=24, mask="float_full",
                   scale=1.0),
              dict(batch=(1,), hq=2, hkv=2, L=4, S=5, E=96, Ev=96, mask="bool_bcast")]
    return [SdpaCase(dtype="float32", seed=seed, **shape) for shape in shapes for seed in (1, 2, 3)]


def f8_groups(device: str) -> list[Group]:
    """torch-flex on :func:`f8_cases`, forward and gradient (label ``torch-flex:F8``)."""
    target = load("torch-flex", torch.device(device))
    if target.unavailable:
        print(f"rule_calibration: --f8: torch-flex unavailable: {target.unavailable}", flush=True)
        return []
    return [Group("correct", "torch-flex:F8", "torch-flex:F8", "sdpa", check, "", "float32",
                  f8_cases(), target=target) for check in CHECKS]


def rows_of(groups: list[Group]) -> list[dict]:
    """One row per group: each rule's :func:`tally`, the examples planned and the seconds spent."""
    rows = []
    for g in groups:
        row = {"area": g.area, "impl": g.label, "dtype": g.dtype, "check": g.check,
               "planned": len(g.cases), "ran": len(g.examples)}
        for rule in RULES:
            row[rule] = tally([e[rule] for e in g.examples])
        row["seconds"] = round(sum(e[r]["seconds"] for e in g.examples for r in RULES), 1)
        rows.append(row)
    return rows


def calibrate(examples: int, include_fast: bool, dtypes=tuple(DTYPES), device: str = "cpu",
              examples_for=None, only=None, budget_s=None, start=None,
              f8: bool = False) -> tuple[list[dict], dict]:
    """Both rules on every group's cases (round-robin, within ``budget_s``); the rows and
    collect's status (elapsed, rounds, why it stopped). ``f8``: F8's shapes first."""
    groups = (f8_groups(device) if f8 else []) + plan(examples, include_fast, dtypes, device,
                                                     examples_for, only)
    print(f"rule_calibration: {len(groups)} groups, {sum(len(g.cases) for g in groups)} examples "
          f"planned on {device}", flush=True)
    status = collect(groups, torch.device(device), budget_s=budget_s, start=start, use_poison=False,
                     judge=judge_both, log=lambda m: print(m, flush=True))
    rows = rows_of(groups)
    for row in rows:
        print(_line(row), flush=True)
    if status["stopped"]:
        print(f"rule_calibration: {status['stopped']} (rounds done: {status['rounds']}; rows show "
              f"run/planned)", flush=True)
    return rows, status


def floor_figures(seeds: int = 40, dtypes=tuple(DTYPES)) -> dict:
    """Where dq cancels to 0 (one key per query: P = 1, dS = 0 exactly), the largest lp error
    of each algorithm in units of eps(dtype) * magnitude (the floor's unit): what FLOOR_ULPS
    must cover. {dtype: {algorithm: worst}} over ``seeds`` random single-key problems."""
    out = {}
    for dname in dtypes:
        dtype, worst = DTYPES[dname], {}
        for seed in range(seeds):
            g = torch.Generator().manual_seed(seed)
            L, E, Ev = (int(x) for x in torch.randint(1, 65, (3,), generator=g))
            spread = float(torch.tensor([0.3, 1.0, 3.0, 10.0])[seed % 4])
            q, k = (torch.randn(2, 3, n, E, generator=g) * spread for n in (L, 1))
            v, do = torch.randn(2, 3, 1, Ev, generator=g), torch.randn(2, 3, L, Ev, generator=g)
            q, k, v, do = (t.to(dtype) for t in (q, k, v, do))
            gold = sdpa_reference(q, k, v, do, magnitudes=True)
            unit = torch.finfo(dtype).eps * gold["magnitude"]["dq"]
            for alg in RULES["ensemble"]:
                lp = sdpa_reference(q, k, v, do, compute_dtype=dtype, algorithm=alg)
                err = float((lp["dq"].double() - gold["dq"]).abs().max())
                worst[alg] = max(worst.get(alg, 0.0), err / unit if unit else 0.0)
        out[dname] = worst
    return out


def corpus_figures(impls=("torch-math", "torch-flash", "torch"), device: str = "cpu") -> list[dict]:
    """The SDPA regression corpus (fixtures/regressions) under both rules, per implementation."""
    from attention_oracle.checks.catalogue import load_case
    from attention_oracle.run.corpus import entries as corpus
    rows = []
    for name, entry in corpus():
        area, check_name = entry["check"].split(".", 1)
        if area != "sdpa" or check_name not in catalogue.checks("sdpa"):
            continue
        case = load_case(entry["case"])
        for impl in impls:
            target = load(impl, torch.device(device))
            if target.unavailable:
                continue
            row = {"entry": name, "impl": impl, "check": check_name}
            for rule in RULES:
                r = worst("sdpa", check_name, target, [case], rule)
                row[rule] = "refused" if r["run"] == 0 else f"{r['worst']:.3f}"
            rows.append(row)
            print(f"{name:36} {impl:12} ensemble {row['ensemble']:>8}  naive-only {row['naive']:>8}",
                  flush=True)
    return rows


def _line(row: dict) -> str:
    e, n = row["ensemble"], row["naive"]
    cut = f"   cases {row['ran']}/{row['planned']}" if "planned" in row else ""
    return (f"{row['area']:4} {row['impl']:32} {row['dtype']:8} {row['check']:18} "
            f"ensemble {e['worst']:9.3f} ({e['failed']}/{e['run']} fail)   "
            f"naive-only {n['worst']:9.3f} ({n['failed']}/{n['run']} fail)   {row['seconds']} s{cut}")


def _name_count(text: str) -> tuple[str, int]:
    name, sep, n = text.partition("=")
    if not sep or not n.isdigit() or int(n) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME=N with N >= 1, got {text!r}")
    return name, int(n)


def main(argv=None) -> None:
    start = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=12, help="Hypothesis examples per check")
    ap.add_argument("--examples-for", type=_name_count, action="append", default=[],
                    metavar="LABEL=N", help="examples per check for one implementation (repeatable); "
                    f"on CUDA torch-flex defaults to {FLEX_CUDA_EXAMPLES} (it compiles per shape)")
    ap.add_argument("--impl", default="", help="comma-separated labels to measure (algo:naive, "
                    "torch-flex, fast, control:WrongScale, controls, ...); default: all")
    ap.add_argument("--fast", action="store_true", help="include fast (slow under the interpreter)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--device", default="cpu", help="cuda: the fused CUDA backends too (F7, F8)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting examples after this many seconds (from the start)")
    ap.add_argument("--no-floor", action="store_true", help="skip the single-key floor figures")
    ap.add_argument("--f8", action="store_true",
                    help="also torch-flex on cases shaped like F8's (fp32; CUDA compiles flex)")
    ap.add_argument("--corpus", action="store_true", help="only the SDPA regression corpus")
    args = ap.parse_args(argv)
    if args.corpus:
        corpus_figures(device=args.device)
        return
    dtypes = tuple(args.dtypes.split(","))
    if args.fast and args.device == "cpu":  # before fast's kernels are imported (FACTS.md)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    examples_for = {"torch-flex": FLEX_CUDA_EXAMPLES} if args.device.startswith("cuda") else {}
    examples_for.update(dict(args.examples_for))
    only = [t for t in args.impl.split(",") if t] or None
    floors = {} if args.no_floor else floor_figures(dtypes=dtypes)
    for dname, w in floors.items():
        print(f"single-key dq (cancels to 0), lp error in eps * magnitude, {dname}: "
              + ", ".join(f"{a} {x:.3f}" for a, x in w.items()), flush=True)
    rows, status = calibrate(args.examples, args.fast, dtypes, args.device, examples_for, only,
                             args.budget_s, start, args.f8)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"floor": floors, "rows": rows, "status": status}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
