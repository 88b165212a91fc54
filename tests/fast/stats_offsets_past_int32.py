"""Run by test_fast_sdpa_smoke.py in a subprocess (a wrapped offset can fault): fast's SDPA
forward kernel launched as ``fast.sdpa._launch_fwd`` launches it, on a small problem whose
statistics buffer has the row stride of a call with 2**30 or more query rows in all (the
stride of the rows m, log2 l, lse and, on the fp32 "accurate" path, log2 l's rounding error).
The buffer is an int8 view of a ~4.3 GB allocation of which only the touched pages are
committed: element offsets, hence their int32 wrap, are the same as for float32.

    python tests/fast/stats_offsets_past_int32.py DEVICE fp16|fp32acc ROW_STRIDE

Exit 0 when every row landed at its own offset and none at the int32-wrapped one, 1
otherwise, 3 when the machine refuses the allocation.
"""
import sys

import torch

import attention_oracle.fast.sdpa as fs

device, which, s_stat = sys.argv[1], sys.argv[2], int(sys.argv[3])
dtype = torch.float16 if which == "fp16" else torch.float32
if which == "fp32acc":
    fs.set_fp32_mode("accurate")
Z1, Z2, HQ, L, E, S = 1, 1, 2, 64, 16, 32
gen = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(Z1, Z2, HQ, n, E, generator=gen).to(device, dtype) for n in (L, S, S))
rows = Z1 * Z2 * HQ * L
natural = fs._natural(dtype, E)
n_stats = 4 if natural else 3
base = 2 ** 31  # the view starts 2 GiB into the buffer, so a wrapped row lands inside it
try:
    buf = torch.empty(base + (n_stats - 1) * s_stat + rows + 4096, dtype=torch.int8, device=device)
except (RuntimeError, MemoryError) as exc:
    print("allocation refused:", exc)
    sys.exit(3)
stats = torch.as_strided(buf, (n_stats, Z1, Z2, HQ, L), (s_stat, Z2 * HQ * L, HQ * L, L, 1), base)
SENTINEL = 0x55


def wrapped(r):
    return ((r * s_stat + 2 ** 31) % 2 ** 32) - 2 ** 31


for r in range(n_stats):
    stats[r].fill_(SENTINEL)
    if wrapped(r) != r * s_stat:
        buf[base + wrapped(r): base + wrapped(r) + rows].fill_(SENTINEL)
out = torch.empty((Z1, Z2, HQ, L, E), dtype=dtype, device=device)
kind, key, meta, sizes, grid, ints, factor, tunes = fs._fwd_plan(
    q.shape, k.shape, v.shape, dtype, None, False, natural, fs._precision(dtype, E),
    fs._fold(E ** -0.5, dtype, False), fs._section(False))
args = (q, k, v, q, out, stats, *q.stride(), *k.stride(), *v.stride(), *fs._strides5(None),
        *out.stride(), stats.stride(0), *ints, E ** -0.5 * factor, *tunes)
fs._FWD(key, grid, args, sizes, meta)
bad = []
for r in range(n_stats):
    written = int((stats[r].reshape(-1) != SENTINEL).sum())
    stray = 0
    if wrapped(r) != r * s_stat:
        stray = int((buf[base + wrapped(r): base + wrapped(r) + rows] != SENTINEL).sum())
    print(f"row {r} at {r * s_stat}: {written}/{rows} written; at the int32 wrap: {stray}")
    if written != rows or stray:
        bad.append(r)
sys.exit(1 if bad else 0)
