"""The SDPA covering grid: the dimensions of a check's cases, their constraints within the
target's declaration, and how a row becomes an :class:`SdpaCase` (``run/grid.py`` makes the
t-wise array).

Dimensions:
- ``shape``: (L, S) pairs that run through every length class (``profiles.grid_lengths``: tile
  edges 1, 63/64/65 ... 255/256/257, and 1023-1025, 4095-4097 on a GPU) once as L and once as
  S, square and rectangular (L < S and L > S);
- ``mask``: ``none``, ``causal`` (square or rectangular, from the shape), ``bool``, ``float``
  (randn, -inf where masked), ``alibi``, ``row_bias`` (half the rows biased down by 100..140:
  their lse is below float32's exp range), ``finfo_min`` (Hugging Face padding);
  ``mask_shape``: ``full`` (per batch and head), ``bcast`` ([L, S]), ``heads`` ([*batch, 1, L,
  S]), ``keys`` ([*batch, 1, 1, S], key padding: bool, float and finfo_min masks, no empty
  rows) or ``expanded`` (``heads`` expanded over the heads by stride 0);
- ``regime``: ``plain``, ``sharp`` (q spread 30: nearly one-hot rows), ``saturating`` (largest
  |score| 1e4);
- ``dtype``, ``E`` (with ``Ev``: the same or another head dim), ``group`` (GQA group size 1, 2,
  4, 8 over two kv heads), ``layout`` (q, k, v), ``rank`` (3, 4, 5), ``scale`` (default or
  explicit), ``dout`` (its layout).

A check's declared case parameters narrow the dimensions (``rank=3``, ``empty_rows=True``: masks
whose empty rows really take no key, ``layouts=False``, ``dout_layouts``). Interpreted kernels
(Triton's CPU interpreter) get fewer values: three shapes at the small tile edges (1, 15, 16,
17, 33), four masks, three mask shapes, two head dims, two group sizes, two dout layouts
(about 17 rows). Long rows with many
heads and wide heads are left out (``MAX_ROWS_X_HEADS``, ``MAX_ROWS_X_DIM``), so the grid of a check stays at a few seconds
on a CPU.
"""
from __future__ import annotations

import math

from attention_oracle.checks.sdpa.cases import AREA, SdpaCase
from attention_oracle.judge import profiles
from attention_oracle.judge.capabilities import SDPA_FN, resolve
from attention_oracle.judge.case import dtype_name
from attention_oracle.judge.registry import Grid

MASKS = ("none", "causal", "bool", "float", "alibi", "row_bias", "finfo_min")
# interpreted kernels (Triton's CPU interpreter: ~0.3 s a case) get a grid of about 12 rows
SMALL_MASKS = ("none", "causal", "bool", "row_bias")
SMALL_SHAPES = ((1, 17), (16, 16), (33, 15))
SMALL_DOUTS = ("contiguous", "transposed")
MASK_SHAPES = ("full", "bcast", "heads", "keys", "expanded")
SMALL_MASK_SHAPES = ("full", "bcast", "keys")
KEY_MASKS = ("bool", "float", "finfo_min")  # the grid's masks a key-padding shape takes
EMPTYING = ("bool", "float", "row_bias")   # masks whose empty rows take no key at all
REGIMES = {"plain": (1.0, 0.0), "sharp": (30.0, 0.0), "saturating": (1.0, 1e4)}  # value_scale, score
HEAD_DIMS = {"native": (8, 40, 64, 128, 256), "interpreted": (16, 64)}
GROUPS = {"native": (1, 2, 4, 8), "interpreted": (1, 2)}
BATCH = {3: (), 4: (2,), 5: (1, 2)}
EXPLICIT_SCALE = 0.75
# what a row may cost, as limits on pairs of dimensions (constraints of at most three dimensions
# prune the array as it is built; one over many dimensions does not, and covertable then needs
# hundreds of rows): L * S * Hq and L * S * max(E, Ev) for the float64 oracle and its lp runs;
# batch * Hq, the programs per query tile, for interpreted kernels
MAX_ROWS_X_HEADS = 257 * 257 * 4
MAX_ROWS_X_DIM = 257 * 257 * 128
MAX_PROGRAMS_INTERPRETED = 4


def _shapes(lengths: tuple) -> tuple:
    """(L, S) pairs: L runs through the classes, S through a permutation of them (i*7 mod n for
    12 classes: squares at even i, both kinds of rectangle at odd i); small sets add squares."""
    n = len(lengths)
    step = next((m for m in (7, 5, 3, 2) if m < n and math.gcd(m, n) == 1), 1)
    pairs = [(lengths[i], lengths[(i * step) % n]) for i in range(n)]
    if sum(L == S for L, S in pairs) < 3:
        pairs += [(L, L) for L in lengths[1:: max(1, n // 2)] if (L, L) not in pairs]
    return tuple(pairs)


def _heads(caps, group: int):
    """(Hq, Hkv) of a group size within the declaration: two kv heads where allowed."""
    for hkv in (2, 1):
        if caps.heads_ok(hkv * group):
            return hkv * group, hkv
    return None


def _factors(caps, params: dict) -> dict:
    size = "interpreted" if caps.interpreted else "native"
    small = caps.interpreted
    masks = [m for m in (SMALL_MASKS if small else MASKS) if _mask_ok(caps, m)]
    if params.get("empty_rows"):
        masks = [m for m in masks if m in EMPTYING]
    dims = tuple(d for d in HEAD_DIMS[size] if caps.head_dim_ok(d)) or tuple(
        d for d in (caps.head_dims or ()) if caps.head_dim_ok(d))
    layouts = [lay for lay in ("contiguous", "transposed", "sliced") if lay in caps.layouts]
    ranks = [params["rank"]] if params.get("rank") else [r for r in (3, 4, 5) if r in caps.ranks]
    return {
        "shape": SMALL_SHAPES if small else _shapes(profiles.grid_lengths(False)),
        "mask": tuple(masks),
        "regime": tuple(REGIMES),
        "dtype": tuple(dtype_name(d) for d in caps.dtypes),
        "E": dims,
        "Ev": ("same",) if caps.same_head_dims else ("same", "other"),
        "group": tuple(g for g in GROUPS[size] if (g == 1 or caps.gqa) and _heads(caps, g)),
        "layout": tuple(layouts if params.get("layouts", True) and layouts else ["contiguous"]),
        "rank": tuple(ranks),
        "mask_shape": tuple(m for m in (SMALL_MASK_SHAPES if small else MASK_SHAPES)
                            if not (m == "keys" and params.get("empty_rows"))),
        "scale": ("default", "explicit"),
        "dout": tuple(params.get("dout_layouts")
                      or (SMALL_DOUTS if small else ("contiguous", "transposed", "sliced", "broadcast"))),
    }


def _mask_ok(caps, mask: str) -> bool:
    if mask == "causal":
        return caps.causal != "never" and "none" in caps.masks
    if caps.causal == "only":
        return False
    family = {"none": "none", "bool": "bool"}.get(mask, "float")
    return family in caps.masks


def _ev(dims: tuple, E: int, choice: str) -> int:
    if choice == "same" or len(dims) < 2:
        return E
    return dims[(dims.index(E) + 1) % len(dims)]


def _constraints(caps, dims: tuple) -> tuple:
    def shape_ok(row):
        L, S = row["shape"]
        return not (caps.l_le_s and L > S)

    def causal_ok(row):
        L, S = row["shape"]
        return not (row["mask"] == "causal" and caps.causal_square and L != S)

    def few_heads(row):
        L, S = row["shape"]
        return L * S * _heads(caps, row["group"])[0] <= MAX_ROWS_X_HEADS

    def narrow(row):
        L, S = row["shape"]
        return L * S * max(row["E"], _ev(dims, row["E"], row["Ev"])) <= MAX_ROWS_X_DIM

    def few_programs(row):
        batch = math.prod(BATCH[row["rank"]])
        return not caps.interpreted or batch * _heads(caps, row["group"])[0] <= MAX_PROGRAMS_INTERPRETED

    def keys_ok(row):  # a key-padding mask: one of the padding-like kinds (or no mask)
        return row["mask_shape"] != "keys" or row["mask"] in KEY_MASKS + ("none", "causal")

    return ((("shape",), shape_ok), (("shape", "mask"), causal_ok),
            (("mask", "mask_shape"), keys_ok),
            (("shape", "group"), few_heads), (("shape", "E", "Ev"), narrow),
            (("group", "rank"), few_programs),
            (("regime", "scale"), lambda r: not (r["regime"] == "saturating" and r["scale"] == "default")))


def _build(dims: tuple, caps, params: dict):
    def build(row: dict) -> SdpaCase:
        L, S = row["shape"]
        hq, hkv = _heads(caps, row["group"])
        mask = row["mask"]
        value_scale, score = REGIMES[row["regime"]]
        empty = 0
        if params.get("empty_rows"):
            empty = max(1, L // 4)
        elif mask == "finfo_min" and row["mask_shape"] != "keys":  # padding rows: every key at
            empty = max(1, L // 8)                                      # the finite minimum
        return SdpaCase(
            batch=BATCH[row["rank"]], hq=hq, hkv=hkv, L=L, S=S, E=row["E"],
            Ev=_ev(dims, row["E"], row["Ev"]), dtype=row["dtype"], causal=mask == "causal",
            mask="none" if mask in ("none", "causal") else f"{mask}_{row['mask_shape']}",
            empty_rows=empty, scale=EXPLICIT_SCALE if row["scale"] == "explicit" else None,
            gqa=row["group"] > 1, layout_q=row["layout"], layout_k=row["layout"],
            layout_v=row["layout"], layout_dout=row["dout"], value_scale=value_scale,
            score_target=score, seed=L * 1000 + S)
    return build


def grid(check, target_or_caps, params: dict) -> Grid:
    """The covering grid of SDPA ``check`` (case parameters ``params``) within what
    ``target_or_caps`` declares."""
    caps = resolve(target_or_caps, SDPA_FN)
    factors = _factors(caps, params)
    return Grid(factors, _constraints(caps, factors["E"]), _build(factors["E"], caps, params))


AREA.grid = grid
