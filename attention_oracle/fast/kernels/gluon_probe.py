"""Offline probe: compile every Gluon kernel variant for sm_90a on a machine without a GPU.

    python -m attention_oracle.fast.kernels.gluon_probe [NAME ...] [--wgmma] [--json]
    python -m attention_oracle.fast.kernels.gluon_probe --sass NAME [--json]

Names (all by default): ``dsa_fwd``, ``dsa_fwd_nope``, ``dsa_bwd``, ``dsa_bwd_nope``,
``dsa_fwd_prefetch``, ``dsa_bwd_prefetch`` (the L2 prefetch one block or pair ahead),
``sdpa_fwd_d64``, ``sdpa_fwd_d128``, ``sdpa_fwd_d128_causal``, ``sdpa_fwd_d128_bool_mask``,
``sdpa_fwd_d64_add_mask`` (a boolean and an additive mask), ``sdpa_fwd_d256_causal`` (the
256-column tile's config), ``sdpa_fwd_d128_persistent``, ``sdpa_fwd_d64_causal_persistent``
(the persistent program), ``sdpa_fwd_d64_causal_persistent_pingpong``,
``sdpa_fwd_d128_persistent_pingpong``, ``sdpa_fwd_d64_causal_persistent_half``,
``sdpa_fwd_d128_causal_persistent_half``, ``sdpa_fwd_d64_causal_persistent_pingpong_half``
(its forms), ``sdpa_fwd_d128_pingpong``,
``sdpa_fwd_d128_causal_pingpong`` (the forward's opt-in ping-pong form), ``sdpa_bwd_d64``,
``sdpa_bwd_d128``, ``sdpa_bwd_d128_causal``, ``sdpa_bwd_d128_bool_mask``,
``sdpa_bwd_d64_add_mask``, ``sdpa_bwd_d64_tma``, ``sdpa_bwd_d128_tma``,
``sdpa_bwd_d128_causal_split_tma``, ``sdpa_bwd_d64_tma_deferred``,
``sdpa_bwd_d128_tma_deferred``, ``sdpa_bwd_d128_causal_tma_deferred`` (the backward's other
schedules), ``sdpa_bwd_fp32_d64``, ``sdpa_bwd_fp32_d128``, ``sdpa_bwd_fp32_d128_causal`` (the fp32
"tf32x3" dK/dV kernel, fp32 operands): the production configuration of each kernel in
bf16 (DSA: H 64, 512 + 64 or 512, int32 indices and lengths; SDPA: the default tile), with
pointer and stride arguments divisible by 16 as the launches specialise them. Prints the
shared memory each needs (the H200 allows 232448 bytes) and, from the ptxas bundled with
Triton, registers and spill bytes; ``--wgmma`` adds the count of each wgmma form in the PTX
(shape and operand transposes); ``--json`` prints one JSON dict instead (name: shared,
registers, spills, forms, l2_prefetches, tma_reductions (count, waited at once, bulk
waits in all), or error). ``--sass NAME`` disassembles one variant (:mod:`.sass`) and
prints its straight-line blocks (cut at labels and branches) that hold a wgmma or at least 16
``MUFU.EX2``: a block's address, its instruction count and its opcodes by count, per warp: the
work of one key tile's softmax, masked or free, read off the machine code (docs/FINDINGS.md
F93); with ``--json``, a list of [address, count, {opcode: count}]. Run it outside Triton's
CPU interpreter (``TRITON_INTERPRET`` unset): under it the standard library's jit functions cannot be
compiled. Figures come from the local Triton, which may differ from the device's (Triton 3.6
there): register and spill counts moved between 3.6 and 3.8 (docs/FINDINGS.md F31), so a
figure near a limit still needs the device.
"""
import json
import re
import sys

import triton
from triton.backends.compiler import GPUTarget

from . import sass
from .dsa_probe import _ptxas_usage
from .gluon_common import GLUON_AVAILABLE
from .sdpa_common import CAUSAL_SECTION_BYTES

if GLUON_AVAILABLE:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from . import (
        dsa_bwd_gluon,
        dsa_fwd_gluon,
        sdpa_bwd_fp32_gluon,
        sdpa_bwd_gluon,
        sdpa_fwd_gluon,
    )

SHARED_LIMIT = 232448  # bytes of shared memory a block may use on the H100 / H200
_BF16 = "*bf16"
_DSA_POINTERS = dict(q_ptr=_BF16, qr_ptr=_BF16, kv_ptr=_BF16, kr_ptr=_BF16, idx_ptr="*i32",
                     len_ptr="*i32", out_ptr=_BF16, lse_ptr="*fp32", do_ptr=_BF16, dq_ptr=_BF16,
                     dqr_ptr=_BF16, dkv_ptr="*fp32", dkr_ptr="*fp32")
_SDPA_SCALARS = dict(Stats="*fp32", Delta="*fp32", DQ="*fp32", DK=_BF16, DV=_BF16,
                     qk_scale="fp32", scale="fp32")


def _compile(kernel, signature, constexprs, divisible):
    """The compiled kernel for sm_90 (``signature``: non-constexpr argument types)."""
    names = kernel.arg_names
    unnamed = [p.name for p in kernel.params if p.is_constexpr and p.name not in constexprs]
    if unnamed:  # an unnamed one would compile as a runtime i32, its default ignored (F92)
        raise ValueError(f"{kernel.fn.__name__}: constexpr arguments {unnamed} not given")
    sig = {n: signature.get(n, "constexpr" if n in constexprs else "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n in divisible}
    src = GluonASTSource(fn=kernel, signature=sig, attrs=attrs,
                         constexprs={(names.index(n),): v for n, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=constexprs["num_warps"]))


def _dsa(kernel, constexprs):
    names = kernel.arg_names
    signature = {n: _DSA_POINTERS.get(n, "fp32" if n in ("c", "scale") else "i32")
                 for n in names if n not in constexprs}
    divisible = [n for n in names if n in _DSA_POINTERS or n.startswith("stride")]
    return _compile(kernel, signature, constexprs, divisible)


def _descriptor(rows, head_dim):
    """Triton's type string of a bf16 TMA descriptor with block [1, 1, 1, rows, head_dim]."""
    layout = gl.NVMMASharedLayout.get_default_for([1, 1, 1, rows, head_dim], gl.bfloat16)
    return f"tensordesc<bf16[1, 1, 1, {rows}, {head_dim}],{layout!r}>"


def _sdpa_fwd(head_dim, causal, pingpong=False, config=None, mask="*fp32"):
    """``mask``: the Mask pointer's type (fp32: none, u8: boolean, bf16: additive)."""
    bm, bn, stages, warps, ws = config or sdpa_fwd_gluon.tile_config(head_dim)
    g = sdpa_fwd_gluon
    kernel = {(True, False): g.sdpa_fwd_gluon_ws_kernel, (False, False): g.sdpa_fwd_gluon_kernel,
              (True, True): g.sdpa_fwd_gluon_ws_masked_kernel,
              (False, True): g.sdpa_fwd_gluon_masked_kernel}[bool(ws), mask != "*fp32"]
    if ws in g.PERSISTENT_FORMS:
        pingpong = pingpong or ws in g.PINGPONG_FORMS
        kernel = g.sdpa_fwd_gluon_ws_persistent_kernel
    signature = dict(_SDPA_SCALARS, Mask=mask,
                     q_desc=_descriptor(64 if ws and bm == 192 else bm, head_dim),
                     k_desc=_descriptor(bn, head_dim), v_desc=_descriptor(bn, head_dim),
                     o_desc=_descriptor(64 if ws else bm, head_dim))
    constexprs = dict(CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn, HEAD_D=head_dim, STAGES=stages,
                      num_warps=warps)
    if ws:
        constexprs["PINGPONG"] = pingpong
    if ws in g.PERSISTENT_FORMS:  # named, or the probe would take it for a runtime integer
        constexprs["HALF_DIAG"] = ws in g.HALF_FORMS
    return _compile(kernel, signature, constexprs, ["Stats", "Mask"])


def _sdpa_bwd(head_dim, causal, schedule="serial", mask="*fp32"):
    """``mask``: the Mask pointer's type (fp32: none, u8: boolean, bf16: additive)."""
    bm, bn = sdpa_bwd_gluon.BLOCK_M, sdpa_bwd_gluon.BLOCK_N
    split, dq_tma, dq_defer = sdpa_bwd_gluon.SCHEDULES[schedule]
    dq_layout = gl.NVMMASharedLayout.get_default_for([64, 64], gl.float32)
    signature = dict(_SDPA_SCALARS, Mask=mask, q_desc=_descriptor(bm, head_dim),
                     k_desc=_descriptor(bn, head_dim), v_desc=_descriptor(bn, head_dim),
                     do_desc=_descriptor(bm, head_dim),
                     dq_desc=f"tensordesc<fp32[64, 64],{dq_layout!r}>")
    kernel = (sdpa_bwd_gluon.sdpa_bwd_gluon_ws_kernel if mask == "*fp32"
              else sdpa_bwd_gluon.sdpa_bwd_gluon_ws_masked_kernel)
    return _compile(kernel, signature,
                    dict(CAUSAL=causal, SPLIT=split, DQ_TMA=dq_tma, DQ_DEFER=dq_defer,
                         SECTION=CAUSAL_SECTION_BYTES, num_warps=4),
                    ["Stats", "Delta", "DQ", "DK", "DV", "Mask"])


def _sdpa_bwd_fp32(head_dim, causal):
    """The fp32 "tf32x3" dK/dV kernel (``sdpa_bwd_fp32_gluon``) on the tile ``head_dim``."""
    g = sdpa_bwd_fp32_gluon
    signature = {n: "*fp32" for n in ("Q", "K", "V", "DO", "Stats", "Delta", "DK", "DV")}
    signature.update(qk_scale="fp32", scale="fp32")
    strides = [n for n in g.sdpa_bwd_fp32_dkdv_kernel.arg_names if n.startswith("s_")]
    return _compile(g.sdpa_bwd_fp32_dkdv_kernel, signature,
                    dict(D=head_dim, BLOCK_M=g.BLOCK_M, BLOCK_N=g.BLOCK_N, CAUSAL=causal,
                         FULL_E=True, num_warps=g.NUM_WARPS),
                    list(signature)[:8] + strides + ["L", "S"])


# FA3's head-dim-64 tile: 192 query rows, three consumer warpgroups
THREE_CONSUMERS = (192, 128, 2, 4, True)
# the default tile as a persistent program: the full diagonal, then the forms (the half one the default)
PERSISTENT_TILE = (128, 128, 2, 4, 3)  # sdpa_fwd_gluon.PERSISTENT
PERSISTENT_PINGPONG_TILE = (128, 128, 2, 4, 4)  # sdpa_fwd_gluon.PERSISTENT_PINGPONG
PERSISTENT_HALF_TILE = (128, 128, 2, 4, 5)  # sdpa_fwd_gluon.PERSISTENT_HALF
PERSISTENT_PINGPONG_HALF_TILE = (128, 128, 2, 4, 6)  # sdpa_fwd_gluon.PERSISTENT_PINGPONG_HALF


def variants():
    """{name: a function compiling that variant} (empty without Gluon)."""
    if not GLUON_AVAILABLE:
        return {}
    block, stages = dsa_fwd_gluon.CONFIG
    fwd = dict(HAS_LEN=True, BLOCK=block, STAGES=stages, PREFETCH=dsa_fwd_gluon.PREFETCH,
               num_warps=4)
    bwd = dict(HAS_LEN=True, PREFETCH=dsa_bwd_gluon.PREFETCH, num_warps=4)
    return {
        "dsa_fwd": lambda: _dsa(dsa_fwd_gluon.dsa_fwd_gluon_kernel, dict(fwd, HAS_ROPE=True)),
        "dsa_fwd_nope": lambda: _dsa(dsa_fwd_gluon.dsa_fwd_gluon_kernel,
                                     dict(fwd, HAS_ROPE=False)),
        "dsa_fwd_prefetch": lambda: _dsa(dsa_fwd_gluon.dsa_fwd_gluon_kernel,
                                         dict(fwd, HAS_ROPE=True, PREFETCH=1)),
        "dsa_bwd": lambda: _dsa(dsa_bwd_gluon.dsa_bwd_gluon_kernel, dict(bwd, HAS_ROPE=True)),
        "dsa_bwd_nope": lambda: _dsa(dsa_bwd_gluon.dsa_bwd_gluon_kernel,
                                     dict(bwd, HAS_ROPE=False)),
        "dsa_bwd_prefetch": lambda: _dsa(dsa_bwd_gluon.dsa_bwd_gluon_kernel,
                                         dict(bwd, HAS_ROPE=True, PREFETCH=1)),
        "sdpa_fwd_d64": lambda: _sdpa_fwd(64, False),
        "sdpa_fwd_d128": lambda: _sdpa_fwd(128, False),
        "sdpa_fwd_d128_causal": lambda: _sdpa_fwd(128, True),
        "sdpa_fwd_d128_bool_mask": lambda: _sdpa_fwd(128, False, mask="*u8"),
        "sdpa_fwd_d128_persistent": lambda: _sdpa_fwd(128, False, config=PERSISTENT_TILE),
        "sdpa_fwd_d64_causal_persistent": lambda: _sdpa_fwd(64, True, config=PERSISTENT_TILE),
        "sdpa_fwd_d64_causal_persistent_pingpong": lambda: _sdpa_fwd(
            64, True, config=PERSISTENT_PINGPONG_TILE),
        "sdpa_fwd_d128_persistent_pingpong": lambda: _sdpa_fwd(
            128, False, config=PERSISTENT_PINGPONG_TILE),
        "sdpa_fwd_d64_causal_persistent_half": lambda: _sdpa_fwd(
            64, True, config=PERSISTENT_HALF_TILE),
        "sdpa_fwd_d128_causal_persistent_half": lambda: _sdpa_fwd(
            128, True, config=PERSISTENT_HALF_TILE),
        "sdpa_fwd_d64_causal_persistent_pingpong_half": lambda: _sdpa_fwd(
            64, True, config=PERSISTENT_PINGPONG_HALF_TILE),
        "sdpa_fwd_d256_causal": lambda: _sdpa_fwd(256, True,
                                                  config=sdpa_fwd_gluon.TILE_CONFIGS[256]),
        "sdpa_fwd_d64_add_mask": lambda: _sdpa_fwd(64, False, mask="*bf16"),
        "sdpa_fwd_d128_pingpong": lambda: _sdpa_fwd(128, False, pingpong=True),
        "sdpa_fwd_d128_causal_pingpong": lambda: _sdpa_fwd(128, True, pingpong=True),
        "sdpa_fwd_d64_three": lambda: _sdpa_fwd(64, False, config=THREE_CONSUMERS),
        "sdpa_fwd_d64_three_causal_pingpong": lambda: _sdpa_fwd(64, True, pingpong=True,
                                                                config=THREE_CONSUMERS),
        "sdpa_bwd_d64": lambda: _sdpa_bwd(64, False),
        "sdpa_bwd_d128": lambda: _sdpa_bwd(128, False),
        "sdpa_bwd_d128_causal": lambda: _sdpa_bwd(128, True),
        "sdpa_bwd_d128_bool_mask": lambda: _sdpa_bwd(128, False, "tma", mask="*u8"),
        "sdpa_bwd_d64_add_mask": lambda: _sdpa_bwd(64, False, mask="*bf16"),
        "sdpa_bwd_d64_tma": lambda: _sdpa_bwd(64, False, "tma"),
        "sdpa_bwd_d128_tma": lambda: _sdpa_bwd(128, False, "tma"),
        "sdpa_bwd_d128_causal_split_tma": lambda: _sdpa_bwd(128, True, "split_tma"),
        "sdpa_bwd_d64_tma_deferred": lambda: _sdpa_bwd(64, False, "tma_deferred"),
        "sdpa_bwd_d128_tma_deferred": lambda: _sdpa_bwd(128, False, "tma_deferred"),
        "sdpa_bwd_d128_causal_tma_deferred": lambda: _sdpa_bwd(128, True, "tma_deferred"),
        "sdpa_bwd_fp32_d64": lambda: _sdpa_bwd_fp32(64, False),
        "sdpa_bwd_fp32_d128": lambda: _sdpa_bwd_fp32(128, False),
        "sdpa_bwd_fp32_d128_causal": lambda: _sdpa_bwd_fp32(128, True),
    }


def wgmma_forms(ptx):
    """{form: count} of the PTX's wgmma instructions: shape, A from registers or shared
    memory, and the transpose flags of the shared-memory operands."""
    forms = {}
    for m in re.finditer(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k(?:8|16))\.f32\.\w+\.\w+\s+"
                         r"\{[^}]*\},\s*(\{[^}]*\}|%rd\d+),\s*%rd\d+,\s*[^,]+,\s*1,\s*1"
                         r"((?:,\s*[01])*);", ptx):
        flags = re.findall(r"[01]", m.group(3))
        a = "A regs" if m.group(2).startswith("{") else "A smem"
        key = f"{m.group(1)} {a} trans {''.join(flags)}"
        forms[key] = forms.get(key, 0) + 1
    return forms


def l2_prefetches(ptx):
    """How many bulk L2 prefetch instructions the PTX holds (the DSA kernels' PREFETCH)."""
    return ptx.count("cp.async.bulk.prefetch.L2")


def tma_reductions(ptx):
    """(TMA reductions, those waited for at once, bulk waits): how many
    ``cp.reduce.async.bulk`` instructions the PTX holds, how many of them are followed, after
    their group's commit, by a wait (``cp.async.bulk.wait_group``: until their tile is read
    with ``.read``, as Triton 3.6 lowers it, or until done, as 3.8 does) before any other
    instruction, and how many such waits it holds in all."""
    found = re.findall(r"cp\.reduce\.async\.bulk\.tensor[^;]*;\s*(?://[^\n]*\s*)*"
                       r"cp\.async\.bulk\.commit_group;\s*(cp\.async\.bulk\.wait_group)?",
                       ptx)
    waits = len(re.findall(r"cp\.async\.bulk\.wait_group[\s.]", ptx))
    return len(found), sum(1 for waited in found if waited), waits


def probe(name):
    """(shared bytes, registers, spill-store bytes, {wgmma form: count}, L2 prefetch
    instructions, (TMA reductions, waited at once)) of one variant."""
    compiled = variants()[name]()
    ptx = compiled.asm["ptx"]
    return ((compiled.metadata.shared,) + _ptxas_usage(ptx)
            + (wgmma_forms(ptx), l2_prefetches(ptx), tma_reductions(ptx)))


def tile_blocks(name):
    """:func:`.sass.tile_blocks` of one variant's machine code."""
    return sass.tile_blocks(variants()[name]().asm["cubin"])


def error_text(exc):
    """A compile error as text, its innermost cause first: a Gluon CompilationError's own text
    is the failing source, one frame per jit call, the reason only in the chain of causes."""
    root = exc
    while (root.__cause__ or root.__context__) is not None:
        root = root.__cause__ or root.__context__
    if root is exc:
        return repr(exc)[:2000]
    return f"{type(root).__name__}: {str(root)[:600]} (raised as {repr(exc)[:1200]})"


def main(argv):
    if argv[:1] == ["--sass"]:
        blocks = tile_blocks(argv[1])
        if "--json" in argv:
            return print(sass.blocks_json(blocks))
        for line in sass.block_lines(blocks):
            print(line, flush=True)
        return None
    forms, as_json = "--wgmma" in argv, "--json" in argv
    names = [a for a in argv if a not in ("--wgmma", "--json")] or list(variants())
    if not GLUON_AVAILABLE:
        raise SystemExit("this Triton has no Gluon")
    results = {}
    for name in names:
        try:
            shared, regs, spills, wgmma, prefetches, reductions = probe(name)
            results[name] = dict(shared=shared, registers=regs, spills=spills, forms=wgmma,
                                 l2_prefetches=prefetches, tma_reductions=reductions)
            line = f"{name}: shared {shared} B, {regs} registers, {spills} B spilled"
            if forms:
                line += "; " + ", ".join(f"{k} x{v}" for k, v in sorted(wgmma.items()))
        except Exception as e:  # noqa: BLE001  (a variant the compiler rejects is reported)
            results[name] = dict(error=error_text(e))
            line = f"{name}: error {error_text(e)}"[:400]
        if not as_json:
            print(line, flush=True)
    if as_json:
        print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
