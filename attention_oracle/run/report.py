"""The end-of-run table (implementation x check), from the sinks of ``judge/record.py``:
passed / failed / skipped / unsupported / known failures (xfail: whole tests; known: examples
in a known failure class), the examples run (grid cases, search examples, and of them those
refused and those judged) and the worst error ratio; in the JSON, each row's judged cases
(``cases``: check, case JSON, its worst ratio and the check's variant, the first ``CASES_CAP`` per
variant), which ``--baseline`` replays (``run/baseline.py``).
"""
from __future__ import annotations

import json
import math
from collections import defaultdict

OUTCOMES = ("passed", "failed", "skipped", "unsupported", "xfail")
# examples per row (``record.record_example``): grid cases, search examples, saved cases
# replayed, refused, judged
EXAMPLE_COUNTS = ("grid", "search", "replay", "refused_examples", "judged_examples")


CASES_CAP = 256  # judged cases kept per row and variant (the first): what --baseline replays


def _add_cases(cases: list, variant: str, judged) -> None:
    """Append a test's judged ``[check, case JSON, worst ratio or None]`` to its row's ``cases``
    ({"variant", "check", "case", "ratio"}; ratio "inf" for a failure, None for a known one).
    Past ``CASES_CAP`` only a case already kept is added again (up to twice the cap): its
    ratios within one run are the noise ``--baseline`` measures."""
    kept = {(c["check"], c["case"]) for c in cases if c["variant"] == variant}
    count = sum(1 for c in cases if c["variant"] == variant)
    for check, case_json, ratio in judged:
        if count >= 2 * CASES_CAP or (count >= CASES_CAP and (check, case_json) not in kept):
            continue
        ratio = "inf" if ratio is not None and math.isinf(ratio) else ratio
        cases.append({"variant": variant, "check": check, "case": case_json, "ratio": ratio})
        kept.add((check, case_json))
        count += 1


class Table:
    """Aggregates test reports into rows keyed by (implementation, check)."""

    def __init__(self):
        self.rows: dict = defaultdict(lambda: {**{o: 0 for o in OUTCOMES}, "worst_ratio": 0.0,
                                               "examples": 0, "refused": 0, "known": 0,
                                               "known_first": "", "cases": [],
                                               **{k: 0 for k in EXAMPLE_COUNTS}})
        # (impl, function) -> [tests that verified something, tests fully refused]
        self.functions: dict = defaultdict(lambda: [0, 0])
        self.known_entries: dict[str, int] = defaultdict(int)  # user entry label -> examples
        self.extra: dict = {}  # further top-level keys of the JSON report (baseline, known file)

    def add(self, impl: str, check: str, outcome: str, info: dict | None) -> None:
        row = self.rows[(impl, check)]
        row[outcome] += 1
        if info:
            row["worst_ratio"] = max(row["worst_ratio"], info.get("worst", 0.0))
            row["examples"] += info.get("examples", 0)
            row["refused"] += info.get("refused", 0)
            row["known"] += info.get("known", 0)
            for k in EXAMPLE_COUNTS:
                row[k] += info.get(k, 0)
            row["known_first"] = row["known_first"] or info.get("known_first", "")
            _add_cases(row["cases"], info.get("variant", ""), info.get("judged", ()))
            for label, n in info.get("known_entries", {}).items():
                self.known_entries[label] += n
            # a function verified something where a call of it was judged; a test that called it
            # and had every call refused verified nothing with it (failed, or unsupported)
            judged = info.get("examples", 0) - info.get("refused", 0)
            for fn in info.get("functions", []):
                entry = self.functions[(impl, fn)]
                if judged > 0 and outcome in ("passed", "failed", "xfail"):
                    entry[0] += 1
                elif info.get("refused", 0) > 0 or outcome == "unsupported":
                    entry[1] += 1

    def verified_nothing(self) -> list[tuple[str, str]]:
        """Functions offered by an implementation that refused every input given to them."""
        return sorted(k for k, (ok, refused) in self.functions.items() if ok == 0 and refused > 0)

    def render(self) -> str:
        if not self.rows:
            return "(no oracle checks ran)"
        head = ("implementation", "check", "pass", "fail", "skip", "unsup", "xfail", "known",
                "grid", "search", "replay", "refused", "judged", "worst ratio")
        lines = [head]
        for (impl, check), r in sorted(self.rows.items()):
            worst = r["worst_ratio"]
            lines.append((impl, check, str(r["passed"]), str(r["failed"]), str(r["skipped"]),
                          str(r["unsupported"]), str(r["xfail"]), str(r["known"]),
                          *(str(r[k]) for k in EXAMPLE_COUNTS),
                          "inf" if math.isinf(worst) else f"{worst:.3f}"))
        widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
        out = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in lines]
        out.insert(1, "  ".join("-" * w for w in widths))
        nothing = self.verified_nothing()
        if nothing:
            out.append("")
            for impl, fn in nothing:
                out.append(f"FAILURE: {impl}.{fn} is offered but refused every input it was given: "
                           f"it verified nothing")
        return "\n".join(out)

    def to_json(self) -> str:
        rows = [{"implementation": i, "check": c, **r} for (i, c), r in sorted(self.rows.items())]
        for r in rows:
            if math.isinf(r["worst_ratio"]):
                r["worst_ratio"] = "inf"
        return json.dumps({"rows": rows, "verified_nothing": [f"{i}.{f}" for i, f in self.verified_nothing()],
                           **self.extra}, indent=2)
