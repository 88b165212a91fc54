"""The machine code of a compiled kernel as straight-line blocks counted by opcode, from the
nvdisasm bundled with Triton: how many instructions a warp issues for one tile's softmax or
products (docs/FINDINGS.md F93), read offline. The probes (:mod:`.gluon_probe`,
:mod:`.sdpa_probe`) print them with ``--sass``."""
import collections
import json
import os
import re
import subprocess
import tempfile

from .dsa_probe import _bin

_SASS_LINE = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_SASS_LABEL = re.compile(r"^\s*\.L_x_\d+:")


def sass_blocks(cubin):
    """[(address, instruction count, Counter of opcodes)] of the cubin's straight-line blocks,
    cut before each label and after each branch (``MUFU.EX2`` and ``HGMMA`` counted under
    those names, other opcodes by their first part)."""
    nvdisasm = _bin("nvdisasm")
    if nvdisasm is None:
        raise RuntimeError("no nvdisasm beside Triton's ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True,
                              check=True).stdout
    blocks, start, ops = [], None, collections.Counter()

    def close():
        if ops:
            blocks.append((start, sum(ops.values()), ops.copy()))
        ops.clear()

    for line in sass.splitlines():
        if _SASS_LABEL.match(line):
            close()
            continue
        m = _SASS_LINE.match(line)
        if not m:
            continue
        if not ops:
            start = int(m.group(1), 16)
        op = m.group(2)
        ops["MUFU.EX2" if op.startswith("MUFU.EX2") else op.split(".")[0]] += 1
        if op.startswith(("BRA", "EXIT", "RET")):
            close()
    close()
    return blocks


def tile_blocks(cubin):
    """The blocks (:func:`sass_blocks`) that do a tile's products or its softmax: a wgmma or
    an mma, or at least 16 ``MUFU.EX2``."""
    return [(addr, n, ops) for addr, n, ops in sass_blocks(cubin)
            if ops["HGMMA"] or ops["HMMA"] or ops["MUFU.EX2"] >= 16]


def block_lines(blocks):
    """One line a block: its address, instruction count and most frequent opcodes."""
    return [f"{addr:#07x}: {n:4} instructions; "
            + ", ".join(f"{k} {v}" for k, v in ops.most_common(12)) for addr, n, ops in blocks]


def blocks_json(blocks):
    """The blocks as JSON: a list of [address, count, {opcode: count}]."""
    return json.dumps([[addr, n, dict(ops)] for addr, n, ops in blocks])
