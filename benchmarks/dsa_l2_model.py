"""A model of the L2 under the DSA kernels' gathers: which slot orders keep packed_glm_a's
key rows in the L2 (docs/FINDINGS.md F96), without a GPU.

    python -m benchmarks.dsa_l2_model [--capacity 20000,43000] [--orders given,network_132,...]

C programs resident at once (one a multiprocessor), each a token walking its row's slots in
order, BLOCK slots a step, all at one speed; a token starts where a program ends. The cache
is LRU over key rows (a row is 1152 bytes at 512 + 64 bf16; 43k rows are the H100's 50 MB, 20k
the fraction of it that reproduces the hit rate measured as given). Rows as ``benchmarks.dsa``
makes them: distinct random keys of the causal prefix, in random order (torch.topk over random
scores), compacted. Orders (``_N``: the pivot's C):

* ``given``; ``ascending`` (sorted, no pivot);
* ``network_N``: fast's "network" and "loop" forms, the row sorted from the pivot key;
* ``runsR_N``: fast's "runs" form with samples of R keys (64 in fast): slot s in sample
  s mod (K / R), each sample sorted from the pivot, written rank by rank.

The model ignores the L2's hashing and halves, the kernels' varying speeds and the backward's
atomics: it ranks orders, it does not predict TFLOP/s. Measured on an H100 (F96): as given 52%
hits; sorted without the pivot no faster; the pivot at C = 132 the fast one, 66 and 264 lose
most of it. The model at 20k rows: 0.54, 0.55, 0.84, 0.56 and 0.73, the same ranking; at 43k
rows it ranks C = 264 first (0.91 against 0.84), against the measurement, so 20k is the
capacity it is read at (docs/FINDINGS.md F97).
"""
import argparse
import time
from collections import OrderedDict

import numpy as np

from .dsa import PACKED_GLM_A, TOPK

_NONE = np.iinfo(np.int64).max
_WRAP = 1 << 30


def given_rows(seed=0):
    """packed_glm_a's rows, one int64 array of valid keys a token, in top-k order."""
    rng = np.random.default_rng(seed)
    cu_q, cu_k = PACKED_GLM_A
    rows = []
    for d in range(len(cu_q) - 1):
        sq, sk = cu_q[d + 1] - cu_q[d], cu_k[d + 1] - cu_k[d]
        for i in range(sq):
            pos = sk - sq + i
            rows.append(rng.choice(pos + 1, size=min(TOPK, pos + 1), replace=False) + cu_k[d])
    return rows


def relative(keys, t, concurrency):
    """(key - pivot) mod 2**30, the pivot at (t mod C) / C of the row's key range."""
    lo, hi = int(keys.min()), int(keys.max())
    pivot = lo + (hi - lo + 1) * (t % concurrency) // concurrency
    return (keys - pivot) % _WRAP


def network(rows, concurrency):
    return [keys[np.argsort(relative(keys, t, concurrency), kind="stable")]
            for t, keys in enumerate(rows)]


def runs(rows, concurrency, run_keys, k=TOPK):
    """Each sample of run_keys slots (slot s in sample s mod samples, rows of k slots) sorted
    from the pivot, written rank by rank; valid keys first (the rows are compacted)."""
    out = []
    samples = max(1, k // run_keys)
    for t, keys in enumerate(rows):
        perm = np.argsort(relative(keys, t, concurrency), kind="stable")
        order = np.full(k, _NONE)
        order[perm] = np.arange(len(keys))  # each slot's rank from the pivot
        ranked = np.sort(order.reshape(-1, samples), axis=0).reshape(-1)
        out.append(keys[perm][ranked[ranked != _NONE]])
    return out


def hit_rate(rows, concurrency=132, capacity=20000, block=64):
    """The fraction of row gathers the LRU cache holds, C programs walking their rows."""
    cache = OrderedDict()
    hits = total = 0
    active, nxt = [], 0
    while nxt < len(rows) and len(active) < concurrency:
        active.append([nxt, 0])
        nxt += 1
    while active:
        still = []
        for a in active:
            t, p = a
            for key in rows[t][p:p + block].tolist():
                total += 1
                if key in cache:
                    hits += 1
                    cache.move_to_end(key)
                else:
                    cache[key] = None
                    if len(cache) > capacity:
                        cache.popitem(last=False)
            a[1] = p + block
            if a[1] < len(rows[t]):
                still.append(a)
            elif nxt < len(rows):
                still.append([nxt, 0])
                nxt += 1
        active = still
    return hits / total


def ordered(name, rows):
    if name == "given":
        return rows
    if name == "ascending":
        return [np.sort(k) for k in rows]
    kind, c = name.rsplit("_", 1)
    if kind == "network":
        return network(rows, int(c))
    if kind.startswith("runs"):
        return runs(rows, int(c), int(kind[4:]))
    raise SystemExit(f"unknown order {name!r}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capacity", default="20000", help="cache rows (comma-separated)")
    ap.add_argument("--orders", default="given,ascending,network_132,network_66,network_264,"
                    "runs16_132,runs32_132,runs64_132,runs64_66,runs64_264")
    args = ap.parse_args(argv)
    rows = given_rows()
    for name in args.orders.split(","):
        r = ordered(name, rows)
        assert all(np.array_equal(np.sort(a), np.sort(b)) for a, b in zip(r, rows)), name
        for cap in (int(c) for c in args.capacity.split(",")):
            t0 = time.time()
            print(f"{name:>12}, {cap} rows: hit rate {hit_rate(r, capacity=cap):.3f} "
                  f"({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
