"""Poisoned allocations: while a check runs, new uninitialised tensors come pre-filled.

``torch.empty`` hands back whatever the allocator had: often zeros on a fresh CPU page, often
the previous tensor's values on a GPU caching allocator. A kernel that never writes part of
its output (a last query row its grid misses, a tail tile it skips) can therefore pass by
luck. Inside :func:`poisoned`, every tensor made by the ``empty`` family is filled first:

- floating point (float8 included, where the type has a NaN): NaN;
- complex: NaN + NaN j;
- signed integers: the dtype's minimum (``-2**31`` for int32: never a valid index, a length or
  the -1 of an invalid slot);
- unsigned integers: the dtype's maximum;
- bool: True.

So an output element the implementation never wrote is NaN (the agreement rule fails
NaN where the gold is finite) or a sentinel (the exact index checks fail it), every time.

Patched, on ``torch`` and ``torch.Tensor``: ``empty``, ``empty_like``, ``empty_strided``,
``empty_permuted``, ``Tensor.new_empty``, ``Tensor.new_empty_strided``. Only Python-level
calls are seen: allocations inside ATen (an op's own output, autograd's gradient buffers) are
the library's business and stay as they are; so do calls made while ``torch.compile`` traces
(the fill would enter the graph) and tensor subclasses (fake or functional tensors of a
tracer). The patch is process-wide, not per thread, on purpose: autograd runs a custom
backward on its own device threads, and those allocations must be poisoned too.

Re-entrant (a depth count: the originals come back when the outermost block exits, also on
an exception) and guarded by a lock, so threads entering and leaving concurrently keep the
patch consistent. ``set_enabled(False)`` (the plugin's ``--no-poison``, ``ORACLE_NO_POISON=1``,
``calibrate --no-poison``, ``replay --no-poison``) turns :func:`poisoned` into a no-op for debugging.
"""
from __future__ import annotations

import contextlib
import functools
import threading

import torch

_TARGETS = (
    (torch, "empty"),
    (torch, "empty_like"),
    (torch, "empty_strided"),
    (torch, "empty_permuted"),
    (torch.Tensor, "new_empty"),
    (torch.Tensor, "new_empty_strided"),
)

_lock = threading.RLock()
_state = {"depth": 0, "enabled": True}
_saved: list[tuple[object, str, object, bool]] = []  # (owner, name, original, owned by owner)
# one wrapper per original, reused by every install: torch.compile guards on the identity of
# the functions it traces through, and a fresh wrapper per block would force a recompile each time
_wrappers: dict[tuple[int, str], object] = {}


def set_enabled(enabled: bool) -> None:
    """Turn poisoning on (the default) or off for every later :func:`poisoned` block."""
    _state["enabled"] = bool(enabled)


def is_enabled() -> bool:
    return _state["enabled"]


def is_active() -> bool:
    """True while the allocation functions are patched."""
    return _state["depth"] > 0


def poison_value(dtype: torch.dtype):
    """The fill for a new tensor of ``dtype`` (None: leave it as allocated)."""
    if dtype == torch.bool:
        return True
    if dtype.is_complex:
        return complex(float("nan"), float("nan"))
    if dtype.is_floating_point:
        return float("nan")
    try:
        info = torch.iinfo(dtype)
    except TypeError:  # quantized and other exotic types
        return None
    return info.min if info.min < 0 else info.max


_values: dict = {}


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` in place with its dtype's poison; a tensor that cannot be filled is left."""
    if type(t) is not torch.Tensor or t.numel() == 0 or t.layout != torch.strided or t.is_meta:
        return t
    if t.dtype not in _values:
        _values[t.dtype] = poison_value(t.dtype)
    value = _values[t.dtype]
    if value is None:
        return t
    try:
        if t.requires_grad:  # a leaf made with requires_grad=True: fill it outside autograd
            with torch.no_grad():
                t.fill_(value)
        else:
            t.fill_(value)
    except (RuntimeError, TypeError):  # a dtype without a fill kernel on this device
        pass
    return t


def _compiling() -> bool:
    try:
        return torch.compiler.is_compiling()
    except AttributeError:  # pragma: no cover - torch < 2.3
        return False


def _poisoning(original):
    @functools.wraps(original)
    def allocate(*args, **kwargs):
        result = original(*args, **kwargs)
        if not _compiling():
            poison_(result)
        return result

    allocate.__poisoned_original__ = original
    return allocate


def _install() -> None:
    for owner, name in _TARGETS:
        original = getattr(owner, name, None)
        if original is None:  # empty_permuted is missing on older torch
            continue
        _saved.append((owner, name, original, name in vars(owner)))
        key = (id(original), name)
        if key not in _wrappers:
            _wrappers[key] = _poisoning(original)
        setattr(owner, name, _wrappers[key])


def _uninstall() -> None:
    while _saved:
        owner, name, original, owned = _saved.pop()
        if owned:
            setattr(owner, name, original)
        else:  # inherited (Tensor.new_empty comes from TensorBase): drop the shadowing attribute
            delattr(owner, name)


@contextlib.contextmanager
def poisoned(enabled: bool | None = None):
    """Within the block, the ``empty`` family returns poisoned tensors (see the module doc).

    ``enabled`` overrides :func:`is_enabled` for this block."""
    if not (is_enabled() if enabled is None else enabled):
        yield
        return
    with _lock:
        if _state["depth"] == 0:
            _install()
        _state["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                _uninstall()
