"""DSA checks beyond the contract (registered into ``properties.dsa.checks.CHECKS``).

default_scale: ``softmax_scale=None`` gives the contract's 1/sqrt(Dl + Dr) (NoPE 1/sqrt(D));
    run only for implementations that declare ``default_scale`` (oracle and fast do; other
    libraries document other defaults, FlashInfer's NoPE default is 1/16).
int64_indices: int64 ``indices`` (the contract's are int32): the right result, or a clear
    TypeError/ValueError/NotImplementedError naming ``indices``
    (``properties/harness/beyond.py``); declared ``index_dtypes`` with int64: the right result.
varlen_int64_indices: the same for the varlen form's ``gather_kv_indices``.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from attention_oracle.properties.dsa import checks as base
from attention_oracle.properties.dsa.cases import DsaCase, build
from attention_oracle.properties.harness.beyond import Declined, attempt
from attention_oracle.properties.harness.capabilities import resolve


def _forward_and_gradients(target, inp, out, gold, lp, case, check) -> None:
    base.agree("out", out, gold, lp, case, target, check, gradient=False)
    got = base.grads(out, inp, inp.dout.contiguous())
    for name, g in got.items():
        base.agree(name, g, gold, lp, case, target, check, gradient=True)


def default_scale(target, case: DsaCase) -> None:
    check = "dsa.default_scale"
    explicit = dataclasses.replace(case, scale=1.0 / math.sqrt(case.qk_dim))
    implicit = dataclasses.replace(case, scale=None)
    inp = build(implicit, target.device)   # values equal explicit's (same effective scale)
    out = base.call(target, inp)
    gold, lp = base.references(build(explicit, target.device), inp.dout.contiguous())
    _forward_and_gradients(target, inp, out, gold, lp, explicit, check)


def _int64_check(target, case: DsaCase, check: str, argument: str) -> None:
    inp = build(case, target.device)
    declared = torch.int64 in resolve(target, case.function).index_dtypes
    wide = inp.indices.to(torch.int64)
    try:
        out = attempt(lambda: base.call(target, inp, indices=wide), argument=argument,
                      what=f"int64 {argument}", declared=declared, check=check,
                      impl=target.name, repro=case.repro(check, target.name))
    except Declined:
        return
    gold, lp = base.references(inp, inp.dout.contiguous())
    _forward_and_gradients(target, inp, out, gold, lp, case, check)


def int64_indices(target, case: DsaCase) -> None:
    if case.varlen:
        raise ValueError("int64_indices runs on global-index cases")
    _int64_check(target, case, "dsa.int64_indices", "indices")


def varlen_int64_indices(target, case: DsaCase) -> None:
    if not case.varlen:
        raise ValueError("varlen_int64_indices runs on varlen cases")
    _int64_check(target, case, "dsa.varlen_int64_indices", "gather_kv_indices")


CHECKS = {f.__name__: f for f in (default_scale, int64_indices, varlen_int64_indices)}
