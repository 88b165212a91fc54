"""fast's varlen entries refuse bad metadata; the oracle and fast refuse a non-finite scale.

Bad varlen metadata (docs/CONTRACT.md "4. Varlen index preparation") is flagged by the index kernel and fails without a
host sync: on CPU (the interpreter) a ValueError names the argument; on CUDA a device-side
assertion fails the process (checked in a subprocess, since a device assert leaves the CUDA
context unusable). Each check keeps a negative control: the same corruption with fast's
metadata check switched off returns a result silently, and the helper that asserts a refusal
reports exactly that.
"""
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import attention_oracle.fast.dsa as fdsa  # noqa: E402
import attention_oracle.fast.index as findex  # noqa: E402
import attention_oracle.oracle.dsa as odsa  # noqa: E402
import attention_oracle.oracle.sdpa as osdpa  # noqa: E402
from attention_oracle.fast.sdpa import scaled_dot_product_attention as fast_sdpa  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_CPU = pytest.mark.skipif(DEVICE != "cpu", reason="a device assert ends the CUDA context: "
                                                    "the CUDA form runs in a subprocess")

# A valid layout: 3 documents, T = 7 queries, S = 13 key rows.
CU_Q = [0, 3, 3, 7]
CU_K = [0, 5, 6, 13]
T, S, K, H, D, DR = 7, 13, 5, 2, 16, 16

# Each corruption and the argument the error must name.
BAD_METADATA = {
    "cu_seqlens_k_decreasing": ("cu_seqlens_k", CU_Q, [0, 5, 4, 13]),
    "cu_seqlens_q_not_starting_at_0": ("cu_seqlens_q", [1, 3, 3, 7], CU_K),
    "cu_seqlens_q_not_ending_at_T": ("cu_seqlens_q", [0, 3, 3, 6], CU_K),
    "cu_seqlens_k_past_kv_rows": ("cu_seqlens_k", CU_Q, [0, 5, 6, 14]),
    "cu_seqlens_k_not_starting_at_0": ("cu_seqlens_k", CU_Q, [2, 5, 6, 13]),
    "cu_seqlens_q_decreasing": ("cu_seqlens_q", [0, 3, 2, 7], CU_K),
}


def _inputs(cu_q, cu_k, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, D, generator=g).to(DEVICE)
    qr = torch.randn(T, H, DR, generator=g).to(DEVICE)
    kv = torch.randn(S, D, generator=g).to(DEVICE)
    kr = torch.randn(S, DR, generator=g).to(DEVICE)
    local = torch.randint(-1, 6, (T, K), generator=g, dtype=torch.int32).to(DEVICE)
    cq = torch.tensor(cu_q, dtype=torch.int32, device=DEVICE)
    ck = torch.tensor(cu_k, dtype=torch.int32, device=DEVICE)
    return q, qr, kv, kr, local, cq, ck


ENTRIES = {
    "offset_gather_kv_indices": lambda q, qr, kv, kr, local, cq, ck: findex.offset_gather_kv_indices(
        local, cq, ck, causal=True, compact=True),
    "dsa_sparse_attention_nope_varlen": lambda q, qr, kv, kr, local, cq, ck:
        fdsa.dsa_sparse_attention_nope_varlen(q, kv, local, cq, ck, causal=True, softmax_scale=0.3),
    "dsa_sparse_attention_varlen": lambda q, qr, kv, kr, local, cq, ck:
        fdsa.dsa_sparse_attention_varlen(q, qr, kv, kr, local, cq, ck, causal=True,
                                         softmax_scale=0.3),
}


def refusal_problem(entry, case):
    """None if ``entry`` refuses ``case`` with a ValueError naming its argument, else what it
    did instead (a silent result, another exception, a message not naming the argument)."""
    name, cu_q, cu_k = BAD_METADATA[case]
    if entry == "offset_gather_kv_indices" and case == "cu_seqlens_k_past_kv_rows":
        return None  # no kv: any cu_seqlens_k[-1] that fits int32 rows is valid there
    try:
        ENTRIES[entry](*_inputs(cu_q, cu_k))
    except ValueError as exc:
        return None if name in str(exc) else f"ValueError not naming {name}: {exc}"
    except Exception as exc:  # noqa: BLE001 - any other exception is the wrong answer
        return f"{type(exc).__name__} instead of ValueError: {exc}"
    return f"silent result for {case}"


@ON_CPU
@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("case", list(BAD_METADATA))
def test_bad_metadata_is_refused(entry, case):
    assert refusal_problem(entry, case) is None


@ON_CPU
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_valid_metadata_is_accepted(entry):
    ENTRIES[entry](*_inputs(CU_Q, CU_K))


@ON_CPU
@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("case", list(BAD_METADATA))
def test_negative_control_unchecked_metadata_is_caught(entry, case, monkeypatch):
    """With the metadata check switched off, refusal_problem reports the silent result."""
    if entry == "offset_gather_kv_indices" and case == "cu_seqlens_k_past_kv_rows":
        pytest.skip("valid for the index function alone")
    monkeypatch.setattr(findex, "raise_on_bad_metadata", lambda flags, name=None: None)
    assert refusal_problem(entry, case) == f"silent result for {case}"


@ON_CPU
def test_every_failed_condition_is_named():
    q, qr, kv, kr, local, _, _ = _inputs(CU_Q, CU_K)
    cq = torch.tensor([1, 3, 2, 6], dtype=torch.int32)
    ck = torch.tensor([2, 5, 4, 14], dtype=torch.int32)
    with pytest.raises(ValueError) as info:
        fdsa.dsa_sparse_attention_nope_varlen(q, kv, local, cq, ck, softmax_scale=0.3)
    msg = str(info.value)
    for condition in ("cu_seqlens_q must start at 0", "cu_seqlens_q must be non-decreasing",
                      "cu_seqlens_q must end at T", "cu_seqlens_k must start at 0",
                      "cu_seqlens_k must be non-decreasing", "cu_seqlens_k must end within the kv"):
        assert condition in msg, msg


@ON_CPU
def test_many_documents_are_scanned():
    """The metadata scan covers more than one block of cu_seqlens (a decrease at the end)."""
    n = findex.CHECK_BLOCK + 40
    cu = torch.arange(n + 1, dtype=torch.int32)
    local = torch.zeros((n, 2), dtype=torch.int32)
    findex.offset_gather_kv_indices(local, cu, cu)
    bad = cu.clone()
    bad[-2] = bad[-1] + 1
    with pytest.raises(ValueError, match="cu_seqlens_k must be non-decreasing"):
        findex.offset_gather_kv_indices(local, cu, bad)


@ON_CPU
def test_no_documents_with_tokens_is_refused():
    local = torch.zeros((3, 2), dtype=torch.int32)
    zero = torch.zeros((1,), dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q must end at T"):
        findex.offset_gather_kv_indices(local, zero, zero)
    rows = findex.offset_gather_kv_indices(local[:0], zero, zero)
    assert rows.shape == (0, 2)


_CUDA_SCRIPT = textwrap.dedent("""
    import torch, attention_oracle.fast.dsa as fdsa
    T, H, D, K = 7, 2, 16, 5
    q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(13, D, device="cuda", dtype=torch.bfloat16)
    local = torch.randint(-1, 6, (T, K), device="cuda", dtype=torch.int32)
    cq = torch.tensor({cu_q}, device="cuda", dtype=torch.int32)
    ck = torch.tensor({cu_k}, device="cuda", dtype=torch.int32)
    out = fdsa.dsa_sparse_attention_nope_varlen(q, kv, local, cq, ck, causal=True,
                                                softmax_scale=0.3)
    torch.cuda.synchronize()
    print("SILENT", float(out.float().abs().sum()))
""")


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA only")
@pytest.mark.parametrize("case", [None] + list(BAD_METADATA))
def test_bad_metadata_fails_on_device(case):
    """CUDA: the device assertion fails the process; valid metadata (case None) runs."""
    cu_q, cu_k = (CU_Q, CU_K) if case is None else BAD_METADATA[case][1:]
    proc = subprocess.run([sys.executable, "-c", _CUDA_SCRIPT.format(cu_q=cu_q, cu_k=cu_k)],
                          capture_output=True, text=True, timeout=300)
    if case is None:
        assert proc.returncode == 0 and "SILENT" in proc.stdout, proc.stderr[-2000:]
    else:
        assert proc.returncode != 0 and "SILENT" not in proc.stdout, proc.stdout
        assert "assert" in proc.stderr.lower(), proc.stderr[-2000:]


# ----------------------------------------------------------------------------- scales

NON_FINITE = [float("nan"), float("inf"), -float("inf")]


def _dsa_calls(mod, scale):
    q, qr, kv, kr, local, cq, ck = _inputs(CU_Q, CU_K)
    rows = torch.where(local >= 0, local, -1)
    return {
        "nope": lambda: mod.dsa_sparse_attention_nope(q, kv, rows, softmax_scale=scale),
        "rope": lambda: mod.dsa_sparse_attention(q, qr, kv, kr, rows, softmax_scale=scale),
        "nope_varlen": lambda: mod.dsa_sparse_attention_nope_varlen(q, kv, local, cq, ck,
                                                                   softmax_scale=scale),
        "rope_varlen": lambda: mod.dsa_sparse_attention_varlen(q, qr, kv, kr, local, cq, ck,
                                                               softmax_scale=scale),
    }


@pytest.mark.parametrize("which", ["fast", "oracle"])
@pytest.mark.parametrize("kind", ["nope", "rope", "nope_varlen", "rope_varlen"])
@pytest.mark.parametrize("scale", NON_FINITE, ids=["nan", "inf", "-inf"])
def test_dsa_non_finite_scale_is_refused(which, kind, scale):
    mod = fdsa if which == "fast" else odsa
    with pytest.raises(ValueError, match="softmax_scale"):
        _dsa_calls(mod, scale)[kind]()


@pytest.mark.parametrize("which", ["fast", "oracle"])
@pytest.mark.parametrize("kind", ["nope", "rope", "nope_varlen", "rope_varlen"])
def test_dsa_negative_control_finite_scale_runs(which, kind):
    """The same calls with a finite scale run: the refusal is the scale's, nothing else."""
    mod = fdsa if which == "fast" else odsa
    out = _dsa_calls(mod, 0.3)[kind]()
    assert torch.isfinite(out.float()).all()


def _sdpa_inputs():
    g = torch.Generator().manual_seed(3)
    return [torch.randn(1, 2, 8, 16, generator=g).to(DEVICE) for _ in range(3)]


@pytest.mark.parametrize("which", ["fast", "oracle"])
@pytest.mark.parametrize("scale", NON_FINITE, ids=["nan", "inf", "-inf"])
def test_sdpa_non_finite_scale_is_refused(which, scale):
    fn = fast_sdpa if which == "fast" else osdpa.scaled_dot_product_attention
    with pytest.raises(ValueError, match="scale"):
        fn(*_sdpa_inputs(), scale=scale)


@pytest.mark.parametrize("which", ["fast", "oracle"])
def test_sdpa_negative_control_finite_scale_runs(which):
    fn = fast_sdpa if which == "fast" else osdpa.scaled_dot_product_attention
    assert torch.isfinite(fn(*_sdpa_inputs(), scale=0.7)).all()


def test_oracle_sdpa_validation_names_scale():
    from attention_oracle.validation import check_sdpa_inputs
    q, k, v = _sdpa_inputs()
    with pytest.raises(ValueError, match="scale must be finite"):
        check_sdpa_inputs(q, k, v, scale=math.nan)
