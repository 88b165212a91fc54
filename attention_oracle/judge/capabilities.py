"""What an implementation declares it supports, so the strategies draw only supported cases.

An implementation may declare its capabilities in its namespace, as an attribute
``ATTENTION_ORACLE_CAPABILITIES`` (or ``CAPABILITIES``): a :class:`Capabilities`, or a dict
with the same field names (dtypes as ``torch.dtype`` or names such as ``"bfloat16"``), plus
an optional ``"functions"`` dict of per-function overrides::

    ATTENTION_ORACLE_CAPABILITIES = {
        "dtypes": ("float16", "bfloat16"),
        "max_head_dim": 128,
        "masks": ("none",),
        "functions": {"dsa_sparse_attention": {"head_dims": (512,), "rope_dims": (64,),
                                               "heads": (64, 128)}},
    }

Fields (every one optional; the default is "everything the contract allows"):

- ``dtypes``: input dtypes; ``heads``: allowed query head counts (SDPA Hq, DSA H), None: any;
- ``max_head_dim`` / ``head_dims``: SDPA E and Ev, DSA Dl (and Dr against ``max_head_dim``);
  ``rope_dims``: allowed DSA Dr;
- ``masks``: SDPA mask families ``none`` / ``bool`` / ``float``; ``causal``: ``allowed`` /
  ``only`` / ``never``; ``l_le_s``: only L <= S; ``causal_square``: is_causal only with
  L == S (PyTorch's CUDA flash backend); ``same_head_dims``: only E == Ev; ``ranks``: SDPA
  ranks; ``gqa``;
- ``deterministic``: the same call twice gives bitwise-equal outputs and gradients (the
  contract does not require it: FlashAttention-2's, cuDNN's and PyTorch's EFFICIENT backwards
  accumulate with atomics; checked, by ``sdpa.determinism``, only where declared);
  ``deterministic_on_request``: the same, while ``torch.use_deterministic_algorithms`` is on
  (PyTorch's convention for its own backends: atomics by default, a repeatable path on
  request); ``sdpa.determinism`` then judges the calls under that mode;
- ``layouts``: input layouts (``contiguous``, ``transposed``, ``sliced``, ``misaligned``;
  DSA's ``kv3d``, ``packed``, ``packed_filler``, ``channel_slice`` count as ``contiguous``/
  ``sliced`` views of one buffer and are drawn where ``sliced`` is declared);
- ``index_dtypes``: index dtypes it computes right; int32 is the contract's, int64 an
  extension (declared: the int64 checks demand a right result; undeclared: a clear error
  naming the argument also passes);
- ``default_scale``: DSA ``softmax_scale=None`` means the contract's ``1/sqrt(D)`` (checked
  only where declared; SDPA's ``scale=None`` is part of its contract and always drawn);
- ``size``: ``native`` (runs at full speed: long rows are drawn on CPU profiles too) or
  ``interpreted`` (Triton's CPU interpreter: small problems only).

The report lists, per implementation, what its declaration leaves unverified.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from attention_oracle import contract

ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MASK_FAMILIES = ("none", "bool", "float")
CAUSAL_MODES = ("allowed", "only", "never")
RANKS = (3, 4, 5)
LAYOUTS = ("contiguous", "transposed", "sliced", "misaligned")
INDEX_DTYPES = (torch.int32, torch.int64)
SIZES = ("native", "interpreted")
ATTRIBUTES = ("ATTENTION_ORACLE_CAPABILITIES", "CAPABILITIES")
SDPA_FN = "scaled_dot_product_attention"
DSA_FNS = ("dsa_sparse_attention_nope", "dsa_sparse_attention",
           "dsa_sparse_attention_nope_varlen", "dsa_sparse_attention_varlen")
INDEX_FN = "offset_gather_kv_indices"


def as_dtype(x) -> torch.dtype:
    """``torch.float16`` or a name (``"float16"``, ``"torch.bfloat16"``, ``"int32"``)."""
    if isinstance(x, torch.dtype):
        return x
    if isinstance(x, str):
        dt = getattr(torch, x.replace("torch.", ""), None)
        if isinstance(dt, torch.dtype):
            return dt
    raise ValueError(f"capabilities: {x!r} is not a torch dtype")


def _dtypes(xs) -> tuple:
    return tuple(as_dtype(x) for x in xs)


def _ints(xs):
    return None if xs is None else tuple(int(x) for x in xs)


@dataclass(frozen=True)
class Capabilities:
    dtypes: tuple = ALL_DTYPES
    heads: tuple | None = None
    max_head_dim: int | None = None
    head_dims: tuple | None = None
    rope_dims: tuple | None = None
    masks: tuple = MASK_FAMILIES
    causal: str = "allowed"
    l_le_s: bool = False
    causal_square: bool = False
    same_head_dims: bool = False
    deterministic: bool = False
    deterministic_on_request: bool = False
    ranks: tuple = RANKS
    gqa: bool = True
    layouts: tuple = LAYOUTS
    index_dtypes: tuple = (torch.int32,)
    default_scale: bool = False
    gradients: bool = True  # False: forward only (the backward checks are not verified)
    size: str = "native"
    functions: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("dtypes", _dtypes(self.dtypes))
        set_("index_dtypes", _dtypes(self.index_dtypes))
        set_("heads", _ints(self.heads))
        set_("head_dims", _ints(self.head_dims))
        set_("rope_dims", _ints(self.rope_dims))
        set_("ranks", tuple(int(r) for r in self.ranks))
        set_("masks", tuple(self.masks))
        set_("layouts", tuple(self.layouts))
        for name, value, allowed in (("masks", self.masks, MASK_FAMILIES),
                                     ("layouts", self.layouts, LAYOUTS),
                                     ("ranks", self.ranks, RANKS)):
            bad = [v for v in value if v not in allowed]
            if bad:
                raise ValueError(f"capabilities: {name} {bad} not among {allowed}")
        if self.causal not in CAUSAL_MODES:
            raise ValueError(f"capabilities: causal {self.causal!r} not among {CAUSAL_MODES}")
        if self.size not in SIZES:
            raise ValueError(f"capabilities: size {self.size!r} not among {SIZES}")
        if torch.int32 not in self.index_dtypes:
            raise ValueError("capabilities: index_dtypes must include int32 (the contract's)")

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_declaration(cls, decl, base: Capabilities | None = None) -> Capabilities:
        """A Capabilities from a declaration (Capabilities, dict, or None: ``base``)."""
        base = base or cls()
        if decl is None:
            return base
        if isinstance(decl, Capabilities):
            return decl
        if not isinstance(decl, dict):
            raise TypeError(f"capabilities must be a Capabilities or a dict, got {type(decl).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(decl) - names)
        if unknown:
            raise ValueError(f"capabilities: unknown field(s) {unknown}; known: {sorted(names)}")
        functions = {fn: dict(v) for fn, v in decl.get("functions", {}).items()}
        plain = {k: v for k, v in decl.items() if k != "functions"}
        return dataclasses.replace(base, **plain, functions=functions)

    def for_function(self, fname: str) -> Capabilities:
        """The capabilities of one function: the global ones with its overrides applied."""
        over = self.functions.get(fname)
        if not over:
            return self
        return dataclasses.replace(self, **over, functions={})

    def narrowed(self, **changes) -> Capabilities:
        """A copy with fields replaced (per-function overrides kept)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ queries

    def head_dim_ok(self, d: int) -> bool:
        if self.max_head_dim is not None and d > self.max_head_dim:
            return False
        return self.head_dims is None or d in self.head_dims

    def rope_dim_ok(self, d: int) -> bool:
        if self.max_head_dim is not None and d > self.max_head_dim:
            return False
        return self.rope_dims is None or d in self.rope_dims

    def heads_ok(self, h: int) -> bool:
        return self.heads is None or h in self.heads

    @property
    def interpreted(self) -> bool:
        return self.size == "interpreted"

    def not_verified(self, area: str = "sdpa") -> list[str]:
        """What the declaration leaves unverified, in words (one entry per item)."""
        if area == "index":  # integer inputs only; int64 is beyond the contract
            return []
        out = [f"{dt}".replace("torch.", "") for dt in ALL_DTYPES if dt not in self.dtypes]
        if self.heads is not None:
            out.append(f"head counts other than {list(self.heads)}")
        if self.max_head_dim is not None:
            out.append(f"head dims > {self.max_head_dim}")
        if self.head_dims is not None:
            out.append(f"head dims other than {list(self.head_dims)}")
        if area == "dsa":
            if self.rope_dims is not None:
                out.append(f"rope dims other than {list(self.rope_dims)}")
            if not self.default_scale:
                out.append("softmax_scale=None (no default declared)")
        if not self.gradients:
            out.append("gradients (forward only declared)")
        if area == "sdpa":
            words = {"none": "unmasked calls", "bool": "boolean masks", "float": "additive masks"}
            out += [words[m] for m in MASK_FAMILIES if m not in self.masks]
            if self.causal == "only":
                out.append("non-causal calls")
            elif self.causal == "never":
                out.append("is_causal=True")
            if self.l_le_s:
                out.append("L > S")
            if self.causal_square and self.causal != "never":
                out.append("is_causal=True with L != S")
            if self.same_head_dims:
                out.append("E != Ev")
            out += [f"rank {r}" for r in RANKS if r not in self.ranks]
            if not self.gqa:
                out.append("GQA (enable_gqa=True)")
        out += [f"{lay} inputs" for lay in LAYOUTS if lay not in self.layouts]
        return out


FUNCTION_AREAS = {SDPA_FN: "sdpa", INDEX_FN: "index", **{fn: "dsa" for fn in DSA_FNS}}


def declared(namespace, base: Capabilities | None = None) -> Capabilities:
    """The namespace's declaration (``ATTENTION_ORACLE_CAPABILITIES`` or ``CAPABILITIES``)."""
    for attr in ATTRIBUTES:
        decl = getattr(namespace, attr, None) if namespace is not None else None
        if decl is not None:
            return Capabilities.from_declaration(decl, base)
    return base or Capabilities()


def resolve(target_or_caps, fname: str | None = None) -> Capabilities:
    """Capabilities from a Target, a Capabilities, or (legacy) a tuple of dtypes."""
    caps = getattr(target_or_caps, "capabilities", target_or_caps)
    if not isinstance(caps, Capabilities):
        caps = Capabilities(dtypes=tuple(caps))
    return caps.for_function(fname) if fname else caps


def not_verified_by_function(caps: Capabilities, offered) -> dict[str, list[str]]:
    """``{function: [items not verified]}`` for the offered functions (empty lists dropped)."""
    out = {}
    for fname in offered:
        items = caps.for_function(fname).not_verified(FUNCTION_AREAS.get(fname, "sdpa"))
        if items:
            out[fname] = items
    return out


def not_verified_report(targets_by_name: dict, names) -> dict[str, dict[str, list[str]]]:
    """``{implementation: {function: [items]}}`` for the named, available targets: what each
    declared away, for the report (functions the target does not offer are left out)."""
    out = {}
    for name in names:
        target = targets_by_name(name) if callable(targets_by_name) else targets_by_name[name]
        if target.unavailable or target.namespace is None:
            continue
        per_fn = not_verified_by_function(target.capabilities,
                                          [f for f in contract.FUNCTIONS if target.offers(f)])
        if per_fn:
            out[name] = per_fn
    return out


def report_lines(not_verified: dict) -> list[str]:
    """One line per implementation: each item its capabilities leave unverified, with the
    functions it concerns (``all`` when every function it offers and declared away shares it)."""
    lines = []
    for impl, per_fn in sorted(not_verified.items()):
        where: dict[str, list[str]] = {}
        for fn, items in sorted(per_fn.items()):
            for item in items:
                where.setdefault(item, []).append(fn)
        parts = [item if len(fns) == len(per_fn) and len(per_fn) > 1 else f"{item} ({', '.join(fns)})"
                 for item, fns in where.items()]
        lines.append(f"not verified (declared unsupported by {impl}): {'; '.join(parts)}")
    return lines
