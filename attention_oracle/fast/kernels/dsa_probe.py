"""Offline probe: compile the DSA kernels for sm_90a on a machine without a GPU.

    python -m fast.kernels.dsa_probe fwd 64,64,512,512,8,2 [more configs...]
    python -m fast.kernels.dsa_probe bwd 64,32,64,256,8,3,1
    python -m fast.kernels.dsa_probe fwd32 32,32,64,512,8,1,0,0,0,1
    python -m fast.kernels.dsa_probe fwdtc 32,32,64,512,8,2

A config is block_h,block_k,block_d,block_dv,num_warps,num_stages[,dkv_transposed[,split_scores
[,halves[,acc64]]]] (0/1 flags; halves only where the latent is two chunks of block_dv; acc64:
the fp32 path's fp64 accumulators), optionally followed by ``+NAME`` switches of
``fast.dsa.KernelConfig``: ``+int32_rows``, ``+no_zero_trip`` (forward), ``+token_major``,
``+rope_owner`` (backward), ``+even_d``; e.g. ``fwd 64,64,512,512,8,2,0,1+no_zero_trip+int32_rows``.
``--sass`` adds the instruction counts of the kernel's largest loop from the disassembly (the
wgmma serialisation warning C7515 of ptxas shows there as a WARPGROUP wait per HGMMA). ``fwd32`` / ``bwd32`` compile the fp32 path (fp32 inputs,
fp64 key-gradient buffers); ``fwdtc`` / ``bwdtc`` the fp32 "tf32x3" path (fast.dsa.set_fp32_mode:
3xTF32 dots, natural-unit softmax), ``fwdtc2`` / ``bwdtc2`` its "tf32x3_exp2" form;
``fwdbf`` / ``bwdbf`` the launches of the "bf16x6" mode (block_h,block_k,block_d,block_dv,
num_warps,num_stages as fast.dsa.BF16X6_CONFIGS: the scores and P.V kernels, or the dS /
key-gradient and dq kernels, each reported). The production geometry is assumed (bf16, H=64, Dl=512, Dr=64,
K=2048, packed [S, 576] keys):
integer arguments that Triton would specialise as divisible by 16 on the GPU are marked so,
unit strides are constants. Prints the shared memory the kernel needs (the H200 allows
232448 bytes) and, from the ptxas bundled with Triton, registers and spill bytes. On the H200
(Triton 3.6) the shared-memory figures matched what the H200 reported (315392 for the
refused 64-head one-tile backward), so configs can be screened before spending device time.
"""
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from .dsa_bwd import dsa_bwd_kernel, dsa_fp32_bwd_dq_kernel, dsa_fp32_bwd_scores_kernel
from .dsa_fwd import dsa_fp32_pv_kernel, dsa_fp32_scores_kernel, dsa_fwd_kernel

_POINTERS = {
    "fwd": dict(q_ptr="*bf16", qr_ptr="*bf16", kv_ptr="*bf16", kr_ptr="*bf16", idx_ptr="*i32",
                len_ptr="*i32", out_ptr="*bf16", lse_ptr="*fp32"),
    "bwd": dict(q_ptr="*bf16", qr_ptr="*bf16", kv_ptr="*bf16", kr_ptr="*bf16", idx_ptr="*i32",
                len_ptr="*i32", out_ptr="*bf16", do_ptr="*bf16", lse_ptr="*fp32", dq_ptr="*bf16",
                dqr_ptr="*bf16", dkv_ptr="*fp32", dkr_ptr="*fp32"),
}
_FLOATS = {"scale", "scale_log2"}
_UNIT = {"stride_qd", "stride_qrd", "stride_kvd", "stride_krd", "stride_ik", "stride_od",
         "stride_dod"}
_DIV16 = {"H", "K", "DL", "DR", "stride_qt", "stride_qh", "stride_qrt", "stride_qrh", "stride_kvs",
          "stride_krs", "stride_it", "stride_ot", "stride_oh", "stride_dot", "stride_doh"}


def _fp32_pointers(pointers):
    return {k: "*fp64" if k in ("dkv_ptr", "dkr_ptr") else "*fp32" if v == "*bf16" else v
            for k, v in pointers.items()}


_SWITCHES = {"int32_rows": "I32", "no_zero_trip": "NO_ZERO_TRIP", "token_major": "TOKEN_MAJOR",
             "rope_owner": "ROPE_OWNER", "even_d": "EVEN_D"}


def compile_for_sm90(which, cfg, fp32=False, asm=False, tc=False, switches=()):
    """Returns (shared bytes, registers, spill-store bytes) of one config (+ the compiled
    kernel's asm dict when ``asm``); ``tc``: the kernels' FP32_TC (1 "tf32x3", 2 "tf32x3_exp2";
    implies fp32); ``switches``: KernelConfig switch names (``_SWITCHES``) set true."""
    fp32 = fp32 or tc
    bh, bk, bd, bdv, warps, stages = cfg[:6]
    kernel = dsa_fwd_kernel if which == "fwd" else dsa_bwd_kernel
    consts = dict(HAS_ROPE=True, HAS_LEN=True, ONE_TILE=bd >= 512 and bdv >= 512, BLOCK_H=bh,
                  BLOCK_K=bk, BLOCK_D=bd, BLOCK_DR=64,
                  PRECISION="tf32x3" if tc else "ieee" if fp32 else "tf32")
    consts["BLOCK_DV" if which == "fwd" else "BLOCK_DC"] = bdv
    consts["SPLIT_S"] = (int if which == "fwd" else bool)(cfg[7]) if len(cfg) > 7 else 0
    if which == "bwd":
        consts["DKV_T"] = bool(cfg[6]) if len(cfg) > 6 else False
        consts["HALVES"] = bool(cfg[8]) if len(cfg) > 8 else False
    if "ACC64" in kernel.arg_names:
        consts["ACC64"] = bool(cfg[9]) if len(cfg) > 9 and not tc else False
    if "FP32_TC" in kernel.arg_names:
        consts["FP32_TC"] = int(tc)
    consts.update({c: False for c in _SWITCHES.values() if c in kernel.arg_names})
    for name in switches:
        if _SWITCHES[name] not in kernel.arg_names:
            raise ValueError(f"switch {name} does not apply to the {which} kernel")
        consts[_SWITCHES[name]] = True
    consts.update({n: 1 for n in _UNIT if n in kernel.arg_names})
    pointers = _fp32_pointers(_POINTERS[which]) if fp32 else _POINTERS[which]
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in consts:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if name in _FLOATS else "i32"
            if name in _DIV16:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=kernel, signature=signature, attrs=attrs,
                    constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=warps, num_stages=stages))
    usage = (compiled.metadata.shared,) + _ptxas_usage(compiled.asm["ptx"])
    return usage + (compiled.asm,) if asm else usage


def _bf16x6_kernels(which, cfg):
    """(name, kernel, constexprs, pointer types) of the "bf16x6" launches of one direction."""
    bh, bk, bd, bdv = cfg[:4]
    f32 = "*fp32"
    common = dict(HAS_LEN=True, BLOCK_H=bh, BF16=True, I32=True)
    if which == "fwd":
        return [("scores", dsa_fp32_scores_kernel,
                 dict(common, HAS_ROPE=True, BLOCK_N=bk, BLOCK_D=bd, BLOCK_DR=64),
                 dict(q_ptr=f32, qr_ptr=f32, kvp_ptr="*bf16", krp_ptr="*bf16", idx_ptr="*i32",
                      len_ptr="*i32", s_ptr=f32, bm_ptr=f32, bl_ptr="*fp64")),
                ("pv", dsa_fp32_pv_kernel,
                 dict(common, BLOCK_K=bk, BLOCK_N=bk, BLOCK_DV=bdv),
                 dict(kvp_ptr="*bf16", idx_ptr="*i32", len_ptr="*i32", s_ptr=f32, bm_ptr=f32,
                      bl_ptr="*fp64", out_ptr=f32, lse_ptr=f32))]
    return [("scores", dsa_fp32_bwd_scores_kernel,
             dict(common, HAS_ROPE=True, BLOCK_N=bk, BLOCK_D=bd, BLOCK_DR=64),
             dict(q_ptr=f32, qr_ptr=f32, kvp_ptr="*bf16", krp_ptr="*bf16", idx_ptr="*i32",
                  len_ptr="*i32", do_ptr=f32, lse_ptr=f32, delta_ptr="*fp64", ds_ptr=f32,
                  dkv_ptr="*fp64", dkr_ptr="*fp64")),
            ("dq", dsa_fp32_bwd_dq_kernel,
             dict(common, HAS_ROPE=True, BLOCK_K=bk, BLOCK_DC=bdv, BLOCK_DR=64),
             dict(kvp_ptr="*bf16", krp_ptr="*bf16", idx_ptr="*i32", len_ptr="*i32", s_ptr=f32,
                  ds_ptr=f32, dq_ptr=f32, dqr_ptr=f32))]


def compile_bf16x6(which, cfg):
    """[(name, shared bytes, registers, spill-store bytes, asm dict)] of the "bf16x6" launches
    of one direction (``fwd`` or ``bwd``) at config (block_h, block_k, block_d, block_dv,
    num_warps, num_stages)."""
    res = []
    for name, kernel, consts, pointers in _bf16x6_kernels(which, cfg):
        signature, attrs = {}, {}
        for i, arg in enumerate(kernel.arg_names):
            if arg in consts:
                signature[arg] = "constexpr"
            elif arg in pointers:
                signature[arg] = pointers[arg]
                attrs[(i,)] = [["tt.divisibility", 16]]
            else:
                signature[arg] = "fp32" if arg in _FLOATS else "i32"
                if arg in ("H", "K", "DL", "DR", "stride_ps", "stride_qt", "stride_qh",
                           "stride_it", "stride_ot", "stride_oh", "stride_dot", "stride_doh"):
                    attrs[(i,)] = [["tt.divisibility", 16]]
        consts = dict(consts, **{n: 1 for n in _UNIT | {"stride_od"} if n in kernel.arg_names})
        src = ASTSource(fn=kernel, signature=signature, attrs=attrs,
                        constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options=dict(num_warps=cfg[4], num_stages=cfg[5]))
        res.append((name, compiled.metadata.shared) + _ptxas_usage(compiled.asm["ptx"])
                   + (compiled.asm,))
    return res


def _bin(*names):
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    return next((os.path.join(bin_dir, n) for n in names
                 if os.path.exists(os.path.join(bin_dir, n))), None)


def _ptxas(ptx, out):
    """ptxas -v output of assembling ``ptx`` for sm_90a into ``out`` (None without a ptxas)."""
    # the newer of Triton's bundled assemblers reads the PTX version Triton emits
    ptxas = _bin("ptxas-blackwell", "ptxas")
    if ptxas is None:
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        r = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", out],
                           capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    return r.stdout + r.stderr


def loop_counts(ptx):
    """(ptxas messages, {opcode: count}) of the largest loop (the longest backward branch) of
    the kernel's sm_90a SASS; opcodes without their modifiers."""
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        messages = _ptxas(ptx, cubin)
        sass = subprocess.run([_bin("nvdisasm"), "-c", cubin], capture_output=True,
                              text=True).stdout
    labels, code, pending = {}, [], None
    for line in sass.splitlines():
        m = re.match(r"\s*\.(L_x_\d+):", line)
        if m:
            pending = m.group(1)
            continue
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*?);", line)
        if m:
            addr = int(m.group(1), 16)
            if pending:
                labels[pending], pending = addr, None
            code.append((addr, m.group(2).split(".")[0], m.group(3)))
    loops = [(labels[m.group(1)], addr) for addr, op, rest in code if op == "BRA"
             for m in [re.search(r"\(\.(L_x_\d+)\)", rest)]
             if m and labels.get(m.group(1), addr) < addr]
    lo, hi = max(loops, key=lambda r: r[1] - r[0]) if loops else (0, -1)
    counts = {}
    for addr, op, _ in code:
        if lo <= addr <= hi:
            counts[op] = counts.get(op, 0) + 1
    return messages, counts


def _ptxas_usage(ptx):
    text = _ptxas(ptx, os.devnull)
    if text is None:
        return None, None
    regs = re.findall(r"Used (\d+) registers", text)
    spills = re.findall(r"(\d+) bytes spill stores", text)
    return (int(regs[0]) if regs else None), (int(spills[0]) if spills else None)


_LOOP_OPS = ("HGMMA", "WARPGROUP", "BAR", "ISETP", "IMAD", "SEL", "FMUL", "LDL", "STL", "LDG",
             "LDGSTS", "REDG")


def main(argv):
    sass = "--sass" in argv
    argv = [a for a in argv if a != "--sass"]
    if len(argv) < 2 or argv[0] not in ("fwd", "bwd", "fwd32", "bwd32", "fwdtc", "bwdtc", "fwdtc2",
                                        "bwdtc2", "fwdbf", "bwdbf"):
        raise SystemExit(__doc__)
    if argv[0] in ("fwdbf", "bwdbf"):
        for text in argv[1:]:
            cfg = tuple(int(x) for x in text.split(","))
            try:
                for name, shared, regs, spills, asm in compile_bf16x6(argv[0][:3], cfg):
                    line = f"{argv[0]} {name} {cfg}: shared {shared} B, {regs} registers, {spills} B spilled"
                    if sass:
                        _, counts = loop_counts(asm["ptx"])
                        line += "; loop: " + ", ".join(f"{op} {counts.get(op, 0)}" for op in _LOOP_OPS)
                    print(line, flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{argv[0]} {cfg}: error {e!r}"[:300], flush=True)
        return
    which, fp32 = argv[0][:3], argv[0].endswith("32")
    tc = 2 if argv[0].endswith("tc2") else 1 if argv[0].endswith("tc") else 0
    for text in argv[1:]:
        numbers, *switches = text.split("+")
        cfg = tuple(int(x) for x in numbers.split(","))
        name = f"{argv[0]} {cfg}{''.join('+' + s for s in switches)}"
        try:
            shared, regs, spills, asm = compile_for_sm90(which, cfg, fp32, asm=True, tc=tc,
                                                         switches=switches)
            line = f"{name}: shared {shared} B, {regs} registers, {spills} B spilled"
            if sass:
                messages, counts = loop_counts(asm["ptx"])
                serial = "C7515" in (messages or "")
                line += (f"; wgmma {'SERIALISED (C7515)' if serial else 'pipelined'}; loop "
                         f"{sum(counts.values())} instructions: "
                         + ", ".join(f"{op} {counts.get(op, 0)}" for op in _LOOP_OPS))
            print(line, flush=True)
        except Exception as e:  # noqa: BLE001  (a config the compiler rejects is reported)
            print(f"{name}: error {e!r}"[:300], flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
