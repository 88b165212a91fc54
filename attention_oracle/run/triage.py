"""Every distinct bug, and what it depends on.

Three things happen to a mismatch that escapes a check (``runner.run_check``):

1. **Distinct failures.** It is re-raised as a subclass of OracleMismatch named for its check and
   output (``OracleMismatch[sdpa.gradient_agreement:dq]``). Hypothesis tells bugs apart by
   exception type and raise location; with one class raised from one line, a kernel with a
   wrong ``out`` and, independently, a wrong ``dq`` was reported as one bug (whichever shrank
   first). With a class per (check, output), ``report_multiple_bugs`` reports each, and
   :func:`search` runs further rounds for the classes behind the first.

2. **Triage** (Hypothesis' final, shrunk example of a conformance search only): the shrunk case
   is varied one field at a time (causal on/off, each mask kind, GQA, dtype, rank, lengths,
   head dims, layouts, scale, seed, ...), each variant is run through the same check. A field
   whose variants both fail and pass gets the simplest rule consistent with what was seen
   ("fails only when L % 16 != 0", "only with causal", "only with bool masks", "S > 64"), and
   the rule is reported as a dependency only once it holds up:

   - **on other failing cases** (``CONFIRM_ON`` of them, at least one): failing variants of
     other fields (seed variants first: same structure, other values) are varied in the same
     field, and the rule must predict every outcome there too, with at least one variant
     passing on each;
   - **on at least two observations on each side** (failing and passing cases, both cases
     pooled), with no value that fails on one case and passes on the other;
   - **on fresh values** (integer fields): values no variant tried, one the rule says fails
     and one it says passes (nearest the case's value first); a wrong prediction adds the
     observation and the rule is derived again (at most ``MAX_REVISIONS`` times).

   A rule that does not hold up is listed as "not confirmed", with the reason. A failure that
   passes with every seed variant depends on the drawn values, and no rule read off it is
   confirmed unless another failing case shows the same.

3. **A signature and an error map** (``run/bugs.py``, ``run/errormap.py``): the confirmed
   dependencies, the fields the failure does not depend on, the pattern of its failing
   coordinates and a PNG of |impl - gold| over the output's last two dims, recorded in the
   test's sink so that the run's summary groups the failures of one root cause across checks.
   Within one check, failures of several outputs with one signature are reported once.

Variants stay inside the contract and the target's declaration: a variant outside the target's
capabilities (dtypes, head dims, heads, masks, causal, L <= S, ranks, GQA, layouts), one the
target refuses (NotImplementedError) or one the oracle itself cannot run (an input beyond the
contract) is left out. Triage is deterministic (fixed lists of variants and probes per field,
in order) and bounded (``MAX_VARIANTS`` runs in all, ``FIRST_PASS`` of them on the one-field
variants of the failing case, and ``MAX_SECONDS``).
"""
from __future__ import annotations

import contextvars
import dataclasses
import re
import sys
import time

from hypothesis.control import current_build_context

from attention_oracle.checks import catalogue
from attention_oracle.judge import record
from attention_oracle.judge.agreement import OracleMismatch, with_detail
from attention_oracle.judge.targets import Refused, load
from attention_oracle.run import bugs, errormap, known_failures, poison

if sys.version_info >= (3, 11):
    from builtins import BaseExceptionGroup, ExceptionGroup
else:  # pragma: no cover - Hypothesis depends on the backport there
    from exceptiongroup import BaseExceptionGroup, ExceptionGroup

MAX_VARIANTS = 96
FIRST_PASS = 48
MAX_SECONDS = 60.0
MAX_REVISIONS = 2
CONFIRM_ON = 2  # other failing cases a rule is checked on (where that many failed)
MODULI = (16, 32, 64, 128)
_ENABLED = {"on": True}
MAX_ROUNDS = 4
# in a search: the mismatch classes its earlier rounds reported (None outside a search)
_active: contextvars.ContextVar = contextvars.ContextVar("oracle_triage", default=None)
_CLASSES: dict = {}
_HEADER = re.compile(r"\[([^\]]+)\] implementation=\S+ output=(\S+?):")


# ----------------------------------------------------------------------------- distinct failures


def mismatch_class(check: str, output: str) -> type:
    """The OracleMismatch subclass of one (check, output): Hypothesis reports each apart."""
    key = (check, output)
    if key not in _CLASSES:
        _CLASSES[key] = type(f"OracleMismatch[{check}:{output}]", (OracleMismatch,),
                             {"check": check, "output": output, "__module__": __name__})
    return _CLASSES[key]


def output_of(exc: BaseException) -> str:
    """The output a failure message names (``out``, ``dq``, ...), or ``?``."""
    m = _HEADER.search(str(exc))
    return m.group(2) if m else "?"


def distinct(exc: OracleMismatch, check, target, case, name: str) -> OracleMismatch | None:
    """The exception to raise for ``exc``: its (check, output) class; on the final example of a
    search, with the triage of the case, its error map and its signature (``.signature``,
    also recorded in the test's sink). None when an earlier round of this search
    (:func:`search`) already reported that class (the example then counts as run)."""
    text, output = str(exc), output_of(exc)
    cls = mismatch_class(name, output)
    seen = _active.get()
    if seen is not None and cls in seen:
        return None
    if not _is_final():
        return with_detail(cls(text), exc.detail)
    found = analyse(check, target, case, name, output) if _ENABLED["on"] else None
    png = errormap.write(exc.detail, found.headline() if found else "")
    sig = bugs.signature(target.name, name, output, found, exc.detail, png, case.repro(name, target.name))
    record.record_bug(sig)
    extra = (f"\n{found.text}" if found else "") + (f"\n  error map: {png}" if png else "")
    new = with_detail(cls(text + extra), exc.detail)
    new.signature = sig
    return new


def set_enabled(on: bool) -> None:
    _ENABLED["on"] = bool(on)


def _leaves(exc: BaseException) -> list:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def search(test, rounds: int = MAX_ROUNDS) -> None:
    """Run the Hypothesis ``test`` until it finds no failure of a new (check, output) class.

    Hypothesis stops looking soon after its first failure (it searches about twice as many
    calls as it took to find the last bug) and then reports what it found. Each further round
    runs the whole search again with the classes already found taken as run, so a bug behind a
    more frequent one is still found and shrunk on its own; the rounds end at the first one
    without a new class (or any other exception), and everything found is raised together,
    failures of one signature (the same bug on several outputs) once (:func:`fold`).
    At most ``rounds`` rounds: the first failing round costs a search, each further one too."""
    seen: set = set()
    found: list = []
    token = _active.set(seen)
    try:
        for _ in range(rounds):
            try:
                test()
                break
            except Exception as exc:  # pytest's skip/fail outcomes are BaseExceptions: they pass
                leaves = _leaves(exc)
                new = [e for e in leaves if isinstance(e, OracleMismatch) and type(e) not in seen]
                if not new or len(new) != len(leaves):  # another exception: report it as it is
                    found.append(exc)
                    break
                found += new
                seen.update(type(e) for e in new)
    finally:
        _active.reset(token)
    found = fold(found)
    if len(found) == 1:
        raise found[0]
    if found:
        raise ExceptionGroup(f"{len(found)} distinct failures (one per bug, check and output)", found)


def fold(found: list) -> list:
    """``found`` with the failures of one signature (``bugs.same_bug``) reported once: the
    first, its message naming the other outputs."""
    sigs = [getattr(e, "signature", None) for e in found]
    kept, outputs = [], {}
    for exc, sig in zip(found, sigs):
        home = next((k for k in kept if sig and getattr(k, "signature", None)
                     and bugs.same_bug(k.signature, sig)), None)
        if home is None:
            kept.append(exc)
        else:
            outputs.setdefault(id(home), []).append(sig["output"])
    out = []
    for exc in kept:
        more = outputs.get(id(exc))
        if more:
            note = (f"\n  also fails on {', '.join(more)} (same dependencies and pattern: the same "
                    f"bug, reported once)")
            folded = with_detail(type(exc)(f"{exc}{note}"), exc.detail)
            folded.signature = exc.signature
            exc = folded
        out.append(exc)
    return out


def _is_final() -> bool:
    if _active.get() is None:
        return False
    try:
        return bool(current_build_context().is_final)
    except Exception:  # outside a Hypothesis test: a plain run of one case
        return False


# ----------------------------------------------------------------------------- variants


def _replace(case, **changes):
    fields = {f.name for f in dataclasses.fields(case)}
    if not set(changes) <= fields:
        return None
    try:
        return dataclasses.replace(case, **changes)
    except (TypeError, ValueError):
        return None


@dataclasses.dataclass
class _Budget:
    """Runs left (``MAX_VARIANTS`` in all; ``limit`` for the current stage) and the deadline."""

    deadline: float
    limit: int = MAX_VARIANTS
    runs: int = 0
    cut: bool = False

    def spend(self) -> bool:
        if self.runs >= min(self.limit, MAX_VARIANTS) or time.monotonic() > self.deadline:
            self.cut = True
            return False
        self.runs += 1
        return True


def _variations(case) -> list:
    """[(label, rule field, variant maker, probe maker or None)] of the case's area."""
    out = []
    for entry in catalogue.area(case.AREA).variations:
        label, field, make = entry[:3]
        if hasattr(case, label if label != "rank" else "batch"):
            out.append((label, field, make, entry[3] if len(entry) > 3 else None))
    return out


# ----------------------------------------------------------------------------- running


def _within(target, case) -> bool:
    """Whether ``case`` is inside what the target declares (its capabilities, if any): the
    area's own ``within`` decides."""
    caps = getattr(target, "capabilities", None)
    area = catalogue.area(case.AREA)
    if caps is None or area.within is None:
        return True
    fn = getattr(case, "function", None)
    if fn and hasattr(caps, "for_function"):
        caps = caps.for_function(fn)
    return area.within(caps, case)


def _safe_within(target, case) -> bool:
    try:
        return _within(target, case)
    except (AttributeError, TypeError, ValueError):  # a case or declaration of another shape
        return True


def _outcome(check, target, variant, output) -> str:
    """'fails' | 'passes' | 'skip' (refused, not offered, or beyond the contract) | 'other:NAME'
    (fails on another output first: another bug, which hides whether this one stays). The
    known failures matching the variant apply as in a run: a failure inside their signatures
    is not this bug, and hides nothing."""
    name = getattr(check, "full_name", None) or f"{variant.AREA}.{check.__name__}"
    try:
        with poison.poisoned(), known_failures.activated(target.name, name, target.device, variant):
            check(target, variant)
    except Refused:
        return "skip"
    except OracleMismatch as exc:
        other = output_of(exc)
        return "fails" if output in (None, "?", other) else f"other:{other}"
    except AttributeError as exc:  # the variant calls a function the target does not offer
        return "skip" if "does not offer" in str(exc) else _error_or_invalid(check, target, variant)
    except Exception:
        return _error_or_invalid(check, target, variant)
    return "passes"


def _error_or_invalid(check, target, variant) -> str:
    """An exception on a variant is the implementation's failure only if the oracle can run it."""
    try:
        check(load("oracle", target.device), variant)
    except Exception:
        return "skip"
    return "fails"


def _vary(check, target, base, label, field, make, budget: _Budget, output, tried=()) -> list:
    """[(label, rule field, value, variant, outcome)] of ``make``'s variants of ``base`` (values
    in ``tried`` left out), while the budget lasts."""
    rows = []
    for value, changes in make(base, target):
        variant = _replace(base, **changes)
        if variant is None or variant == base or value in tried or not _safe_within(target, variant):
            continue
        if not budget.spend():
            break
        rows.append((label, field, value, variant, _outcome(check, target, variant, output)))
    return rows


def _run_variants(check, target, case, deadline: float, output=None):
    """[(label, rule field, value, variant case, outcome)] for every one-field variant tried, and
    whether the budget cut them short."""
    budget = _Budget(deadline, limit=FIRST_PASS)
    seen = []
    for label, field, make, _ in _variations(case):
        seen += _vary(check, target, case, label, field, make, budget, output)
    return seen, budget.cut


# ----------------------------------------------------------------------------- rules


def _value(case, field):
    return getattr(case, field, None)


def _int_rules(field, case, fails, passes):
    """Candidate rules over an int field, most general first: (text, predicate on a case)."""
    v = _value(case, field)
    rules = [(f"{field} % {m} != 0", lambda c, m=m: _value(c, field) % m != 0) for m in MODULI]
    rules += [(f"{field} == 1", lambda c: _value(c, field) == 1),
              (f"{field} > 1", lambda c: _value(c, field) > 1)]
    other = {"L": "S", "S": "L", "T": "S"}.get(field)
    if other and hasattr(case, other):
        rules += [(f"{field} > {other}", lambda c: _value(c, field) > _value(c, other)),
                  (f"{field} < {other}", lambda c: _value(c, field) < _value(c, other)),
                  (f"{field} != {other}", lambda c: _value(c, field) != _value(c, other))]
    fv = [_value(c, field) for c in fails]
    pv = [_value(c, field) for c in passes]
    below = [p for p in pv if p < min(fv)]
    above = [p for p in pv if p > max(fv)]
    if below:
        rules.append((f"{field} > {max(below)}", lambda c, t=max(below): _value(c, field) > t))
    if above:
        rules.append((f"{field} < {min(above)}", lambda c, t=min(above): _value(c, field) < t))
    return rules + [(f"{field} == {v}", lambda c: _value(c, field) == v)]


def _rule(field, case, fails, passes):
    """(text, predicate) of the first candidate rule true on every failing case and false on
    every passing one, phrased as "only ..."; the predicate says whether a case should fail."""
    v = _value(case, field)
    if isinstance(v, bool):
        return f"only {'with' if v else 'without'} {field}", (lambda c: _value(c, field) == v)
    if isinstance(v, int):
        for text, holds in _int_rules(field, case, fails, passes):
            if all(holds(c) for c in fails) and not any(holds(c) for c in passes):
                return f"only when {text}", holds
    failing = sorted({repr(_value(c, field)) for c in fails})
    values = {_value(c, field) for c in fails}
    member = (lambda c: _value(c, field) in values)
    if len(failing) == 1:
        return f"only with {field}={failing[0]}", member
    family = _family([_value(c, field) for c in fails], [_value(c, field) for c in passes])
    if family:
        return (f"only with {family} {field}s ({field} in {{{', '.join(failing)}}})",
                lambda c: str(_value(c, field)).split("_", 1)[0] == family)
    return f"only with {field} in {{{', '.join(failing)}}}", member


def _family(fails, passes) -> str:
    """The common ``prefix_`` of the failing string values that no passing value has ('' if none)."""
    if not all(isinstance(v, str) for v in fails + passes):
        return ""
    prefixes = {v.split("_", 1)[0] for v in fails}
    if len(prefixes) != 1:
        return ""
    (prefix,) = prefixes
    return "" if any(v.split("_", 1)[0] == prefix for v in passes) else prefix


def _listed(values, most: int = 4) -> str:
    shown = ", ".join(values[:most])
    return shown if len(values) <= most else f"{shown} and {len(values) - most} more"


def _observations(rows):
    fail_vals = [repr(v) for (_, _, v, _, o) in rows if o == "fails"]
    pass_vals = [repr(v) for (_, _, v, _, o) in rows if o == "passes"]
    other = [f"{o[len('other:'):]} fails first with {v!r}" for (_, _, v, _, o) in rows
             if o.startswith("other:")]
    parts = []
    if fail_vals:
        parts.append(f"also fails with {_listed(fail_vals)}")
    if pass_vals:
        parts.append(f"passes with {_listed(pass_vals)}")
    return "; ".join(parts + other[:2])


# ----------------------------------------------------------------------------- confirming


@dataclasses.dataclass
class Triage:
    """What the triage of one failing case found: ``confirmed`` {label: rule},
    ``unconfirmed`` {label: (rule, why)}, the labels it does not depend on, those varied with
    a decisive outcome (``observed``), and the text for the failure message."""

    confirmed: dict
    unconfirmed: dict
    independent: list
    observed: list
    text: str
    runs: int = 0
    seen: dict = dataclasses.field(default_factory=dict)  # {label: the rule this case alone gives}

    def headline(self) -> str:
        """The confirmed dependencies in one line ('' if none)."""
        return "; ".join(f"{label} {rule}" for label, rule in self.confirmed.items())


def _other_bases(rows, label, independent) -> list:
    """Up to ``CONFIRM_ON`` failing variants of other fields to confirm ``label``'s rule on: seed
    variants first (the same structure, other values), then fields the failure does not depend
    on, each field once."""
    failing = [r for r in rows if r[4] == "fails" and r[0] != label]
    failing.sort(key=lambda r: (r[0] != "seed", r[0] not in independent))
    picked, fields = [], set()
    for r in failing:
        if r[0] not in fields or r[0] == "seed":
            picked.append(r[3])
            fields.add(r[0])
    return picked[:CONFIRM_ON]


def _describe(base, case) -> str:
    changed = [f"{f.name}={getattr(base, f.name)!r}" for f in dataclasses.fields(case)
               if getattr(base, f.name) != getattr(case, f.name)]
    return ", ".join(changed) or "the case itself"


def _clash(field, fails, passes):
    """A value of ``field`` that fails on one case and passes on another (None if none)."""
    both = {repr(_value(c, field)) for c in fails} & {repr(_value(c, field)) for c in passes}
    return sorted(both)[0] if both else None


def _probe(check, target, case, field, probe, tried, holds, budget, output):
    """Fresh values of ``field`` (none tried yet): the nearest one the rule says fails and the
    nearest it says passes, run on ``case``: [(variant, outcome, predicted)]."""
    v = _value(case, field)
    options = []
    for value, changes in probe(case, target):
        variant = _replace(case, **changes)
        if variant is None or value in tried or not _safe_within(target, variant):
            continue
        options.append((abs(value - v) if isinstance(value, int) else 0, value, variant))
    picked = []
    for side in (True, False):
        near = sorted((o for o in options if bool(holds(o[2])) == side), key=lambda o: o[:2])
        picked += near[:1]
    out = []
    for *_, variant in picked:
        if not budget.spend():
            break
        outcome = _outcome(check, target, variant, output)
        if outcome in ("fails", "passes"):
            out.append((variant, outcome, "fails" if holds(variant) else "passes"))
    return out


def _confirm(check, target, case, entry, rows, independent, budget, output):
    """(rule, None) when ``entry``'s field rule holds up (module docstring), else (rule, why)."""
    label, field, make, probe = entry
    mine = [r for r in rows if r[0] == label]
    first, _ = _rule(field, case, [case] + [r[3] for r in mine if r[4] == "fails"],
                     [r[3] for r in mine if r[4] == "passes"])
    bases = _other_bases(rows, label, independent)
    if not bases:
        return first, "no second failing case to confirm it on"
    fails, passes = [case] + [r[3] for r in mine if r[4] == "fails"], [r[3] for r in mine if r[4] == "passes"]
    for base in bases:
        again = _vary(check, target, base, label, field, make, budget, output)
        fails += [base] + [r[3] for r in again if r[4] == "fails"]
        passes += [r[3] for r in again if r[4] == "passes"]
        where = f"on {_describe(base, case)}"
        if not any(r[4] in ("fails", "passes") for r in again):
            return first, f"every variant {where} was refused or failed on another output"
        clash = _clash(field, fails, passes)
        if clash is not None:
            return first, f"{field}={clash} fails on one case and passes on another ({where})"
        if not any(r[4] == "passes" for r in again):
            return first, f"every {label} variant {where} fails"
    rule, holds = _rule(field, case, fails, passes)
    return _revise(check, target, case, field, probe, fails, passes, rule, holds, budget, output)


def _revise(check, target, case, field, probe, fails, passes, rule, holds, budget, output):
    """The rule re-verified on fresh values (integer fields), derived again when one disagrees;
    a rule that comes to list values (``S in {...}``) is not confirmed."""
    refuted = []
    for _ in range(MAX_REVISIONS + 1):
        if len(fails) < 2 or len(passes) < 2:
            return rule, f"{len(fails)} failing and {len(passes)} passing observations (2 of each needed)"
        if " in {" in rule and refuted:
            break
        if probe is None or not isinstance(_value(case, field), int) or isinstance(_value(case, field), bool):
            return rule, None
        tried = {_value(c, field) for c in fails + passes}
        probes = _probe(check, target, case, field, probe, tried, holds, budget, output)
        wrong = [(c, o) for c, o, predicted in probes if o != predicted]
        for c, o, _ in probes:
            (fails if o == "fails" else passes).append(c)
        if not wrong:
            return rule, None
        refuted += [f"'{rule.removeprefix('only when ')}' refuted by fresh {field}={_value(c, field)!r} ({o})"
                    for c, o in wrong[:1]]
        rule, holds = _rule(field, case, fails, passes)
    return rule, "; ".join(refuted)


def analyse(check, target, case, name: str = "", output: str | None = None) -> Triage:
    """The triage of a failing ``case`` of ``check`` on ``target`` (``output``: the output that
    failed; a variant failing first on another one is another bug)."""
    start = time.monotonic()
    budget = _Budget(start + MAX_SECONDS)
    with record.silenced():
        rows, cut = _run_variants(check, target, case, budget.deadline, output)
        budget.runs = len(rows)
        entries = {e[0]: e for e in _variations(case)}
        labels = list(dict.fromkeys(r[0] for r in rows))
        kinds = {lab: {r[4] for r in rows if r[0] == lab} - {"skip"} for lab in labels}
        independent = [lab for lab in labels if kinds[lab] == {"fails"}]
        dependent = [lab for lab in labels if "passes" in kinds[lab]]
        results = {lab: _confirm(check, target, case, entries[lab], rows, independent, budget, output)
                   for lab in dependent}
    confirmed = {lab: rule for lab, (rule, why) in results.items() if why is None}
    unconfirmed = {lab: (rule, why) for lab, (rule, why) in results.items() if why is not None}
    observed = [lab for lab in labels if kinds[lab] & {"fails", "passes"}]
    text = _text(rows, labels, kinds, confirmed, unconfirmed, independent,
                 budget, time.monotonic() - start, cut or budget.cut, case)
    seen = {lab: _first_rule(entries[lab][1], case, [r for r in rows if r[0] == lab]) for lab in dependent}
    return Triage(confirmed, unconfirmed, independent, observed, text, budget.runs, seen)


def _first_rule(field, case, mine) -> str:
    """The rule the case's own variants of one field give (before any confirmation)."""
    return _rule(field, case, [case] + [r[3] for r in mine if r[4] == "fails"],
                 [r[3] for r in mine if r[4] == "passes"])[0]


def _text(rows, labels, kinds, confirmed, unconfirmed, independent, budget, seconds, cut, case) -> str:
    head = (f"  depends on (triage: {budget.runs} runs, one field changed at a time, each rule "
            f"checked on other failing cases and on fresh values, {seconds:.1f} s"
            f"{'; stopped at the budget' if cut else ''}):")
    lines = [head]
    for label, rule in confirmed.items():
        lines.append(f"    {label}: fails {rule} ({_observations([r for r in rows if r[0] == label])})")
    if not confirmed:
        lines.append("    no dependency confirmed" + (" (the failure stays with every variant that ran)"
                                                    if not unconfirmed else ""))
    for label, (rule, why) in unconfirmed.items():
        lines.append(f"  not confirmed: {label} ({rule} on this case; {why})")
    seeds = kinds.get("seed", set())
    if seeds == {"passes"}:
        lines.append("  passes with every other seed: the failure depends on the drawn values")
    if independent:
        lines.append(f"  does not depend on: {', '.join(independent)} (every variant tried fails too)")
    untried = [lab for lab in labels if not kinds[lab]]
    hidden = [lab for lab in labels if kinds[lab] and not kinds[lab] & {"fails", "passes"}]
    if untried:
        lines.append(f"  not varied (refused or beyond the contract): {', '.join(untried)}")
    if hidden:
        lines.append(f"  hidden by another failure when varied: {', '.join(hidden)}")
    return "\n".join(lines)


def explain(check, target, case, name: str = "", output: str | None = None) -> str:
    """The "depends on" section of :func:`analyse`."""
    return analyse(check, target, case, name, output).text
