"""DSA sparse attention as Triton kernels for Hopper and the CPU interpreter (docs/CONTRACT.md "3. DSA sparse attention").

Public functions (docs/CONTRACT.md "1. Surface and signatures"): ``dsa_sparse_attention_nope``, ``dsa_sparse_attention``
and their ``_varlen`` forms. Shapes:

- NoPE: q [T, H, D], kv [S, D] or [S, 1, D]; values are the kv rows (Dv = D).
- RoPE: q_latent [T, H, Dl], q_rope [T, H, Dr], kv_latent [S, Dl] or [S, 1, Dl],
  k_rope [S, Dr] or [S, 1, Dr]; values are the kv_latent rows (Dv = Dl).
- indices [T, K] int32/int64 global key rows; slot s of row t is valid iff
  0 <= indices[t, s] < S and s < topk_length[t] (when given). Duplicates count.
- out [T, H, Dv] in the input dtype; lse [T, H] float32, natural log, -inf for an empty row.

Every input may be a strided view (q_rope a channel slice of a wider buffer, key rows packed
in one [S, 576] buffer); the kernels read through strides. Gradients flow through autograd:
dq (dq_latent, dq_rope) and dkv (dkv_latent, dk_rope) accumulated in fp32 (the key gradients
in fp64 for fp32 inputs), dq deterministic.

fp32 inputs take one of four paths (``set_fp32_mode`` / ``$ATTENTION_ORACLE_FAST_DSA_FP32``):

- "acc64": natural-unit scores from fp64-accumulated dots rounded once, an
  accurate exponential, every later product an fp64 dot (``KernelConfig.acc64``);
- "tf32x3": every dot (scores, dP, P.V, dS.K, the key-gradient products) as three TF32
  tensor-core products (``tl.dot(input_precision="tf32x3")``: a = big + small with
  big = tf32(a), a.b ~ big.big + big.small + small.big, as PyTorch's fp32 EFFICIENT attention
  computes), fp32 operands straight from memory, each slot block's P.V and dS.K summed apart;
  the scores fl(dot * scale) in natural units, the exponential, l and dS in fp64, lse =
  m + log(l) as in "acc64";
- "tf32x3_exp2": the same dots with the 16-bit kernels' softmax (log2-unit scores, exp2,
  Delta summed in fp64);
- "bf16x6" (the default): every product split-bf16 on the bf16 tensor cores (each fp32 operand split
  exactly into three bf16 parts, a = a0 + a1 2^-8 + a2 2^-16 with the lower parts kept
  scaled up so that the split stays exact down to fp32's smallest normals (F45), and a.b
  the six part products with i + j <= 2, each exact, summed in the tensor cores' fp32
  accumulator by their scales; kernels/dsa_common.py),
  the "acc64" softmax (natural-unit scores fl(dot * scale), exponentials and sums in fp64,
  lse = m + log(l)), the naive algorithm in separate launches with the scores (forward) and
  dS (backward) passing through a scratch buffer of at most 1 GiB (tokens in passes), beside a
  [3, S, Dl + Dr] bf16 copy of the key rows' parts (``_forward_bf16x6``, ``_launch_bwd_bf16x6``).

The key gradients are summed in fp64 atomics in every fp32 mode. The CPU interpreter computes
tf32x3 dots in plain fp32 (tests/fast/tf32x3_emulation.py emulates the GPU's split), and
bf16x6's part products as fp32 dots of the same bf16 values (it computes bf16 dots wrongly).
The varlen forms run :func:`fast.index.offset_gather_kv_indices` (one launch, no host sync)
and then the global kernel with the returned lengths.
"""
import functools
from dataclasses import dataclass

import torch
from triton.runtime.errors import OutOfResources

from ..validation import FLOAT_DTYPES, check_dsa_inputs, check_flags, key_rows
from .guards import first_order_only, resolved_neg
from .host import Choice, cdiv, check_device, check_scale, next_pow2, slot_offsets_pass_int32
from .index import _multiprocessors, offset_rows, pdl_on
from .kernels import dsa_bwd_gluon, dsa_fwd_gluon
from .kernels.dsa_bwd import (
    dsa_bwd_kernel,
    dsa_fp32_bwd_dq_kernel,
    dsa_fp32_bwd_scores_kernel,
    dsa_fp32_delta_kernel,
)
from .kernels.dsa_fwd import dsa_fp32_pv_kernel, dsa_fp32_scores_kernel, dsa_fwd_kernel
from .kernels.slot_order import slot_order_kernel
from .launch import BuildGuard, DirectLauncher

FP32_MODES = ("acc64", "tf32x3", "tf32x3_exp2", "bf16x6")
_FP32 = Choice("ATTENTION_ORACLE_FAST_DSA_FP32", FP32_MODES, "bf16x6")
FWD_BACKENDS = ("triton", "gluon")
_FWD_BACKEND = Choice("ATTENTION_ORACLE_FAST_DSA_FWD", FWD_BACKENDS, "gluon")
BWD_BACKENDS = ("triton", "gluon")
_BWD_BACKEND = Choice("ATTENTION_ORACLE_FAST_DSA_BWD", BWD_BACKENDS, "gluon")
# the slot order (kernels/slot_order.py): "off", "backward" (the backward's rows ordered before
# its launch) or "on" (the default: the forward's rows ordered, and kept for the backward; on
# an H100 packed_glm_a's forward 422-426 -> 434-444 TFLOP/s queued in three alternated rounds,
# the backward 157 -> 214, the ordering's 0.41 ms included; docs/FINDINGS.md F96)
ORDERS = ("off", "backward", "on")
_ORDER = Choice("ATTENTION_ORACLE_FAST_DSA_ORDER", ORDERS, "on")
# the ordering kernel's form (kernels/slot_order.py): "network" (the row sorted by the whole
# network unrolled: 0.58-0.60 ms on 16k x 2048 slots on an H100), "loop" (the same rows, the
# stages past a thread's registers in a loop: 0.41-0.43 ms) or "runs" (another order: the
# row's slots s = lane (mod LANES) sorted a run of RUN_KEYS each, interleaved rank by rank:
# 0.27-0.28 ms, but packed_glm_a's backward 199.5 against the sorted rows' 209.7, F97). Two
# settings: the form of calls that record no backward (default "loop"; "runs" put
# packed_glm_a's forward 1-2% ahead of "loop" in alternated rounds on an H100,
# docs/PERFORMANCE.md, and becomes the default once the suite passes under it on the GPU), and
# the backward's form (default "loop"), in which a call that records a backward orders its
# rows once, before its forward; the backward orders them again only where they are in
# another order (the setting changed between the steps)
ORDER_FORMS = ("network", "loop", "runs")
_ORDER_FORM = Choice("ATTENTION_ORACLE_FAST_DSA_ORDER_FORM", ORDER_FORMS, "loop")
_BACKWARD_ORDER_FORM = Choice("ATTENTION_ORACLE_FAST_DSA_BACKWARD_ORDER_FORM", ORDER_FORMS, "loop")
_ROWS_OF = {"network": "sorted", "loop": "sorted", "runs": "runs"}  # the order a form writes
RUN_KEYS = 64
# calls ordered: at least ORDER_MIN_SLOTS slots (T * K; below it the launch's host time is not
# repaid), at most ORDER_MAX_K a row (one sort a program), and key rows (latent and rope) of
# more bytes than ORDER_MIN_KEY_BYTES (None: the device's L2; rows the L2 holds gain nothing,
# doc_16384's 19 MB lost 1% of the backward to the ordering); ORDER_CONCURRENCY the programs
# resident at once that the pivot assumes (None: the device's multiprocessors, one DSA
# program an SM)
ORDER_MIN_SLOTS = 1 << 22
ORDER_MAX_K = 4096
ORDER_MIN_KEY_BYTES = None
ORDER_CONCURRENCY = None
ORDER_MAX_S = 1 << 30  # the ordering kernel sorts keys as (key - pivot) mod 2**30
# the Gluon kernels, turned off for the process if they fail to build on this Triton
GLUON_FWD = BuildGuard("fast.dsa's Gluon forward (kernels/dsa_fwd_gluon.py)")
GLUON_BWD = BuildGuard("fast.dsa's Gluon backward (kernels/dsa_bwd_gluon.py)")


def set_forward_backend(backend):
    """The 16-bit forward kernel of later calls: "triton" (every input) or "gluon" (the
    Hopper warp-specialised kernel of :mod:`fast.kernels.dsa_fwd_gluon` wherever it applies:
    sm_90, fp16/bf16, H a multiple of 64, a 512-wide latent and a 64-wide rope part or none,
    unit channel strides and other strides multiples of 16 elements, 16-byte aligned data;
    other calls keep the Triton kernel; H200: 1.35-1.49x the Triton forward on the
    production problems, docs/PERFORMANCE.md "DSA, bf16"; a forward tile put first by
    ``set_configs`` keeps the Triton kernel, so tile sweeps time what they name). Default:
    $ATTENTION_ORACLE_FAST_DSA_FWD or "gluon". Returns the previous backend."""
    return _FWD_BACKEND.set(backend)


def set_backward_backend(backend):
    """The 16-bit backward kernel of later calls: "triton" (every input) or "gluon" (the
    Hopper warp-specialised kernel of :mod:`fast.kernels.dsa_bwd_gluon` wherever it applies:
    the forward's conditions, with out and dout as q); a backward tile put first by
    ``set_configs`` keeps the Triton kernel. H100: 1.5-2.1x the Triton backward on the
    production problems (docs/PERFORMANCE.md "DSA, bf16"). Default:
    $ATTENTION_ORACLE_FAST_DSA_BWD or "gluon". Returns the previous backend."""
    return _BWD_BACKEND.set(backend)


def set_fp32_mode(mode):
    """The fp32 path of later calls, one of ``FP32_MODES`` (module docstring); returns the
    previous mode. Default: $ATTENTION_ORACLE_FAST_DSA_FP32 or "bf16x6"."""
    return _FP32.set(mode)


def set_slot_order(order):
    """Where later calls order their slots, one of ``ORDERS``; returns the previous setting.
    Default: $ATTENTION_ORACLE_FAST_DSA_ORDER or "on"."""
    return _ORDER.set(order)


def set_slot_order_form(form, step="forward"):
    """The ordering kernel's form in later calls, one of ``ORDER_FORMS`` ("network" and
    "loop" give the same rows, "runs" another order of the same keys), for `step`: "forward"
    (calls that record no backward) or "backward" (the backward's rows: under "on" a call that
    records a backward orders its rows in this form before its forward, and the backward keeps
    them). Returns the previous form. Defaults: $ATTENTION_ORACLE_FAST_DSA_ORDER_FORM or "loop"
    (forward), $ATTENTION_ORACLE_FAST_DSA_BACKWARD_ORDER_FORM or "loop" (backward)."""
    forms = {"forward": _ORDER_FORM, "backward": _BACKWARD_ORDER_FORM}
    if step not in forms:
        raise ValueError(f"step: 'forward' or 'backward', got {step!r}")
    return forms[step].set(form)


def settings():
    """The process-wide options later calls run under, by name (what a benchmark records
    beside its figures)."""
    return {"forward_backend": _FWD_BACKEND.value, "backward_backend": _BWD_BACKEND.value,
            "fp32_mode": _FP32.value, "slot_order": _ORDER.value,
            "slot_order_form": _ORDER_FORM.value,
            "backward_slot_order_form": _BACKWARD_ORDER_FORM.value,
            "prefetch_ahead": {"forward": dsa_fwd_gluon.PREFETCH,
                               "backward": dsa_bwd_gluon.PREFETCH}}


def _bf16x6(dtype):
    """Whether inputs of this dtype take the "bf16x6" launches."""
    return dtype == torch.float32 and _FP32.value == "bf16x6"


def _fp32_tc(dtype):
    """The kernels' FP32_TC for inputs of this dtype: 0 (no tensor-core fp32 path), 1
    ("tf32x3"), 2 ("tf32x3_exp2")."""
    if dtype != torch.float32:
        return 0
    return {"tf32x3": 1, "tf32x3_exp2": 2}.get(_FP32.value, 0)


_ONE_TILE_MAX = 512  # widest latent kept as one register tile (Dl = 512 production path)
_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes of one launch; ``block_dv`` is the latent chunk a program owns."""
    block_h: int
    block_k: int
    block_d: int
    block_dv: int
    num_warps: int
    num_stages: int
    dkv_transposed: bool = False  # backward: compute dkv^T = q^T dS + dO^T P (less shared memory)
    # 16-bit only: the score dots' results go through dsa_common.chain_break, so each warpgroup
    # computes its own slot columns instead of both computing the whole score tile (forward:
    # 1 = a branch after each score dot, 2 = latent and rope dots first, then one branch)
    split_scores: int = 0
    # backward, chunked tiles: the latent in two halves (owned chunk + the other), both gathered
    # in the slot loop itself (no inner chunk loop, so the slot loop is software-pipelined)
    halves: bool = False
    # fp32 inputs in "acc64" mode only: every product of the slot loop as an fp64 dot (fp64
    # tensor cores) with fp64 accumulators (forward P.V, backward dq, dkv); others ignore it
    acc64: bool = False
    # 32-bit slot counts, index compares and row offsets where the inputs allow
    # (``_int32_rows``: int32 indices, element offsets of the key buffers below 2**31)
    int32_rows: bool = False
    # forward: the slot loop runs at least once (an empty row runs one all-invalid block), so
    # the compiled loop has no zero-trip path; with one, ptxas serialises every wgmma of the
    # split 2-stage forward (warning C7515; docs/DESIGN.md "11. fast DSA (Triton)", docs/FINDINGS.md F19)
    no_zero_trip: bool = False
    # backward: a 1-D grid with the programs of one token (latent chunks, head blocks)
    # adjacent, so the second gather of the same key rows finds them in L2
    token_major: bool = False
    # backward: the rope gradients (dq_rope, dk_rope) computed by chunk 0 only, behind a
    # run-time branch (the other chunks computed and masked them)
    rope_owner: bool = False
    # gathers masked by slot validity alone where the tiles divide the widths (``_even_d``)
    even_d: bool = False

    def one_tile(self, dl):
        return self.block_dv >= dl and self.block_d >= dl


def _pow2(n, lo=16):
    return max(lo, next_pow2(max(int(n), 1)))


def _two_chunks(cfg, dl):
    """Whether the backward's latent splits into exactly two owned chunks (HALVES path)."""
    chunk = min(cfg.block_dv, _pow2(dl))
    return chunk < dl <= 2 * chunk


# fp32 on the GPU (both kinds), fastest first (H200, Triton 3.6, H 64, 512 + 64 / 512, top-k
# 2048, doc_4096, synced TFLOP/s; docs/PERFORMANCE.md "DSA, fp32"): forward 14.2 / 14.0,
# backward 7.5 / 6.0; the last entry is the config fp32 ran before (2.5 / 2.3), for a GPU that
# refuses the others
FP32_CONFIGS = {
    "forward": (KernelConfig(64, 16, 64, 256, 8, 2, acc64=True),
                KernelConfig(32, 16, 64, 512, 8, 2, acc64=True),
                KernelConfig(16, 16, 32, 64, 4, 1)),
    "backward": (KernelConfig(32, 16, 64, 256, 8, 1, acc64=True),
                 KernelConfig(32, 16, 64, 128, 8, 2, acc64=True),
                 KernelConfig(16, 16, 32, 64, 4, 1)),
}


# fp32 in the "tf32x3" modes on the GPU, fastest first (H200, Triton 3.6, H 64, 512 + 64 / 512,
# top-k 2048, doc_4096, synced TFLOP/s; docs/PERFORMANCE.md "DSA, fp32"): forward 32
# heads, the whole 512 value width (scores once per head) 9.65; backward 32 heads, 256-wide
# latent chunks, 2 stages 7.57 (128-wide chunks: 4.54). Chunked tiles only (the one-tile fp32
# forward spilled 2.5-14 KB offline); 64-head tf32x3 forward tiles (wgmma) gave garbage on
# Triton 3.6 (relative error 3e32) and are not offered. The last entry for a GPU that refuses
# the others.
TF32X3_CONFIGS = {
    "forward": (KernelConfig(32, 16, 64, 512, 8, 2),
                KernelConfig(16, 16, 32, 64, 4, 1)),
    "backward": (KernelConfig(32, 16, 64, 256, 8, 2),
                 KernelConfig(32, 16, 64, 128, 8, 2),
                 KernelConfig(16, 16, 32, 64, 4, 1)),
}


@functools.lru_cache(maxsize=256)
def candidate_configs(h, dl, *, backward, device_type, fp32=False, tc32=False):
    """Tile configs to try in order for H heads and latent width dl.

    The first that fits the GPU's shared memory is used (and remembered); the CPU
    interpreter takes small tiles. ONE_TILE configs (whole latent in one tile) come first
    for dl <= 512; the chunked ones work for any width.

    fp32 inputs (both kinds) take ``FP32_CONFIGS`` on the GPU: ``acc64`` configs (every
    product an fp64 dot on the fp64 tensor cores) with the latent in 64-wide fp64 score pieces
    and 256 / 512-wide value or latent chunks, 16 slots per block. The 16-bit one-tile configs
    do not suit fp32 (offline sm_90a: backward 64 heads one tile 13 KB of spills at Dl 512; a
    64-head one-tile backward gave an illegal address on the H200 for H = 128, Dl = 64), nor
    did fp32 one-tile acc64 tiles (H200, Triton 3.6: forward 16 heads 9.6 vs 14.2 TFLOP/s,
    backward refused for shared memory). On the CPU fp32 takes acc64 too, so the
    interpreter checks the GPU's arithmetic.

    ``tc32`` (fp32 in a "tf32x3" mode) takes ``TF32X3_CONFIGS`` on the GPU, the 16-bit CPU tiles
    on the CPU.
    """
    block_h = min(64, _pow2(h))
    latent = _pow2(dl)
    one = latent <= _ONE_TILE_MAX
    if device_type != "cuda":
        chunk = latent if one else 256
        lean = not fp32 and not backward  # the 16-bit GPU forward's switches, checked here too
        return (KernelConfig(block_h, 16, latent if one else 64, chunk, 4, 1,
                             acc64=fp32 and not tc32, int32_rows=lean, no_zero_trip=lean),)
    if tc32:
        return TF32X3_CONFIGS["backward" if backward else "forward"]
    if fp32:
        return FP32_CONFIGS["backward" if backward else "forward"]
    if backward:
        # measured on H200 (docs/DESIGN.md "11. fast DSA (Triton)"): for 64-head blocks and a latent
        # of two 256-wide chunks (the production 512), both halves gathered in the slot loop
        # with unchained score dots (halves, split_scores) beat the inner chunk loop: BLOCK_K
        # 64 124.2, BLOCK_K 32 108.9, chunk loop 91.0 TFLOP/s synced on doc_16384 (only the
        # 64-head block was run natively). Before that (docs/DESIGN.md "11. fast DSA (Triton)"): the 64-head latent split in two
        # 256-wide chunks with transposed dkv was fastest; 32-head one-tile close. The 64-head
        # one-tile config with transposed dkv gave wrong dkv and an illegal address
        # (Triton 3.6, heavy spills): it is not offered. (For Dl <= 256 the first config is one
        # tile all the same, BLOCK_DC being capped at the latent; in 16-bit it stays under
        # 500 B of spills there and passed the suite natively.)
        # Then (docs/DESIGN.md "11. fast DSA (Triton)", docs/FINDINGS.md F19) the BLOCK_K 64 halves config with 32-bit
        # index math, a token's two programs adjacent and the rope gradients in chunk 0 only:
        # 139.4 vs 124.2 (doc_16384), 119.7 vs 108.5 (packed_glm_a) TFLOP/s synced.
        halves = ((KernelConfig(64, 64, 64, 256, 8, 1, True, split_scores=True, halves=True,
                                int32_rows=True, token_major=True, rope_owner=True),
                   KernelConfig(64, 32, 64, 256, 8, 1, True, split_scores=True, halves=True))
                  if block_h == 64 and 256 < dl <= 512 else ())
        return halves + (KernelConfig(block_h, 32, 64, 256, 8, 3, True),
                         KernelConfig(min(block_h, 32), 32, latent, latent, 8, 3, True) if one
                         else KernelConfig(min(block_h, 32), 32, 64, 128, 8, 3, True),
                         KernelConfig(min(block_h, 32), 16, 64, 128, 4, 1),
                         KernelConfig(16, 16, 32, 64, 4, 1))
    # one tile: unchained score dots first (each warpgroup its own slot columns; H200,
    # doc_16384: 276.8 vs 208.3 TFLOP/s synced, docs/PERFORMANCE.md "Tile switches"), with 32-bit
    # index math and a slot loop free of a zero-trip path (docs/DESIGN.md "11. fast
    # DSA (Triton)": 339.3 vs 274.2 doc_16384, 298.8 vs 249.2 packed_glm_a TFLOP/s synced)
    first = (KernelConfig(block_h, 64, latent, latent, 8, 2, split_scores=1, int32_rows=True,
                          no_zero_trip=True),
             KernelConfig(block_h, 64, latent, latent, 8, 2, split_scores=1),
             KernelConfig(block_h, 64, latent, latent, 8, 2),
             KernelConfig(block_h, 32, latent, latent, 8, 1)) if one else ()
    return first + (KernelConfig(block_h, 32, 64, 256, 8, 1),
                    KernelConfig(min(block_h, 32), 16, 64, 128, 4, 1),
                    KernelConfig(16, 16, 32, 64, 4, 1))


_OVERRIDES = {"forward": None, "backward": None}
_FITTING = {}  # (kind, device, dtype, fp32 mode, H, DL, DR) -> index of the first candidate that launched


def set_configs(*, forward=None, backward=None):
    """Tries these tile configs first in later launches (None restores the defaults)."""
    _OVERRIDES["forward"], _OVERRIDES["backward"] = forward, backward
    _FITTING.clear()


def _launch_first_fitting(kind, q, dr, launch, config):
    """Runs launch(cfg) for the first candidate whose kernel fits this GPU.

    Triton raises OutOfResources before the kernel starts, so a refused config wrote nothing.
    """
    T, H, DL = q.shape
    if config is not None:
        return launch(config)
    candidates = candidate_configs(H, DL, backward=kind == "backward", device_type=q.device.type,
                                   fp32=q.dtype == torch.float32, tc32=_fp32_tc(q.dtype) > 0)
    if _OVERRIDES[kind] is not None:
        candidates = (_OVERRIDES[kind],) + candidates
    key = (kind, str(q.device), q.dtype, _FP32.value, H, DL, dr)
    for i in range(_FITTING.get(key, 0), len(candidates)):
        try:
            launch(candidates[i])
        except OutOfResources:
            continue
        _FITTING[key] = i
        return
    raise NotImplementedError(f"fast DSA {kind}: no tile config fits this GPU for H={H}, "
                              f"Dl={DL}, Dr={dr}")


# ----------------------------------------------------------------------------- validation

def _validate(q, q_rope, kv, k_rope, indices, topk_length, softmax_scale, rope):
    """The contract's checks (attention_oracle/validation.py), fast's device and a scale within
    float32's range; returns (kv [S, Dl] view, k_rope [S, Dr] view or None, scale)."""
    checked = check_dsa_inputs(q, q_rope, kv, k_rope, indices, topk_length, softmax_scale,
                               rope=rope, dtypes=FLOAT_DTYPES)
    check_device(q.device)
    check_scale("softmax_scale", checked[2])
    return checked


# ----------------------------------------------------------------------------- launches

def _precision(dtype):
    """The dots' input_precision: fp32 IEEE dots ("acc64" mode; its fp64 dots ignore it) or
    3xTF32 (the "tf32x3" modes); 16-bit operands ignore it."""
    if dtype != torch.float32:
        return "tf32"
    return "tf32x3" if _fp32_tc(dtype) > 0 else "ieee"


def _acc64(cfg, dtype):
    return cfg.acc64 and dtype == torch.float32 and _fp32_tc(dtype) == 0


def _strides3(x):
    return x.stride(0), x.stride(1), x.stride(2)


def _int32_rows(indices, kv, k_rope, dl, dr):
    """Whether the kernels may count slots and address key rows in int32: int32 indices
    (int64 ones could hold values past 2**31 that a cast would wrap into range) and every
    element offset row * stride + column of kv, k_rope and the [S, Dl] / [S, Dr] gradient
    buffers below 2**31."""
    if indices.dtype != torch.int32:
        return False
    rows = kv.shape[0]
    strides = [kv.stride(0), dl, dr] + ([k_rope.stride(0)] if k_rope is not None else [])
    cols = [dl * kv.stride(1), dl, dr] + ([dr * k_rope.stride(1)] if k_rope is not None else [])
    return rows * max(strides) + max(cols) < 2 ** 31


def _even_d(dl, dr, *blocks, block_dr, rope=False):
    """Whether every latent tile width in ``blocks`` divides dl and the rope tile is dr (or
    there is no rope), so no gathered column lies past the widths (the kernels' EVEN_D). A rope
    part of width 0 is rope: its tile gathers block_dr columns of none (docs/FINDINGS.md F43)."""
    return all(dl % b == 0 for b in blocks) and (dr == block_dr or not rope and dr == 0)


# the compiled kernels' own launchers after Triton's first launch (fast/launch.py); n_tensors:
# the kernels' leading pointer arguments
_FWD_LAUNCH = DirectLauncher(dsa_fwd_kernel, n_tensors=8)
_BWD_LAUNCH = DirectLauncher(dsa_bwd_kernel, n_tensors=13)


def _rope_args(q_rope, k_rope, q):
    """Kernel args for the rope operands; NoPE passes q itself with width 0."""
    if q_rope is None:
        return q, q, 0, (0, 0, 0), (0, 0)
    return q_rope, k_rope, q_rope.shape[2], _strides3(q_rope), (k_rope.stride(0), k_rope.stride(1))


def _forward(q, q_rope, kv, k_rope, indices, topk_length, scale, config=None):
    if _bf16x6(q.dtype):
        return _forward_bf16x6(q, q_rope, kv, k_rope, indices, topk_length, scale, config)
    T, H, DL = q.shape
    out = torch.empty((T, H, DL), dtype=q.dtype, device=q.device)
    lse = torch.empty((T, H), dtype=torch.float32, device=q.device)
    if T == 0 or H == 0:
        return out, lse
    if kv.shape[0] == 0 or indices.shape[1] == 0:  # no key: every row is empty
        return out.zero_(), lse.fill_(float("-inf"))
    # a Triton tile asked for (``config``, ``set_configs``) runs on the Triton forward
    if (_FWD_BACKEND.value == "gluon" and config is None and _OVERRIDES["forward"] is None
            and dsa_fwd_gluon.applies(q, q_rope, kv, k_rope, indices)
            and GLUON_FWD(dsa_fwd_gluon.launch, q, q_rope, kv, k_rope, indices, topk_length,
                          scale, out, lse)):
        return out, lse
    qr, kr, DR, sqr, skr = _rope_args(q_rope, k_rope, q)
    use_pdl = pdl_on(q.device)
    pdl_kw = {"launch_pdl": True} if use_pdl else {}

    def launch(cfg):
        grid = (T, cdiv(H, cfg.block_h), cdiv(DL, cfg.block_dv))
        _FWD_LAUNCH[grid](
            q, qr, kv, kr, indices, topk_length if topk_length is not None else indices, out, lse,
            H, kv.shape[0], indices.shape[1], DL, DR,
            *_strides3(q), *sqr, kv.stride(0), kv.stride(1), *skr,
            indices.stride(0), indices.stride(1), *_strides3(out),
            scale, scale * _LOG2E,
            HAS_ROPE=q_rope is not None, HAS_LEN=topk_length is not None,
            ONE_TILE=cfg.one_tile(DL), BLOCK_H=cfg.block_h, BLOCK_K=cfg.block_k,
            BLOCK_D=min(cfg.block_d, _pow2(DL)), BLOCK_DV=min(cfg.block_dv, _pow2(DL)),
            BLOCK_DR=_pow2(DR), PRECISION=_precision(q.dtype), PDL=use_pdl,
            SPLIT_S=int(cfg.split_scores), ACC64=_acc64(cfg, q.dtype), FP32_TC=_fp32_tc(q.dtype),
            I32=cfg.int32_rows and _int32_rows(indices, kv, k_rope, DL, DR),
            NO_ZERO_TRIP=cfg.no_zero_trip,
            EVEN_D=cfg.even_d and _even_d(DL, DR, min(cfg.block_d, _pow2(DL)),
                                          min(cfg.block_dv, _pow2(DL)), block_dr=_pow2(DR),
                                          rope=q_rope is not None),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_kw,
        )

    _launch_first_fitting("forward", q, DR, launch, config)
    return out, lse


def _backward(q, q_rope, kv, k_rope, indices, topk_length, out, lse, dout, scale, config=None):
    """Returns (dq, dq_rope | None, dkv, dk_rope | None); dout is read through its strides."""
    T, H, DL = q.shape
    S = kv.shape[0]
    qr, kr, DR, sqr, skr = _rope_args(q_rope, k_rope, q)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    # fp32 inputs: the key gradients are summed in fp64 (a key named by many slots, heads and
    # queries takes thousands of atomic adds; in fp32 their rounding alone exceeded the rule:
    # H 128, K 512 duplicates of one key, ratio 1.48), rounded once at the end
    acc_dtype = torch.float64 if q.dtype == torch.float32 else torch.float32
    dkv_acc = torch.zeros((S, DL), dtype=acc_dtype, device=q.device)
    if q_rope is None:  # the kernel never touches the rope gradients; pass real buffers
        dqr, dkr_acc = dq, dkv_acc
    else:
        dqr = torch.empty((T, H, DR), dtype=q.dtype, device=q.device)
        dkr_acc = torch.zeros((S, DR), dtype=acc_dtype, device=q.device)
    nonempty = T > 0 and H > 0 and S > 0 and indices.shape[1] > 0
    if nonempty and _bf16x6(q.dtype):
        _launch_bwd_bf16x6(q, q_rope, qr, sqr, DR, kv, k_rope, indices, topk_length, out, lse,
                           dout, scale, config, dq, dqr, dkv_acc, dkr_acc)
    elif (nonempty and _BWD_BACKEND.value == "gluon" and config is None
          and _OVERRIDES["backward"] is None
          and dsa_bwd_gluon.applies(q, q_rope, kv, k_rope, indices, out, dout)
          and GLUON_BWD(dsa_bwd_gluon.launch, q, q_rope, kv, k_rope, indices, topk_length, out,
                        lse, dout, scale, dq, dqr, dkv_acc, dkr_acc)):
        pass  # the Gluon kernel filled dq and added the key gradients
    elif nonempty:

        def launch(cfg):
            grid = (T, cdiv(H, cfg.block_h), cdiv(DL, cfg.block_dv))
            if cfg.token_major:
                grid = (grid[0] * grid[1] * grid[2],)
            _BWD_LAUNCH[grid](
                q, qr, kv, kr, indices, topk_length if topk_length is not None else indices,
                out, dout, lse, dq, dqr, dkv_acc, dkr_acc,
                H, S, indices.shape[1], DL, DR,
                *_strides3(q), *sqr, kv.stride(0), kv.stride(1), *skr,
                indices.stride(0), indices.stride(1), *_strides3(out), *_strides3(dout),
                scale, scale * _LOG2E,
                HAS_ROPE=q_rope is not None, HAS_LEN=topk_length is not None,
                ONE_TILE=cfg.one_tile(DL), BLOCK_H=cfg.block_h, BLOCK_K=cfg.block_k,
                BLOCK_D=min(cfg.block_d, _pow2(DL)), BLOCK_DC=min(cfg.block_dv, _pow2(DL)),
                BLOCK_DR=_pow2(DR), PRECISION=_precision(q.dtype), DKV_T=cfg.dkv_transposed,
                SPLIT_S=bool(cfg.split_scores), HALVES=cfg.halves and _two_chunks(cfg, DL),
                ACC64=_acc64(cfg, q.dtype), FP32_TC=_fp32_tc(q.dtype),
                I32=cfg.int32_rows and _int32_rows(indices, kv, k_rope, DL, DR),
                TOKEN_MAJOR=cfg.token_major, ROPE_OWNER=cfg.rope_owner,
                EVEN_D=cfg.even_d and _even_d(DL, DR, min(cfg.block_d, _pow2(DL)),
                                              min(cfg.block_dv, _pow2(DL)), block_dr=_pow2(DR),
                                              rope=q_rope is not None),
                num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )

        _launch_first_fitting("backward", q, DR, launch, config)
    else:  # no kernel ran: every row is empty, so dq (and dq_rope) are zeros
        dq.zero_()
        dqr.zero_()
    dkv = dkv_acc.to(q.dtype)
    if q_rope is None:
        return dq, None, dkv, None
    return dq, dqr, dkv, dkr_acc.to(q.dtype)


# ----------------------------------------------------------------------------- fp32 "bf16x6"

# (block_h, slot block, latent piece of the score / dkv products, value or dq column chunk,
# warps, stages) of both launches of a direction. 64 heads are one wgmma M tile on 4 warps
# (8 warps would put both warpgroups on the whole tile: a dot feeding another dot gets all its
# warps along M, dsa_common.chain_break); the column chunks keep the fp32 accumulator at
# 64 x 128 (64 registers a thread; 256 spilled 0.8-1.3 KB offline). H200, Triton 3.6, doc_4096,
# kernels alone, synced (docs/PERFORMANCE.md "DSA, fp32"): forward 3 stages 23.7 ms, 2 stages
# 25.1, 32-wide pieces 24.5; backward 3 stages 64.3, 2 stages 47.9, 32-wide pieces 3 stages
# 47.7 (within the noise of 2 stages).
BF16X6_CONFIGS = {"forward": KernelConfig(64, 64, 64, 128, 4, 3),
                  "backward": KernelConfig(64, 64, 64, 128, 4, 2)}
_SCRATCH_ELEMENTS = 1 << 28  # scores / dS scratch per pass: 1 GiB of fp32, tokens in passes


def _bf16x6_config(kind, q, config):
    if config is not None:
        return config
    if _OVERRIDES[kind] is not None:
        return _OVERRIDES[kind]
    if q.device.type == "cuda":
        return BF16X6_CONFIGS[kind]
    T, H, DL = q.shape
    return KernelConfig(min(64, _pow2(H)), 16, 32, 32, 4, 1)


def _key_parts(kv, k_rope):
    """[3, S, Dl + Dr] bf16: kv (and k_rope) rows split exactly into three bf16 parts, the
    lower two scaled up by 2**8 and 2**16 (dsa_common.split3; torch's fp32 -> bf16 conversion
    rounds to nearest even, as the kernels' does)."""
    rows = kv if k_rope is None else torch.cat([kv, k_rope], dim=1)
    parts = torch.empty((3,) + rows.shape, dtype=torch.bfloat16, device=kv.device)
    parts[0] = rows
    rest = rows - parts[0].float()
    parts[1] = rest * 256.0
    parts[2] = (rest - parts[1].float() * 0.00390625) * 65536.0
    return parts


def _parts_i32(indices, parts):
    """32-bit row arithmetic (the kernels' I32): int32 indices, and every element offset of
    one part of the parts buffer below 2**31."""
    return indices.dtype == torch.int32 and parts[0].numel() < 2 ** 31


def _token_passes(T, H, K):
    """Token ranges whose [tokens, H, K] fp32 scratch stays within _SCRATCH_ELEMENTS."""
    step = max(1, _SCRATCH_ELEMENTS // max(1, H * K))
    return [(t0, min(T, t0 + step)) for t0 in range(0, T, step)]


def _forward_bf16x6(q, q_rope, kv, k_rope, indices, topk_length, scale, config=None):
    """fp32 "bf16x6" forward (module docstring): per token pass, the scores launch then the
    P.V launch."""
    T, H, DL = q.shape
    out = torch.empty((T, H, DL), dtype=q.dtype, device=q.device)
    lse = torch.empty((T, H), dtype=torch.float32, device=q.device)
    if T == 0 or H == 0:
        return out, lse
    S, K = kv.shape[0], indices.shape[1]
    if S == 0 or K == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    cfg = _bf16x6_config("forward", q, config)
    qr, _, DR, sqr, _ = _rope_args(q_rope, k_rope, q)
    parts = _key_parts(kv, k_rope)
    W = parts.shape[2]
    i32 = _parts_i32(indices, parts)
    bh, bn = min(cfg.block_h, _pow2(H)), cfg.block_k
    bd, bdv = min(cfg.block_d, _pow2(DL)), min(cfg.block_dv, _pow2(DL))
    NB = cdiv(K, bn)
    passes = _token_passes(T, H, K)
    n_max = max(t1 - t0 for t0, t1 in passes)
    scores = torch.empty((n_max, H, K), dtype=torch.float32, device=q.device)
    bm = torch.empty((n_max, NB, H), dtype=torch.float32, device=q.device)
    bl = torch.empty((n_max, NB, H), dtype=torch.float64, device=q.device)
    kw = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    for t0, t1 in passes:
        n = t1 - t0
        idx = indices[t0:t1]
        lens = topk_length[t0:t1] if topk_length is not None else idx
        dsa_fp32_scores_kernel[(n, cdiv(H, bh), NB)](
            q[t0:t1], qr[t0:t1], parts[0], parts[0, :, DL:], idx, lens, scores, bm, bl,
            H, S, K, DL, DR, NB, *_strides3(q), *sqr, W, idx.stride(0), idx.stride(1), scale,
            HAS_ROPE=q_rope is not None, HAS_LEN=topk_length is not None, BLOCK_H=bh,
            BLOCK_N=bn, BLOCK_D=bd, BLOCK_DR=_pow2(DR), BF16=q.device.type == "cuda", I32=i32,
            **kw)
        o = out[t0:t1]
        dsa_fp32_pv_kernel[(n, cdiv(H, bh), cdiv(DL, bdv))](
            parts[0], idx, lens, scores, bm, bl, o, lse[t0:t1], H, S, K, DL, NB,
            W, idx.stride(0), idx.stride(1), *_strides3(o),
            HAS_LEN=topk_length is not None, BLOCK_H=bh, BLOCK_K=bn, BLOCK_N=bn, BLOCK_DV=bdv,
            BF16=q.device.type == "cuda", I32=i32, **kw)
    return out, lse


def _launch_bwd_bf16x6(q, q_rope, qr, sqr, DR, kv, k_rope, indices, topk_length, out, lse,
                       dout, scale, config, dq, dqr, dkv_acc, dkr_acc):
    """fp32 "bf16x6" backward launches (kernels/dsa_bwd.py) into :func:`_backward`'s buffers
    (dkv_acc, dkr_acc fp64): Delta, then per token pass the dS and key-gradient launch and the
    dq launch."""
    T, H, DL = q.shape
    S, K = kv.shape[0], indices.shape[1]
    cfg = _bf16x6_config("backward", q, config)
    parts = _key_parts(kv, k_rope)
    W = parts.shape[2]
    i32 = _parts_i32(indices, parts)
    bh, bn = min(cfg.block_h, _pow2(H)), cfg.block_k
    bd, bdc = min(cfg.block_d, _pow2(DL)), min(cfg.block_dv, _pow2(DL))
    kw = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    delta = torch.empty((T, H), dtype=torch.float64, device=q.device)
    dsa_fp32_delta_kernel[(T, cdiv(H, bh))](
        out, dout, delta, H, DL, *_strides3(out), *_strides3(dout), BLOCK_H=bh,
        BLOCK_D=bd, num_warps=cfg.num_warps)
    passes = _token_passes(T, H, K)
    n_max = max(t1 - t0 for t0, t1 in passes)
    ds = torch.empty((n_max, H, K), dtype=torch.float32, device=q.device)
    n_chunks = cdiv(DL, bdc) + (q_rope is not None)
    for t0, t1 in passes:
        n = t1 - t0
        idx = indices[t0:t1]
        lens = topk_length[t0:t1] if topk_length is not None else idx
        g = dout[t0:t1]
        dsa_fp32_bwd_scores_kernel[(n, cdiv(H, bh), cdiv(K, bn))](
            q[t0:t1], qr[t0:t1], parts[0], parts[0, :, DL:], idx, lens, g, lse[t0:t1],
            delta[t0:t1], ds, dkv_acc, dkr_acc, H, S, K, DL, DR,
            *_strides3(q), *sqr, W, idx.stride(0), idx.stride(1), *_strides3(g), scale,
            HAS_ROPE=q_rope is not None, HAS_LEN=topk_length is not None, BLOCK_H=bh,
            BLOCK_N=bn, BLOCK_D=bd, BLOCK_DR=_pow2(DR), BF16=q.device.type == "cuda",
            I32=i32, **kw)
        dsa_fp32_bwd_dq_kernel[(n, cdiv(H, bh), n_chunks)](
            parts[0], parts[0, :, DL:], idx, lens, ds, dq[t0:t1], dqr[t0:t1],
            H, S, K, DL, DR, W, idx.stride(0), idx.stride(1),
            HAS_ROPE=q_rope is not None, HAS_LEN=topk_length is not None, BLOCK_H=bh,
            BLOCK_K=bn, BLOCK_DC=bdc, BLOCK_DR=_pow2(DR), BF16=q.device.type == "cuda",
            I32=i32, **kw)


def slot_offsets_fit(indices):
    """``indices`` [T, K], or a contiguous copy where a slot's offset in a row, slot * stride,
    passes int32: the kernels compute it in int32 (a K-major [T, K] view has stride T)."""
    return indices.contiguous() if slot_offsets_pass_int32(indices) else indices


_ORDER_LAUNCH = DirectLauncher(slot_order_kernel, n_tensors=4)


def _l2_bytes(device):
    """The device's L2 in bytes (0 for the CPU interpreter)."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).L2_cache_size


# the setting under which each step orders its rows ("on" orders before the forward, whose
# ordered rows the backward keeps)
_ORDERED_AT = {"forward": "on", "backward": "backward"}


def _orders(where, indices, kv, k_rope):
    """Whether a call's rows are put in the slot order at `where` ("forward", "backward")."""
    T, K = indices.shape
    S = kv.shape[0]
    if not (_ORDER.value == _ORDERED_AT[where] and T * K >= ORDER_MIN_SLOTS
            and 0 < K <= ORDER_MAX_K and S <= ORDER_MAX_S):
        return False
    row_bytes = kv.shape[1] * kv.element_size() + (0 if k_rope is None else
                                                   k_rope.shape[1] * k_rope.element_size())
    floor = _l2_bytes(kv.device) if ORDER_MIN_KEY_BYTES is None else ORDER_MIN_KEY_BYTES
    return S * row_bytes > floor


def _order_lanes(form, block_k, warps):
    """The ordering kernel's lanes: the sorting forms' threads of the launch; "runs" defines
    its order by them, so there they depend on the row alone (runs of 64 keys)."""
    if form == "runs":
        return max(1, block_k // RUN_KEYS)
    return min(32 * warps, block_k)


def slot_order(indices, topk_length, S, num_warps=None, form=None):
    """(rows int32 [T, K], lengths int32 [T]): each row's n valid slots (``s < topk_length[t]``
    where given, ``0 <= indices[t, s] < S``) in key order from the pivot key
    ``lo + (hi - lo + 1) * (t mod C) // C`` (lo, hi: the row's least and greatest valid key;
    C: ``ORDER_CONCURRENCY`` or the device's multiprocessors), those below it last, then -1
    (kernels/slot_order.py). The same valid slots a row. ``S <= 2**30``. ``num_warps``: the
    launch, default one warp a 2048 keys; ``form``: one of ``ORDER_FORMS``, default the
    forward's (:func:`set_slot_order_form`). The "runs" form writes another order: samples
    of RUN_KEYS slots (slot s in sample s mod L), each sorted from the pivot, rank by rank,
    -1 where a sample has run out; a compacted row stays so, other rows keep holes inside
    their length (the end of their last valid key)."""
    if S > ORDER_MAX_S:
        raise ValueError(f"S: slot_order takes at most {ORDER_MAX_S} keys, got {S}")
    form = form or _ORDER_FORM.value
    if form not in ORDER_FORMS:
        raise ValueError(f"form: one of {ORDER_FORMS}, got {form!r}")
    T, K = indices.shape
    out = torch.empty((T, K), dtype=torch.int32, device=indices.device)
    lengths = torch.empty((T,), dtype=torch.int32, device=indices.device)
    concurrency = ORDER_CONCURRENCY or _multiprocessors(indices.device)
    block_k = max(2, next_pow2(K))
    warps = num_warps or max(1, block_k // 2048)
    _ORDER_LAUNCH[(T,)](indices, topk_length if topk_length is not None else indices, out, lengths,
                        K, S, indices.stride(0), indices.stride(1), concurrency,
                        HAS_LEN=topk_length is not None, BLOCK_K=block_k,
                        LANES=_order_lanes(form, block_k, warps),
                        LOG_K=block_k.bit_length() - 1, FORM=ORDER_FORMS.index(form),
                        num_warps=warps)
    return out, lengths


def _attend(q, q_rope, kv, k_rope, indices, topk_length, scale):
    """(out, lse): through autograd only where a gradient is needed (no Function node, and its
    cost, on the inference path). The kernels read topk_length by its data pointer alone: a
    strided one is copied first (docs/FINDINGS.md F34); so are indices whose slot offsets
    pass int32 (F35)."""
    if (q.is_neg() or kv.is_neg() or indices.is_neg() or (q_rope is not None and q_rope.is_neg())
            or (k_rope is not None and k_rope.is_neg())
            or (topk_length is not None and topk_length.is_neg())):
        q, q_rope, kv, k_rope, indices, topk_length = resolved_neg(
            q, q_rope, kv, k_rope, indices, topk_length)
    if topk_length is not None:
        topk_length = topk_length.contiguous()
    indices = slot_offsets_fit(indices)
    grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad
                                           for x in (q, q_rope, kv, k_rope))
    rows = None  # the order the rows are in: None (as given), or _ROWS_OF's
    if _orders("forward", indices, kv, k_rope):
        # a call that records a backward orders once, in the backward's form
        form = (_BACKWARD_ORDER_FORM if grad else _ORDER_FORM).value
        indices, topk_length = slot_order(indices, topk_length, kv.shape[0], form=form)
        rows = _ROWS_OF[form]
    if grad:
        return _DsaFunction.apply(q, q_rope, kv, k_rope, indices, topk_length, scale, rows)
    return _forward(q, q_rope, kv, k_rope, indices, topk_length, scale)


def _backward_rows(indices, topk_length, kv, k_rope, rows):
    """(indices, topk_length) the backward runs on: the forward's rows, or those ordered in the
    backward's form where the setting says ("backward"; "on" where the forward's rows are in
    another order than that form's: the form changed between the steps)."""
    form = _BACKWARD_ORDER_FORM.value
    if (rows is not None and rows != _ROWS_OF[form]) or _orders("backward", indices, kv, k_rope):
        return slot_order(indices, topk_length, kv.shape[0], form=form)
    return indices, topk_length


class _DsaFunction(torch.autograd.Function):
    """Autograd wrapper; k_rope/q_rope are None for NoPE."""

    @staticmethod
    def forward(ctx, q, q_rope, kv, k_rope, indices, topk_length, scale, rows):
        out, lse = _forward(q, q_rope, kv, k_rope, indices, topk_length, scale)
        ctx.save_for_backward(q, q_rope, kv, k_rope, indices, topk_length, out, lse)
        ctx.scale, ctx.rows = scale, rows
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, q_rope, kv, k_rope, indices, topk_length, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        elif dout.is_neg():
            dout, = resolved_neg(dout)
        indices, topk_length = _backward_rows(indices, topk_length, kv, k_rope, ctx.rows)
        grads = _backward(q, q_rope, kv, k_rope, indices, topk_length, out, lse, dout, ctx.scale)
        if torch.is_grad_enabled():  # create_graph=True: the gradients may be differentiated
            grads = first_order_only("fast DSA", grads, (q, q_rope, kv, k_rope, dout))
        return (*grads, None, None, None, None)


def dsa_sparse_attention_nope(q, kv, indices, *, topk_length=None, softmax_scale=None,
                              return_lse=False):
    """NoPE DSA: q [T, H, D], kv [S, D] or [S, 1, D], indices [T, K] -> out [T, H, D] (+ lse).

    Scores scale * q . kv[idx] (scale default 1/sqrt(D)); values kv[idx].
    """
    kv_rows, _, scale = _validate(q, None, kv, None, indices, topk_length, softmax_scale, False)
    check_flags(return_lse=return_lse)
    out, lse = _attend(q, None, kv_rows, None, indices, topk_length, scale)
    return (out, lse) if return_lse else out


def dsa_sparse_attention(q_latent, q_rope, kv_latent, k_rope, indices, *, topk_length=None,
                         softmax_scale=None, return_lse=False):
    """RoPE DSA: q_latent [T, H, Dl], q_rope [T, H, Dr], kv_latent [S, Dl], k_rope [S, Dr].

    Scores scale * (q_latent . kv_latent[idx] + q_rope . k_rope[idx]) (scale default
    1/sqrt(Dl + Dr)); values kv_latent[idx]; out [T, H, Dl] (+ lse [T, H] fp32).
    """
    kv_rows, kr_rows, scale = _validate(q_latent, q_rope, kv_latent, k_rope, indices, topk_length,
                                        softmax_scale, True)
    check_flags(return_lse=return_lse)
    out, lse = _attend(q_latent, q_rope, kv_rows, kr_rows, indices, topk_length, scale)
    return (out, lse) if return_lse else out


def _global_indices(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, causal, topk_length, kv,
                    kv_name):
    """(global rows, lengths); cu_seqlens_k[-1] past kv's rows fails (fast.index docstring)."""
    kv = key_rows(kv_name, kv, FLOAT_DTYPES)
    # compaction pays off whenever rows have holes; lengths then stop the slot loop early
    return offset_rows(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, causal=causal, compact=True,
                       topk_length=topk_length, key_rows=kv.shape[0], key_rows_name=kv_name)


def dsa_sparse_attention_nope_varlen(q, kv, gather_kv_indices, cu_seqlens_q, cu_seqlens_k,
                                     max_seqlen_q=None, max_seqlen_k=None, *, causal=False,
                                     topk_length=None, softmax_scale=None, return_lse=False):
    """Varlen NoPE DSA: per-document local indices (docs/CONTRACT.md "4. Varlen index preparation"), then the global kernel.

    max_seqlen_q / max_seqlen_k are accepted for signature compatibility and not needed.
    """
    rows, lengths = _global_indices(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, causal,
                                    topk_length, kv, "kv")
    return dsa_sparse_attention_nope(q, kv, rows, topk_length=lengths,
                                     softmax_scale=softmax_scale, return_lse=return_lse)


def dsa_sparse_attention_varlen(q_latent, q_rope, kv_latent, k_rope, gather_kv_indices,
                                cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                                *, causal=False, topk_length=None, softmax_scale=None,
                                return_lse=False):
    """Varlen RoPE DSA: per-document local indices (docs/CONTRACT.md "4. Varlen index preparation"), then the global kernel.

    max_seqlen_q / max_seqlen_k are accepted for signature compatibility and not needed.
    """
    rows, lengths = _global_indices(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, causal,
                                    topk_length, kv_latent, "kv_latent")
    return dsa_sparse_attention(q_latent, q_rope, kv_latent, k_rope, rows, topk_length=lengths,
                                softmax_scale=softmax_scale, return_lse=return_lse)
