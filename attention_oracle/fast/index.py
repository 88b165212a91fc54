"""Varlen index preparation as one Triton launch (docs/CONTRACT.md "4. Varlen index preparation").

``offset_gather_kv_indices`` turns per-document local key indices into global key rows:
document lookup (binary search over ``cu_seqlens_q`` inside the kernel), ``topk_length``
cut, key-range and causal cuts, optional stable compaction, and per-row lengths. It never
synchronises with the host: no ``.item()``, no data-dependent shapes.

Bad metadata (a ``cu_seqlens_q`` not starting at 0 or not ending at T, a decreasing
``cu_seqlens_q`` / ``cu_seqlens_k``, a ``cu_seqlens_k`` past the key rows) is caught by the
kernel itself: on CUDA a device-side assertion in the same launch fails it (asynchronously;
the CUDA context is unusable afterwards, as after any device assert), on CPU (the interpreter)
the kernel writes flags and a ``ValueError`` names the argument. The kernel never reads past
its tensors either way.

Host path: per problem shape the grid, the constexprs and the leading int arguments are
computed once and kept with a :class:`fast.launch.BoundLaunch`; a call then validates its
arguments, allocates the rows and the lengths, and launches once. A call without ``out`` whose
signature was validated and served on CUDA before skips the validation and the plan lookup: its
kept :class:`_Call` allocates and launches by the tensors' addresses
(:meth:`fast.launch.BoundLaunch.addresses`).
"""
import torch

from ..validation import check_flags, check_index_inputs
from .guards import resolved_neg
from .host import check_device, next_pow2, slot_offsets_pass_int32
from .kernels import pdl
from .kernels.index_offset import BAD_BITS, CHECK_BLOCK, offset_gather_kernel
from .launch import BoundLaunch, DirectLauncher

_MAX_BLOCK_K = 4096
_INT32_MAX = 2**31 - 1
# the compiled kernel's own launcher after Triton's first launch (fast/launch.py); 7 pointers lead
_OFFSET_LAUNCH = DirectLauncher(offset_gather_kernel, n_tensors=7)
# per problem shape (and settings): the launch with its grid and constexprs fixed
_PLANS = {}
_MAX_PLANS = 1024
# per call signature (offset_rows): the validated calls served on CUDA without out
_CALLS = {}
_SMS = {}


_PDL = {"on": False}
# the kernel's warps (None: 4 up to 2048 slots per block, else 8); benchmarks sweep it
_WARPS = {"num_warps": None}
# rows of one block: programs per multiprocessor (each takes a run of rows) and the row
# loop's pipeline depth; benchmarks sweep them
_PIPELINE = {"per_sm": 4, "num_stages": 3}
# the settings above (warps, pipeline, PDL) as one value, in the plans' and the call
# signatures' keys
_SETTINGS = [None]


def _settings_changed():
    _SETTINGS[0] = (_WARPS["num_warps"], _PIPELINE["per_sm"], _PIPELINE["num_stages"], _PDL["on"])


_settings_changed()


def set_num_warps(num_warps=None):
    """The offset kernel's ``num_warps`` for later calls (None: the default rule); returns the
    previous value."""
    previous, _WARPS["num_warps"] = _WARPS["num_warps"], num_warps
    _settings_changed()
    return previous


def set_pipeline(per_sm=4, num_stages=3):
    """Programs per multiprocessor and the row loop's ``num_stages`` for rows of one block in
    later calls; returns the previous (per_sm, num_stages)."""
    previous = _PIPELINE["per_sm"], _PIPELINE["num_stages"]
    _PIPELINE["per_sm"], _PIPELINE["num_stages"] = int(per_sm), int(num_stages)
    _settings_changed()
    return previous


def set_pdl(on):
    """Programmatic dependent launch for index preparation -> DSA forward (kernels.pdl); off by
    default. Returns whether it is on (it stays off where Triton lacks the intrinsics)."""
    _PDL["on"] = bool(on) and pdl.AVAILABLE
    _settings_changed()
    return _PDL["on"]


def pdl_on(device):
    """True when launches on ``device`` use PDL (CUDA only)."""
    return _PDL["on"] and device.type == "cuda"


def describe_bad_metadata(bits, key_rows_name):
    """The error message for the kernel's BAD_BITS ``bits`` (each failed condition, named)."""
    parts = []
    for bit, (name, condition) in BAD_BITS.items():
        if bits & bit:
            if bit == 32 and key_rows_name is not None:
                condition = f"must end within the {key_rows_name} rows"
            parts.append(f"{name} {condition}")
    return "bad varlen metadata: " + "; ".join(parts)


def raise_on_bad_metadata(flags, key_rows_name=None):
    """Fails when the kernel flagged the metadata, without a host sync on CUDA.

    flags: the kernel's [2] int32 (valid, bits), written where the kernel runs without its
    device assertion (the CPU interpreter): ValueError naming each failed argument. On CUDA
    the kernel asserts itself and writes no flags, so this is not called there."""
    bits = int(flags[1])
    if bits:
        raise ValueError(describe_bad_metadata(bits, key_rows_name))


def _needs_scratch(out, idx, compact, K, metadata):
    """True when the kernel cannot write its result straight into ``out``.

    In place is safe when out is exactly idx (same start, strides and dtype): each program
    reads its whole row before writing it, except multi-block compaction, which scatters into
    blocks it has not read yet. Any other overlap, with idx or with the ``metadata`` tensors
    the programs read (cu_seqlens, topk_length), goes through a scratch buffer.
    """
    if out is None or slot_offsets_pass_int32(out) or out.is_neg():
        return True  # none given, slot offsets past int32 (the kernel's are int32), or a
        # negative-bit view (its storage holds -value: copy_ writes it right)
    storage = out.untyped_storage().data_ptr()
    if any(t is not None and t.untyped_storage().data_ptr() == storage for t in metadata):
        return True
    if storage != idx.untyped_storage().data_ptr():
        return False
    same_view = (out.data_ptr() == idx.data_ptr() and out.stride() == idx.stride()
                 and out.dtype == idx.dtype)
    return not same_view or (compact and K > _MAX_BLOCK_K)


def offset_gather_kv_indices(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, *, causal=False,
                             out=None, return_topk_length=False, compact=False, topk_length=None):
    """Per-document local indices -> global key rows, invalid slots -1.

    gather_kv_indices: [T, K] int32/int64, local to each token's document (any strides).
    cu_seqlens_q, cu_seqlens_k: [n_docs + 1] int32/int64 cumulative segment starts.
    topk_length: optional [T] int; slots s >= topk_length[t] are invalid (cut first).
    causal: a local index j is valid only if j <= the token's key position.
    compact: move valid rows to the front in slot order (stable); the rest is -1.
    out: optional [T, K] int32 tensor written in place and returned; it may alias
    gather_kv_indices.

    Returns int32 rows [T, K] (``out`` when given), and with
    ``return_topk_length`` also lengths [T] int32: the count of valid slots when compact,
    else the last valid slot + 1 (0 for an empty row). Bad metadata fails (module docstring).
    """
    if return_topk_length.__class__ is not bool:
        check_flags(return_topk_length=return_topk_length)
    result, lengths = offset_rows(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, causal=causal,
                                  out=out, compact=compact, topk_length=topk_length)
    if return_topk_length:
        return result, lengths
    return result


def offset_rows(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, *, causal=False, out=None,
                compact=False, topk_length=None, key_rows=None, key_rows_name=None):
    """:func:`offset_gather_kv_indices` returning (rows, lengths); ``key_rows`` (the S of the
    keys the rows will index, named ``key_rows_name`` in errors) also bounds cu_seqlens_k[-1].

    A call without ``out`` whose signature (:func:`_signature`) was validated and served on
    CUDA before takes its kept :class:`_Call`; any other runs :func:`_general_rows`, which
    keeps a ``_Call`` for the signature when one can serve it."""
    sig = None
    if out is None:
        sig = _signature(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, topk_length, causal,
                         compact, key_rows, key_rows_name)
        if sig is not None:
            call = _CALLS.get(sig)
            if call is not None:
                return call(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, topk_length)
    return _general_rows(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, causal, out, compact,
                         topk_length, key_rows, key_rows_name, sig)


def _signature(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, topk_length, causal, compact,
               key_rows, key_rows_name):
    """Everything a call's validation and plan depend on (None for arguments of types it does
    not key on, and for negative-bit views: those take the general path every time). The
    layouts are in the key: a sparse COO tensor's ``stride()`` is all zeros, not an error, and
    would match a dense one broadcast along every dim (docs/FINDINGS.md F82); nested and mkldnn
    tensors raise in ``stride()`` and get None (validation names the argument)."""
    if causal.__class__ is not bool or compact.__class__ is not bool:
        return None  # 1 or 0.0 equal True and False and would match their keys
    if key_rows is not None and key_rows.__class__ is not int:
        return None
    Tensor = torch.Tensor
    if not (isinstance(gather_kv_indices, Tensor) and isinstance(cu_seqlens_q, Tensor)
            and isinstance(cu_seqlens_k, Tensor)):
        return None
    try:
        if gather_kv_indices.is_neg() or cu_seqlens_q.is_neg() or cu_seqlens_k.is_neg():
            return None
        lengths = None
        if topk_length is not None:
            if not isinstance(topk_length, Tensor) or topk_length.is_neg():
                return None
            lengths = (topk_length.shape, topk_length.stride(), topk_length.dtype,
                       topk_length.device, topk_length.layout)
        return (gather_kv_indices.shape, gather_kv_indices.stride(), gather_kv_indices.dtype,
                gather_kv_indices.device, gather_kv_indices.layout, cu_seqlens_q.shape,
                cu_seqlens_q.stride(), cu_seqlens_q.dtype, cu_seqlens_q.device,
                cu_seqlens_q.layout, cu_seqlens_k.shape, cu_seqlens_k.stride(),
                cu_seqlens_k.dtype, cu_seqlens_k.device, cu_seqlens_k.layout, lengths, causal,
                compact, key_rows, key_rows_name, _SETTINGS[0])
    except (RuntimeError, NotImplementedError, TypeError):
        return None


class _Call:
    """One validated call signature served on CUDA without ``out``: the launch is its plan's
    with the kept non-tensor arguments, given the tensors' addresses
    (:meth:`fast.launch.BoundLaunch.addresses`)."""
    __slots__ = ("rows_shape", "lengths_shape", "index", "launch", "rest", "all_holes")

    def __init__(self, T, K, device, launch, rest, all_holes):
        self.rows_shape, self.lengths_shape = (T, K), (T,)
        self.index = device.index
        self.launch, self.rest, self.all_holes = launch, rest, all_holes

    def __call__(self, gather_kv_indices, cu_seqlens_q, cu_seqlens_k, topk_length):
        # two allocations, by new_empty (the device taken from the tensor, not parsed: ~1 us
        # less a call than torch.empty's device argument); one buffer cut into two views costs
        # more (docs/PERFORMANCE.md "Index preparation and PDL")
        result = gather_kv_indices.new_empty(self.rows_shape, dtype=torch.int32)
        lengths = gather_kv_indices.new_empty(self.lengths_shape, dtype=torch.int32)
        own = lengths.data_ptr()
        ptrs = (gather_kv_indices.data_ptr(), cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(),
                own if topk_length is None else topk_length.data_ptr(), result.data_ptr(), own,
                own)
        if not self.launch.addresses(ptrs, self.index, self.rest):
            self.launch.fixed((gather_kv_indices, cu_seqlens_q, cu_seqlens_k,
                               lengths if topk_length is None else topk_length, result,
                               lengths, lengths), self.rest)
        if self.all_holes:
            result.fill_(-1)
            lengths.zero_()
        return result, lengths


def _general_rows(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, causal, out, compact,
                  topk_length, key_rows, key_rows_name, sig):
    """The validating path of :func:`offset_rows` (every check, aliasing, the CPU interpreter);
    keeps a :class:`_Call` under ``sig`` when the call ran on CUDA with inputs the kernel
    reads as they are."""
    T, K = check_index_inputs(gather_kv_indices, cu_seqlens_q, cu_seqlens_k, topk_length, out)
    check_flags(causal=causal, compact=compact)
    given = (gather_kv_indices, cu_seqlens_q, cu_seqlens_k, topk_length)
    if (gather_kv_indices.is_neg() or cu_seqlens_q.is_neg() or cu_seqlens_k.is_neg()
            or (topk_length is not None and topk_length.is_neg())):
        # a negative-bit view reads as -x from storage holding x (docs/FINDINGS.md F46)
        gather_kv_indices, cu_seqlens_q, cu_seqlens_k, topk_length = resolved_neg(
            gather_kv_indices, cu_seqlens_q, cu_seqlens_k, topk_length)
    # the kernel reads these by their data pointers alone (FINDINGS F34)
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    if topk_length is not None:
        topk_length = topk_length.contiguous()
    # slot offsets (slot * stride) are int32 in the kernel (FINDINGS F35)
    if slot_offsets_pass_int32(gather_kv_indices):
        gather_kv_indices = gather_kv_indices.contiguous()
    device = gather_kv_indices.device
    check_device(device)
    result = out
    # on the CPU the metadata check comes after the kernel: a scratch buffer keeps out (which may
    # be the caller's input) untouched when it fails
    if (_needs_scratch(out, gather_kv_indices, compact, K,
                       (cu_seqlens_q, cu_seqlens_k, topk_length)) or device.type != "cuda"):
        result = torch.empty((T, K), dtype=torch.int32, device=device)
    n_docs = cu_seqlens_q.shape[0] - 1
    on_cuda = device.type == "cuda"
    use_pdl = _PDL["on"] and on_cuda
    # the dtypes too: a plan's launch then always sees the same dtype at each position
    # (BoundLaunch.addresses keys on the alignment alone); use_pdl follows from the device and
    # the settings
    plan_key = (device, T, K, n_docs, key_rows, bool(causal), bool(compact),
                None if topk_length is None else topk_length.dtype, gather_kv_indices.dtype,
                cu_seqlens_q.dtype, cu_seqlens_k.dtype, _SETTINGS[0])
    plan = _PLANS.get(plan_key)
    if plan is None:
        plan = _plan(device, T, K, n_docs, key_rows, causal, compact, topk_length is None,
                     use_pdl)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[plan_key] = plan
    launch, ints, rests = plan
    # the non-tensor arguments as one tuple kept per stride pattern (BoundLaunch.fixed: the same
    # object is the same values, so a repeat call compares nothing)
    strides = (*gather_kv_indices.stride(), *result.stride())
    rest = rests.get(strides)
    if rest is None:
        if len(rests) >= _MAX_PLANS:
            rests.clear()
        rest = rests[strides] = (*ints, *strides)
    if on_cuda:  # bad metadata fails in the kernel (a device assertion)
        lengths = flags = torch.empty((T,), dtype=torch.int32, device=device)
    else:  # one buffer: lengths [T], then the kernel's metadata flags [2]
        buf = torch.empty((T + 2,), dtype=torch.int32, device=device)
        lengths, flags = buf[:T], buf[T:]
    launch.fixed((gather_kv_indices, cu_seqlens_q, cu_seqlens_k,
                  lengths if topk_length is None else topk_length, result, lengths, flags), rest)
    all_holes = T > 0 and ints[1] == 0  # no slot or no document
    if all_holes:
        result.fill_(-1)
        lengths.zero_()
    if not on_cuda:
        raise_on_bad_metadata(flags, key_rows_name)
    elif sig is not None and all(a is b for a, b in zip(
            given, (gather_kv_indices, cu_seqlens_q, cu_seqlens_k, topk_length))):
        # validated, on CUDA, and every input read as given (none copied): later calls of this
        # signature take the kept call
        if len(_CALLS) >= _MAX_PLANS:
            _CALLS.clear()
        _CALLS[sig] = _Call(T, K, device, launch, rest, all_holes)
    if out is not None and result is not out:
        out.copy_(result)
        result = out
    return result, lengths


def _multiprocessors(device):
    """The device's multiprocessor count (1 for the CPU interpreter)."""
    count = _SMS.get(device)
    if count is None:
        count = 1
        if device.type == "cuda":
            count = torch.cuda.get_device_properties(device).multi_processor_count
        _SMS[device] = count
    return count


def _plan(device, T, K, n_docs, key_rows, causal, compact, no_topk_length, use_pdl):
    """(launch, leading int arguments, {strides: non-tensor arguments}) of one problem shape: a
    BoundLaunch with the grid and the constexprs fixed, so that a call builds no keyword
    arguments and no launcher key."""
    n_rows = T if K > 0 and n_docs > 0 else 0
    block_k = min(next_pow2(max(K, 1)), _MAX_BLOCK_K)
    single = K <= block_k
    if single and n_rows:  # a run of consecutive rows per program, the grid about the SMs
        programs = max(1, min(n_rows, _multiprocessors(device) * _PIPELINE["per_sm"]))
        rows_per_prog = -(-n_rows // programs)
        programs = -(-n_rows // rows_per_prog)
    else:
        rows_per_prog, programs = 1, max(n_rows, 1)
    limit = _INT32_MAX if key_rows is None else min(int(key_rows), _INT32_MAX)
    on_cuda = device.type == "cuda"
    kwargs = dict(
        CAUSAL=bool(causal), COMPACT=bool(compact), HAS_TOPK_LEN=not no_topk_length,
        SEARCH_STEPS=max(n_docs - 1, 0).bit_length(), BLOCK_K=block_k, SINGLE_BLOCK=single,
        CHECK_BLOCK=CHECK_BLOCK, PDL=use_pdl, ASSERT=on_cuda, NUM_STAGES=_PIPELINE["num_stages"],
        # launched plainly: it has no gdc_wait, so it must not overlap the grid before it
        num_warps=_WARPS["num_warps"] or (4 if block_k <= 2048 else 8),
    )
    if on_cuda:  # the device assertion needs debug; Triton's integer-overflow checks stay off
        kwargs.update(debug=True, sanitize_overflow=False)
    return (BoundLaunch(_OFFSET_LAUNCH, (programs,), kwargs),
            (T, n_rows, K, n_docs, limit, rows_per_prog), {})
