"""The regression corpus: every case saved under fixtures/regressions/ is replayed on every
selected implementation (``attention-oracle replay --save NAME`` adds one), and so is every
failure a fuzz campaign saved in its corpus directory (``--oracle-corpus DIR``, default
``.hypothesis/corpus``; entries written after this run started wait for the next run). A
replay the implementation's capability declaration excludes is skipped as not verified."""
import pytest

from attention_oracle.checks import catalogue
from attention_oracle.judge import record
from attention_oracle.run import corpus, fuzzing
from attention_oracle.run.runner import run_check

ENTRIES = corpus.entries(fuzzing.corpus_dir(), before=fuzzing.corpus_cutoff())


def _known_failure(entry: dict, impl_name: str, device: str) -> str:
    """An entry may list implementations it is a known failure of: ``impl`` or ``impl@device``."""
    known = entry.get("known_failures", {})
    return known.get(f"{impl_name}@{device}") or known.get(impl_name, "")


def _declared_away(check, impl, case) -> str:
    """Why the implementation's declaration excludes this replay ('' if it does not): the check
    itself (``Check.unsupported``), or the case outside what it declares for the case's function
    (the area's ``within``: dtype, head dims, masks, causal, rank, GQA, layouts)."""
    why = check.unsupported(impl)
    if why:
        return why
    within = catalogue.area(case.AREA).within
    caps = impl.capabilities.for_function(case.function)
    if within is not None and not within(caps, case):
        return f"its case ({_summary(case)}) lies outside the declaration"
    return ""


def _summary(case) -> str:
    fields = ("dtype", "E", "Ev", "Dl", "mask", "causal", "rank", "gqa")
    return ", ".join(f"{f} {getattr(case, f)}" for f in fields if hasattr(case, f))


@pytest.mark.parametrize("name,entry", ENTRIES, ids=[n for n, _ in ENTRIES])
def test_regression(request, impl, name, entry):
    reason = _known_failure(entry, impl.name, impl.device.type)
    if reason:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=False))
    check = catalogue.check(entry["check"])
    case = catalogue.load_case(entry["case"])
    if not impl.offers(case.function):
        pytest.skip(f"{impl.name} does not offer {case.function}")
    why = _declared_away(check, impl, case)
    if why:
        pytest.skip(f"not verified: regression {name}: {why} (capabilities declared by {impl.name})")
    judged = True  # a replay that fails (raises) was judged
    try:
        judged = run_check(check, impl, case)
    finally:
        record.record_example(None, refused=not judged, replay=True)
    if not judged:
        pytest.skip(f"unsupported: {impl.name} refused regression {name}")
