"""Whether the DSA agreement rule passes the oracle's own fp32 math with the score's dot summed
in other correct orders (docs/FINDINGS.md F27).

    python -m benchmarks.dsa_score_orders [--orders naive,sequential,...] [--case JSON ...]

The oracle's DSA forward (``oracle/dsa.py``) is run in float32 instead of float64 as the
implementation under test ("oracle" target, its float64 backward unchanged), with the scores'
dot q.k (latent and rope) summed in one of these orders, every other step the naive member's:

- ``naive``: the ensemble's naive member itself (a matmul; must pass);
- ``rope_first``: the rope product, then the latent one;
- ``piecesN``: N-wide pieces, each from zero, summed in fp32 (a tiled kernel's order);
- ``sequential``: one product at a time, in channel order (a scalar loop over d);
- ``reversed``: the same loop from the last channel.

Each (order, case) is judged by the suite's replay of ``dsa.varlen_agreement`` on CPU. The
default cases are the two grid cases of the CPU conformance run (``low_lse``: every score moved
down by 120, the shift carried by latent channel 0) on which fast's opt-in fp32 "bf16x6" failed.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json

import torch

import attention_oracle.oracle.dsa as oracle_dsa
from attention_oracle.cli import main as cli_main

CASES = (
    {"Dl": 16, "Dr": 8, "H": 2, "K": 16, "S": 17, "T": 5, "area": "dsa", "causal": True,
     "density": 0.0, "docs": [[2, 16], [3, 1]], "dtype": "float32", "duplicates": 1,
     "empty_rows": 0, "gap": [], "holes": "alternate", "invalid": "minus_one",
     "layout_dout": "contiguous", "layout_kv": "kv3d", "layout_q": "contiguous",
     "layout_q_rope": "contiguous", "poison_doc": -1, "q_chunk": 2, "rope": True,
     "scale": 0.204124, "score_shift": -120.0, "score_target": 0.0, "seed": 16016,
     "selection": "random", "topk": "none", "value_scale": 1.0},
    {"Dl": 16, "Dr": 8, "H": 2, "K": 33, "S": 16, "T": 5, "area": "dsa", "causal": False,
     "density": 0.0, "docs": [[2, 15], [3, 1]], "dtype": "float32", "duplicates": 0,
     "empty_rows": 2, "gap": [], "holes": "none", "invalid": "minus_one",
     "layout_dout": "transposed", "layout_kv": "contiguous", "layout_q": "contiguous",
     "layout_q_rope": "contiguous", "poison_doc": -1, "q_chunk": 2, "rope": True,
     "scale": 0.204124, "score_shift": -120.0, "score_target": 0.0, "seed": 33015,
     "selection": "random", "topk": "none", "value_scale": 1.0},
)
ORDERS = ("naive", "rope_first", "pieces8", "pieces16", "sequential", "reversed")

_ORIGINAL_SCORES = oracle_dsa._scores
_ORIGINAL_FORWARD = oracle_dsa._DSAFunction.forward
_ORDER = [None]  # the order of the implementation under test; None: the oracle unchanged
_ACTIVE = [False]  # inside that implementation's forward (the gold and the ensemble keep theirs)


def _pieces(a, b, width):
    """a . b^T over the last dim in ``width``-wide pieces, each from zero, summed in order."""
    out = None
    for d0 in range(0, a.shape[-1], width):
        p = torch.matmul(a[..., d0:d0 + width], b[..., d0:d0 + width].transpose(1, 2))
        out = p if out is None else out + p
    return out


def _loop(q, k, channels):
    """sum_e q[..., e] k[..., e] one rounded product at a time, over ``channels`` in order."""
    s = torch.zeros(q.shape[0], q.shape[1], k.shape[1], dtype=q.dtype)
    for e in channels:
        s = s + q[:, :, None, e] * k[:, None, :, e]
    return s


def _ordered_dot(order, qs, ks, qrs, krs):
    if order == "rope_first" and qrs is not None:
        return torch.matmul(qrs, krs.transpose(1, 2)) + torch.matmul(qs, ks.transpose(1, 2))
    if order.startswith("pieces"):
        width = int(order[len("pieces"):])
        s = _pieces(qs, ks, width)
        return s if qrs is None else s + _pieces(qrs, krs, width)
    q = qs if qrs is None else torch.cat([qs, qrs], -1)
    k = ks if krs is None else torch.cat([ks, krs], -1)
    if order == "sequential":
        return _loop(q, k, range(q.shape[-1]))
    if order == "reversed":
        return _loop(q, k, reversed(range(q.shape[-1])))
    raise ValueError(f"order must be one of {ORDERS}, got {order!r}")


def _scores(qs, ks, qrs, krs, valid, scale, dtype):
    order = _ORDER[0]
    if not _ACTIVE[0] or order == "naive":
        return _ORIGINAL_SCORES(qs, ks, qrs, krs, valid, scale, dtype)
    cast = (lambda x: None if x is None else x.to(dtype))
    s = _ordered_dot(order, cast(qs), cast(ks), cast(qrs), cast(krs))
    if scale != 1.0:
        s = s * scale
    return s.masked_fill_(~valid[:, None, :], float("-inf"))


def _forward_fp32(ctx, q_latent, q_rope, kv_latent, k_rope, indices, topk_length, scale,
                  chunk_bytes):
    """The oracle's autograd forward in float32 with ``_ORDER``'s scores (backward unchanged)."""
    ops = oracle_dsa._Operands(q_latent, q_rope, oracle_dsa.key_rows("kv_latent", kv_latent),
                               None if k_rope is None else oracle_dsa.key_rows("k_rope", k_rope),
                               oracle_dsa._pad_empty_index_table(indices), topk_length, scale)
    _ACTIVE[0] = True
    try:
        res = oracle_dsa._attend(ops, None, compute_dtype=torch.float32,
                                 result_dtype=q_latent.dtype, magnitudes=False,
                                 chunk_bytes=chunk_bytes)
    finally:
        _ACTIVE[0] = False
    ctx.save_for_backward(q_latent, q_rope, kv_latent, k_rope, indices, topk_length)
    ctx.scale, ctx.chunk_bytes = scale, chunk_bytes
    ctx.mark_non_differentiable(res["lse"])
    return res["out"], res["lse"]


def _forward(ctx, *args):
    if _ORDER[0] is None:
        return _ORIGINAL_FORWARD(ctx, *args)
    return _forward_fp32(ctx, *args)


def judge(order, case):
    """The replay's verdict line on ``case`` with the implementation in ``order``."""
    oracle_dsa._scores = _scores
    oracle_dsa._DSAFunction.forward = staticmethod(_forward)
    _ORDER[0] = order
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            cli_main(["replay", "--impl", "oracle", "--check", "dsa.varlen_agreement",
                      json.dumps(case)])
    finally:
        _ORDER[0] = None
        oracle_dsa._scores = _ORIGINAL_SCORES
        oracle_dsa._DSAFunction.forward = staticmethod(_ORIGINAL_FORWARD)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip() and not ln.startswith("  ")]
    return " ".join(lines[:2])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orders", default=",".join(ORDERS))
    ap.add_argument("--case", action="append", help="a case's JSON (repeatable); default: F27's")
    args = ap.parse_args(argv)
    cases = [json.loads(c) for c in args.case] if args.case else list(CASES)
    for order in args.orders.split(","):
        for i, case in enumerate(cases):
            print(f"{order:11s} case {i} (seed {case.get('seed')}): {judge(order, case)}",
                  flush=True)


if __name__ == "__main__":
    main()
