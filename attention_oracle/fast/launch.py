"""Direct launches of compiled Triton kernels, without ``JITFunction.run``'s per-call work.

``kernel[grid](*args, **kwargs)`` costs ~25-30 us of host time per launch on the H200 machine
(docs/DESIGN.md "10. fast SDPA (Triton)", Launches: Triton's binder and ``native_specialize_impl`` over ~45 arguments, the
cache key, option parsing). :class:`DirectLauncher` makes the first launch of each
specialization that way and keeps the ``CompiledKernel`` Triton returned; later launches with
the same specialization key call the kernel's C launcher directly (``CompiledKernel.run``,
whose calling convention Triton 3.2-3.8 share).

The specialization key (:func:`specialization_key`) distinguishes at least everything Triton
specializes a compiled kernel on, so two launches sharing a key run the same compiled kernel:

* tensors: the dtype and whether ``data_ptr()`` is a multiple of 16;
* host tensor descriptors (Gluon's TMA ``TensorDescriptor``): the base's dtype, the block
  shape, the shared layout and the padding (what their type string holds);
* ints: i32 / i64 / u64 by range, the value 1, divisibility by 16 (Triton ignores the last two
  for ``do_not_specialize`` arguments; keeping them only adds cache entries);
* floats (fp32), bools (u1), None (a constexpr): their type;
* every keyword argument (constexprs and options such as ``num_warps``) by value;
* the current CUDA device (a launch first makes its first tensor's device current).

Anything else (an argument of another type, a launch hook or pre-run hook installed, Triton's
interpreter, a ``CompiledKernel`` without the expected attributes, an exception on the first
direct launch) falls back to ``kernel[grid](...)``. Not covered: changing Triton's process-wide
knobs (``TRITON_DEBUG``, instrumentation) after the first launch; ``check`` mode (below) finds
any key collision.

The first direct launch of each compiled kernel asks Triton (``warmup=True``: no launch) which
compiled kernel it would run for those arguments; a mismatch sends the launcher back to
Triton's path with a warning. Modes (``set_launch_mode`` / ``$ATTENTION_ORACLE_FAST_LAUNCH``):
``direct`` (default), ``triton`` (always ``kernel[grid](...)``), ``check`` (every direct launch
is checked so, and a mismatch raises).

:class:`BoundLaunch` and :class:`TmaBoundLaunch` (kernels whose leading arguments are host TMA
descriptors) keep one call site's launch once it went direct, so that a repeat call builds no
key; the second also expands the descriptors itself (:func:`tma_expansion`).
"""
import copy
import ctypes
import functools
import inspect
import sys
import warnings

import torch
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from .host import Choice

LAUNCH_MODES = ("direct", "triton", "check")
_MODE = Choice("ATTENTION_ORACLE_FAST_LAUNCH", LAUNCH_MODES, "direct")

# int codes of specialization_key: (i32, i64, u64) x (not / divisible by 16), and the value 1
_I32_MIN, _I32_MAX = -2**31, 2**31 - 1
_I64_MIN, _I64_MAX = -2**63, 2**63 - 1
_ONE, _FLOAT, _BOOL, _NONE = 6, 7, 8, 9
_MAX_KERNELS = 4096  # entries per launcher before the cache is emptied (shapes are in the key)
_MAX_MAPS = 64  # tensor maps kept per descriptor of a TmaBoundLaunch (by base address)
_DATA_PTR = torch.Tensor.data_ptr  # mapped over a launch's tensors: cheaper than a method call each


def set_launch_mode(mode):
    """Launch mode of later calls (module docstring); returns the previous one."""
    return _MODE.set(mode)


class Unkeyable(TypeError):
    """An argument whose Triton specialization the key does not model."""


def _int_code(a):
    if a == 1:
        return _ONE
    div = a & 15 == 0
    if _I32_MIN <= a <= _I32_MAX:
        return div
    if _I64_MIN <= a <= _I64_MAX:
        return 2 + div
    return 4 + div


def specialization_key(args):
    """One hashable entry per positional argument (module docstring); raises
    :class:`Unkeyable` for a type it does not model."""
    out = []
    append = out.append
    for a in args:
        c = a.__class__
        if c is int:  # the common i32 case inline (a call per argument costs as much again)
            append((a & 15 == 0) if a != 1 and _I32_MIN <= a <= _I32_MAX else _int_code(a))
        elif c is float:
            append(_FLOAT)
        elif c is bool:
            append(_BOOL)
        elif a is None:
            append(_NONE)
        elif c in _DESCRIPTOR_CLASSES:  # a class seen as a descriptor before: no exception
            append(_descriptor_key(a))
        else:
            try:
                append((a.dtype, a.data_ptr() & 15 == 0))
            except AttributeError as exc:
                desc = _descriptor_key(a)
                if desc is None:
                    raise Unkeyable(f"argument of type {c.__name__}") from exc
                _DESCRIPTOR_CLASSES.add(c)
                append(desc)
    return tuple(out)


_DESCRIPTOR_CLASSES = set()  # classes of host tensor descriptors met so far


def _descriptor_key(a):
    """A host tensor descriptor's specialization (its type string's parts: dtype, block shape,
    shared layout, padding), None for any other object."""
    try:
        return ("tensordesc", a.base.dtype, tuple(a.block_shape), a.layout,
                getattr(a, "padding", None))
    except AttributeError:
        return None


def tensor_keys(tensors, ptrs=None):
    """(dtype, 16-byte aligned) per tensor: what Triton specializes a tensor argument on.
    ``ptrs``: the tensors' addresses where the caller has read them already."""
    if ptrs is None:
        return tuple([(t.dtype, t.data_ptr() & 15 == 0) for t in tensors])
    return tuple([(t.dtype, p & 15 == 0) for t, p in zip(tensors, ptrs)])


def misaligned(ptrs):
    """Whether any of the addresses ``ptrs`` is not a multiple of 16 bytes."""
    m = 0
    for p in ptrs:
        m |= p
    return m & 15 != 0


def _grid3(grid):
    g = tuple(grid)
    return (g + (1, 1))[:3] if len(g) < 3 else g


class _Entry:
    """What a direct launch needs of one compiled kernel."""
    __slots__ = ("kernel", "run", "function", "packed", "tail", "verified")

    def __init__(self, kernel, tail):
        self.kernel = kernel
        self.verified = False  # Triton confirmed it picks this kernel (on the first direct launch)
        self.run = kernel.run  # initialises the module handles on Triton versions that defer it
        self.function = kernel.function
        self.packed = kernel.packed_metadata
        self.tail = tail


class DirectLauncher:
    """``launcher(grid, args, kwargs)`` launches ``jit[grid](*args, **kwargs)`` (``grid`` a tuple
    of at most 3 ints, ``args`` the leading positional parameters, ``kwargs`` the remaining
    parameters and Triton options), directly once the specialization has been launched once."""

    def __init__(self, jit, n_tensors=None):
        """``n_tensors``: the caller promises that exactly the first ``n_tensors`` arguments are
        tensors (the rest ints, floats, bools or None); launches are then looked up first by
        the raw values of the rest (a C-speed tuple hash instead of :func:`specialization_key`'s
        loop; finer than Triton's key, so it only adds entries)."""
        self.jit = jit
        self.n_tensors = n_tensors
        self.raw = {}
        self.kernels = {}
        self.names = None
        self.defaults = None
        self.usable = _is_jit_function(jit)
        self.driver = None
        self.direct_launches = 0  # for tests: how many launches took the direct path

    def __call__(self, grid, args, kwargs):
        """Launches; returns the entry of the compiled kernel when it was launched directly
        (for :class:`BoundLaunch`), else None."""
        return on_device_of(args[0], self._launch, grid, args, kwargs)  # the tensors' device

    def _launch(self, grid, args, kwargs):
        mode = _MODE.value
        if mode == "triton" or not self.usable or getattr(self.jit, "pre_run_hooks", None):
            self.jit[grid](*args, **kwargs)
            return None
        try:
            device, options = self._device(), tuple(kwargs.items())
            raw = entry = None
            n = self.n_tensors
            if n is not None:
                rest = args[n:]
                raw = (device, tensor_keys(args[:n]),
                       rest, tuple(map(type, rest)), options)
                entry = self.raw.get(raw)
            if entry is None:
                key = (device, specialization_key(args), options)
                entry = self.kernels.get(key)
                if entry is not None and raw is not None:
                    self._remember_raw(raw, entry)
        except Exception:  # noqa: BLE001 - an unmodelled argument, no driver: Triton's own path
            self.jit[grid](*args, **kwargs)
            return None
        if entry is None:
            kernel = self.jit.run(*args, grid=grid, warmup=False, **kwargs)
            self._remember(key, kernel, len(args), kwargs)
            return None
        if mode == "check" or not entry.verified:
            if not self._check(entry, grid, args, kwargs, strict=mode == "check"):
                self.jit[grid](*args, **kwargs)
                return None
        if self.hooked():
            self.jit[grid](*args, **kwargs)
            return None
        g0, g1, g2 = _grid3(grid)
        try:
            entry.run(g0, g1, g2, self.stream(device), entry.function, entry.packed, None, None,
                      None, *args, *entry.tail)
            self.direct_launches += 1
        except Exception as exc:  # noqa: BLE001 - any failure: back to Triton's own path for good
            self.usable = False
            warnings.warn(f"{self.jit.fn.__name__}: direct launch failed ({exc!r}); "
                          f"using Triton's launch path from now on", RuntimeWarning, stacklevel=2)
            self.jit[grid](*args, **kwargs)
            return None
        return entry

    def hooked(self):
        """Whether a profiler installed a launch hook (those launches take Triton's path)."""
        knobs = self.knobs
        return _installed(knobs.launch_enter_hook) or _installed(knobs.launch_exit_hook)

    def __getitem__(self, grid):
        """``launcher[grid](*args, **kwargs)``, as a JIT function is called."""
        return lambda *args, **kwargs: self(grid, args, kwargs)

    def _device(self):
        if self.driver is None:
            from triton import knobs
            from triton.runtime.driver import driver
            active = driver.active
            self.device_of, self.stream = active.get_current_device, active.get_current_stream
            self.knobs = knobs.runtime
            self.driver = active
        return self.device_of()

    def _remember(self, key, kernel, n_args, kwargs):
        if kernel is None or hasattr(kernel, "result"):  # not compiled yet (a hook or async mode)
            return
        if self.names is None:
            self.names = [p.name for p in self.jit.params]
            self.defaults = [_default_of(p) for p in self.jit.params]
        try:
            tail = tuple(kwargs[n] if n in kwargs else d
                         for n, d in zip(self.names[n_args:], self.defaults[n_args:]))
            entry = _Entry(kernel, tail)
        except (AttributeError, KeyError):
            self.usable = False
            return
        if len(self.kernels) >= _MAX_KERNELS:
            self.kernels.clear()
        self.kernels[key] = entry

    def _remember_raw(self, raw, entry):
        if len(self.raw) >= _MAX_KERNELS:
            self.raw.clear()
        self.raw[raw] = entry

    def _check(self, entry, grid, args, kwargs, strict):
        """Whether Triton (asked with ``warmup=True``, which launches nothing) would run this
        entry's compiled kernel for these arguments. Each entry is checked on its first direct
        launch; in check mode on every one, and a mismatch raises. Otherwise a mismatch sends
        this launcher to Triton's path for good, with a warning."""
        expected = self.jit.run(*args, grid=grid, warmup=True, **kwargs)
        if expected is entry.kernel:
            entry.verified = True
            return True
        msg = (f"{self.jit.fn.__name__}: the direct launcher's specialization key maps these "
               f"arguments to another compiled kernel than Triton's")
        if strict:
            raise RuntimeError(msg)
        self.usable = False
        warnings.warn(msg + "; using Triton's launch path from now on", RuntimeWarning,
                      stacklevel=3)
        return False


class BoundLaunch:
    """``bound(args)`` launches ``launcher[grid](*args, **kwargs)`` for one call site whose grid
    and keyword arguments are fixed and whose argument types per position never change.

    Once ``launcher`` (a :class:`DirectLauncher` with ``n_tensors``) has launched directly, the
    compiled kernel it ran is kept with that call's non-tensor arguments and its tensors'
    (dtype, 16-byte alignment); a later call whose non-tensor arguments compare equal and whose
    tensors have the same keys calls the kernel's own launcher without building the launcher's
    lookup keys: equal values at positions of fixed types are equal specializations. Anything
    else (another launch mode, a launch hook, tensors on another device than the current one,
    a failing launch) goes through ``launcher``.

    :meth:`fixed` serves a call site whose non-tensor arguments are one tuple kept by the
    caller: the same object means the same values, so it skips the comparison and launches
    with that tuple and the compiled kernel's trailing arguments joined once."""
    __slots__ = ("launcher", "grid", "grid3", "kwargs", "n", "bound")

    def __init__(self, launcher, grid, kwargs):
        if launcher.n_tensors is None:
            raise ValueError("BoundLaunch needs a DirectLauncher with n_tensors")
        self.launcher, self.grid, self.grid3, self.kwargs = launcher, grid, _grid3(grid), kwargs
        self.n = launcher.n_tensors
        # (entry, non-tensor arguments, tensor keys, those arguments + the entry's tail, whether
        # every tensor was 16-byte aligned) of the last direct launch: one tuple, so a thread
        # never sees one launch's entry with another's arguments
        self.bound = None

    def __call__(self, args):
        n, bound = self.n, self.bound
        rest = args[n:]
        if bound is not None and rest == bound[1]:
            rest = bound[1]  # equal values: the kept tuple, so that fixed takes the direct path
        self.fixed(args[:n], rest)

    def fixed(self, tensors, rest):
        """``self(tensors + rest)`` for ``len(tensors) == n_tensors`` where the caller passes the
        same ``rest`` object while its values stay the same (class docstring)."""
        bound = self.bound
        if bound is not None and rest is bound[1] and _MODE.value == "direct":
            launcher = self.launcher
            if (launcher.usable and other_device(tensors[0]) is None and not launcher.hooked()
                    and tensor_keys(tensors) == bound[2]):
                entry = bound[0]
                g0, g1, g2 = self.grid3
                try:
                    entry.run(g0, g1, g2, launcher.stream(launcher.device_of()), entry.function,
                              entry.packed, None, None, None, *tensors, *bound[3])
                    launcher.direct_launches += 1
                    return
                except Exception:  # noqa: BLE001 - the launcher's own path decides (and warns)
                    self.bound = None
        entry = self.launcher(self.grid, tensors + rest, self.kwargs)
        if entry is not None and other_device(tensors[0]) is None:
            keys = tensor_keys(tensors)
            self.bound = (entry, rest, keys, rest + entry.tail, all(k[1] for k in keys))

    def addresses(self, ptrs, device, rest):
        """The bound launch with ``ptrs`` (ints) in the tensors' places, for a caller whose
        tensors are validated CUDA tensors of device ``device`` (an index) with the same dtype at
        each position in every call of this object; returns whether it launched (False: call
        :meth:`fixed` with the tensors instead). Triton's C launcher asks the driver about each
        tensor argument's pointer (what turns a CPU tensor into an error); these are known to be
        device memory, so that query and the dtype keys are skipped. Only launches whose bound
        tensors were all 16-byte aligned, with every address here aligned too, take it."""
        bound = self.bound
        if bound is None or rest is not bound[1] or not bound[4] or _MODE.value != "direct":
            return False
        launcher = self.launcher
        if (misaligned(ptrs) or not launcher.usable or launcher.hooked()
                or (_several_gpus() and device != torch.cuda.current_device())):
            return False
        entry = bound[0]
        g0, g1, g2 = self.grid3
        try:
            entry.run(g0, g1, g2, launcher.stream(device), entry.function, entry.packed, None,
                      None, None, *ptrs, *bound[3])
        except Exception:  # noqa: BLE001 - the launcher's own path decides (and warns)
            self.bound = None
            return False
        launcher.direct_launches += 1
        return True


class TmaBoundLaunch:
    """``bound.fixed(bases, tensors, rest)`` launches ``launcher[grid](*descriptors, *middle,
    **kwargs)`` for one call site of a kernel whose leading arguments are host TMA descriptors
    (Gluon's ``TensorDescriptor``): ``make(fields[i], bases[i])`` each, the fields fixed per
    call site; ``middle`` holds ``tensors`` at the positions ``tensor_slots`` (default: first)
    and ``rest``'s values elsewhere, in order.

    Through :class:`DirectLauncher` a launch builds the descriptor objects and the launcher's
    key over them, and Triton's launcher expands each descriptor in Python (its tensor map
    encoded, then its shape and strides): ~10 us of host time a call at four descriptors
    (docs/PERFORMANCE.md "Gluon launches: the descriptors expanded here"). Once ``launcher``
    has launched this call site directly, the compiled kernel's C launcher is called with the
    arguments expanded here: each tensor map encoded by the driver's encoder with the
    arguments Triton would pass (computed once), then its shape and strides. A map is a
    function of the base address and those fixed arguments alone, so each descriptor keeps the
    maps of up to ``_MAX_MAPS`` addresses (0.5-0.6 us each to encode; the caching allocator
    hands the same addresses to the same shapes call after call). The binding compares that
    expansion with Triton's own for the same descriptors, the tensor maps byte for byte; any
    difference, or a Triton whose launcher is not laid out as :func:`tma_expansion` expects,
    leaves the call site on the launcher's path. As in :class:`BoundLaunch`, a later call
    whose ``rest`` is the same object and whose tensors (``bases`` and ``tensors``) have the
    same keys takes the bound path, its tensors passed as their addresses; its arguments are
    kept for the last addresses, so a call repeated on the same addresses builds none;
    anything else goes through ``launcher``. As the tensor maps always were, the tensors are
    then taken for device memory without asking the driver (what would turn a CPU tensor into
    an error): the callers pass CUDA tensors of one device, validated or allocated by them."""
    __slots__ = ("launcher", "grid", "grid3", "kwargs", "fields", "make", "tensor_slots",
                 "utils", "bound", "failure", "refused", "last", "typed")

    def __init__(self, launcher, grid, kwargs, fields, make, tensor_slots=None, utils=None,
                 typed=False):
        """``utils``: the driver's utility module with the encoder (the active CUDA driver's
        by default). ``typed``: the caller passes tensors of one dtype per position in every
        call (its own allocations, or a plan made per dtype), so a launch on the last bound
        launch's addresses skips comparing the tensors' keys."""
        self.launcher, self.grid, self.grid3, self.kwargs = launcher, grid, _grid3(grid), kwargs
        self.typed = typed
        self.fields, self.make = tuple(fields), make
        self.tensor_slots, self.utils = tensor_slots, utils
        # (entry, rest, tensor keys, launcher without the descriptor wrapper, argument template,
        # ((slot, maps by address, encoder, its arguments after the address) per descriptor),
        # tensor slots)
        self.bound = None
        # (addresses, the launch's arguments) of the last bound launch: the caching allocator
        # hands a repeated call the same addresses, whose arguments are then made once
        self.last = None
        self.failure = None  # why the last binding was refused (None: bound, or not yet tried)
        self.refused = None  # the compiled kernel it was refused for (not tried again)

    def middle(self, tensors, rest):
        """The arguments after the descriptors."""
        slots = self.tensor_slots
        if slots is None:
            return tuple(tensors) + tuple(rest)
        out, it_t, it_r = [], iter(tensors), iter(rest)
        for i in range(len(tensors) + len(rest)):
            out.append(next(it_t) if i in slots else next(it_r))
        return tuple(out)

    def fixed(self, bases, tensors, rest):
        """One launch (class docstring); returns True, or False where a base's address is not
        16-byte aligned (what TMA requires): then nothing is launched and the caller runs
        another kernel. The last bound launch's addresses were aligned, so a call on them is
        not checked again."""
        bound = self.bound
        if bound is not None and rest is bound[1] and _MODE.value == "direct":
            launcher = self.launcher
            every = bases + tensors
            ptrs = list(map(_DATA_PTR, every))
            last = self.last
            # typed: the same addresses as the last launch's are its keys again
            same = last is not None and last[0] == ptrs
            if not same and misaligned(ptrs[:len(bases)]):
                return False
            if (launcher.usable and other_device(bases[0]) is None and not launcher.hooked()
                    and ((same and self.typed) or tensor_keys(every, ptrs) == bound[2])):
                entry, _, _, run, template, maps, slots = bound
                g0, g1, g2 = self.grid3
                try:
                    if same:
                        args = last[1]
                    else:
                        args = self._arguments(template, maps, slots, ptrs)
                        self.last = (ptrs, args)
                    run(g0, g1, g2, launcher.stream(launcher.device_of()), entry.function,
                        entry.packed, None, None, None, *args)
                    launcher.direct_launches += 1
                    return True
                except Exception:  # noqa: BLE001 - the launcher's own path decides (and warns)
                    self.bound = self.last = None
        if misaligned(map(_DATA_PTR, bases)):
            return False
        descs = tuple(self.make(f, t) for f, t in zip(self.fields, bases))
        middle = self.middle(tensors, rest)
        # Triton launches on the current device: the tensors' one is made current first
        entry = on_device_of(bases[0], self.launcher, self.grid, descs + middle, self.kwargs)
        if entry is not None and other_device(bases[0]) is None:
            self._bind(entry, descs, middle, bases, tensors, rest)
        return True

    @staticmethod
    def _arguments(template, maps, slots, ptrs):
        """The bound launch's arguments for these addresses (the bases' then the tensors'):
        each base's tensor map (kept per address), each tensor as its address (Triton's
        launcher takes an int for a pointer argument and then asks the driver nothing)."""
        args = template[:]
        for (slot, kept, encode, enc_args), ptr in zip(maps, ptrs):
            tensor_map = kept.get(ptr)
            if tensor_map is None:
                if len(kept) >= _MAX_MAPS:
                    kept.clear()
                tensor_map = kept[ptr] = encode(ptr, *enc_args)
            args[slot] = tensor_map
        for slot, ptr in zip(slots, ptrs[len(maps):]):
            args[slot] = ptr
        return tuple(args)

    def _bind(self, entry, descs, middle, bases, tensors, rest):
        """Keeps what the bound path needs after this direct launch, or the reason it cannot."""
        self.last = None
        if entry is self.refused:
            return
        try:
            expansion = tma_expansion(entry.run, descs, self.utils)
        except Exception as exc:  # noqa: BLE001 - an unexpected layout: the launcher's path
            expansion, self.failure = None, f"{type(exc).__name__}: {exc}"
        if expansion is None:
            self.failure = self.failure or "Triton's launcher is not laid out as expected"
            self.bound, self.refused = None, entry
            return
        run, maps = expansion
        template, map_slots = [], []
        for (encode, enc_args, tail) in maps:
            map_slots.append((len(template), {}, encode, enc_args))
            template.append(None)
            template.extend(tail)
        start = len(template)
        template.extend(middle)
        template.extend(entry.tail)
        positions = range(len(tensors)) if self.tensor_slots is None else self.tensor_slots
        slots = [start + i for i in positions]
        for slot in slots:
            template[slot] = None
        self.failure = None
        self.bound = (entry, rest, tensor_keys(bases + tensors), run, template, tuple(map_slots),
                      tuple(slots))


def tma_expansion(run, descs, utils=None):
    """(a launcher without Triton's descriptor wrapper, ((encoder, its arguments after the
    base address, shape and strides) per descriptor)) for ``run`` (a compiled kernel's
    ``CudaLauncher``) whose leading descriptor arguments are ``descs``; None where Triton's
    launcher is laid out otherwise or the expansion made here differs from Triton's own.

    What Triton's sources from 3.4 to 3.8 share (run on 3.6): the launcher's ``launch``
    attribute is a closure (``inner``)
    over the raw C ``launcher`` and the kernel's ``tensordesc_meta`` (one dict per descriptor
    argument: swizzle, element size and type, block), and the module's ``make_tensordesc_arg``
    turns a descriptor into [tensor map, *shape, *strides]; the raw launcher takes those
    expanded arguments where the wrapper would have put them. ``utils``: the driver's utility
    module (the active CUDA driver's by default)."""
    inner = getattr(run, "launch", None)
    closure, code = getattr(inner, "__closure__", None), getattr(inner, "__code__", None)
    if not closure or code is None:
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in closure)))
    raw, metas = cells.get("launcher"), cells.get("tensordesc_meta")
    make = cells.get("make_tensordesc_arg") or inner.__globals__.get("make_tensordesc_arg")
    if raw is None or make is None or not metas or len(metas) < len(descs):
        return None
    driver_module = sys.modules.get(type(run).__module__)
    to_host = getattr(driver_module, "TMA_DTYPE_DEVICE_TO_HOST", None)
    if utils is None:
        from triton.runtime.driver import driver
        utils = driver.active.utils
    encode = (getattr(utils, "fill_tma_descriptor_tiled", None)
              or getattr(utils, "fill_tma_descriptor", None))
    if to_host is None or encode is None:
        return None
    maps = []
    for desc, meta in zip(descs, metas):
        if (not isinstance(meta, dict) or meta.get("fp4_padded") or meta.get("is_im2col")
                or getattr(desc, "round_f32_to_tf32", False)):
            return None
        enc_args = (meta["swizzle"], meta["elem_size"], to_host[meta["elem_type"]],
                    list(meta["block_size"]), list(desc.shape), list(desc.strides),
                    1 if getattr(desc, "padding", None) == "nan" else 0)
        tail = (*desc.shape, *desc.strides)
        ours = [encode(desc.base.data_ptr(), *enc_args), *tail]
        try:
            theirs = make(desc, meta)
        except TypeError:  # Triton >= 3.7: (arg, metadata, base arguments)
            theirs = make(desc, meta, ())
        theirs = list(theirs)
        if (len(theirs) != len(ours) or theirs[1:] != ours[1:]
                or type(theirs[0]) is not type(ours[0])):
            return None
        mine, tritons = _map_bytes(ours[0]), _map_bytes(theirs[0])
        if mine is None or mine != tritons:
            return None
        maps.append((encode, enc_args, tail))
    direct = copy.copy(run)
    direct.launch = raw
    return direct, tuple(maps)


def _map_bytes(tensor_map):
    """The 128 bytes of an encoded tensor map (Triton's PyCUtensorMap keeps them at the end of
    the object), or the object's buffer; None where neither is readable."""
    try:
        return bytes(memoryview(tensor_map))
    except TypeError:
        pass
    size = type(tensor_map).__basicsize__
    if type(tensor_map).__name__ != "PyCUtensorMap" or size < 144:
        return None
    return ctypes.string_at(id(tensor_map) + size - 128, 128)


def _pipeline_failure(exc):
    """Whether ``exc`` is Triton's report of a failed MLIR pass (``pm.run``: "PassManager::run
    failed"), the way a lowering bug of one Triton release surfaces (F78)."""
    return type(exc) is RuntimeError and "PassManager::run failed" in str(exc)


class BuildGuard:
    """A kernel path that may fail to build on the installed Triton: the Gluon kernels use an
    experimental API that changes between releases (docs/FINDINGS.md F32). ``guard(launch,
    *args)`` runs the launch and returns True; a build failure (``CompilationError``,
    ``OutOfResources`` for shared memory or registers, or a failed pass of Triton's MLIR
    pipeline, a ``RuntimeError`` naming ``PassManager::run``: all raised before the kernel
    runs; F78) turns the path off for the process with one ``RuntimeWarning`` naming the
    kernel and the error, and returns False, so that the caller runs its Triton kernel
    instead; so do later calls. A launch that returns False declined the call (an address TMA
    cannot take): False, the path staying on. ``failure`` holds the error (None while the path works): the
    Gluon tests assert it stays None, so a fallback cannot pass them as the Gluon kernel."""

    def __init__(self, name):
        self.name = name
        self.failure = None

    def __call__(self, launch, *args):
        if self.failure is not None:
            return False
        try:
            launched = launch(*args)
        except (CompilationError, OutOfResources, RuntimeError) as exc:
            if isinstance(exc, RuntimeError) and not _pipeline_failure(exc):
                raise  # a launch or device error, not a build failure
            self.failure = f"{type(exc).__name__}: {exc}"[-1500:]
            warnings.warn(f"{self.name} failed to build on this Triton; the Triton kernel runs "
                          f"instead from now on: {self.failure}", RuntimeWarning, stacklevel=2)
            return False
        return launched is not False


class CachedEncoder:
    """A TMA descriptor encoder whose results are kept: a ``CUtensorMap`` is a function of the
    encoder's arguments alone (base address, swizzle, element size and type, box, shape,
    strides, padding), so a call with equal arguments gets the object encoded before (at
    most ``size`` kept; lists compared as tuples)."""

    def __init__(self, encode, size=256):
        self.encode = encode
        self.size = size
        self.kept = {}
        self.hits = 0

    def __call__(self, *args):
        key = tuple(tuple(a) if isinstance(a, list) else a for a in args)
        tensor_map = self.kept.get(key)
        if tensor_map is None:
            tensor_map = self.encode(*args)
            if len(self.kept) >= self.size:
                self.kept.clear()
            self.kept[key] = tensor_map
        else:
            self.hits += 1
        return tensor_map


# the encoders Triton's launcher calls for each host TensorDescriptor argument, by release
_TMA_ENCODERS = ("fill_tma_descriptor", "fill_tma_descriptor_tiled")


def set_tma_descriptor_cache(on, utils=None):
    """Whether Triton's kernel launcher keeps the TMA descriptors it encodes for host
    ``TensorDescriptor`` arguments (the Gluon SDPA kernels pass four a call, and Triton
    encodes each on every launch: ~10 us of the Gluon forward's host time,
    docs/PERFORMANCE.md "Gluon forward"). Off by default: on an H100 it made the Gluon
    forward's host time per call longer, not shorter (docs/PERFORMANCE.md "Gluon forward: the
    ping-pong and three-consumer tiles, the descriptor cache"); it changes
    the driver's encoder process-wide, for every Triton kernel with such arguments, exactly
    (a descriptor depends on its arguments alone). ``utils``: the driver's utility module
    (the active CUDA driver's by default). Returns whether it was on; False (and nothing
    changes) without a CUDA driver."""
    if utils is None:
        try:
            from triton.runtime.driver import driver
            utils = driver.active.utils
        except Exception:  # noqa: BLE001 - no CUDA driver here: nothing to cache
            return False
    was_on = False
    for name in _TMA_ENCODERS:
        encode = getattr(utils, name, None)
        if encode is None:
            continue
        was_on = was_on or isinstance(encode, CachedEncoder)
        if on and not isinstance(encode, CachedEncoder):
            setattr(utils, name, CachedEncoder(encode))
        elif not on and isinstance(encode, CachedEncoder):
            setattr(utils, name, encode.encode)
    return was_on


def other_device(tensor):
    """The index of ``tensor``'s CUDA device when it is not the current one, else None (also
    for a CPU tensor or another argument). Triton launches on the current device and its
    current stream, while torch's own ops follow their tensors' device: a launch on tensors of
    another GPU must make that device current first (``with torch.cuda.device(index)``), or the
    kernel runs on the wrong GPU with pointers it cannot address."""
    if not _several_gpus() or not isinstance(tensor, torch.Tensor):
        return None
    index = tensor.get_device()
    return None if index < 0 or index == torch.cuda.current_device() else index


def on_device_of(tensor, launch, *args, **kwargs):
    """``launch(*args, **kwargs)`` with ``tensor``'s CUDA device current (:func:`other_device`);
    a plain call when it already is."""
    index = other_device(tensor)
    if index is None:
        return launch(*args, **kwargs)
    with torch.cuda.device(index):
        return launch(*args, **kwargs)


@functools.lru_cache(maxsize=16)
def is_sm90(device):
    """Whether ``device`` (a CUDA torch.device) is Hopper, compute capability 9.0: the Gluon
    kernels' only target."""
    return torch.cuda.get_device_capability(device) == (9, 0)


@functools.cache
def _several_gpus():
    """Whether this process sees more than one CUDA device (fixed once CUDA is initialised);
    with one, every CUDA tensor is on the current device."""
    return torch.cuda.is_available() and torch.cuda.device_count() > 1


def _installed(hook):
    """Whether a launch hook is set: Triton >= 3.5 keeps a ``HookChain`` there, empty unless a
    profiler added a hook (3.4 and older: None or the hook)."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return not isinstance(calls, list) or bool(calls)


def _default_of(param):
    default = getattr(param, "default", inspect.Parameter.empty)
    return None if default is inspect.Parameter.empty else default


def _is_jit_function(jit):
    """Only a native JITFunction (not the interpreter's) offers the direct path."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    return isinstance(jit, JITFunction) and hasattr(jit, "params")
