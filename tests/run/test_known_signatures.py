"""Known failures confined to their signature (judge/known.py), a mechanism confirmed before an
example is excused, and a check that judged nothing failing its test.

Each entry is loaded from a file through run/known_failures.py's one loader, against real
controls (attention_oracle/controls/):

- ``NanOnEmptyRows`` is wrong only on fully masked rows: a signature of those rows excuses it;
- ``WrongScale`` is wrong everywhere: the same signature leaves its other rows failing,
  "outside the known signature";
- ``DoutPlanCachedByShape`` (F9's model) fails strided_dout in one process and passes
  gradient_agreement in a fresh one: confirmed; ``WrongScale`` fails there too: not confirmed;
- ``RefusesAllButOne`` refuses every drawn example: the test fails, "verified nothing".
"""
import pytest

from attention_oracle.checks.sdpa import checks as sdpa_checks
from attention_oracle.checks.sdpa.cases import SdpaCase
from attention_oracle.judge import record
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.judge.targets import load
from attention_oracle.run import known_failures
from attention_oracle.run.runner import run_check
from tests.helpers import run_suite

BROKEN = "attention_oracle.controls.sdpa_broken"
EMPTY_ROWS = SdpaCase(batch=(1,), hq=2, hkv=2, L=6, S=7, E=8, Ev=8, mask="bool_full",
                      empty_rows=2, seed=5)
STRIDED = SdpaCase(batch=(1,), hq=2, hkv=2, L=5, S=7, E=8, Ev=8, layout_dout="transposed", seed=3)


def _entries(tmp_path, monkeypatch, impl, check, signature, where='"mask != \'none\'"'):
    path = tmp_path / "known.toml"
    path.write_text(f'[[known]]\nimplementation = "{impl}"\ncheck = "{check}"\nwhere = {where}\n'
                    f'signature = {signature}\nreason = "control"\n')
    monkeypatch.setattr(known_failures, "_USER", known_failures.load(str(path)))


def _run(impl, check, case):
    sink, token = record.open_sink()
    try:
        run_check(sdpa_checks.CHECKS[check], load(impl), case)
    finally:
        record.close_sink(token)
    return sink


ROWS = '{outputs = ["out", "dq", "dk", "dv"], rows = "fully_masked"}'


def test_a_failure_inside_the_rows_is_known(tmp_path, monkeypatch):
    _entries(tmp_path, monkeypatch, f"{BROKEN}:NanOnEmptyRows", "sdpa.forward_agreement", ROWS)
    sink = _run(f"{BROKEN}:NanOnEmptyRows", "forward_agreement", EMPTY_ROWS)
    assert sink.known == 1 and "inside its signature" in sink.known_first
    assert 0 < sink.worst < 1  # the rows outside were judged by the rule


def test_the_fully_masked_rows_check_maps_the_rows_signature(tmp_path, monkeypatch):
    """fully_masked_rows compares only the rows no key takes part in: a rows signature excuses
    them there too (cuDNN's F2 under the default dispatch), and a row selector of other rows
    does not."""
    _entries(tmp_path, monkeypatch, f"{BROKEN}:NanOnEmptyRows", "sdpa.fully_masked_rows",
             '{outputs = ["out", "dq", "dk", "dv"], rows = "fully_masked"}')
    with pytest.raises(OracleMismatch, match="non-finite"):  # NaN is judged before the rows
        _run(f"{BROKEN}:NanOnEmptyRows", "fully_masked_rows", EMPTY_ROWS)
    _entries(tmp_path, monkeypatch, f"{BROKEN}:NonzeroOnEmptyRows", "sdpa.fully_masked_rows", ROWS)
    sink = _run(f"{BROKEN}:NonzeroOnEmptyRows", "fully_masked_rows", EMPTY_ROWS)
    assert sink.known == 1
    _entries(tmp_path, monkeypatch, f"{BROKEN}:NonzeroOnEmptyRows", "sdpa.fully_masked_rows",
             '{outputs = ["out", "dq", "dk", "dv"], rows = "finfo_min"}')
    with pytest.raises(OracleMismatch, match="outside the known signature"):
        _run(f"{BROKEN}:NonzeroOnEmptyRows", "fully_masked_rows", EMPTY_ROWS)


def test_a_failure_outside_the_rows_fails(tmp_path, monkeypatch):
    _entries(tmp_path, monkeypatch, f"{BROKEN}:WrongScale", "sdpa.forward_agreement", ROWS)
    with pytest.raises(OracleMismatch, match="outside the known signature of known.toml#1") as info:
        _run(f"{BROKEN}:WrongScale", "forward_agreement", EMPTY_ROWS)
    assert "the elements it excuses were left out and the rest still fails" in str(info.value)


def test_a_failure_in_an_output_the_signature_does_not_name_fails(tmp_path, monkeypatch):
    _entries(tmp_path, monkeypatch, f"{BROKEN}:DoutPlanCachedByShape", "sdpa.strided_dout",
             '{outputs = ["dq"]}', where='{layout_dout = "transposed"}')
    with pytest.raises(OracleMismatch, match="outside the known signature") as info:
        _run(f"{BROKEN}:DoutPlanCachedByShape", "strided_dout", STRIDED)
    assert "not dk" in str(info.value)


def test_a_mechanism_is_confirmed_in_a_fresh_process(tmp_path, monkeypatch):
    signature = '{outputs = ["dq", "dk", "dv"], confirm = "sdpa.gradient_agreement"}'
    _entries(tmp_path, monkeypatch, f"{BROKEN}:DoutPlanCachedByShape", "sdpa.strided_dout",
             signature, where='{layout_dout = "transposed"}')
    sink = _run(f"{BROKEN}:DoutPlanCachedByShape", "strided_dout", STRIDED)
    assert sink.known == 1


def test_an_unconfirmed_mechanism_fails(tmp_path, monkeypatch):
    _entries(tmp_path, monkeypatch, f"{BROKEN}:WrongScale", "sdpa.strided_dout",
             '{confirm = "sdpa.gradient_agreement"}', where='{layout_dout = "transposed"}')
    with pytest.raises(OracleMismatch, match="its mechanism is not confirmed"):
        _run(f"{BROKEN}:WrongScale", "strided_dout", STRIDED)


def _two_entries(tmp_path, monkeypatch, impl, first, second, checks=('"sdpa.strided_dout"',) * 2):
    path = tmp_path / "known.toml"
    path.write_text("".join(f'[[known]]\nimplementation = "{impl}"\ncheck = {c}\nsignature = {sig}\n'
                            f'reason = "control"\n\n' for c, sig in zip(checks, (first, second))))
    monkeypatch.setattr(known_failures, "_USER", known_failures.load(str(path)))


def test_every_entry_an_excuse_rests_on_is_confirmed(tmp_path, monkeypatch):
    """dk is covered by a rows entry (no row of this case is fully masked) and by a whole-output
    entry whose mechanism must be confirmed: the excuse rests on the second, whose confirmation
    fails (dk lacks the scale in a fresh process too)."""
    _two_entries(tmp_path, monkeypatch, f"{BROKEN}:KeyGradientMissesScale",
                 '{outputs = ["dk"], rows = "fully_masked"}',
                 '{outputs = ["dk"], confirm = "sdpa.gradient_agreement"}')
    with pytest.raises(OracleMismatch, match="its mechanism is not confirmed"):
        _run(f"{BROKEN}:KeyGradientMissesScale", "strided_dout", STRIDED)


EMPTY_STRIDED = SdpaCase(batch=(1,), hq=2, hkv=2, L=6, S=7, E=8, Ev=8, mask="bool_full",
                         empty_rows=2, layout_dout="transposed", seed=5)


def test_the_confirmation_applies_the_known_failures(tmp_path, monkeypatch):
    """The fresh process that confirms a mechanism judges as a run does: the rows another entry
    excuses (F2's, beside F9's whole dq) stay excused there."""
    _two_entries(tmp_path, monkeypatch, f"{BROKEN}:NonzeroOnEmptyRows", ROWS,
                 '{outputs = ["dq"], confirm = "sdpa.gradient_agreement"}',
                 checks=('["sdpa.strided_dout", "sdpa.gradient_agreement"]', '"sdpa.strided_dout"'))
    sink = _run(f"{BROKEN}:NonzeroOnEmptyRows", "strided_dout", EMPTY_STRIDED)
    assert sink.known == 1 and set(sink.known_entries) == {"known.toml#1", "known.toml#2"}


def test_a_signature_must_name_a_row_selector_of_the_area(tmp_path):
    path = tmp_path / "known.toml"
    path.write_text('[[known]]\nimplementation = "m"\ncheck = "sdpa.forward_agreement"\n'
                    'signature = {rows = "masked"}\nreason = "r"\n')
    with pytest.raises(known_failures.KnownFailuresError, match="no row selector"):
        known_failures.load(str(path))


def test_a_check_that_judged_nothing_fails_the_run(tmp_path):
    report = tmp_path / "r.json"
    proc = run_suite("attention_oracle/conformance/test_sdpa.py::test_forward_agreement",
                     "--impl", "attention_oracle.controls.refusing:RefusesAllButOne",
                     "--oracle-report", str(report))
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "verified nothing: refused all" in proc.stdout and "first reason: " in proc.stdout


@pytest.mark.parametrize("kernel, failed", [("NarrowFp32", False), ("UndeclaredNarrowFp32", True)])
def test_the_corpus_respects_capabilities(tmp_path, kernel, failed):
    """A replay outside the declaration (fp32 only, no masks, no causal, head dims <= 64) is
    skipped as not verified; the same kernel undeclared fails those replays."""
    proc = run_suite("attention_oracle/conformance/test_regressions.py", "--oracle-corpus",
                     str(tmp_path), "--impl", f"attention_oracle.controls.refusing:{kernel}")
    assert proc.returncode == (1 if failed else 0), proc.stdout[-3000:]
    assert ("failed" in proc.stdout.splitlines()[-1]) is failed
    if not failed:
        assert "not verified: regression" in proc.stdout + proc.stderr or "skipped" in proc.stdout


FINFO_MIN = SdpaCase(batch=(), hq=2, hkv=2, L=6, S=7, E=8, Ev=8, mask="finfo_min_full", empty_rows=2, seed=4)


def test_rank3_against_rank4_under_a_rows_signature_still_judges_the_other_rows(tmp_path, monkeypatch):
    """rank3_equals_rank4 compares two results of the implementation; a signature of finfo.min rows
    (F11's) excuses only those rows, and for dk / dv only their contribution (both ranks rerun
    with those rows' dout zero): a rank-3 bug everywhere still fails."""
    _entries(tmp_path, monkeypatch, f"{BROKEN}:Rank3ScaleHalved", "sdpa.rank3_equals_rank4",
             '{outputs = ["out", "dq", "dk", "dv"], rows = "finfo_min"}', where='{mask = "finfo_min*"}')
    with pytest.raises(OracleMismatch, match="outside the known signature"):
        _run(f"{BROKEN}:Rank3ScaleHalved", "rank3_equals_rank4", FINFO_MIN)
