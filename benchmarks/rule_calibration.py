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

    python -m benchmarks.rule_calibration --examples 8          # CPU, ~20 minutes on 2 busy cores
    python -m benchmarks.rule_calibration --examples 20 --fast --json out.json
    python -m benchmarks.rule_calibration --device cuda --dtypes float32   # F7 / F8 on a GPU
    python -m benchmarks.rule_calibration --corpus             # the SDPA corpus, both rules
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
from hypothesis import HealthCheck, Phase, given, settings

from attention_oracle.oracle.dsa import dsa_reference
from attention_oracle.oracle.sdpa import sdpa_reference
from attention_oracle.properties.dsa import checks as dsa_checks
from attention_oracle.properties.dsa.cases import strategy_for as dsa_strategy
from attention_oracle.properties.harness import report
from attention_oracle.properties.harness.agreement import OracleMismatch
from attention_oracle.properties.harness.targets import Refused, Target, load
from attention_oracle.properties.sdpa import checks as sdpa_checks
from attention_oracle.properties.sdpa.cases import strategy_for as sdpa_strategy

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CHECKS = ("forward_agreement", "gradient_agreement")
RULES = {"ensemble": ("naive", "flash", "prescaled"), "naive": ("naive",)}

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

def cases_for(area: str, check_name: str, target: Target, dtype: torch.dtype, examples: int) -> list:
    """The check's first ``examples`` derandomized Hypothesis cases within the target's
    capabilities: drawn once, so that both rules judge the very same inputs."""
    strategy = sdpa_strategy if area == "sdpa" else dsa_strategy
    caps = target.capabilities.narrowed(dtypes=(dtype,))
    cases = strategy(check_name, caps) if area == "sdpa" else strategy(check_name, caps, rope=True)
    drawn = []

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def draw(case):
        drawn.append(case)

    draw()
    return drawn


def worst(area: str, check_name: str, target: Target, cases: list, rule: str) -> dict:
    """Worst ratio, failures and examples run (refusals left out) of one check under one rule."""
    module = sdpa_checks if area == "sdpa" else dsa_checks
    check = module.CHECKS[check_name]
    saved = module.ALGORITHMS
    module.ALGORITHMS = RULES[rule]
    tally = {"worst": 0.0, "failed": 0, "run": 0, "first": "", "case": "", "worst_case": ""}
    try:
        for case in cases:
            sink, token = report.open_sink()
            try:
                check(target, case)
                tally["run"] += 1
            except Refused:
                continue
            except OracleMismatch as exc:
                tally["run"] += 1
                tally["failed"] += 1
                if not tally["first"]:
                    tally["first"], tally["case"] = str(exc).splitlines()[0][:300], case.to_json()
            finally:
                report.close_sink(token)
            if sink.worst > tally["worst"]:
                tally["worst"], tally["worst_case"] = sink.worst, case.to_json()
    finally:
        module.ALGORITHMS = saved
    return tally


def _targets(include_fast: bool, device: str = "cpu") -> list[tuple[str, str, Target]]:
    """(area, label, target) for every implementation measured (unavailable ones left out)."""
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
    return out


def calibrate(examples: int, include_fast: bool, dtypes=tuple(DTYPES), device: str = "cpu") -> list[dict]:
    rows = []
    for area, label, target in _targets(include_fast, device):
        controls = SDPA_CONTROLS if area == "sdpa" else DSA_CONTROLS
        checks = (controls[label.split(":", 1)[1]],) if label.startswith("control:") else CHECKS
        for dname in dtypes:
            dtype = DTYPES[dname]
            if dtype not in target.dtypes:
                continue
            for check_name in checks:
                t0 = time.perf_counter()
                row = {"area": area, "impl": label, "dtype": dname, "check": check_name}
                cases = cases_for(area, check_name, target, dtype, examples)
                for rule in RULES:
                    r = worst(area, check_name, target, cases, rule)
                    row[rule] = r
                row["seconds"] = round(time.perf_counter() - t0, 1)
                rows.append(row)
                print(_line(row), flush=True)
    return rows


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
    from attention_oracle.properties.harness.case import load_case
    from attention_oracle.properties.tools.replay import corpus
    rows = []
    for name, entry in corpus():
        area, check_name = entry["check"].split(".", 1)
        if area != "sdpa" or check_name not in sdpa_checks.CHECKS:
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
    return (f"{row['area']:4} {row['impl']:32} {row['dtype']:8} {row['check']:18} "
            f"ensemble {e['worst']:9.3f} ({e['failed']}/{e['run']} fail)   "
            f"naive-only {n['worst']:9.3f} ({n['failed']}/{n['run']} fail)   {row['seconds']} s")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=12, help="Hypothesis examples per check")
    ap.add_argument("--fast", action="store_true", help="include fast (slow under the interpreter)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--device", default="cpu", help="cuda: the fused CUDA backends too (F7, F8)")
    ap.add_argument("--corpus", action="store_true", help="only the SDPA regression corpus")
    args = ap.parse_args(argv)
    if args.corpus:
        corpus_figures(device=args.device)
        return
    dtypes = tuple(args.dtypes.split(","))
    if args.fast and args.device == "cpu":  # before fast's kernels are imported (FACTS.md)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    floors = floor_figures(dtypes=dtypes)
    for dname, worst in floors.items():
        print(f"single-key dq (cancels to 0), lp error in eps * magnitude, {dname}: "
              + ", ".join(f"{a} {w:.3f}" for a, w in worst.items()), flush=True)
    rows = calibrate(args.examples, args.fast, dtypes, args.device)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"floor": floors, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
