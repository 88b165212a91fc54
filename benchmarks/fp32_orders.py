"""Which summation order explains an implementation's fp32 SDPA error on one case.

    python -m benchmarks.fp32_orders --impl torch --case '{"area": "sdpa", ...}' [--out FILE]

For each output (out, and dq/dk/dv with ``--backward``) it prints max|impl - gold| against the
float64 gold, the error of each lp member of the agreement rule's ensemble (naive, flash,
prescaled), the bound the rule allows and the ratio, and max|impl - lp_a| for each member: a
member the implementation reproduces sits near 0 there, and a bound that misses the
implementation's order shows as every member far from it. Also the implementation run twice
(its own run-to-run spread).
"""
from __future__ import annotations

import argparse
import json

import torch

from attention_oracle.checks.catalogue import load_case
from attention_oracle.checks.sdpa.cases import build
from attention_oracle.judge.agreement import rule
from attention_oracle.judge.targets import load
from attention_oracle.oracle.sdpa import lp_algorithms, sdpa_reference

from .timing import write_json


def _max(x) -> float:
    return float(x.abs().max()) if x.numel() else 0.0


def analyse(impl: str, case_dict: dict, backward: bool) -> dict:
    case = load_case(case_dict)
    target = load(impl)
    inp = build(case, target.device, requires_grad=backward)
    kw = dict(attn_mask=inp.attn_mask, **inp.kwargs)
    runs = []
    for _ in range(2):
        out = target.call("scaled_dot_product_attention", inp.q, inp.k, inp.v, **kw)
        got = {"out": out.detach()}
        if backward:
            dq, dk, dv = torch.autograd.grad(out, (inp.q, inp.k, inp.v), inp.dout.contiguous())
            got.update(dq=dq, dk=dk, dv=dv)
        runs.append(got)
    args = [t.detach() for t in (inp.q, inp.k, inp.v)]
    dout = inp.dout.contiguous() if backward else None
    gold = sdpa_reference(*args, dout, compute_dtype=torch.float64, magnitudes=True, apriori=True, **kw)
    lp = {a: sdpa_reference(*args, dout, compute_dtype=case.torch_dtype, algorithm=a, **kw)
          for a in lp_algorithms(case.torch_dtype)}
    result = {}
    for name, x in runs[0].items():
        g = gold[name].double()
        x64 = x.double()
        lp_err = {a: _max(r[name].double() - g) for a, r in lp.items()}
        v = rule(_max(x64 - g), lp_err, _max(g.to(case.torch_dtype).double() - g),
                 gold["magnitude"][name], case.torch_dtype, name != "out",
                 gold.get("magnitude_acc", {}).get(name, 0.0), gold.get("apriori", {}).get(name, 0.0))
        result[name] = {"err": _max(x64 - g), "allowed": v.allowed, "ratio": v.ratio, "set_by": v.set_by, "lp_err": lp_err,
                        "impl_minus_lp": {a: _max(x64 - r[name].double()) for a, r in lp.items()},
                        "run_to_run": _max(x64 - runs[1][name].double())}
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", default="torch")
    p.add_argument("--case", required=True, help="the case JSON a failure printed")
    p.add_argument("--backward", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    result = analyse(a.impl, json.loads(a.case), a.backward)
    print(json.dumps(result, indent=2))
    if a.out:
        write_json(a.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
