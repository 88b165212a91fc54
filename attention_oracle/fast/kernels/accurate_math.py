"""Accurate exp and log for the fp32 kernel paths (fast SDPA and fast DSA).

Natively, fp32 ``tl.exp`` lowers to a multiply by log2(e) and ``ex2.approx`` (a few ulps), so the
fp32 paths use libdevice (``__nv_exp`` / ``__nv_log`` on fp64 arguments, rounded once to fp32
by the caller). Triton's CPU interpreter does not run libdevice (its stubs return None), but
there ``tl.exp`` / ``tl.log`` are numpy's, and numpy's double functions are accurate. Which
pair is used follows what ``@triton.jit`` made of these functions: no environment is read.
"""
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _exp_libdevice(x):
    return libdevice.exp(x)


@triton.jit
def _log_libdevice(x):
    return libdevice.log(x)


@triton.jit
def _exp_interpreted(x):
    return tl.exp(x)


@triton.jit
def _log_interpreted(x):
    return tl.log(x)


_INTERPRETED = isinstance(_exp_libdevice, InterpretedFunction)
exp_accurate = _exp_interpreted if _INTERPRETED else _exp_libdevice
log_accurate = _log_interpreted if _INTERPRETED else _log_libdevice
