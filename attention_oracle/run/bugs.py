"""Distinct bugs: the failures of one root cause grouped across checks and outputs.

Each triaged failure (``run/triage.py``) leaves a signature, a plain dict that travels in the
test's sink (so it survives pytest-xdist): ``impl``, ``check``, ``output``, ``confirmed``
{label: rule} (its dependencies that held up on a second failing case and on fresh values),
``independent`` (labels every variant of which fails), ``observed`` (labels varied with a
decisive outcome), ``pattern`` (its failing coordinates in words, ``run/errormap.py``),
``map`` (the PNG), ``replay`` (the command), ``nodeid`` (set on the controller).

Two failures are one bug (:func:`same_bug`) when they come from the same implementation and:

- they share a confirmed structural dependency, the same rule on the same field ("S > 64",
  "L % 16 != 0", "only without causal", "only with bool masks"); a failure with none confirmed
  (its regime made the rule fail on other cases: saturated scores, where a dropped key shows
  only if it was a row's maximum) joins one whose confirmed rule its own case's variants show
  (``seen``); two with none confirmed group when their own cases show a common rule, or
  neither shows any. A rule that only lists values ("only with
  value_scale=0.3", "only with mask in {...}") says where the error is large enough to be seen
  in that regime, which differs between outputs and checks of one bug (a dropped key moves
  ``out`` beyond the bound in fp16 and ``dv`` only in fp32, say): it neither joins nor splits;
- on the same output, their failing coordinates have the same pattern (outputs along other axes,
  ``dq`` over queries and ``dk`` over keys, are not compared by pattern).

Grouping is by linkage: a failure joins the first group one of whose members it matches.

:func:`summary` gives one line per distinct bug, first in the run's report; :func:`shorten` cuts
the repeated failure text of a bug already shown in full to a few lines.
"""
from __future__ import annotations

from attention_oracle.run import errormap


def signature(impl: str, check: str, output: str, found, detail, png: str, replay: str) -> dict:
    """The signature of one failure (``found``: its ``triage.Triage`` or None without triage)."""
    return {"impl": impl, "check": check, "output": output,
            "confirmed": dict(found.confirmed) if found else {},
            "independent": list(found.independent) if found else [],
            "observed": list(found.observed) if found else [],
            "seen": dict(found.seen) if found else {},
            "pattern": errormap.pattern(detail) if detail else "",
            "map": png, "replay": replay, "nodeid": ""}


def structural(rule: str) -> bool:
    """Whether a confirmed rule states a structure (not a list of the values seen failing)."""
    return not (rule.startswith("only with ") and ("=" in rule or " in {" in rule)
                and " masks" not in rule and "s (" not in rule)


def _strong(sig: dict) -> set:
    return {(label, rule) for label, rule in sig["confirmed"].items() if structural(rule)}


def _seen(sig: dict) -> set:
    return {(label, rule) for label, rule in sig.get("seen", {}).items() if structural(rule)}


def _agree(a: dict, b: dict) -> bool:
    sa, sb = _strong(a), _strong(b)
    if sa & sb:
        return True
    if not sa and not sb:
        return not (_seen(a) or _seen(b)) or bool(_seen(a) & _seen(b))
    # one confirmed nothing (its regime hides the rule on other cases): its own case shows a
    # rule the other confirmed
    return bool((_seen(a) & sb) if not sa else (_seen(b) & sa))


def same_bug(a: dict, b: dict) -> bool:
    """Whether signatures ``a`` and ``b`` are one bug (module docstring)."""
    if a["impl"] != b["impl"] or not _agree(a, b):
        return False
    return a["output"] != b["output"] or a["pattern"] == b["pattern"]


def group(sigs: list[dict]) -> list[list[dict]]:
    """``sigs`` in groups of one bug each (a failure joins the first group it matches any member
    of), in order of first appearance."""
    groups: list[list[dict]] = []
    for sig in sigs:
        home = next((g for g in groups if any(same_bug(s, sig) for s in g)), None)
        if home is None:
            groups.append([sig])
        else:
            home.append(sig)
    return groups


def _plain(rule: str) -> str:
    """'only when S > 64' -> 'S > 64'; 'only with bool masks (mask in {...})' -> 'bool masks';
    'only without causal' -> 'not causal'."""
    if rule.startswith("only without "):
        return "not " + rule[len("only without "):]
    for prefix in ("only when ", "only with ", "only "):
        if rule.startswith(prefix):
            rule = rule[len(prefix):]
            break
    return rule.split(" (", 1)[0]


def _where(members: list[dict]) -> str:
    """The structural rules shared by every member that confirmed any, in words (else the
    first member's confirmed rules, whatever they are)."""
    strong = [_strong(s) for s in members if _strong(s)]
    shared = set.intersection(*strong) if strong else set()
    lead = next((s for s in members if _strong(s)), members[0])
    ordered = [(label, rule) for label, rule in lead["confirmed"].items()
               if (label, rule) in shared or not shared]
    rules = [_plain(rule) for _, rule in ordered]
    return " and ".join(rules)


def line(n: int, members: list[dict]) -> str:
    """``BUG n: <impl> <outputs> fail where <dependency>; seen in checks A, B (N failures);
    first replay: <command>; error map: <png>``."""
    first = members[0]
    outputs = ", ".join(dict.fromkeys(s["output"] for s in members))
    checks = ", ".join(dict.fromkeys(s["check"] for s in members))
    png = next((s["map"] for s in members if s["map"]), "") or "none (no tensor to map)"
    tests = len({s["nodeid"] for s in members})
    where = _where(members)
    where = f"where {where}" if where else "(no dependency confirmed)"
    return (f"BUG {n}: {first['impl']} {outputs} fail {where}; seen in checks "
            f"{checks} ({len(members)} failure{'s' if len(members) != 1 else ''} in {tests} "
            f"test{'s' if tests != 1 else ''}); first replay: {first['replay']}; error map: {png}")


def summary(sigs: list[dict]) -> list[str]:
    """One line per distinct bug among ``sigs``."""
    return [line(i + 1, g) for i, g in enumerate(group(sigs))]


def _failure_sigs(rep) -> list[dict]:
    sink = dict(getattr(rep, "user_properties", ())).get("oracle_sink") or {}
    return list(sink.get("bugs", ()))


def shorten(reports: list) -> int:
    """Replace the failure text of each report (pytest TestReport) all of whose bugs were
    already shown in full by an earlier report with a short reference to that bug; the
    number of reports shortened. Reports without signatures are left as they are."""
    sigs = [s for rep in reports for s in _failure_sigs(rep)]
    groups = group(sigs)
    number = {id(s): i + 1 for i, g in enumerate(groups) for s in g}
    first_report = {}
    shortened = 0
    for rep in reports:
        mine = _failure_sigs(rep)
        if not mine:
            continue
        bugs_here = [number[id(s)] for s in mine if id(s) in number]
        if all(first_report.get(b, rep.nodeid) != rep.nodeid for b in bugs_here):
            rep.longrepr = _short(mine, bugs_here, first_report)
            shortened += 1
        for b in bugs_here:
            first_report.setdefault(b, rep.nodeid)
    return shortened


def _short(mine: list[dict], numbers: list[int], first_report: dict) -> str:
    """A few lines per bug of one report: the outputs, where it is shown in full, the first
    replay and error map."""
    lines = []
    for n in dict.fromkeys(numbers):
        sigs = [s for s, m in zip(mine, numbers) if m == n]
        outputs = ", ".join(dict.fromkeys(s["output"] for s in sigs))
        png = next((s["map"] for s in sigs if s["map"]), "")
        lines += [f"BUG {n} again ({sigs[0]['check']}: {outputs}; {('where ' + _where(sigs)) if _where(sigs) else 'no dependency confirmed'}; shown in full "
                  f"in {first_report[n]})", f"  reproduce: {sigs[0]['replay']}"]
        lines += [f"  error map: {png}"] if png else []
    return "\n".join(lines)
