"""Named DSA fixtures (fixtures/dsa.py) on every selected implementation.

The CPU form of each fixture runs always; the full-size form only on CUDA under the gpu or
fuzz profile (marks ``gpu``, ``slow``; run with ``-s`` to see the oracle's figures).
Both go through the same path, chosen so that full size never computes anything twice and
never holds a float64 copy of a whole output:

1. the implementation runs the whole problem once (forward with lse, then backward with the
   fixture's dout layout, e.g. head-major);
2. gold (float64) and lp (case dtype) come from the oracle's ``dsa_reference`` over query
   chunks of ``CHUNK`` rows (the trainer's 4096), on the oracle's global rows;
3. each chunk feeds running maxima of |impl - gold|, |lp_a - gold| (for each standard
   algorithm a of the lp ensemble) and |round(gold) - gold| per output; dkv/dk_rope gold and
   lp are summed over chunks (float64 / case dtype) and compared once at the end, as are
   their per-row magnitudes (the floor). The agreement rule (``agreement.rule``) is then
   applied to the global maxima: the same verdict as one unchunked comparison.

For the full-size run the oracle's time and peak memory growth are printed, and the growth
must stay within 16 GiB.
"""
from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from attention_oracle.checks.dsa.cases import build
from attention_oracle.checks.dsa.checks import call, global_rows, grads, lp_references
from attention_oracle.fixtures.dsa import FIXTURES
from attention_oracle.judge import profiles, record
from attention_oracle.judge.agreement import OracleMismatch, lp_runs, measure_lp, round_error, rule
from attention_oracle.judge.case import dtype_name
from attention_oracle.judge.targets import Refused
from attention_oracle.oracle.dsa import dsa_reference

CHUNK = {"cpu": 23, "gpu": 4096}
ORACLE_BUDGET_GIB = 16
GRADIENTS = ("dq_latent", "dq_rope", "dkv_latent", "dk_rope")


class RunningRule:
    """The agreement rule (docs/CONTRACT.md "5. The agreement rule", ``agreement.rule``) over an
    output seen in pieces: running maxima of each term, the rule applied once to them."""

    def __init__(self, name: str, dtype: torch.dtype, gradient: bool):
        self.name, self.dtype, self.gradient = name, dtype, gradient
        self.err = self.round = self.magnitude = 0.0
        self.lp: dict = {}
        self.worst_at = None
        self.worst = ()

    def add(self, impl: torch.Tensor, gold: torch.Tensor, lp, offset: int,
            magnitude: float, fail) -> None:
        """``lp``: one tensor or {algorithm: tensor}, as ``assert_agrees`` takes it."""
        lp = lp_runs(lp)
        x = impl.detach().to(torch.float64)
        gold = gold.to(torch.float64)
        finite = torch.isfinite(gold)
        wrong = (~finite & (x != gold)) | (finite & ~torch.isfinite(x))
        if bool(wrong.any()):
            at = torch.nonzero(wrong)[0]
            fail(self.name, f"non-finite mismatch at row {offset + int(at[0])}: "
                            f"impl={x[tuple(at)].item()} gold={gold[tuple(at)].item()}")
        zero = torch.zeros((), dtype=torch.float64, device=x.device)
        diff = torch.where(finite, (x - gold).abs(), zero)
        self.magnitude = max(self.magnitude, magnitude)
        if diff.numel() == 0:
            return
        for a, e in measure_lp(lp, gold, finite).items():
            self.lp[a] = max(self.lp.get(a, 0.0), e)
        self.round = max(self.round, round_error(gold, finite, self.dtype))
        err = float(diff.max())
        if err > self.err:
            at = torch.unravel_index(torch.argmax(diff), diff.shape)
            at = tuple(int(i) for i in at)
            self.err, self.worst_at = err, (offset + at[0],) + at[1:]
            self.worst = (x[at].item(), gold[at].item(),
                          " ".join(f"lp[{a}]={t[at].item():.6g}" for a, t in lp.items()))

    def verdict(self, fail) -> float:
        v = rule(self.err, self.lp, self.round, self.magnitude, self.dtype, self.gradient)
        record.record_ratio("dsa.fixture", "-", v.ratio)
        if self.err > v.allowed:
            impl, gold, lp = self.worst
            fail(self.name, f"max|impl-gold| = {self.err:.3e} > allowed {v.allowed:.3e} (ratio {v.ratio:.2f}); "
                            f"{v.terms(self.dtype)}; worst at {self.worst_at}: impl={impl:.6g} "
                            f"gold={gold:.6g} {lp}")
        return v.ratio


def _failer(impl_name: str, fixture: str, size: str):
    def fail(output, body):
        raise OracleMismatch(f"[dsa.fixture:{fixture}] implementation={impl_name} output={output}: {body}\n"
                             f"  reproduce: pytest attention_oracle/conformance/test_dsa_fixtures.py --impl {impl_name} "
                             f"-k '{fixture} and {size}'")
    return fail


def _impl_results(impl, inp) -> dict:
    """Forward (with lse where offered) and backward of the whole problem, once."""
    try:
        out, lse = call(impl, inp, return_lse=True)
    except Refused:
        out, lse = call(impl, inp), None
    got = grads(out, inp, inp.dout)
    return {"out": out.detach(), "lse": lse, **got}


def _oracle_chunks(inp, size, consume):
    """Gold and lp per query chunk: ``consume(start, gold, lp)``; returns (seconds, peak GiB)."""
    case = inp.case
    rows, topk = global_rows(inp)
    args = [None if t is None else t.detach() for t in (inp.q_latent, inp.q_rope)]
    keys = [None if t is None else t.detach() for t in (inp.kv_latent, inp.k_rope)]
    cuda = inp.q_latent.is_cuda
    seconds, peak = 0.0, 0.0
    for a in range(0, case.T, CHUNK[size]):
        sl = slice(a, min(case.T, a + CHUNK[size]))
        q = [None if t is None else t[sl] for t in args]
        kw = dict(topk_length=None if topk is None else topk[sl], softmax_scale=case.scale)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        gold = dsa_reference(q[0], q[1], *keys, rows[sl], inp.dout[sl], compute_dtype=torch.float64, **kw)
        if cuda:
            torch.cuda.synchronize()
            peak = max(peak, (torch.cuda.max_memory_allocated() - base) / 2 ** 30)
        seconds += time.perf_counter() - t0
        lp = lp_references(q[0], q[1], *keys, rows[sl], inp.dout[sl], compute_dtype=case.torch_dtype, **kw)
        consume(a, gold, lp)
        del gold, lp
    return seconds, peak


def run_fixture(impl, name: str, size: str) -> dict:
    """Run one fixture form on ``impl``; raise OracleMismatch on a failure; return figures."""
    case = FIXTURES[name].form(size)
    if case.torch_dtype not in impl.dtypes:
        case = dataclasses.replace(case, dtype=dtype_name(impl.dtypes[0]))
    inp = build(case, impl.device, values_on_device=size == "gpu")
    fail = _failer(impl.name, name, size)
    got = _impl_results(impl, inp)
    dt = case.torch_dtype
    rules = {n: RunningRule(n, dt, gradient=n in GRADIENTS) for n in got if got[n] is not None}
    sums: dict = {}

    def consume(a, gold, lp):
        b = a + gold["out"].shape[0]
        for n in ("out", "lse", "dq_latent", "dq_rope"):
            if n in rules:
                rules[n].add(got[n][a:b], gold[n], {al: r[n] for al, r in lp.items()}, a,
                             gold["magnitude"][n], fail)
        for n in ("dkv_latent", "dk_rope"):
            if n in rules:
                g, l, m = sums.get(n, (0, {}, 0.0))
                # lp chunks summed exactly and rounded once at the end: the one-shot lp also
                # rounds dkv once (after an fp32 accumulation); a running sum in the dtype would
                # add a rounding per chunk and loosen the bound with the number of chunks.
                # the floor's magnitude is per key row: summed over chunks, maximised at the end
                l = {al: r[n].to(torch.float64) + l.get(al, 0) for al, r in lp.items()}
                sums[n] = (gold[n] + g, l, gold["magnitude_rows"][n] + m)

    seconds, peak = _oracle_chunks(inp, size, consume)
    for n, (g, l, m) in sums.items():
        rules[n].add(got[n], g, {al: t.to(dt) for al, t in l.items()}, 0,
                     float(m.max()) if m.numel() else 0.0, fail)
    ratios = {n: r.verdict(fail) for n, r in rules.items()}
    return {"oracle_seconds": seconds, "oracle_peak_gib": peak, "ratios": ratios, "T": case.T,
            "S": case.S}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_cpu_form(impl, name):
    fn = FIXTURES[name].cpu.function
    if not impl.offers(fn):
        pytest.skip(f"{impl.name} does not offer {fn}")
    try:
        run_fixture(impl, name, "cpu")
    except Refused as exc:
        pytest.skip(f"unsupported: {exc}")


# Skipped by marks, before any fixture: a full_size test takes the device exclusively in setup.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="full-size fixtures need a CUDA device")
@pytest.mark.skipif(profiles.size() != "large", reason="full-size fixtures run under the gpu/fuzz "
                                                       f"profiles (active: {profiles.name()})")
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.full_size
@pytest.mark.xdist_group("gpu_full_size")  # one worker runs them, each alone on the device
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_full_size(impl, name):
    fn = FIXTURES[name].gpu.function
    if not impl.offers(fn):
        pytest.skip(f"{impl.name} does not offer {fn}")
    try:
        figures = run_fixture(impl, name, "gpu")
    except Refused as exc:
        pytest.skip(f"unsupported: {exc}")
    finally:
        torch.cuda.empty_cache()
    print(f"\n{name} on {impl.name}: T={figures['T']} S={figures['S']}; oracle (float64 gold, "
          f"chunks of {CHUNK['gpu']} queries) {figures['oracle_seconds']:.2f} s, peak memory growth "
          f"{figures['oracle_peak_gib']:.2f} GiB; worst ratios "
          + ", ".join(f"{k} {v:.3f}" for k, v in figures["ratios"].items()))
    assert figures["oracle_peak_gib"] <= ORACLE_BUDGET_GIB, (
        f"oracle grew device memory by {figures['oracle_peak_gib']:.2f} GiB > {ORACLE_BUDGET_GIB} GiB")
