"""SDPA cases: what Hypothesis draws (structure and a seed) and how tensors are built from it.

Values come from a seeded ``torch.Generator`` (Hypothesis' own array strategies give
mostly-constant tensors, useless for attention).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from attention_oracle.properties.harness import profiles
from attention_oracle.properties.harness.case import CaseMixin, dtype_name
from attention_oracle.properties.harness.layouts import fresh, lay_out

MASKS = ("none", "bool_full", "bool_bcast", "float_full", "float_bcast")
HEAD_DIMS = (1, 3, 8, 16, 24, 40, 64, 72, 96, 128, 200, 256)


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
    seed: int = 0

    @property
    def rank(self) -> int:
        return len(self.batch) + 3

    def kwargs(self) -> dict:
        return {"is_causal": self.causal, "scale": self.scale, "enable_gqa": self.gqa}


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


def _mask(case: SdpaCase, g: torch.Generator) -> torch.Tensor | None:
    if case.mask == "none":
        return None
    full = case.mask.endswith("full")
    shape = (tuple(case.batch) + (case.hq,) if full else ()) + (case.L, case.S)
    keep = torch.rand(shape, generator=g) < 0.75
    if case.empty_rows:
        rows = torch.randperm(case.L, generator=g)[: case.empty_rows]
        keep[..., rows, :] = False
    if case.mask.startswith("bool"):
        return keep
    add = torch.randn(shape, generator=g)
    return torch.where(keep, add, torch.full_like(add, float("-inf")))


def build(case: SdpaCase, device: torch.device, requires_grad: bool = True) -> SdpaInputs:
    """Tensors of the case on ``device``, in their layouts (q, k, v are leaves)."""
    g = _gen(case.seed)
    dt = case.torch_dtype
    lead = tuple(case.batch)
    q = torch.randn(lead + (case.hq, case.L, case.E), generator=g) * case.value_scale
    k = torch.randn(lead + (case.hkv, case.S, case.E), generator=g)
    v = torch.randn(lead + (case.hkv, case.S, case.Ev), generator=g)
    dout = torch.randn(lead + (case.hq, case.L, case.Ev), generator=g)
    mask = _mask(case, g)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(dt)
    to = dict(device=device, dtype=dt)
    return SdpaInputs(
        q=fresh(q.to(**to), case.layout_q, requires_grad=requires_grad),
        k=fresh(k.to(**to), case.layout_k, requires_grad=requires_grad),
        v=fresh(v.to(**to), case.layout_v, requires_grad=requires_grad),
        attn_mask=None if mask is None else mask.to(device),
        dout=lay_out(dout.to(**to), case.layout_dout),
        kwargs=case.kwargs(),
    )


# ----------------------------------------------------------------------------- strategies


def _limits() -> dict:
    if profiles.size() == "large":
        return {"max_len": 300, "max_heads": 8, "max_batch": 3, "dims": HEAD_DIMS}
    return {"max_len": 40, "max_heads": 4, "max_batch": 2, "dims": HEAD_DIMS}


@st.composite
def sdpa_cases(draw, dtypes, *, rank=None, empty_rows=None, layouts=True, dout_layouts=None):
    """Draw an SdpaCase. ``dtypes``: what the target runs; ``rank``: force 3 or 4;
    ``empty_rows``: force (True) or forbid (False) fully masked query rows."""
    lim = _limits()
    r = rank or draw(st.sampled_from((3, 4, 4, 4, 5)))
    batch = tuple(draw(st.integers(1, lim["max_batch"])) for _ in range(r - 3))
    gqa = draw(st.booleans())
    hkv = draw(st.integers(1, lim["max_heads"]))
    hq = hkv * draw(st.integers(1, max(1, 8 // hkv))) if gqa else hkv
    length = st.one_of(st.just(1), st.integers(1, lim["max_len"]))
    L, S = draw(length), draw(length)
    E = draw(st.sampled_from(lim["dims"]))
    Ev = draw(st.one_of(st.just(E), st.sampled_from(lim["dims"])))
    if empty_rows:
        mask = draw(st.sampled_from(MASKS[1:]))
        causal = False
    else:
        causal = draw(st.booleans())
        mask = "none" if causal else draw(st.sampled_from(MASKS))
    n_empty = 0
    if mask != "none" and empty_rows is not False:
        n_empty = draw(st.integers(1 if empty_rows else 0, max(1, L // 2)))
    n_empty = min(n_empty, L)
    scale = draw(st.one_of(st.none(), st.floats(0.05, 2.0).map(lambda x: round(x, 4))))
    layout = st.sampled_from(("contiguous", "transposed", "sliced")) if layouts else st.just("contiguous")
    dout_layout = st.sampled_from(dout_layouts or ("contiguous", "transposed", "sliced", "broadcast"))
    return SdpaCase(
        batch=batch, hq=hq, hkv=hkv, L=L, S=S, E=E, Ev=Ev,
        dtype=dtype_name(draw(st.sampled_from(tuple(dtypes)))),
        causal=causal, mask=mask, empty_rows=n_empty, scale=scale, gqa=gqa,
        layout_q=draw(layout), layout_k=draw(layout), layout_v=draw(layout),
        layout_dout=draw(dout_layout),
        value_scale=draw(st.sampled_from((0.3, 1.0, 3.0))),
        seed=draw(st.integers(0, 2 ** 31 - 1)),
    )


def strategy_for(check: str, dtypes):
    """The cases each SDPA check is run on (shared by tests and negative controls)."""
    if check == "strided_dout":
        return sdpa_cases(dtypes, dout_layouts=("transposed", "sliced", "broadcast"))
    if check == "rank3_equals_rank4":
        return sdpa_cases(dtypes, rank=3)
    if check == "fully_masked_rows":
        return sdpa_cases(dtypes, empty_rows=True)
    if check == "misaligned_inputs":
        return sdpa_cases(dtypes, layouts=False, dout_layouts=("contiguous",))
    return sdpa_cases(dtypes)
