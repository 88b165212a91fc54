"""Offline probe: compile the SDPA kernels for sm_90a on a machine without a GPU.

    python -m attention_oracle.fast.kernels.sdpa_probe fwd tf32x3 128 64,32,4,2 128,64,8,2
    python -m attention_oracle.fast.kernels.sdpa_probe dkdv ieee 64 32,64,4,2
    python -m attention_oracle.fast.kernels.sdpa_probe dkdv+atomic tf32x3 128 32,32,4,2
    python -m attention_oracle.fast.kernels.sdpa_probe fwd+causal bf16 64 128,64,4,3
    python -m attention_oracle.fast.kernels.sdpa_probe --sass fwd+causal bf16 64 128,64,4,3

Arguments: the kernel (``fwd``, ``dkdv``, ``dq``; ``dkdv+atomic``: the dK/dV kernel with the
TMA-reduce atomic dQ; ``+causal``: causal, its programs dealt in sections of 32 MiB of heads,
``+rows``: causal, one head's blocks after another, the default), the path (``ieee`` or ``tf32x3``: fp32
"plain" / "tf32x3" mode; ``accurate``: fp32 "accurate" mode, natural units and fp64 pieces;
``bf16``: the 16-bit kernel), the head dim (E = Ev, a power of two), then configs
``BLOCK_M,BLOCK_N,num_warps,num_stages``. Unmasked; not causal unless named. Prints the shared memory each config needs (the H200
allows 232448 bytes), from the ptxas bundled with Triton registers and spill bytes, and the
tensor-core instructions the products took (``wgmma``, ``mma.sync`` or both): Triton gives a
product wgmma only where its result has a multiple of 64 rows. ``--sass`` first: each config's
machine-code blocks that do a tile's products or softmax, counted by opcode (:mod:`.sass`;
with ``--json``, one JSON list of [address, count, {opcode: count}] a config).
Shared-memory figures come from the local Triton, which may lay operands out differently from
the device's (docs/DESIGN.md "11. fast DSA (Triton)"), so a config near the limit still needs the device.
"""
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import sass
from .dsa_probe import _ptxas_usage
from .sdpa_bwd import sdpa_bwd_dkdv_kernel, sdpa_bwd_dq_kernel
from .sdpa_common import TRIED_SECTION_BYTES, chunk_of
from .sdpa_fwd import sdpa_fwd_kernel

_KERNELS = {"fwd": (sdpa_fwd_kernel, 6), "dkdv": (sdpa_bwd_dkdv_kernel, 11),
            "dq": (sdpa_bwd_dq_kernel, 8)}


def compile_for_sm90(which, prec, head_dim, cfg, exp2_poly=0, atomic_dq=0, mma=False,
                     section=None, cubin=False):
    """(shared bytes, registers, spill-store bytes) of one config (``exp2_poly``: the
    forward's EXP2_POLY; ``atomic_dq``: the dK/dV kernel's ATOMIC_DQ; ``section``: None not
    causal, else causal with that SECTION), and with ``mma`` the tensor-core form of its
    products (:func:`mma_form`); with ``cubin``, the compiled machine code alone."""
    autotuned, n_tensors = _KERNELS[which]
    kernel = autotuned.fn.fn
    bm, bn, warps, stages = cfg
    elem = "*bf16" if prec == "bf16" else "*fp32"
    consts = dict(CAUSAL=section is not None, SECTION=section or 0, MASK_KIND=0,
                  PREC={"bf16": "tf32", "accurate": "ieee"}.get(prec, prec),
                  NATURAL=prec == "accurate", CHUNK_E=chunk_of(head_dim),
                  CHUNK_EV=chunk_of(head_dim), BLOCK_E=head_dim, BLOCK_EV=head_dim,
                  BLOCK_M=bm, BLOCK_N=bn, CHECK_M=False, CHECK_N=False, CHECK_E=False,
                  CHECK_EV=False, FOLD=True, FUSE_DQ=False, ATOMIC_DQ=atomic_dq,
                  EXP2_POLY=exp2_poly)
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in consts:
            signature[name] = "constexpr"
        elif i < n_tensors:
            fp32_row = name in ("Stats", "Delta") or (name == "Mask")
            signature[name] = "*fp32" if fp32_row else elem
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in ("qk_scale", "scale"):
            signature[name] = "fp32"
        elif name.endswith("e") and name.startswith("s_"):  # unit channel strides
            consts[name] = 1
            signature[name] = "constexpr"
        else:
            signature[name] = "i32"
            if name not in ("Z2", "HQ", "GROUP"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    consts = {k: v for k, v in consts.items() if k in kernel.arg_names}
    src = ASTSource(fn=kernel, signature=signature, attrs=attrs,
                    constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=warps, num_stages=stages))
    if cubin:
        return compiled.asm["cubin"]
    usage = (compiled.metadata.shared,) + _ptxas_usage(compiled.asm["ptx"])
    return usage + (mma_form(compiled.asm["ptx"]),) if mma else usage


def mma_form(ptx):
    """The tensor-core instructions in ``ptx``: "wgmma", "mma.sync", both, or "none"."""
    forms = [f for f in ("wgmma", "mma.sync") if f + "." in ptx]
    return " + ".join(forms) or "none"


def main(argv):
    show_sass, as_json = argv[:1] == ["--sass"], "--json" in argv
    argv = [a for a in argv if a not in ("--sass", "--json")]
    name = argv[0] if argv else ""
    section = (TRIED_SECTION_BYTES[0] if "+causal" in name else 0 if "+rows" in name else None)
    which = name.split("+")[0]
    if len(argv) < 4 or which not in _KERNELS or argv[1] not in ("ieee", "tf32x3", "accurate", "bf16"):
        raise SystemExit(__doc__)
    prec, head_dim = argv[1], int(argv[2])
    atomic_dq = 2 if "+atomic" in name else 0
    for text in argv[3:]:
        cfg = tuple(int(x) for x in text.split(","))
        try:
            if show_sass:
                blocks = sass.tile_blocks(compile_for_sm90(
                    which, prec, head_dim, cfg, atomic_dq=atomic_dq, section=section, cubin=True))
                print(sass.blocks_json(blocks) if as_json else
                      "\n".join([f"{argv[0]} {prec} D{head_dim} {cfg}:"]
                                 + sass.block_lines(blocks)), flush=True)
                continue
            shared, regs, spills, form = compile_for_sm90(which, prec, head_dim, cfg,
                                                          atomic_dq=atomic_dq, mma=True,
                                                          section=section)
            print(f"{argv[0]} {prec} D{head_dim} {cfg}: shared {shared} B, {regs} registers, "
                  f"{spills} B spilled, {form}", flush=True)
        except Exception as exc:  # report and go on with the next config
            print(f"{argv[0]} {prec} D{head_dim} {cfg}: {type(exc).__name__}: {str(exc)[:200]}",
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
