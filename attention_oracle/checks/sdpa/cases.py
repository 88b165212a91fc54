"""SDPA cases: what Hypothesis draws (structure and a seed) and how tensors are built from it.

Values come from a seeded ``torch.Generator`` (Hypothesis' own array strategies give
mostly-constant tensors, useless for attention).

Masks (``mask`` is ``<kind>_<shape>``; shapes: ``full`` [*batch, Hq, L, S], ``bcast`` [L, S],
``heads`` [*batch, 1, L, S] (one mask for every head), ``keys`` [*batch, 1, 1, S] (a key-padding
mask, Hugging Face's: each sequence keeps a prefix of its keys, at least one key off where S >
1; padding-like kinds only, no empty rows), ``expanded`` (``heads`` expanded to [*batch, Hq, L,
S] by stride 0: PyTorch's own broadcast view):
- ``bool``: True = take part; ``float``: randn where kept, -inf where masked;
- ``finfo_min``: Hugging Face padding: 0 where kept, ``torch.finfo(dtype).min`` where masked
  (-65504 in fp16); ``neg1e4``: -1e4 where masked (randn where kept);
- ``mixed_inf``: randn where kept, masked keys -inf, finfo.min or -1e4 at random;
- ``row_bias``: randn - B on half of the rows (B in 100..140, so their lse is below -100 and
  exp of their scores underflows fp32), -inf where masked;
- ``alibi``: ALiBi, ``-slope_h * |i - j|`` with slopes ``2^(-8 (h+1) / H)`` (no -inf).
``empty_rows`` rows take no key: False / -inf, except for ``finfo_min`` and ``neg1e4``, whose
"empty" rows hold only the finite minimum: NOT masked in PyTorch's semantics (out is that
row's softmax, uniform where the minimum absorbs the scores).

Value regimes: ``value_scale`` spreads q (30 makes rows nearly one-hot); ``score_target`` > 0
rescales q so that the largest |scale * q.k| is that value (1e4: near fp16's range; the
inputs and the unscaled q.k stay representable, the scale is then >= 0.5).

Sizes follow the target's capabilities (``size``): interpreted kernels get small problems;
native ones also draw lengths at tile edges (63/64/65 .. 255/256/257) on the CPU profiles, and
up to 1025 on the ``gpu`` profile.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from attention_oracle.judge import profiles, registry
from attention_oracle.judge.capabilities import SDPA_FN, Capabilities, resolve
from attention_oracle.judge.case import CaseMixin, dtype_name
from attention_oracle.judge.layouts import fresh, lay_out

MASK_KINDS = ("bool", "float", "finfo_min", "neg1e4", "mixed_inf", "row_bias", "alibi")
MASK_SHAPES = ("full", "bcast", "heads", "keys", "expanded")
# kinds a key-padding mask ([*batch, 1, 1, S]) takes: the same keys for every query row
KEY_KINDS = ("bool", "float", "finfo_min", "neg1e4", "mixed_inf")
MASKS = ("none",) + tuple(f"{k}_{s}" for k in MASK_KINDS for s in MASK_SHAPES
                          if s != "keys" or k in KEY_KINDS)
# kinds whose empty rows are really empty (no key takes part): what fully_masked_rows draws
EMPTYING_KINDS = ("bool", "float", "mixed_inf", "row_bias")
HEAD_DIMS = (1, 3, 8, 16, 24, 40, 64, 72, 96, 128, 200, 256)
VALUE_SCALES = (0.3, 1.0, 3.0, 30.0)
LARGE_SCORE = 1e4
ROW_BIAS = (100.0, 140.0)
TILE_EDGES = {"small": (15, 16, 17, 31, 32, 33),
              "native": (63, 64, 65, 127, 128, 129, 255, 256, 257),
              "large": (63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1023, 1024, 1025)}


@dataclass(frozen=True)
class SdpaCase(CaseMixin):
    AREA = "sdpa"
    function = "scaled_dot_product_attention"  # the public function its checks call
    batch: tuple = ()          # dims before the head dim; () means rank 3 ([N, L, E])
    hq: int = 1
    hkv: int = 1
    L: int = 1
    S: int = 1
    E: int = 8
    Ev: int = 8
    dtype: str = "float32"
    causal: bool = False
    mask: str = "none"
    empty_rows: int = 0         # query rows whose mask takes no key at all
    scale: float | None = None
    gqa: bool = False
    layout_q: str = "contiguous"
    layout_k: str = "contiguous"
    layout_v: str = "contiguous"
    layout_dout: str = "contiguous"
    value_scale: float = 1.0    # spread of q (sharpens the softmax)
    score_target: float = 0.0   # > 0: q rescaled so that max|scale * q.k| is this
    seed: int = 0

    @property
    def rank(self) -> int:
        return len(self.batch) + 3

    def kwargs(self) -> dict:
        return {"is_causal": self.causal, "scale": self.scale, "enable_gqa": self.gqa}

    @property
    def mask_kind(self) -> str:
        return self.mask.rsplit("_", 1)[0] if self.mask != "none" else "none"

    @property
    def mask_shape(self) -> str:
        return self.mask.rsplit("_", 1)[1] if self.mask != "none" else "none"

    @property
    def effective_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.E)


@dataclass
class SdpaInputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    attn_mask: torch.Tensor | None
    dout: torch.Tensor      # in its drawn layout
    kwargs: dict


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _finite_min(case: SdpaCase) -> float:
    return float(torch.finfo(case.torch_dtype).min)


def _alibi(case: SdpaCase, shape) -> torch.Tensor:
    """``-slope_h * |i - j|`` broadcast to ``shape`` (one slope where the mask has no head dim
    or a head dim of 1)."""
    heads = shape[-3] if len(shape) > 2 else 1
    slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1, dtype=torch.float64) / heads)
    dist = (torch.arange(case.L)[:, None] - torch.arange(case.S)[None, :]).abs().double()
    bias = -(slopes[:, None, None] * dist)
    return (bias if len(shape) > 2 else bias[0]).expand(shape).float()


def mask_shape(case: SdpaCase) -> tuple:
    """The shape of the case's mask as drawn (``expanded`` is ``heads`` before its expand)."""
    lead = tuple(case.batch)
    return {"full": lead + (case.hq, case.L, case.S), "bcast": (case.L, case.S),
            "heads": lead + (1, case.L, case.S), "expanded": lead + (1, case.L, case.S),
            "keys": lead + (1, 1, case.S)}[case.mask_shape]


def _mask(case: SdpaCase, g: torch.Generator) -> torch.Tensor | None:
    if case.mask == "none":
        return None
    kind = case.mask_kind
    shape = mask_shape(case)
    keep = torch.rand(shape, generator=g) < 0.75
    if case.mask_shape == "keys":  # padding: each sequence keeps a prefix, at least one key off
        lengths = torch.randint(1, max(1, case.S - 1) + 1, shape[:-1] + (1,), generator=g)
        keep = torch.arange(case.S) < lengths
    emptied = case.empty_rows and shape[-2] == case.L  # a key-padding mask has no rows
    if emptied:
        rows = torch.randperm(case.L, generator=g)[: case.empty_rows]
        keep[..., rows, :] = False
    if kind == "bool":
        return keep
    add = torch.randn(shape, generator=g)
    if kind == "alibi":
        return _alibi(case, shape)
    if kind == "finfo_min":
        return torch.where(keep, torch.zeros_like(add), torch.full_like(add, _finite_min(case)))
    if kind == "neg1e4":
        return torch.where(keep, add, torch.full_like(add, -1e4))
    if kind == "mixed_inf":
        fills = torch.tensor([float("-inf"), _finite_min(case), -1e4])
        which = torch.randint(0, 3, shape, generator=g)
        if emptied:  # empty rows really empty: -inf only
            which[..., rows, :] = 0
        return torch.where(keep, add, fills[which])
    if kind == "row_bias":
        biased = torch.rand(shape[:-1] + (1,), generator=g) < 0.5
        lo, hi = ROW_BIAS
        bias = lo + (hi - lo) * torch.rand(shape[:-1] + (1,), generator=g)
        add = add - torch.where(biased, bias, torch.zeros_like(bias))
    return torch.where(keep, add, torch.full_like(add, float("-inf")))


def _rescale_to_target(q: torch.Tensor, k: torch.Tensor, case: SdpaCase):
    """(q, k) with the largest |scale * q.k| (any head pairing) equal to ``case.score_target``:
    q scaled alone, or, where that would take q past 1/16 of the dtype's largest value (fp16,
    few channels, a small scale: q overflowed to inf), q and k each by the square root."""
    kk = k.repeat_interleave(case.hq // case.hkv, dim=-3) if case.hq != case.hkv else k
    s = torch.matmul(q.double(), kk.double().transpose(-1, -2)) * case.effective_scale
    peak = float(s.abs().max()) if s.numel() else 0.0
    if peak == 0.0:
        return q, k
    factor = case.score_target / peak
    if float(q.abs().max()) * factor <= torch.finfo(case.torch_dtype).max / 16:
        return q * factor, k
    root = math.sqrt(factor)
    return q * root, k * root


def build(case: SdpaCase, device: torch.device, requires_grad: bool = True) -> SdpaInputs:
    """Tensors of the case on ``device``, in their layouts (q, k, v are leaves)."""
    g = _gen(case.seed)
    dt = case.torch_dtype
    lead = tuple(case.batch)
    q = torch.randn(lead + (case.hq, case.L, case.E), generator=g) * case.value_scale
    k = torch.randn(lead + (case.hkv, case.S, case.E), generator=g)
    if case.score_target > 0:
        q, k = _rescale_to_target(q, k, case)
    v = torch.randn(lead + (case.hkv, case.S, case.Ev), generator=g)
    dout = torch.randn(lead + (case.hq, case.L, case.Ev), generator=g)
    mask = _mask(case, g)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(dt)
    if mask is not None:
        mask = mask.to(device)
        if case.mask_shape == "expanded":  # after the copies: .to() would materialise it
            mask = mask.expand(tuple(case.batch) + (case.hq, case.L, case.S))
    to = dict(device=device, dtype=dt)
    return SdpaInputs(
        q=fresh(q.to(**to), case.layout_q, requires_grad=requires_grad),
        k=fresh(k.to(**to), case.layout_k, requires_grad=requires_grad),
        v=fresh(v.to(**to), case.layout_v, requires_grad=requires_grad),
        attn_mask=mask,
        dout=lay_out(dout.to(**to), case.layout_dout),
        kwargs=case.kwargs(),
    )


# ----------------------------------------------------------------------------- strategies


def _limits(caps: Capabilities) -> dict:
    if profiles.size() == "large":
        return {"max_len": 300, "max_heads": 8, "max_batch": 3, "dims": HEAD_DIMS,
                "edges": TILE_EDGES["large"]}
    edges = TILE_EDGES["small" if caps.interpreted else "native"]
    return {"max_len": 40, "max_heads": 4, "max_batch": 2, "dims": HEAD_DIMS, "edges": edges}


def _length(draw, lim) -> int:
    """1, a short length, or (a quarter of the draws) a length at a tile edge."""
    return draw(st.one_of(st.just(1), st.integers(1, lim["max_len"]), st.integers(1, lim["max_len"]),
                          st.sampled_from(lim["edges"])))


def _dims(caps: Capabilities, lim) -> tuple:
    dims = tuple(d for d in lim["dims"] if caps.head_dim_ok(d))
    if not dims and caps.head_dims:
        dims = tuple(d for d in caps.head_dims if caps.head_dim_ok(d))
    return dims


def _mask_choices(caps: Capabilities, causal: bool, empty_rows) -> tuple:
    if causal:
        return ("none",) if "none" in caps.masks else ()
    kinds = EMPTYING_KINDS if empty_rows else MASK_KINDS
    masks = tuple(m for m in MASKS[1:] if m.rsplit("_", 1)[0] in kinds
                  and not (empty_rows and m.endswith("_keys"))
                  and ("bool" if m.startswith("bool") else "float") in caps.masks)
    if not empty_rows and "none" in caps.masks:
        masks = ("none",) + masks
    return masks


def _shrunk_for_long_rows(caps: Capabilities, batch, hq, hkv, E, Ev):
    """Long rows (L * S > 4096): one batch entry, one kv head (two with GQA) and at most 64 channels where
    declared, so that the float64 oracle and the lp runs stay quick on a CPU."""
    group = hq // hkv
    kv = 2 if hkv > 1 and group > 1 else 1  # two kv heads keep a GQA head mapping visible
    if caps.heads_ok(kv * group):
        hq, hkv = kv * group, kv
    cap = lambda d: 64 if d > 64 and caps.head_dim_ok(64) else d  # noqa: E731
    return tuple(1 for _ in batch), hq, hkv, cap(E), cap(Ev)


# what a check can require of the declared capabilities (``registry.declare(..., requires=...)``):
# {requirement: caps -> why it is not met ('' if it is)}
REQUIREMENTS = {
    "ranks_3_and_4": lambda caps: "" if {3, 4} <= set(caps.ranks) else "needs ranks 3 and 4",
    "masks": lambda caps: ("" if caps.causal != "only" and _mask_choices(caps, False, True)
                           else "needs masks"),
    "misaligned": lambda caps: "" if "misaligned" in caps.layouts else "misaligned inputs not declared",
    "deterministic": lambda caps: ("" if caps.deterministic or caps.deterministic_on_request
                                   else "determinism not declared"),
    "gradients": lambda caps: "" if caps.gradients else "gradients not declared (forward only)",
}


def unsupported(check: str, target_or_caps, requires: tuple | None = None) -> str:
    """Why ``check`` cannot run on what the target declares ('' if it can); ``requires``: the
    check's declared requirements (``REQUIREMENTS``; looked up by name when not given)."""
    caps = resolve(target_or_caps, SDPA_FN)
    if not caps.dtypes:
        return "no dtype declared"
    if not _dims(caps, _limits(caps)):
        return "no head dim declared"
    for need in _requires("sdpa", check) if requires is None else requires:
        why = REQUIREMENTS[need](caps)
        if why:
            return why
    if caps.causal == "only" and "none" not in caps.masks:
        return "causal only, without unmasked calls"
    if caps.causal == "never" and not _mask_choices(caps, False, False):
        return "no mask family declared"
    return ""


@st.composite
def sdpa_cases(draw, dtypes_or_caps, *, rank=None, empty_rows=None, layouts=True, dout_layouts=None):
    """Draw an SdpaCase within what the target declares. ``dtypes_or_caps``: a Target, a
    Capabilities, or a tuple of dtypes; ``rank``: force 3 or 4; ``empty_rows``: force (True)
    or forbid (False) fully masked query rows."""
    caps = resolve(dtypes_or_caps, SDPA_FN)
    lim = _limits(caps)
    ranks = tuple(r for r in (3, 4, 4, 4, 5) if r in caps.ranks)
    r = rank or draw(st.sampled_from(ranks))
    batch = tuple(draw(st.integers(1, lim["max_batch"])) for _ in range(r - 3))
    gqa = caps.gqa and draw(st.booleans())
    heads = tuple(h for h in range(1, 9) if caps.heads_ok(h)) or tuple(caps.heads)
    if gqa:
        # a head mapping is only visible with two or more kv heads and groups of two or more
        hkv = draw(st.sampled_from(tuple(range(2, lim["max_heads"] + 1)) * 3 + (1,)))
        groups = [n for n in range(1, max(1, 8 // hkv) + 1) if caps.heads_ok(hkv * n)]
        if groups:
            hq = hkv * draw(st.sampled_from([n for n in groups if n > 1] * 2 + groups))
        else:
            gqa, hkv = False, draw(st.sampled_from(heads))
            hq = hkv
    else:
        hkv = hq = draw(st.sampled_from(tuple(h for h in heads if h <= lim["max_heads"]) or heads))
    L, S = _length(draw, lim), _length(draw, lim)
    if caps.l_le_s and L > S:
        L, S = S, L
    dims = _dims(caps, lim)
    E = draw(st.sampled_from(dims))
    Ev = E if caps.same_head_dims else draw(st.one_of(st.just(E), st.sampled_from(dims)))
    if L * S > 64 * 64:
        batch, hq, hkv, E, Ev = _shrunk_for_long_rows(caps, batch, hq, hkv, E, Ev)
    if empty_rows:
        causal = False
    elif caps.causal == "allowed":
        # is_causal takes no mask: a declaration without "none" among its masks has no causal case
        causal = draw(st.booleans()) if _mask_choices(caps, True, empty_rows) else False
    else:
        causal = caps.causal == "only"
    if causal and caps.causal_square:
        S = L
    mask = draw(st.sampled_from(_mask_choices(caps, causal, empty_rows)))
    n_empty = 0
    if (mask != "none" and empty_rows is not False and not mask.startswith("alibi")
            and not mask.endswith("_keys")):
        # padding kinds exist for their all-minimum rows: always draw some
        padding = mask.startswith(("finfo_min", "neg1e4"))
        n_empty = draw(st.integers(1 if (empty_rows or padding) else 0, max(1, L // 2)))
    n_empty = min(n_empty, L)
    score_target = draw(st.sampled_from((0.0,) * 7 + (LARGE_SCORE,)))
    if score_target:
        scale = draw(st.floats(0.5, 2.0).map(lambda x: round(x, 4)))
    else:
        scale = draw(st.one_of(st.none(), st.floats(0.05, 2.0).map(lambda x: round(x, 4))))
    allowed = tuple(lay for lay in ("contiguous", "transposed", "sliced") if lay in caps.layouts)
    layout = st.sampled_from(allowed) if layouts and allowed else st.just("contiguous")
    dout_layout = st.sampled_from(dout_layouts or ("contiguous", "transposed", "sliced", "broadcast"))
    return SdpaCase(
        batch=batch, hq=hq, hkv=hkv, L=L, S=S, E=E, Ev=Ev,
        dtype=dtype_name(draw(st.sampled_from(tuple(caps.dtypes)))),
        causal=causal, mask=mask, empty_rows=n_empty, scale=scale, gqa=gqa,
        layout_q=draw(layout), layout_k=draw(layout), layout_v=draw(layout),
        layout_dout=draw(dout_layout),
        value_scale=draw(st.sampled_from(VALUE_SCALES)),
        score_target=score_target,
        seed=draw(st.integers(0, 2 ** 31 - 1)),
    )


# ----------------------------------------------------------------------------- the area (judge/registry.py)

VARIANTS = {"": {}}


def strategy(target_or_caps, params: dict):
    """SDPA cases with a check's declared parameters (``sdpa_cases``' keywords)."""
    return sdpa_cases(resolve(target_or_caps, SDPA_FN), **params)


def function_for(params: dict) -> str:
    return SdpaCase.function


def unsupported_for(check, target_or_caps, params: dict) -> str:
    return unsupported(check.name, target_or_caps, check.requires)


def _requires(area: str, check: str) -> tuple:
    declared = registry.declared(area).get(check)
    return declared.requires if declared is not None else ()


def strategy_for(check: str, target_or_caps):
    """The cases the SDPA check ``check`` declares (``judge.registry``), drawn
    within the target's capabilities (a Target, a Capabilities, or a tuple of dtypes)."""
    return registry.declared("sdpa")[check].strategy(target_or_caps)


AREA = registry.register(registry.Area("sdpa", sys.modules[__name__], SdpaCase))
