"""Index-preparation checks beyond the contract (registered into ``properties.index.checks.CHECKS``).

int64_indices: ``offset_gather_kv_indices`` on int64 ``gather_kv_indices`` (the contract's
    are int32): the oracle's int32 rows and lengths exactly, or a clear TypeError/ValueError/
    NotImplementedError naming ``gather_kv_indices`` (``properties/harness/beyond.py``);
    an implementation declaring int64 in ``index_dtypes`` must give the right rows.
"""
from __future__ import annotations

import torch

from attention_oracle.oracle.index import offset_gather_kv_indices as oracle_offset
from attention_oracle.properties.harness.agreement import assert_exact
from attention_oracle.properties.harness.beyond import Declined, attempt
from attention_oracle.properties.harness.capabilities import resolve
from attention_oracle.properties.index import checks as base
from attention_oracle.properties.index.cases import IndexCase, build_index

ARGUMENT = "gather_kv_indices"


def int64_indices(target, case: IndexCase) -> None:
    check = "index.int64_indices"
    repro = case.repro(check, target.name)
    inp = build_index(case, target.device)
    wide = inp.gather_kv_indices.to(torch.int64)
    declared = torch.int64 in resolve(target, case.function).index_dtypes
    expected = oracle_offset(inp.gather_kv_indices, inp.cu_seqlens_q, inp.cu_seqlens_k,
                             causal=case.causal, return_topk_length=True, compact=case.compact,
                             topk_length=inp.topk_length)
    try:
        result = attempt(lambda: base._call(target, inp, case, indices=wide, return_topk_length=True),
                         argument=ARGUMENT, what=f"int64 {ARGUMENT}", declared=declared,
                         check=check, impl=target.name, repro=repro)
    except Declined:
        return
    rows, lengths = base._split(result, True, check, target, case)
    assert_exact(rows, expected[0], check=check, impl=target.name, name="rows",
                 what="global rows from int64 indices", repro=repro)
    assert_exact(lengths, expected[1], check=check, impl=target.name, name="lengths",
                 what="lengths from int64 indices", repro=repro)


CHECKS = {f.__name__: f for f in (int64_indices,)}
