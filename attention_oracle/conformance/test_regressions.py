"""The regression corpus: every case saved under fixtures/regressions/ is replayed on every
selected implementation (``attention-oracle replay --save NAME`` adds one), and so is every
failure a fuzz campaign saved in its corpus directory (``--oracle-corpus DIR``, default
``.hypothesis/corpus``; entries written after this run started wait for the next run)."""
import pytest

from attention_oracle.checks import catalogue
from attention_oracle.run import corpus, fuzzing
from attention_oracle.run.runner import run_check

ENTRIES = corpus.entries(fuzzing.corpus_dir(), before=fuzzing.corpus_cutoff())


def _known_failure(entry: dict, impl_name: str, device: str) -> str:
    """An entry may list implementations it is a known failure of: ``impl`` or ``impl@device``."""
    known = entry.get("known_failures", {})
    return known.get(f"{impl_name}@{device}") or known.get(impl_name, "")


@pytest.mark.parametrize("name,entry", ENTRIES, ids=[n for n, _ in ENTRIES])
def test_regression(request, impl, name, entry):
    reason = _known_failure(entry, impl.name, impl.device.type)
    if reason:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=False))
    check = catalogue.check(entry["check"])
    case = catalogue.load_case(entry["case"])
    if not impl.offers(case.function):
        pytest.skip(f"{impl.name} does not offer {case.function}")
    if not run_check(check, impl, case):
        pytest.skip(f"unsupported: {impl.name} refused regression {name}")
