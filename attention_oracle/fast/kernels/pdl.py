"""Programmatic dependent launch (PDL, Hopper): index preparation -> DSA forward.

With PDL on (:func:`attention_oracle.fast.index.set_pdl`), the index kernel lets its dependent
launch early (``gdc_launch_dependents``) and the DSA forward, launched with
``launch_pdl=True``, loads its queries and then waits for the index grid to finish
(``gdc_wait``) before reading indices and lengths. Both calls sit behind a ``PDL`` constexpr,
so the default kernels (and the CPU interpreter) never see them. ``AVAILABLE`` is False on a
Triton without Triton's GDC intrinsics.
"""
try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    AVAILABLE = True
except ImportError:  # an older Triton: PDL stays off
    gdc_launch_dependents = gdc_wait = None
    AVAILABLE = False

__all__ = ["AVAILABLE", "gdc_launch_dependents", "gdc_wait"]
