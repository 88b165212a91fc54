"""Triton's 3xTF32 dots as the GPU computes them, for kernels run under the interpreter.

Triton's interpreter computes ``tl.dot(..., input_precision="tf32x3")`` as a plain fp32 matmul,
so a CPU run would check a tf32x3 kernel's algorithm but not its arithmetic. Inside
:func:`emulated_tf32x3` the interpreter computes those dots as Triton's F32DotTC decomposition
does on the GPU (read off the sm_90 TTGIR of Triton 3.8): big = cvt.rna.tf32(a), small = a - big
(read by the tensor core as tf32, i.e. truncated), small_a.big_b + big_a.small_b + big_a.big_b,
each product exact and summed in fp32, then + acc. Shared by the SDPA and DSA smoke tests.
"""
import contextlib

import numpy as np


def _tf32_rna(x):
    """fp32 -> tf32 (10 mantissa bits) rounded to nearest, ties away: PTX cvt.rna.tf32.f32."""
    r = ((x.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isfinite(x), r, x)


def _tf32_read(x):
    """What a TF32 tensor core reads of an fp32 register: its top 19 bits (truncation)."""
    return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


@contextlib.contextmanager
def emulated_tf32x3(drop_cross_term=False):
    """Inside this block the interpreter computes fp32 tf32x3 dots as the GPU does (module
    docstring). ``drop_cross_term`` leaves big_a.small_b out (a planted bug for negative
    controls: an error of ~2^-11 relative per product, between TF32 and 3xTF32)."""
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    plain = InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if "TF32x3" not in str(input_precision) or a.data.dtype != np.float32:
            return plain(self, a, b, d, input_precision, max_num_imprecise_acc)
        a_big, b_big = _tf32_rna(a.data), _tf32_rna(b.data)
        a_small, b_small = _tf32_read(a.data - a_big), _tf32_read(b.data - b_big)
        r = np.matmul(a_small, b_big, dtype=np.float32)
        if not drop_cross_term:
            r = np.matmul(a_big, b_small, dtype=np.float32) + r
        r = np.matmul(a_big, b_big, dtype=np.float32) + r
        return TensorHandle(r + d.data, d.dtype.scalar)

    InterpreterBuilder.create_dot = create_dot
    try:
        yield
    finally:
        InterpreterBuilder.create_dot = plain
