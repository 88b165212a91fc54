"""Layouts: the strided views a user really passes, holding the same values as a logical tensor.

- ``contiguous``: a plain contiguous tensor.
- ``transposed``: stored with two dims swapped in memory, viewed back (e.g. SDPA's
  ``[B, L, H, E]`` buffer seen as ``[B, H, L, E]``; DSA's head-major ``dout``
  ``[H, T, Dv]`` seen as ``[T, H, Dv]`` with strides ``(Dv, T*Dv, 1)``).
- ``sliced``: a window of a larger buffer (extra rows and channels). The rest of the buffer
  is poisoned with NaN, so a kernel that reads outside its view produces NaN. Row strides and
  the start stay multiples of 8 elements (16-byte aligned), as in a trainer's channel slices.
- ``misaligned``: like ``sliced`` but the row stride and the start are odd element counts
  (not 16-byte aligned): legal strides that vectorised kernels must handle or refuse.
- ``broadcast``: stride 0 along one dim (the values are made constant along it first).

A layout never changes values except ``broadcast``, whose values callers take from the
returned view (``view.contiguous()`` is the logical tensor).
"""
from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "transposed", "sliced", "misaligned", "broadcast")


def _poisoned(shape, like: torch.Tensor) -> torch.Tensor:
    fill = float("nan") if like.is_floating_point() else -(2 ** 30)
    return torch.full(shape, fill, dtype=like.dtype, device=like.device)


def lay_out(values: torch.Tensor, layout: str, dims: tuple[int, int] = (-3, -2)) -> torch.Tensor:
    """Return a tensor with ``values``' contents (see module doc for ``broadcast``) in ``layout``.

    ``dims``: the two dims that ``transposed`` swaps in memory and that ``broadcast``
    (the second) and ``sliced`` (both, plus the last) pad.
    """
    if values.dim() < 2 and layout in ("transposed", "broadcast"):
        layout = "sliced"
    if layout == "contiguous":
        return values.contiguous()
    if layout == "transposed":
        a, b = dims
        if values.dim() < 3:
            a, b = 0, 1
        return values.transpose(a, b).contiguous().transpose(a, b)
    if layout in ("sliced", "misaligned"):
        return _window(values, dims, aligned=layout == "sliced")
    if layout == "broadcast":
        d = dims[1] if values.dim() >= 3 else 0
        return values.narrow(d, 0, 1).expand(values.shape)
    raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")


def _window(values: torch.Tensor, dims, aligned: bool) -> torch.Tensor:
    """``values`` copied into a NaN-poisoned larger buffer: rows padded by 3 (start 1) in the
    ``dims``; channels padded to a multiple of 8 plus 8, starting at 8 (``aligned``), or to an
    odd count, starting at 1."""
    n = values.dim()
    rows = {d % n for d in (dims if n >= 3 else (0,))} - {n - 1}
    c = values.shape[-1]
    if aligned:
        c_pad, c_start = (-c) % 8 + 8, 8
    else:
        c_pad, c_start = (3 if (c + 3) % 2 else 4), 1
    pads = [c_pad if d == n - 1 else (3 if d in rows else 0) for d in range(n)]
    starts = [c_start if d == n - 1 else (1 if d in rows else 0) for d in range(n)]
    buf = _poisoned([size + pad for size, pad in zip(values.shape, pads)], values)
    window = buf[tuple(slice(b, b + size) for b, size in zip(starts, values.shape))]
    window.copy_(values)
    return window


def fresh(values: torch.Tensor, layout: str, dims=(-3, -2), requires_grad=False) -> torch.Tensor:
    """``lay_out`` as a leaf tensor (strides kept), optionally requiring grad."""
    t = lay_out(values, layout, dims).detach()
    return t.requires_grad_() if requires_grad else t
