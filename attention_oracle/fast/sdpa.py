"""Triton flash-attention with ``torch.nn.functional.scaled_dot_product_attention`` semantics.

Public functions (docs/CONTRACT.md "2. SDPA"):

* ``scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
  is_causal=False, scale=None, enable_gqa=False) -> out``
* ``scaled_dot_product_attention_with_lse(...) -> (out, lse)`` with ``lse [..., Hq, L]`` float32,
  natural log, -inf for a row with no key left.

Shapes: ``query [..., Hq, L, E]``, ``key [..., Hkv, S, E]``, ``value [..., Hkv, S, Ev]`` with any
number (>= 0) of leading batch dims, broadcast against each other; rank 3 ``[N, L, E]`` is
``Hq = N`` with no batch dim. ``Hkv == Hq`` (or broadcastable) unless ``enable_gqa``, where query
head h uses kv head ``h // (Hq // Hkv)`` (key and value may have different head counts there, as
PyTorch allows). Inputs are checked by ``attention_oracle/validation.py``. ``attn_mask`` is boolean (True = take part) or
additive float, broadcastable to ``[..., Hq, L, S]``; it is read through strides (stride 0 on
broadcast dims), never materialised. ``is_causal`` is top-left: query i sees keys j <= i.
A query row with no key left gives out = 0 and zero gradients. Output ``[..., Hq, L, Ev]`` in the
input dtype. Inputs of any strides are read in place; so is the backward's ``dout``.

Precision: fp32 inputs (``set_fp32_mode``) in "tf32x3" mode (the default; head dims up to 128)
run the 16-bit kernels' algorithm with 3xTF32 tensor-core dots, PyTorch's own fp32 arithmetic;
"plain" the same with IEEE fp32 dots; "accurate" (wider head dims in any mode) takes scores in
natural units from fp64-accumulated dots (``fl(q.k * scale)``, one rounding as the naive math),
an accurate exp/log and IEEE division (docs/FINDINGS.md F5). fp16/bf16 use fp32
accumulation, scores in log2 units with the fast exp2, and P and dS rounded to the input dtype
for their dots.

The kernels run on CUDA tensors natively and on CPU tensors under ``TRITON_INTERPRET=1``
(bf16 is wrong in the interpreter; use fp32/fp16 there). Both forward and backward are
``torch.library`` custom ops (``attention_oracle::sdpa_fwd`` / ``sdpa_bwd``) with fake
implementations, so ``torch.compile`` traces through them.
"""
import functools
import math
from typing import Optional, Tuple

import torch
from torch.autograd import forward_ad

from ..validation import FLOAT_DTYPES, check_sdpa_inputs
from .guards import first_order_only, resolved_neg
from .host import Choice, cdiv, check_device, check_scale, ensure_scratch_allocator, next_pow2
from .kernels import sdpa_bwd_fp32_gluon, sdpa_bwd_gluon, sdpa_fwd_gluon
from .kernels.sdpa_bwd import (
    FUSE_DQ_MAX_S,
    sdpa_bwd_dkdv_kernel,
    sdpa_bwd_dq_kernel,
    sdpa_bwd_preprocess_kernel,
)
from .kernels.sdpa_common import (
    CAUSAL_SECTION_BYTES,
    LOG2E,
    MASK_ADD,
    MASK_BOOL,
    MASK_NONE,
    MIN_QK_SCALE,
    STATS_LSE,
    CachedLauncher,
    chunk_of,
    interpreting,
    score_count,
    stats_rows,
    tune_bucket,
    tune_heads,
)
from .kernels.sdpa_fwd import sdpa_fwd_kernel
from .launch import BoundLaunch, BuildGuard, DirectLauncher

__all__ = ["scaled_dot_product_attention", "scaled_dot_product_attention_with_lse"]

MAX_HEAD_DIM = 256


# ----------------------------------------------------------------------------- validation
# (attention_oracle/validation.py checks the contract's inputs; these are fast's own limits)

def _check_head_dims(e, ev):
    for name, d in (("query/key head dim", e), ("value head dim", ev)):
        if d == 0 or d > MAX_HEAD_DIM:
            raise NotImplementedError(f"{name} {d} is outside 1..{MAX_HEAD_DIM}")


def _common_kv_heads(key, value, hk, hv):
    """GQA with different key and value head counts (PyTorch allows it where both divide Hq):
    both repeated to lcm(Hk, Hv) heads, which keeps query head h on key head h // (Hq / Hk) and
    value head h // (Hq / Hv). A copy, but the kernels take one group size."""
    h = math.lcm(hk, hv)
    if h != hk:
        key = key.repeat_interleave(h // hk, dim=-3)
    if h != hv:
        value = value.repeat_interleave(h // hv, dim=-3)
    return key, value, h


# ----------------------------------------------------------------------------- layout

def _expand_to(t, batch, heads):
    """Broadcast ``t [..., h, n, d]`` to ``batch + (heads, n, d)`` (a view; no-op if equal)."""
    shape = tuple(batch) + (heads,) + tuple(t.shape[-2:])
    return t if tuple(t.shape) == shape else t.expand(shape)


def _to_rank5(t, name):
    """View ``[..., h, n, d]`` as ``[Z1, Z2, h, n, d]`` without copying.

    unsqueeze/squeeze (not select/reshape) so autograd's backward stays a view too."""
    r = t.dim()
    if r == 3:
        return t.unsqueeze(0).unsqueeze(0)
    if r == 4:
        return t.unsqueeze(0)
    if r == 5:
        return t
    try:
        return t.view((-1,) + tuple(t.shape[r - 4:]))
    except RuntimeError as exc:
        raise NotImplementedError(f"{name}: leading batch dims of this rank-{r} view cannot be "
                                  f"merged without a copy") from exc


def _mergeable(dout):
    """``dout``, or a contiguous copy of it where it has more than five dims and its leading
    batch dims cannot be merged into one without a copy: autograd, not the caller, chooses
    dout's layout (``out.permute(...).contiguous()`` downstream gives such a view), so it is
    copied, not refused."""
    if dout.dim() > 5:
        try:
            dout.view((-1,) + tuple(dout.shape[-4:]))
        except RuntimeError:
            return dout.contiguous()
    return dout


def _from_rank5(t5, shape):
    if len(shape) == 3:
        return t5.squeeze(1).squeeze(0)
    if len(shape) == 4:
        return t5.squeeze(0)
    if len(shape) == 5:
        return t5
    return t5.view(shape)


def _strides5(t):
    return tuple(t.stride()) if t is not None else (0, 0, 0, 0, 0)


_INT32_MAX = 2**31 - 1


def _check_tile_offsets(named):
    """The kernels address rows/cols inside one head with int32 arithmetic (batch offsets are
    int64): refuse views whose in-head span would overflow rather than read wrong memory."""
    for name, t in named:
        if t is None:
            continue
        shape, stride = t.shape, t.stride()
        if 0 not in shape:
            _check_span(name, shape[-2], shape[-1], stride[-2], stride[-1])


def _check_span(name, rows, cols, s_rows, s_cols):
    span = (rows - 1) * abs(s_rows) + (cols - 1) * abs(s_cols)
    if span > _INT32_MAX:
        raise NotImplementedError(f"{name}: one head spans {span} elements (rows x strides), "
                                  f"beyond the kernels' int32 in-head addressing")


def _block(d):
    return max(16, next_pow2(d))


def _precision(dtype, width):
    """The ``input_precision`` of the kernels' dots for head dims up to ``width``: fp32 takes
    IEEE dots (FMA on the GPU), or in "tf32x3" mode the 3xTF32 split on tensor cores; 16-bit
    operands ignore it."""
    if dtype != torch.float32:
        return "tf32"
    return "tf32x3" if _fp32_mode(width) == "tf32x3" else "ieee"


FP32_MODES = ("accurate", "plain", "tf32x3")
_FP32 = Choice("ATTENTION_ORACLE_FAST_FP32", FP32_MODES, "tf32x3")
DQ_MODES = ("auto", "kernel", "atomic", "atomic_element")
_DQ_MODE = Choice("ATTENTION_ORACLE_FAST_SDPA_DQ", DQ_MODES, "auto")
# the fp32 "tf32x3" calls "auto" gives atomic dQ: unmasked, no GQA, from this many scores over
# the whole L x S rectangle, causal or not. At B 4 H 16 L 1k D 128 (2**26) the step went 0.89
# -> 0.95 of torch's causal and stayed 0.85 not causal; at L 2k and 4k 0.83-0.85 -> 0.94-0.97
# causal and 0.84-0.85 -> 0.87 not; D 64 L 2k 1.01-1.08 -> 1.22-1.33; at B 8 L 512 (2**25)
# it lost synced (H100, docs/PERFORMANCE.md "fp32: atomic dQ under auto")
AUTO_ATOMIC_DQ_MIN_SCORES = 2 ** 26
FWD_BACKENDS = ("auto", "triton", "gluon")
_FWD_BACKEND = Choice("ATTENTION_ORACLE_FAST_SDPA_FWD", FWD_BACKENDS, "auto")
# per backend: the Gluon forward takes a call its plan applies to ("gluon"), or where it is
# also the faster one ("auto", sdpa_fwd_gluon.auto_takes), or never ("triton")
_GLUON_ALWAYS, _GLUON_AUTO = frozenset(("gluon",)), frozenset(("gluon", "auto"))
BWD_BACKENDS = ("triton", "gluon", "auto")
# "auto" is the default: the suite passed under the Gluon backward wherever it applies, and the
# determinism check under "auto" (`bash benchmarks/h200.sh bwddefault`; docs/DESIGN.md 10)
_BWD_BACKEND = Choice("ATTENTION_ORACLE_FAST_SDPA_BWD", BWD_BACKENDS, "auto")
# the Gluon kernels, turned off for the process if they fail to build on this Triton
GLUON_FWD = BuildGuard("fast.sdpa's Gluon forward (kernels/sdpa_fwd_gluon.py)")
GLUON_BWD = BuildGuard("fast.sdpa's Gluon backward (kernels/sdpa_bwd_gluon.py)")
GLUON_FP32_DKDV = BuildGuard("fast.sdpa's Gluon fp32 dK/dV (kernels/sdpa_bwd_fp32_gluon.py)")
# whether "auto" backward takes the Gluon fp32 "tf32x3" dK/dV where it applies ("gluon" always
# does, "triton" never): not, as it measured slower than the Triton backward at every point
# timed (step 0.66-0.70x torch's fp32 default against 0.86-0.97x at D 128; docs/FINDINGS.md F89)
AUTO_FP32_DKDV = False


def set_forward_backend(backend):
    """The forward kernel of later calls: "triton" (every input), "gluon" (the Hopper
    warp-specialised kernel of :mod:`fast.kernels.sdpa_fwd_gluon` wherever it applies: sm_90,
    fp16/bf16, head dims up to 256 that are multiples of 8, no mask or a boolean one or an
    additive one of the inputs' dtype, TMA-ready strides and 16-byte aligned data; other calls
    keep the Triton kernel) or "auto" (the Gluon kernel where it applies and measured faster
    with its host cost: at least ``sdpa_fwd_gluon.AUTO_MIN_SCORES`` scores, and head dim 128
    with no mask or a key-padding one of a kind in ``AUTO_FWD_MASKS``, or head dim 64 unmasked
    where the persistent program runs: ``sdpa_fwd_gluon.auto_takes``). Default:
    $ATTENTION_ORACLE_FAST_SDPA_FWD or "auto". Returns the previous backend."""
    return _FWD_BACKEND.set(backend)


def set_backward_backend(backend):
    """The backward kernels of later calls: "triton" (every input: :func:`set_dq_mode`
    applies), "auto" (the Gluon kernel where it applies and measured ahead of the Triton
    backward with its host cost: head dims 64 and 128, no mask, no GQA, at least
    ``AUTO_BWD_MIN_SCORES[head_dim]`` scores, and not under
    ``torch.use_deterministic_algorithms``; :func:`gluon_backward_takes`) or "gluon" (the
    Hopper warp-specialised kernel of
    :mod:`fast.kernels.sdpa_bwd_gluon` wherever the Gluon forward's plan applies, with a mask
    it takes or none, and dout is TMA-ready too: dK, dV and dQ in one launch, dQ added by fp32
    atomics or TMA reductions in an order that varies between runs; and fp32 "tf32x3" calls,
    unmasked, head dims up to 128, with dK and dV from :mod:`fast.kernels.sdpa_bwd_fp32_gluon`
    and dQ from the dQ kernel, under the "auto" or "kernel" dQ mode: slower than the Triton
    backward, docs/FINDINGS.md F89; other calls keep the Triton kernels). Default:
    $ATTENTION_ORACLE_FAST_SDPA_BWD or "auto". Returns the previous backend."""
    previous = _BWD_BACKEND.set(backend)
    _options_key()
    return previous


def set_dq_mode(mode):
    """How the Triton backward of later calls forms dQ, where it is not fused
    (:func:`_fuse_bwd`): "kernel" (a dQ kernel of its own, looping over keys and recomputing S
    and dP: bitwise repeatable), "atomic" (16-bit and fp32 "plain"/"tf32x3" inputs: the dK/dV
    kernel adds each key block's share of dQ to an fp32 buffer, by a TMA reduce per tile on
    sm_90 where the head dim is a multiple of 4, else by per-element atomics, in an order that
    varies between runs; fp32 "accurate" keeps the dQ kernel), "atomic_element" ("atomic" with
    per-element atomics everywhere) or "auto" ("atomic" where it measured ahead: fp32
    "tf32x3", unmasked, no GQA, at least ``AUTO_ATOMIC_DQ_MIN_SCORES`` scores, and not under
    ``torch.use_deterministic_algorithms``; else "kernel"). Default:
    $ATTENTION_ORACLE_FAST_SDPA_DQ or "auto". Returns the previous mode."""
    previous = _DQ_MODE.set(mode)
    _options_key()
    return previous


def settings():
    """The process-wide options later calls run under, by name (what a benchmark records
    beside its figures)."""
    return {"forward_backend": _FWD_BACKEND.value, "backward_backend": _BWD_BACKEND.value,
            "auto_bwd_min_scores": {str(d): n for d, n in AUTO_BWD_MIN_SCORES.items()},
            "dq_mode": _DQ_MODE.value,
            "fp32_mode": _FP32.value, "gluon_bwd_schedule": sdpa_bwd_gluon._SCHEDULE.value}


def deterministic():
    """Whether later calls give bitwise-equal outputs and gradients for equal inputs: in
    :func:`set_dq_mode`'s "kernel" mode with the Triton backward, or in "kernel" or "auto"
    mode under the "triton" or "auto" backward while ``torch.use_deterministic_algorithms``
    is on."""
    return ((_DQ_MODE.value == "kernel" and _BWD_BACKEND.value == "triton")
            or deterministic_on_request() and torch.are_deterministic_algorithms_enabled())


def deterministic_on_request():
    """Whether later calls are bitwise repeatable while ``torch.use_deterministic_algorithms``
    is on: in "kernel" or "auto" dQ mode under the "triton" and "auto" backward backends
    ("gluon" and the "atomic" dQ modes add dQ in an order that varies between runs)."""
    return _DQ_MODE.value in ("kernel", "auto") and _BWD_BACKEND.value in ("triton", "auto")


# the calls "auto" gives the Gluon backward, by head dim: from this many scores (half under
# causal). Its host time per call measured ~50 us above the Triton backward's (172 against 122
# us at L 128, H100), which a backward ~10% faster repays from ~500 us of kernel time: ~2**27
# D-128 scores at ~450 TFLOP/s. At D 64 it trails the Triton backward at L 1k (B 16 H 32:
# 2**29 scores; step 0.87x cuDNN against 0.92x) and leads from L 4k (2**30 causal); at L 1k
# causal the two are level (step 0.89-0.91x against 0.91-0.92x in three runs; the Triton one
# 0.79x in a fourth, docs/FINDINGS.md F91). At D 128 it leads at every length (H100,
# docs/PERFORMANCE.md "Gluon backward: where dQ goes" and "D 64 causal backward at L 1k");
# other head dims and masked calls are untimed
AUTO_BWD_MIN_SCORES = {128: 2 ** 27, 64: 2 ** 30}


def gluon_backward_takes(q_shape, k_shape, is_causal, masked=False):
    """Whether the backward backend of later calls runs the Gluon backward for a call of these
    rank-5 shapes (with a mask or not) where its plan applies. "auto" leaves GQA calls to the
    Triton backward: the Gluon one walks a kv head's query heads in one program (the Triton
    one spreads dQ over them), and is not timed there."""
    backend = _BWD_BACKEND.value
    if backend == "gluon":
        return True
    return (backend == "auto" and not masked and q_shape[2] == k_shape[2]
            and score_count(q_shape, k_shape, is_causal)
            >= AUTO_BWD_MIN_SCORES.get(q_shape[-1], float("inf"))
            and not torch.are_deterministic_algorithms_enabled())


# the masks "auto" gives the Gluon forward (sdpa_fwd_gluon.auto_takes the size): key-padding
# ones (every query row reads the same mask row), where it measured ahead of the Triton forward
# (boolean [B, 1, 1, L]: 1.23-1.38x at D 128 and 96, L 4k; additive of the inputs' dtype, 0 or
# finfo.min: 1.46x at D 128, L 4k, bf16; H100, docs/PERFORMANCE.md). A dense mask read in the
# softmax's path costs the Gluon kernel more than the Triton one (boolean [B, 1, L, L]:
# 0.79-0.86x; additive: 0.66-0.78x)
AUTO_FWD_MASKS = frozenset((torch.bool, torch.bfloat16, torch.float16))


def _auto_mask(mask):
    """Whether "auto" may give the Gluon forward a call under ``mask`` (None, or the call's
    rank-5 [Z1, Z2, HQ, L, S] view): none, or a key-padding mask (query-row stride 0) of a
    dtype in ``AUTO_FWD_MASKS``."""
    return mask is None or (mask.dtype in AUTO_FWD_MASKS
                            and (mask.shape[3] == 1 or mask.stride(3) == 0))


def _gluon_backends(q_shape, k_shape, is_causal, mask=None, device=None):
    """The forward backends under which a call of these rank-5 shapes under ``mask`` on
    ``device`` runs the Gluon kernel, where its plan applies: "auto" only where measured faster
    (sizes: ``sdpa_fwd_gluon.auto_takes``; masks: :func:`_auto_mask`)."""
    if _auto_mask(mask) and sdpa_fwd_gluon.auto_takes(q_shape, k_shape, is_causal,
                                                      mask is not None, device):
        return _GLUON_AUTO
    return _GLUON_ALWAYS


def set_fp32_mode(mode):
    """The fp32 path of later calls: "accurate" (natural-unit scores from fp64-accumulated dots,
    an accurate exp/log, IEEE division: module docstring), "plain" (the 16-bit kernels'
    flash algorithm in fp32 arithmetic: IEEE fp32 dots, exp2 of log2-unit scores, as the
    agreement rule's flash lp reference computes) or "tf32x3" (plain's algorithm with every
    dot as three TF32 tensor-core products of CUTLASS's split, a = big + small with big = a
    truncated to tf32 and small = a - big rounded to tf32: a.b ~ small.big + big.small +
    big.big, each product within ~2^-21 relative, as PyTorch's fp32 EFFICIENT kernel computes
    (CUTLASS OpMultiplyAddFastF32); each tile split once in the kernels,
    ``kernels.sdpa_common.split_tf32``, and each product added to its fp32 accumulator in
    registers; the interpreter computes the TF32 dots of the exact halves in fp32).
    Default: $ATTENTION_ORACLE_FAST_FP32 or "tf32x3" (0.82x torch's fp32 default for forward
    and backward on the H200 against 0.60x for "accurate"; docs/PERFORMANCE.md). Returns the
    previous mode."""
    previous = _FP32.set(mode)
    _options_key()
    return previous


# "tf32x3" keeps q (or k and v) in shared memory twice (the big and small halves): wider heads
# than this do not fit the H200's 227 KB with any tile the kernels use
TF32X3_MAX_BLOCK = 128


def _fp32_mode(width):
    """The fp32 mode a call with head dims up to ``width`` runs: :func:`set_fp32_mode`'s, except
    that "tf32x3" runs "accurate" where a head dim's block exceeds ``TF32X3_MAX_BLOCK``."""
    mode = _FP32.value
    return "accurate" if mode == "tf32x3" and _block(width) > TF32X3_MAX_BLOCK else mode


def _natural(dtype, width):
    """fp32 in "accurate" mode keeps scores and lse in natural units with an accurate exp (the
    old rule allowed about two naive fp32 roundings); 16-bit inputs and fp32 in "plain" or
    "tf32x3" mode take the log2-unit, exp2 fast path."""
    return dtype == torch.float32 and _fp32_mode(width) == "accurate"


def _lse_state_shape(q_shape, dtype, width):
    """The forward's saved row statistics ``[R, Z1, Z2, Hq, L]`` float32, rows ``STATS_*``
    (:mod:`fast.kernels.sdpa_common`): m, log l, the public lse and, on the natural-unit fp32
    path (R = 4), the rounding error of log l. ``width``: the larger head dim."""
    return (stats_rows(_natural(dtype, width)),) + tuple(q_shape[:4])


# ----------------------------------------------------------------------------- launches

# n_tensors: the kernels' leading tensor arguments (DirectLauncher's raw lookup)
_FWD = CachedLauncher(sdpa_fwd_kernel, n_tensors=6)
_DKDV = CachedLauncher(sdpa_bwd_dkdv_kernel, n_tensors=11)
_DQ = CachedLauncher(sdpa_bwd_dq_kernel, n_tensors=8)
_PRE = DirectLauncher(sdpa_bwd_preprocess_kernel, n_tensors=3)


def _mask_dtype(mask):
    """The dtype the kernels read the mask as (bool travels as uint8), None without one."""
    if mask is None:
        return None
    return torch.uint8 if mask.dtype == torch.bool else mask.dtype


KERNEL_OPTIONS = {"fold": True, "fuse_bwd": True, "causal_section": CAUSAL_SECTION_BYTES}
# (kernel options, fp32 mode) of later calls, part of each call plan's key; kept by the setters
# (building it per call cost ~0.5 us of host time)
_OPTIONS_KEY = [None]


def _options_key():
    _OPTIONS_KEY[0] = (tuple(KERNEL_OPTIONS.values()), _FP32.value, _DQ_MODE.value,
                       _BWD_BACKEND.value)


_options_key()


def set_kernel_options(*, fold=None, fuse_bwd=None, causal_section=None):
    """Kernel variants for later calls (benchmarks compare them): ``fold`` forms the exponent of
    each score with no mask to apply as one FMA, ``exp2(qk * c - m)``, in the 16-bit kernels
    (the forward also with fp32 "plain"; the backward's P as ``exp2(qk * c - (m + log l))``,
    as flash attention's backward does with its lse). ``fuse_bwd`` runs the backward of a
    small problem (:func:`_fuse_bwd`) as one launch of the dK/dV kernel that also forms Delta
    and dQ, in place of three launches (Delta, dK/dV, dQ). ``causal_section``: the bytes of
    re-read operands a section of heads of a causal launch holds (the Triton kernels and the
    Gluon backward), its blocks dealt heaviest first across the section
    (``sdpa_common.causal_program``); 0, the default, deals one head's blocks after another
    (docs/FINDINGS.md F90). None leaves an option as it is; returns the previous options."""
    previous = dict(KERNEL_OPTIONS)
    if fold is not None:
        KERNEL_OPTIONS["fold"] = bool(fold)
    if fuse_bwd is not None:
        KERNEL_OPTIONS["fuse_bwd"] = bool(fuse_bwd)
    if causal_section is not None:
        if (isinstance(causal_section, bool) or not isinstance(causal_section, int)
                or not 0 <= causal_section < 2**31):
            raise ValueError(f"causal_section must be an int of bytes in [0, 2**31), got "
                             f"{causal_section!r}")
        KERNEL_OPTIONS["causal_section"] = causal_section
    _options_key()
    return previous


# query rows per kv head (L x group) up to which a fused backward is taken: its one program per
# kv head walks them in turn where the unfused dQ kernel spreads them over programs
FUSE_BWD_MAX_ROWS = 256


def _fuse_bwd(natural, prec, L, S, group):
    """Whether a backward runs as one launch (:func:`set_kernel_options`): the log2-unit
    kernels (16-bit, fp32 "plain") but not fp32 "tf32x3" (its fused dK/dV kernel at head dim
    72, padded to 128, asked the H200 for 270464 B of shared memory, past the 232448 B limit),
    every key in one dK/dV key block (``S <= FUSE_DQ_MAX_S``) and at most
    ``FUSE_BWD_MAX_ROWS`` query rows per kv head, where host time dominates."""
    return (KERNEL_OPTIONS["fuse_bwd"] and not natural and prec != "tf32x3"
            and S <= FUSE_DQ_MAX_S and L * group <= FUSE_BWD_MAX_ROWS)


def _atomic_dq(natural, prec, fuse, E, device, auto_takes=False):
    """How an unfused backward adds dQ in the dK/dV kernel (:func:`set_dq_mode`; the kernel's
    ATOMIC_DQ): 0 not at all (the dQ kernel runs), 1 per-element atomics, 2 a TMA reduce per
    tile (sm_90 on, fp32 rows of E a multiple of 16 bytes; the interpreter has none).
    ``auto_takes``: the call's shapes and mask are ones "auto" gives atomic dQ
    (:func:`_auto_dq_shapes`)."""
    mode = _DQ_MODE.value
    if mode == "kernel" or natural or fuse:
        return 0
    if mode == "auto" and not (auto_takes and prec == "tf32x3"
                               and not torch.are_deterministic_algorithms_enabled()):
        return 0
    tma = (mode != "atomic_element" and E % 4 == 0 and device.type == "cuda"
           and torch.cuda.get_device_capability(device)[0] >= 9)
    return 2 if tma else 1


def _fp32_gluon_dkdv(prec, masked, q, k, v, dout):
    """Whether an fp32 "tf32x3" backward's dK/dV runs the Gluon kernel
    (:mod:`fast.kernels.sdpa_bwd_fp32_gluon`), dQ then by the dQ kernel: unmasked, under the
    "gluon" backward backend (or "auto" where ``AUTO_FP32_DKDV``), a dQ mode that is not
    atomic (atomic dQ lives in the Triton dK/dV kernel), rank-5 operands it applies to
    (``dout``: None where the caller checks it later, with ``q`` standing in here)."""
    backend = _BWD_BACKEND.value
    return (prec == "tf32x3" and not masked
            and (backend == "gluon" or (backend == "auto" and AUTO_FP32_DKDV))
            and _DQ_MODE.value in ("auto", "kernel") and GLUON_FP32_DKDV.failure is None
            and sdpa_bwd_fp32_gluon.applies(q, k, v, q if dout is None else dout))


def _auto_dq_shapes(q_shape, k_shape, masked):
    """Whether "auto" dQ mode may take atomic dQ for a call of these rank-5 shapes: unmasked, no
    GQA, at least ``AUTO_ATOMIC_DQ_MIN_SCORES`` scores over the whole L x S rectangle."""
    return (not masked and q_shape[2] == k_shape[2]
            and score_count(q_shape, k_shape, False) >= AUTO_ATOMIC_DQ_MIN_SCORES)


def _section(is_causal):
    """A launch's SECTION constexpr (:func:`set_kernel_options`): 0 unless causal."""
    return KERNEL_OPTIONS["causal_section"] if is_causal else 0


def _fold(scale, dtype, backward):
    """Whether a launch takes the fold (:func:`set_kernel_options`): the kernels' log2-unit
    fast path needs a positive scale whose fp32 ``scale * log2 e`` is a normal number (a masked
    tile multiplies a -inf by it); the backward folds only in 16-bit."""
    return (KERNEL_OPTIONS["fold"] and scale * LOG2E >= MIN_QK_SCALE
            and not (backward and dtype == torch.float32))


@functools.lru_cache(maxsize=1024)
def _fwd_plan(q_shape, k_shape, v_shape, dtype, mask_dtype, is_causal, natural, prec, fold,
              section):
    """What a forward launch derives from shapes and flags alone (cached; shapes are rank 5):
    (mask kind, CachedLauncher key, constexprs, sizes, grid spec, int scalars, q.k factor)."""
    Z1, Z2, HQ, L, E = q_shape
    HKV, S, EV = k_shape[2], k_shape[3], v_shape[4]
    kind = MASK_NONE if mask_dtype is None else MASK_BOOL if mask_dtype == torch.uint8 else MASK_ADD
    tune_l, tune_s, block_e, block_ev = tune_bucket(L), tune_bucket(S), _block(E), _block(EV)
    tune_h = tune_heads(Z1 * Z2 * HQ, tune_l)
    meta = dict(CAUSAL=is_causal, MASK_KIND=kind, PREC=prec, NATURAL=natural,
                CHUNK_E=chunk_of(block_e), BLOCK_E=block_e, BLOCK_EV=block_ev, FOLD=fold,
                SECTION=section)
    # meta is a function of the key (the launcher's memo relies on it)
    key = (tune_l, tune_s, tune_h, E, EV, block_e, block_ev, is_causal, kind, dtype, mask_dtype,
           natural, prec, fold, section)
    ints = (Z2, HQ, HQ // HKV, L, S, E, EV)
    factor = 1.0 if natural or kind == MASK_ADD else LOG2E  # _qk_scale
    return (kind, key, meta, (L, S, E, EV), ("BLOCK_M", L, Z1 * Z2 * HQ), ints, factor,
            (tune_l, tune_s, tune_h))


def _launch_fwd(q, k, v, mask, is_causal, scale):
    """q [Z1,Z2,Hq,L,E], k [Z1,Z2,Hkv,S,E], v [Z1,Z2,Hkv,S,Ev], mask None or [Z1,Z2,Hq,L,S]."""
    Z1, Z2, HQ, L, E = q.shape
    S, EV = k.shape[3], v.shape[4]
    out = torch.empty((Z1, Z2, HQ, L, EV), dtype=q.dtype, device=q.device)
    width = max(E, EV)
    lse_k = torch.empty(_lse_state_shape(q.shape, q.dtype, width), dtype=torch.float32,
                        device=q.device)
    if out.numel() == 0:
        return out, lse_k
    if S == 0:  # only the public lse is read (the backward returns zeros)
        lse_k.fill_(float("-inf"))
        return out.zero_(), lse_k
    backend = _FWD_BACKEND.value
    if (backend != "triton" and (mask is None or sdpa_fwd_gluon.takes_mask(mask, q.dtype))
            and backend in _gluon_backends(q.shape, k.shape, is_causal, mask, q.device)):
        gluon_plan = sdpa_fwd_gluon.plan((q.shape, k.shape, v.shape),
                                         (q.stride(), k.stride(), v.stride()), q.dtype, q.device,
                                         is_causal, scale)
        if (gluon_plan is not None
                and GLUON_FWD(sdpa_fwd_gluon.launch, q, k, v, out, lse_k, gluon_plan, mask)):
            return out, lse_k
    natural = _natural(q.dtype, width)
    kind, key, meta, sizes, grid, ints, factor, tunes = _fwd_plan(
        q.shape, k.shape, v.shape, q.dtype, _mask_dtype(mask), is_causal, natural,
        _precision(q.dtype, width), _fold(scale, q.dtype, False), _section(is_causal))
    mask_arg = q if mask is None else mask.view(torch.uint8) if kind == MASK_BOOL else mask
    args = (q, k, v, mask_arg, out, lse_k,
            *q.stride(), *k.stride(), *v.stride(), *_strides5(mask), *out.stride(),
            lse_k.stride(0), *ints, scale * factor, *tunes)
    _FWD(key, grid, args, sizes, meta)
    return out, lse_k


def _pre_block(block_ev, interpreted):
    """The Delta kernel's query rows a program (its tile [rows, block_ev] at most 8192)."""
    return 64 if interpreted else max(16, min(128, 8192 // block_ev))


@functools.lru_cache(maxsize=1024)
def _bwd_plan(q_shape, k_shape, v_shape, dtype, mask_dtype, dout_dtype, is_causal, natural,
              prec, interpreted, fold, fuse, atomic, section):
    """The backward's analogue of :func:`_fwd_plan`: (key, constexprs, sizes, dK/dV grid spec,
    dQ grid spec, int scalars, q.k factor, Delta block, Delta grid, the dQ kernel's
    constexprs). ``fuse``: :func:`_fuse_bwd` and ``atomic``: :func:`_atomic_dq` (the dK/dV
    kernel's FUSE_DQ and ATOMIC_DQ, which the dQ kernel does not take)."""
    Z1, Z2, HQ, L, E = q_shape
    HKV, S, EV = k_shape[2], k_shape[3], v_shape[4]
    kind = MASK_NONE if mask_dtype is None else MASK_BOOL if mask_dtype == torch.uint8 else MASK_ADD
    block_e, block_ev = _block(E), _block(EV)
    pre_block = _pre_block(block_ev, interpreted)
    meta = dict(CAUSAL=is_causal, MASK_KIND=kind, PREC=prec, NATURAL=natural,
                CHUNK_E=chunk_of(block_e), CHUNK_EV=chunk_of(block_ev), BLOCK_E=block_e,
                BLOCK_EV=block_ev, FOLD=fold, FUSE_DQ=fuse, ATOMIC_DQ=atomic, SECTION=section)
    tune_l, tune_s = tune_bucket(L), tune_bucket(S)
    tune_h = tune_heads(Z1 * Z2 * HQ, tune_l)
    key = (tune_l, tune_s, tune_h, E, EV, block_e, block_ev, is_causal, kind, dtype, mask_dtype,
           dout_dtype, natural, prec, fold, fuse, atomic, section)
    ints = (Z2, HQ, HQ // HKV, L, S, E, EV)
    factor = 1.0 if natural or kind == MASK_ADD else LOG2E
    return (kind, key, meta, (L, S, E, EV), ("BLOCK_N", S, Z1 * Z2 * HKV),
            ("BLOCK_M", L, Z1 * Z2 * HQ), ints, factor, (tune_l, tune_s, tune_h), pre_block,
            (cdiv(L, pre_block), Z1 * Z2 * HQ),
            {name: x for name, x in meta.items() if name not in ("FUSE_DQ", "ATOMIC_DQ")})


def _launch_bwd(dout, q, k, v, mask, out, lse_k, is_causal, scale):
    """Gradients (dq, dk, dv) shaped like q, k, v (rank 5); dout read through its strides.
    ``lse_k`` is the forward's saved row statistics (:func:`_lse_state_shape`)."""
    Z1, Z2, HQ, L, E = q.shape
    S = k.shape[3]
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if L == 0 or S == 0 or Z1 * Z2 * HQ == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    _check_tile_offsets((("dout", dout),))
    # the kernels address the statistics as [R, Z1*Z2*Hq*L] rows; saved-tensor hooks may give
    # them back in another layout (docs/FINDINGS.md F50)
    if not lse_k.is_contiguous():
        lse_k = lse_k.contiguous()
    # the forward's statistics say which path made them (the fp32 mode may have changed since)
    natural = lse_k.shape[0] == stats_rows(True)
    if (not natural
            and gluon_backward_takes(q.shape, k.shape, is_causal, mask is not None)
            and (mask is None or sdpa_fwd_gluon.takes_mask(mask, q.dtype))):
        gluon_plan = sdpa_bwd_gluon.plan(
            sdpa_fwd_gluon.plan((q.shape, k.shape, v.shape), (q.stride(), k.stride(), v.stride()),
                                q.dtype, q.device, is_causal, scale), dout.stride(), q.dtype,
            _section(is_causal))
        if gluon_plan is not None and dout.dtype == q.dtype and sdpa_fwd_gluon.aligned(
                q.data_ptr(), k.data_ptr(), v.data_ptr(), dout.data_ptr()):
            grads = _launch_bwd_gluon(dout, q, k, v, out, lse_k, dq, dk, dv, gluon_plan,
                                      mask=mask)
            if grads is not None:
                return grads
    prec = "ieee" if natural else _precision(q.dtype, max(E, v.shape[4]))
    fuse = _fuse_bwd(natural, prec, L, S, HQ // k.shape[2]) and out.is_contiguous()
    fp32_gluon = _fp32_gluon_dkdv(prec, mask is not None, q, k, v, dout)
    atomic = 0 if fp32_gluon else _atomic_dq(natural, prec, fuse, E, q.device,
                                             _auto_dq_shapes(q.shape, k.shape, mask is not None))
    (kind, key, meta, sizes, grid_kv, grid_q, ints, factor, tunes, pre_block,
     pre_grid, meta_q) = _bwd_plan(q.shape, k.shape, v.shape, q.dtype, _mask_dtype(mask), dout.dtype,
                           is_causal, natural, prec, interpreting(), _fold(scale, q.dtype, True),
                           fuse, atomic, _section(is_causal))
    mask_arg = q if mask is None else mask.view(torch.uint8) if kind == MASK_BOOL else mask
    dout_strides = dout.stride()
    common_strides = (*q.stride(), *k.stride(), *v.stride(), *_strides5(mask), *dout_strides)
    scalars = (lse_k.stride(0), *ints, scale * factor, scale, *tunes)
    if fuse:  # one launch: Delta and dQ inside the dK/dV kernel (O and dQ contiguous)
        _DKDV(key + (HQ // k.shape[2],), grid_kv,
              (q, k, v, mask_arg, dout, lse_k, q, dk, dv, out, dq,
               *common_strides, *dk.stride(), *dv.stride(), *scalars), sizes, meta)
        return dq, dk, dv
    delta = torch.empty((Z1 * Z2 * HQ, L), dtype=torch.float32, device=q.device)
    _PRE(pre_grid, (out, dout, delta, *out.stride(), *dout_strides, Z2, HQ, L, sizes[3]),
         {"BLOCK_M": pre_block, "BLOCK_EV": meta["BLOCK_EV"]})
    dq_sum = _dq_sum(dq, atomic)
    if not (fp32_gluon and GLUON_FP32_DKDV(
            sdpa_bwd_fp32_gluon.launch, q, k, v, dout, lse_k, delta, dk, dv, (q.shape, k.shape),
            (q.stride(), k.stride(), v.stride(), dout_strides, dk.stride(), dv.stride()),
            is_causal, scale, scale * factor)):
        _DKDV(key + (HQ // k.shape[2],), grid_kv,
              (q, k, v, mask_arg, dout, lse_k, delta, dk, dv, q, dq_sum,
               *common_strides, *dk.stride(), *dv.stride(), *scalars), sizes, meta)
    if atomic:
        return dq.copy_(dq_sum), dk, dv
    _DQ(key, grid_q, (q, k, v, mask_arg, dout, lse_k, delta, dq,
                      *common_strides, *dq.stride(), *scalars), sizes, meta_q)
    return dq, dk, dv


def _launch_bwd_gluon(dout, q, k, v, out, lse_k, dq, dk, dv, gluon_plan, pre=None, mask=None):
    """The Gluon backward (:func:`set_backward_backend`): Delta by the preprocess kernel
    (``pre``: a plan's bound launch of it, else a direct one), then dK, dV and dQ's fp32 sum
    in one launch, under ``mask`` (None, or one the Gluon kernels take); dq, dk, dv contiguous
    as rank 5. None where the kernel does not build on
    this Triton (``GLUON_BWD``): the caller runs the Triton backward."""
    if GLUON_BWD.failure is not None:
        return None
    (qs, _, vs), *_ = gluon_plan
    Z1, Z2, HQ, L, EV = *qs[:4], vs[4]
    delta = torch.empty((Z1 * Z2 * HQ, L), dtype=torch.float32, device=dq.device)
    if pre is None:
        pre_block = _pre_block(_block(EV), interpreting())
        _PRE((cdiv(L, pre_block), Z1 * Z2 * HQ),
             (out, dout, delta, *out.stride(), *dout.stride(), Z2, HQ, L, EV),
             {"BLOCK_M": pre_block, "BLOCK_EV": _block(EV)})
    else:
        pre(delta)
    dq_sum = torch.zeros(dq.shape, dtype=torch.float32, device=dq.device)
    if not GLUON_BWD(sdpa_bwd_gluon.launch, dout, q, k, v, lse_k, delta, dq_sum, dk, dv,
                     gluon_plan, mask):
        return None
    return dq.copy_(dq_sum), dk, dv


def _dq_sum(dq, atomic):
    """Where the dK/dV kernel's DQ points: ``dq`` itself unless ``atomic``, else a zeroed fp32
    buffer shaped as the rank-5 dq that the atomic-dQ backward adds into (:func:`set_dq_mode`);
    the TMA variant (``atomic`` 2) builds its descriptors in a scratch buffer that this thread's
    Triton allocator provides."""
    if not atomic:
        return dq
    if atomic == 2:
        ensure_scratch_allocator()
    return torch.zeros(dq.shape, dtype=torch.float32, device=dq.device)


# ----------------------------------------------------------------------------- custom ops

@torch.library.custom_op("attention_oracle::sdpa_fwd", mutates_args=())
def _sdpa_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                 is_causal: bool, scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rank-5 forward: returns (out [Z1,Z2,Hq,L,Ev], the row statistics of
    :func:`_lse_state_shape`)."""
    return _launch_fwd(q, k, v, mask, is_causal, scale)


@_sdpa_fwd_op.register_fake
def _sdpa_fwd_fake(q, k, v, mask, is_causal, scale):
    out = q.new_empty(tuple(q.shape[:4]) + (v.shape[4],))
    width = max(q.shape[4], v.shape[4])
    return out, q.new_empty(_lse_state_shape(q.shape, q.dtype, width), dtype=torch.float32)


@torch.library.custom_op("attention_oracle::sdpa_bwd", mutates_args=())
def _sdpa_bwd_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 mask: Optional[torch.Tensor], out: torch.Tensor, lse_k: torch.Tensor,
                 is_causal: bool, scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank-5 backward: (dq, dk, dv) shaped like (q, k, v), contiguous."""
    return _launch_bwd(dout, q, k, v, mask, out, lse_k, is_causal, scale)


@_sdpa_bwd_op.register_fake
def _sdpa_bwd_fake(dout, q, k, v, mask, out, lse_k, is_causal, scale):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape))


def _setup_context(ctx, inputs, output):
    q, k, v, mask, is_causal, scale = inputs
    out, lse_k = output
    ctx.save_for_backward(q, k, v, mask, out, lse_k)
    ctx.is_causal, ctx.scale = is_causal, scale
    ctx.mark_non_differentiable(lse_k)


def _backward(ctx, dout, _dlse):
    q, k, v, mask, out, lse_k = ctx.saved_tensors
    if dout is None:
        return None, None, None, None, None, None
    dq, dk, dv = _sdpa_bwd_op(dout, q, k, v, mask, out, lse_k, ctx.is_causal, ctx.scale)
    return dq, dk, dv, None, None, None


_sdpa_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerSdpa(torch.autograd.Function):
    """The eager path: the same launches as the custom ops without their dispatch cost
    (torch.library's Python custom-op layers cost more than the kernels' own launches at small
    shapes); ``torch.compile`` traces the custom ops instead (:func:`_attention`).

    Takes the user's query, key and value and makes the rank-5 views inside, so autograd
    records this one node and no view nodes around it (each costs host time in the backward);
    the gradients come back shaped like the inputs, summed over broadcast dims."""

    @staticmethod
    def forward(ctx, query, key, value, mask5, is_causal, scale, geometry):
        (q, k, v), ctx.shapes = _rank5_operands(query, key, value, geometry)
        out5, lse_k = _launch_fwd(q, k, v, mask5, is_causal, scale)
        out = _from_rank5(out5, geometry[3])
        # out as returned (not its rank-5 view): saved as this node's output, it leads back to
        # query, key and value under create_graph=True (:func:`fast.guards.first_order_only`)
        ctx.save_for_backward(q, k, v, mask5, out, lse_k)
        ctx.is_causal, ctx.scale = is_causal, scale
        ctx.set_materialize_grads(False)  # lse's gradient stays None (no zeros made, filled)
        ctx.mark_non_differentiable(lse_k)
        return out, lse_k

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, mask, out, lse_k = ctx.saved_tensors
        if dout is None:
            return None, None, None, None, None, None, None
        _refuse_tangents((("dout", dout),))
        if dout.is_neg():
            dout, = resolved_neg(dout)
        grads = _launch_bwd(_to_rank5(_mergeable(dout), "dout"), q, k, v, mask,
                            _to_rank5(out, "out"), lse_k, ctx.is_causal, ctx.scale)
        grads = tuple(_grad_of_input(g, *shapes) for g, shapes in zip(grads, ctx.shapes))
        if torch.is_grad_enabled():  # create_graph=True
            grads = first_order_only("fast SDPA", grads, (out, dout))
        return (*grads, None, None, None, None)


def _grad_of_input(g5, shape, expanded_shape):
    """The gradient of an input of ``shape`` from that of its rank-5 view ``g5`` (contiguous)
    of the input broadcast to ``expanded_shape``: summed over the broadcast dims."""
    return _summed_to(_from_rank5(g5, expanded_shape), shape, expanded_shape)


def _summed_to(g, shape, expanded_shape):
    """A gradient of the broadcast shape summed to its input's shape (itself when equal)."""
    return g if expanded_shape == shape else g.sum_to_size(shape)


_OPERANDS = ("query", "key", "value")


def _rank5_operands(query, key, value, geometry):
    """(rank-5 views of query, key, value broadcast to the call's batch and head counts, and
    per operand its (input shape, broadcast shape)), after the kernels' int32 addressing
    checks."""
    batch, hq, hkv, _ = geometry
    expanded = (_expand_to(query, batch, hq), _expand_to(key, batch, hkv),
                _expand_to(value, batch, hkv))
    _check_tile_offsets(zip(_OPERANDS, expanded))
    views = tuple(_to_rank5(t, name) for t, name in zip(expanded, _OPERANDS))
    shapes = tuple((tuple(t.shape), tuple(x.shape))
                   for t, x in zip((query, key, value), expanded))
    return views, shapes


# ----------------------------------------------------------------------------- call plans

class _CallPlan:
    """What an unmasked eager call derives from its operands' shapes, strides, dtypes and
    devices and its flags, validation included: rank-5 strides of the broadcast operands, the
    output's and gradients' shapes, both kernels' launch keys and the arguments that do not
    change between such calls. Kept per call signature (:func:`_signature`), so a repeated call
    validates nothing and makes no views: the kernels read the caller's tensors through the
    saved strides (a broadcast or unsqueeze view has its base's data pointer)."""

    __slots__ = ("dtype", "device", "out_shape", "out5", "lse_shape", "fwd", "fwd_tail",
                 "bwd", "bwd_common", "bwd_scalars", "grad_shapes", "grad_tails", "pre_tail",
                 "rows", "gluon", "gluon_backends", "bound", "pre", "fuse", "atomic", "stacked",
                 "lse_scratch", "lse_stride", "bwd_rest", "gluon_bwd", "strides", "geometry",
                 "flags", "auto_atomic", "fp32_gluon")

    def __init__(self, q5, k5, v5, out_shape, shapes, is_causal, scale, strides, geometry):
        Z1, Z2, HQ, L, E = q5.shape
        EV = v5.shape[4]
        dtype = q5.dtype
        width = max(E, EV)
        natural = _natural(dtype, width)
        self.dtype, self.device, self.out_shape = dtype, q5.device, out_shape
        self.lse_shape = _lse_state_shape(q5.shape, dtype, width)
        self.lse_scratch = _lse_scratch(self.device, self.lse_shape)
        self.out5 = _contiguous_strides((Z1, Z2, HQ, L, EV))
        # Stats' row stride: every forward allocates them in this layout (or views the scratch
        # buffer in it)
        self.lse_stride = lse_stride = _contiguous_strides(self.lse_shape)[0]
        operands = (*q5.stride(), *k5.stride(), *v5.stride(), 0, 0, 0, 0, 0)
        kind, key, meta, sizes, grid, ints, factor, tunes = _fwd_plan(
            q5.shape, k5.shape, v5.shape, dtype, None, is_causal, natural, _precision(dtype, width),
            _fold(scale, dtype, False), _section(is_causal))
        self.fwd = (key, grid, sizes, meta)
        self.gluon = sdpa_fwd_gluon.plan((q5.shape, k5.shape, v5.shape),
                                         (q5.stride(), k5.stride(), v5.stride()), dtype,
                                         q5.device, is_causal, scale)
        self.gluon_backends = (frozenset() if self.gluon is None
                               else _gluon_backends(q5.shape, k5.shape, is_causal,
                                                    device=q5.device))
        self.fwd_tail = (*operands, *self.out5, lse_stride, *ints, scale * factor, *tunes)
        self.fuse = _fuse_bwd(natural, _precision(dtype, width), L, k5.shape[3],
                              HQ // k5.shape[2])
        # the Gluon fp32 dK/dV (dout checked per call; the Triton dK/dV without atomic dQ
        # where it fails)
        self.fp32_gluon = None
        if _fp32_gluon_dkdv(_precision(dtype, width), False, q5, k5, v5, None):
            self.fp32_gluon = ((q5.shape, k5.shape), (q5.stride(), k5.stride(), v5.stride()),
                               (is_causal, scale, scale * LOG2E))
        self.atomic = 0 if self.fp32_gluon else _atomic_dq(
            natural, _precision(dtype, width), self.fuse, E, q5.device,
            _auto_dq_shapes(q5.shape, k5.shape, False))
        # atomic by "auto" dQ mode's choice: a backward run after torch.use_deterministic_algorithms
        # was turned on takes the general path, which then picks the dQ kernel
        self.auto_atomic = bool(self.atomic) and _DQ_MODE.value == "auto"
        (_, key, meta, sizes, grid_kv, grid_q, ints, factor, tunes, pre_block,
         pre_grid, meta_q) = _bwd_plan(q5.shape, k5.shape, v5.shape, dtype, None, dtype, is_causal,
                               natural, _precision(dtype, width), interpreting(),
                               _fold(scale, dtype, True), self.fuse, self.atomic,
                               _section(is_causal))
        self.bwd = (key, key + (HQ // k5.shape[2],), grid_kv, grid_q, sizes, meta, pre_grid,
                    meta_q)
        self.bwd_common = operands
        self.bwd_scalars = (lse_stride, *ints, scale * factor, scale, *tunes)
        # dout's strides last seen, its rank-5 strides, the dK/dV and dQ non-tensor arguments
        self.bwd_rest = (None, None, None)
        self.gluon_bwd = (None, None)  # dout's strides last seen, the Gluon backward's plan
        self.pre_tail = (Z2, HQ, L, EV)
        self.pre = BoundLaunch(_PRE, pre_grid, {"BLOCK_M": pre_block, "BLOCK_EV": meta["BLOCK_EV"]})
        self.bound = [None, None, None]  # forward, dK/dV, dQ: BoundLaunch once tuned
        self.rows = (L, EV)
        # per operand: (input shape, broadcast shape); the gradient is allocated contiguous in
        # the broadcast shape, whose strides are those of its rank-5 view's contiguous layout
        self.grad_shapes = shapes
        self.grad_tails = tuple(_contiguous_strides(t.shape) for t in (q5, k5, v5))
        # equal gradient shapes (self-attention): one allocation, unbound into the three
        self.stacked = (3,) + shapes[0][1] if shapes[0][1] == shapes[1][1] == shapes[2][1] else None
        # the user's query, key and value strides (the signature's) and what the general
        # backward takes, for saved tensors that come back in another layout (:meth:`saved_as_made`)
        self.strides, self.geometry, self.flags = strides, geometry, (is_causal, scale)

    def forward(self, query, key, value, need_lse=True):
        """(out, row statistics); ``need_lse=False`` (nothing reads the statistics: a no_grad
        call of :func:`scaled_dot_product_attention`) writes them to a scratch buffer."""
        out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
        lse_k = self.lse_scratch
        if need_lse or lse_k is None:
            lse_k = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        if (_FWD_BACKEND.value in self.gluon_backends
                and GLUON_FWD(sdpa_fwd_gluon.launch, query, key, value, out, lse_k,
                              self.gluon, None, self.lse_stride)):
            return out, lse_k
        key_, grid, sizes, meta = self.fwd
        self._launch(0, _FWD, key_, grid, sizes, meta,
                     (query, key, value, query, out, lse_k), self.fwd_tail)
        return out, lse_k

    def backward(self, dout, query, key, value, out, lse_k):
        st = dout.stride()
        seen, dst, rest = self.bwd_rest
        if st != seen:
            dst = _dout_strides5(dout, self.rows)
            gq, gk, gv = self.grad_tails
            common = (*self.bwd_common, *dst)
            rest = ((*common, *gk, *gv, *self.bwd_scalars), (*common, *gq, *self.bwd_scalars))
            self.bwd_rest = (st, dst, rest)
        dkey, dkv_key, grid_kv, grid_q, sizes, meta, pre_grid, meta_q = self.bwd
        if self.stacked is not None:
            dq, dk, dv = torch.empty(self.stacked, dtype=self.dtype, device=self.device).unbind(0)
        else:
            dq, dk, dv = (torch.empty(x, dtype=self.dtype, device=self.device)
                          for _, x in self.grad_shapes)
        gluon_plan = self._gluon_bwd_plan(dout, dst)
        if (gluon_plan is not None
                and sdpa_fwd_gluon.aligned(query.data_ptr(), key.data_ptr(), value.data_ptr(),
                                           dout.data_ptr())
                and _launch_bwd_gluon(dout, query, key, value, out, lse_k, dq, dk, dv,
                                      gluon_plan,
                                      lambda delta: self.pre((out, dout, delta, *self.out5, *dst,
                                                              *self.pre_tail))) is not None):
            pass  # the Gluon kernel filled dq, dk, dv
        elif self.fuse:  # one launch: Delta and dQ inside the dK/dV kernel
            self._launch(1, _DKDV, dkv_key, grid_kv, sizes, meta,
                         (query, key, value, query, dout, lse_k, query, dk, dv, out, dq), rest[0])
        else:
            delta = torch.empty(pre_grid[1] * self.rows[0], dtype=torch.float32,
                                device=self.device)
            self.pre((out, dout, delta, *self.out5, *dst, *self.pre_tail))
            dq_sum = _dq_sum(dq, self.atomic)
            fp32 = self.fp32_gluon
            if not (fp32 is not None and sdpa_bwd_fp32_gluon.strides_apply(dst)
                    and GLUON_FP32_DKDV(sdpa_bwd_fp32_gluon.launch, query, key, value, dout,
                                        lse_k, delta, dk, dv, fp32[0],
                                        (*fp32[1], dst, *self.grad_tails[1:]), *fp32[2])):
                self._launch(1, _DKDV, dkv_key, grid_kv, sizes, meta,
                             (query, key, value, query, dout, lse_k, delta, dk, dv, query,
                              dq_sum), rest[0])
            if self.atomic:
                dq.copy_(dq_sum)
            else:
                self._launch(2, _DQ, dkey, grid_q, sizes, meta_q,
                             (query, key, value, query, dout, lse_k, delta, dq), rest[1])
        return tuple(_summed_to(g, *shapes) for g, shapes in zip((dq, dk, dv), self.grad_shapes))

    def saved_as_made(self, query, key, value, out, lse_k):
        """Whether the tensors autograd saved come back in the layout the forward made them:
        saved-tensor hooks may return copies in another one (``save_on_cpu(pin_memory=True)``
        copies each contiguous), whose strides this plan's launch arguments do not describe
        (docs/FINDINGS.md F50)."""
        return ((query.stride(), key.stride(), value.stride()) == self.strides
                and out.is_contiguous() and lse_k.is_contiguous())

    def backward_relaid(self, dout, query, key, value, out, lse_k):
        """:meth:`backward` for saved tensors in another layout (:meth:`saved_as_made`): the
        general launcher, which reads every tensor through its own strides."""
        (q5, k5, v5), shapes = _rank5_operands(query, key, value, self.geometry)
        grads = _launch_bwd(_to_rank5(dout, "dout"), q5, k5, v5, None, _to_rank5(out, "out"),
                            lse_k, *self.flags)
        return tuple(_grad_of_input(g, *s) for g, s in zip(grads, shapes))

    def _gluon_bwd_plan(self, dout, dst):
        """The Gluon backward's plan for a dout of rank-5 strides ``dst`` where the backward
        backend takes it (:func:`gluon_backward_takes`; None where it does not apply)."""
        if (self.gluon is None or dout.dtype != self.dtype
                or not gluon_backward_takes(self.gluon[0][0], self.gluon[0][1],
                                            self.gluon[2])):
            return None
        seen, gluon_plan = self.gluon_bwd
        if dst != seen:
            gluon_plan = sdpa_bwd_gluon.plan(self.gluon, dst, self.dtype,
                                             _section(self.gluon[2]))
            self.gluon_bwd = (dst, gluon_plan)
        return gluon_plan

    def _launch(self, i, launcher, key, grid, sizes, meta, tensors, rest):
        """This plan's launch ``i`` through ``launcher`` (a CachedLauncher) of ``tensors`` and
        the non-tensor arguments ``rest`` (one tuple per value, kept by the plan); once the key
        is tuned, through a BoundLaunch of it (the launch's grid and constexprs fixed)."""
        bound = self.bound[i]
        if bound is None:
            bound = launcher.bind(key, grid, sizes, meta)
            if bound is None:
                launcher(key, grid, tensors + rest, sizes, meta)
                return
            self.bound[i] = bound
        bound.fixed(tensors, rest)


# a no_grad forward's row statistics (written, never read) go to one never-freed buffer per
# device, viewed by each plan: its address stays valid for any CUDA graph that captured it
_LSE_SCRATCH_ELEMS = 16384
_LSE_SCRATCH = {}


def _lse_scratch(device, shape):
    """A view of ``device``'s scratch buffer shaped ``shape`` (float32), None when too large."""
    n = math.prod(shape)
    if n > _LSE_SCRATCH_ELEMS:
        return None
    buf = _LSE_SCRATCH.get(device)
    if buf is None:
        buf = _LSE_SCRATCH[device] = torch.empty(_LSE_SCRATCH_ELEMS, dtype=torch.float32,
                                                 device=device)
    return buf[:n].view(shape)


def _contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _dout_strides5(dout, rows):
    """The strides of ``dout``'s rank-5 view (arithmetic for ranks 3 to 5), after the kernels'
    int32 in-head addressing check."""
    st = dout.stride()
    r = len(st)
    if r > 5:
        st = _to_rank5(dout, "dout").stride()
    elif r < 5:
        st = (0,) * (5 - r) + st
    _check_span("dout", rows[0], rows[1], st[3], st[4])
    return st


_CALL_PLANS = {}
_MAX_CALL_PLANS = 1024


def _signature(query, key, value, dropout_p, is_causal, scale, enable_gqa):
    """Everything an unmasked call's validation and plan depend on (None for arguments of types
    the plan does not key on: such calls take the validating path every time). The layouts are
    in the key: a sparse COO tensor's ``stride()`` is all zeros, not an error, and would match
    a dense one broadcast along every dim (docs/FINDINGS.md F82); nested and mkldnn tensors
    raise in ``stride()`` and get None (validation names the argument). So is
    ``torch.use_deterministic_algorithms``'s flag: "auto" dQ mode takes atomic dQ only while it
    is off (:func:`set_dq_mode`)."""
    if not (scale is None or type(scale) in (float, int)) or type(dropout_p) not in (float, int):
        return None
    # the flags must be bools: 1 or 0.0 equal True and False, and would match their plans' keys
    # (docs/FINDINGS.md F55)
    if is_causal.__class__ is not bool or enable_gqa.__class__ is not bool:
        return None
    Tensor = torch.Tensor
    if not (isinstance(query, Tensor) and isinstance(key, Tensor) and isinstance(value, Tensor)):
        return None
    try:
        if query.is_neg() or key.is_neg() or value.is_neg():
            return None  # a negative-bit view: the general path resolves it (_attention)
        return (query.shape, key.shape, value.shape, query.stride(), key.stride(), value.stride(),
                query.dtype, key.dtype, value.dtype, query.device, key.device, value.device,
                query.layout, key.layout, value.layout, dropout_p, is_causal, scale, enable_gqa,
                _OPTIONS_KEY[0], torch.are_deterministic_algorithms_enabled())
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _validated(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """The validation prelude of every call, run once per call that is not served from a
    cached plan: the contract's input checks (``attention_oracle/validation.py``), then fast's
    own limits (device, head dims, a scale within float32's range). Returns
    ``(batch, hq, hkv, hv, scale)``."""
    checked = check_sdpa_inputs(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                enable_gqa, dtypes=FLOAT_DTYPES)
    check_device(query.device)
    _check_head_dims(query.shape[-1], value.shape[-1])
    check_scale("scale", checked[4])
    return checked


class _Unplanned(tuple):
    """The validated ``(batch, hq, hkv, hv, scale)`` of an unmasked call signature that the
    general path serves (no :class:`_CallPlan` covers it): cached like a plan, so such a call
    is validated once on first sight and never again."""

    __slots__ = ()


def _call_plan(query, key, value, dropout_p, is_causal, scale, enable_gqa):
    """The cached entry of an unmasked eager call, made (and the inputs validated, once) on
    first sight: its :class:`_CallPlan`; or an :class:`_Unplanned` (the validated geometry)
    where the general path must run (GQA key and value head counts that differ, an empty dim,
    batch dims that cannot be merged without a copy); or None for arguments the cache does not
    key on (the general path validates those). A refusal is never cached."""
    sig = _signature(query, key, value, dropout_p, is_causal, scale, enable_gqa)
    if sig is None:
        return None
    plan = _CALL_PLANS.get(sig)
    if plan is not None:
        return plan
    checked = _validated(query, key, value, None, dropout_p, is_causal, scale, enable_gqa)
    batch, hq, hkv, hv, scale = checked
    plan = _Unplanned(checked)
    L, S = query.shape[-2], key.shape[-2]
    if hkv == hv and L > 0 and S > 0 and len(batch) <= 2 and 0 not in batch and hq > 0:
        out_shape = tuple(batch) + (hq, L, value.shape[-1])
        (q5, k5, v5), shapes = _rank5_operands(query, key, value,
                                               (tuple(batch), hq, hkv, out_shape))
        _check_row_span(L, S, query.shape[-1], value.shape[-1], batch, hq)
        plan = _CallPlan(q5, k5, v5, out_shape, shapes, is_causal, scale, sig[3:6],
                         (tuple(batch), hq, hkv, out_shape))
    if len(_CALL_PLANS) >= _MAX_CALL_PLANS:
        _CALL_PLANS.clear()
    _CALL_PLANS[sig] = plan
    return plan


class _PlannedSdpa(torch.autograd.Function):
    """The eager autograd node of a planned call: the user's query, key and value in, out and
    the row statistics back; one node, gradients shaped like the inputs."""

    @staticmethod
    def forward(ctx, query, key, value, plan):
        out, lse_k = plan.forward(query, key, value)
        ctx.save_for_backward(query, key, value, out, lse_k)
        ctx.plan = plan
        ctx.set_materialize_grads(False)  # lse's gradient stays None (no zeros made, filled)
        ctx.mark_non_differentiable(lse_k)
        return out, lse_k

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return None, None, None, None
        _refuse_tangents((("dout", dout),))
        if dout.is_neg():
            dout, = resolved_neg(dout)
        plan, saved = ctx.plan, ctx.saved_tensors
        if (not plan.saved_as_made(*saved)
                or plan.auto_atomic and torch.are_deterministic_algorithms_enabled()):
            grads = plan.backward_relaid(_mergeable(dout), *saved)
        else:
            grads = plan.backward(_mergeable(dout), *saved)
        if torch.is_grad_enabled():  # create_graph=True
            grads = first_order_only("fast SDPA", grads, (*saved[:3], dout))
        return (*grads, None)


# autograd.Function's C apply, which Function.apply reaches after its Python steps (default
# arguments bound when setup_context is defined, functorch's checks); called straight where
# those steps change nothing: no functorch transform active and no functorch wrapper passed
_PLANNED_APPLY = torch._C._FunctionBase.__dict__["apply"].__get__(None, _PlannedSdpa)
_transforms_active = torch._C._are_functorch_transforms_active
_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)


def _apply_planned(query, key, value, plan):
    """``_PlannedSdpa.apply(query, key, value, plan)``, through the C apply when that is the
    same call (above)."""
    if (_wrapped is None or _transforms_active() or _wrapped(query) or _wrapped(key)
            or _wrapped(value)):
        return _PlannedSdpa.apply(query, key, value, plan)
    return _PLANNED_APPLY(query, key, value, plan)


# ----------------------------------------------------------------------------- public API

def scaled_dot_product_attention_with_lse(query, key, value, attn_mask=None, dropout_p=0.0,
                                          is_causal=False, scale=None, enable_gqa=False):
    """Like :func:`scaled_dot_product_attention`, also returning ``lse [..., Hq, L]`` (float32,
    natural log of the row sum of exp(scaled, masked scores), -inf for a row with no key).
    lse is not differentiable."""
    try:
        out, lse_k, out_shape = _attention(query, key, value, attn_mask, dropout_p, is_causal,
                                           scale, enable_gqa)
    except _RowsPastGrid as past:
        return _in_batch_chunks(scaled_dot_product_attention_with_lse, past, query, key, value,
                                attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return out, _lse_view(lse_k, out_shape)


# CUDA's limit on a grid's second dim, where the kernels put the flattened batch and heads
_MAX_GRID_Y = 65535


class _RowsPastGrid(NotImplementedError):
    """More batch x head rows than one launch's grid takes: the public functions split the
    call along its batch dims (:func:`_in_batch_chunks`). ``args``: (the message, the
    broadcast batch shape, the query heads); no ``__init__`` of its own, which torch.compile
    would not trace."""

    def __str__(self):
        return self.args[0]


def _check_row_span(L, S, E, EV, batch, hq):
    if max(L, S) * max(E, EV) > _INT32_MAX:  # the outputs/gradients are contiguous
        raise NotImplementedError(f"query/key: {max(L, S)} rows x head dim overflow the kernels' "
                                  f"int32 in-head addressing")
    rows = hq
    for n in batch:
        rows *= n
    if rows > _MAX_GRID_Y:  # checked on every device, so the result does not depend on one
        raise _RowsPastGrid(f"query: {rows} batch x head rows exceed the {_MAX_GRID_Y} programs "
                            f"a CUDA grid dim takes (the kernels' second grid dim)",
                            tuple(batch), hq)


def _batch_chunk_plan(batch, hq):
    """Where to split a call with more rows than a grid dim takes: ``(dim, size)``, the first
    batch dim longer than 1 and the chunk length along it that keeps a chunk's rows within
    :data:`_MAX_GRID_Y` (1 when even one index is too many: the chunk splits again further in).
    None when no batch dim is left to split (the query heads alone are too many)."""
    for dim, n in enumerate(batch):
        if n > 1:
            inner = hq
            for m in batch[dim + 1:]:
                inner *= m
            return dim, max(1, _MAX_GRID_Y // inner)
    return None


def _batch_slice(t, dim, start, length, rank):
    """``t`` narrowed to ``[start, start + length)`` along broadcast batch dim ``dim`` of a
    call whose broadcast operands have ``rank`` dims (t aligns from the right); a dim t lacks
    or broadcasts (size 1) is kept whole."""
    if t is None:
        return None
    d = dim - (rank - t.dim())
    if d < 0 or t.shape[d] == 1:
        return t
    return t.narrow(d, start, length)


def _in_batch_chunks(attention, past, query, key, value, attn_mask, *args):
    """``attention`` (a public function) over chunks of the batch that each fit one launch's
    grid, concatenated along the split dim; out (and lse) as one call would give them.
    Autograd sees the slices and the concatenation, so gradients flow to every input."""
    message, batch, hq = past.args
    split = _batch_chunk_plan(batch, hq)
    if split is None:
        raise NotImplementedError(message)
    dim, size = split
    rank = len(batch) + 3
    pieces = []
    for start in range(0, batch[dim], size):
        length = min(size, batch[dim] - start)
        pieces.append(attention(*(_batch_slice(t, dim, start, length, rank)
                                  for t in (query, key, value, attn_mask)), *args))
    if isinstance(pieces[0], tuple):
        return tuple(torch.cat(parts, dim) for parts in zip(*pieces))
    return torch.cat(pieces, dim)


def _needs_grad(query, key, value):
    """Whether autograd records this call (validated tensors only)."""
    return torch.is_grad_enabled() and (
        query.requires_grad or key.requires_grad or value.requires_grad)


def _refuse_tangents(named):
    """Under a forward-mode AD level (``forward_ad.dual_level``), refuse a tensor with a tangent
    by name: the kernels compute no Jacobian-vector product, and a result that carried none
    would read as a zero one (docs/FINDINGS.md F52)."""
    if forward_ad._current_level < 0:
        return
    for name, t in named:
        if isinstance(t, torch.Tensor) and forward_ad.unpack_dual(t).tangent is not None:
            raise NotImplementedError(f"{name}: forward-mode AD (a tangent made by "
                                      f"forward_ad.make_dual) is not implemented by fast SDPA")


def _attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
               need_lse=True):
    """Validates (once: :func:`_validated`, or nothing for a signature seen before), launches;
    returns (out, the kernels' row statistics, out's shape). Unmasked eager calls take their
    cached :class:`_CallPlan`; the rest the general path below. ``need_lse=False``: the caller
    reads no statistics of a call autograd does not record (they may go to a scratch buffer)."""
    compiling = torch.compiler.is_compiling()
    if forward_ad._current_level >= 0:
        _refuse_tangents((("query", query), ("key", key), ("value", value),
                          ("attn_mask", attn_mask)))
    checked = None
    if attn_mask is None and not compiling:
        plan = _call_plan(query, key, value, dropout_p, is_causal, scale, enable_gqa)
        if plan.__class__ is _CallPlan:
            if _needs_grad(query, key, value):
                out, lse_k = _apply_planned(query, key, value, plan)
            else:
                out, lse_k = plan.forward(query, key, value, need_lse)
            return out, lse_k, plan.out_shape
        checked = plan  # the validated geometry of a signature no plan covers, or None
    if checked is None:
        checked = _validated(query, key, value, attn_mask, dropout_p, is_causal, scale,
                             enable_gqa)
    batch, hq, hkv, hv, scale = checked
    if not compiling and (query.is_neg() or key.is_neg() or value.is_neg()
                          or (attn_mask is not None and attn_mask.is_neg())):
        query, key, value, attn_mask = resolved_neg(query, key, value, attn_mask)
    if hkv != hv:
        key, value, hkv = _common_kv_heads(key, value, hkv, hv)
    L, S, E = query.shape[-2], key.shape[-2], query.shape[-1]
    mask5 = None
    if attn_mask is not None:
        mask5 = _to_rank5(attn_mask.expand(batch + (hq, L, S)), "attn_mask")
        _check_tile_offsets((("attn_mask", mask5),))
    _check_row_span(L, S, E, value.shape[-1], batch, hq)
    out_shape = tuple(batch) + (hq, L, value.shape[-1])
    geometry = (tuple(batch), hq, hkv, out_shape)
    if not compiling and _needs_grad(query, key, value):
        out, lse_k = _EagerSdpa.apply(query, key, value, mask5, is_causal, scale, geometry)
        return out, lse_k, out_shape
    (q5, k5, v5), _ = _rank5_operands(query, key, value, geometry)
    launch = _sdpa_fwd_op if compiling else _launch_fwd
    out5, lse_k = launch(q5, k5, v5, mask5, is_causal, scale)
    return _from_rank5(out5, out_shape), lse_k, out_shape


def _lse_view(lse_k, out_shape):
    """Natural-log lse shaped [..., Hq, L], a tensor of its own (the kernels' buffer is saved
    for the backward)."""
    lse = lse_k[STATS_LSE].clone()
    if len(out_shape) == 3:
        return lse.squeeze(1).squeeze(0)
    if len(out_shape) == 4:
        return lse.squeeze(0)
    if len(out_shape) == 5:
        return lse
    return lse.view(out_shape[:-1])


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """Triton flash attention with exactly PyTorch's SDPA semantics (dropout_p must be 0).

    query [..., Hq, L, E], key [..., Hkv, S, E], value [..., Hkv, S, Ev] -> out [..., Hq, L, Ev].
    See the module docstring for masks, GQA, causal alignment and empty-row conventions."""
    try:
        out, _, _ = _attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                               enable_gqa, need_lse=False)
    except _RowsPastGrid as past:
        return _in_batch_chunks(scaled_dot_product_attention, past, query, key, value, attn_mask,
                                dropout_p, is_causal, scale, enable_gqa)
    return out
