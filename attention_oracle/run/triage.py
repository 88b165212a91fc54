"""Every distinct bug, and what it depends on.

Two things happen to a mismatch that escapes a check (``runner.run_check``):

1. **Distinct failures.** It is re-raised as a subclass of OracleMismatch named for its check and
   output (``OracleMismatch[sdpa.gradient_agreement:dq]``). Hypothesis tells bugs apart by
   exception type and raise location; with one class raised from one line, a kernel with a
   wrong ``out`` and, independently, a wrong ``dq`` was reported as one bug (whichever shrank
   first). With a class per (check, output), ``report_multiple_bugs`` reports each.

2. **Triage** (Hypothesis' final, shrunk example of a conformance search only): the shrunk case
   is varied one field at a time (causal on/off, each mask kind, GQA, dtype, rank, lengths,
   head dims, layouts, scale, seed, ...), each variant is run through the same check, and the
   failure message gains a "depends on" section: the fields whose change makes the failure go
   away, with the simplest rule consistent with what was seen ("fails only when L % 32 != 0",
   "only with causal=True", "only with mask in {bool_full, bool_bcast}"), and the fields it does
   not depend on.

Variants stay inside the contract and the target's declaration: a variant outside the target's
capabilities (dtypes, head dims, heads, masks, causal, L <= S, ranks, GQA, layouts), one the
target refuses (NotImplementedError) or one the oracle itself cannot run (an input beyond the
contract) is left out. Triage is deterministic (a fixed list of
variants per field, in order) and bounded (``MAX_VARIANTS`` runs and ``MAX_SECONDS``).
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
from attention_oracle.judge.agreement import OracleMismatch
from attention_oracle.judge.targets import Refused, load
from attention_oracle.run import poison

if sys.version_info >= (3, 11):
    from builtins import BaseExceptionGroup, ExceptionGroup
else:  # pragma: no cover - Hypothesis depends on the backport there
    from exceptiongroup import BaseExceptionGroup, ExceptionGroup

MAX_VARIANTS = 40
MAX_SECONDS = 60.0
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
    """The exception to raise for ``exc``: its (check, output) class, with the triage of the
    case appended when this is the final example of a search; None when an earlier round of
    this search (:func:`search`) already reported that class (the example then counts as run)."""
    text, output = str(exc), output_of(exc)
    cls = mismatch_class(name, output)
    seen = _active.get()
    if seen is not None and cls in seen:
        return None
    if _should_triage():
        text = f"{text}\n{explain(check, target, case, name, output)}"
    return cls(text)


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
    without a new class (or any other exception), and everything found is raised together.
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
    if len(found) == 1:
        raise found[0]
    if found:
        raise ExceptionGroup(f"{len(found)} distinct failures (one per check and output)", found)


def _should_triage() -> bool:
    if not (_ENABLED["on"] and _active.get() is not None):
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
    (fails on another output first: another bug, which hides whether this one stays)."""
    try:
        with poison.poisoned():
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


def _run_variants(check, target, case, deadline: float, output=None):
    """[(label, rule field, value, variant case, outcome)] for every variant tried."""
    seen, tried = [], 0
    for label, rule_field, make in catalogue.area(case.AREA).variations:
        if not hasattr(case, label if label != "rank" else "batch"):
            continue
        for value, changes in make(case, target):
            if tried >= MAX_VARIANTS or time.monotonic() > deadline:
                return seen, True
            variant = _replace(case, **changes)
            if variant is None or variant == case or not _safe_within(target, variant):
                continue
            tried += 1
            seen.append((label, rule_field, value, variant, _outcome(check, target, variant, output)))
    return seen, False


# ----------------------------------------------------------------------------- describing


def _value(case, field):
    return getattr(case, field, None) if field != "rank" else getattr(case, "rank", None)


def _int_rules(field, case):
    """Candidate rules over an int field, simplest first: (text, predicate on a case)."""
    v = _value(case, field)
    rules = [(f"{field} == {v}", lambda c: _value(c, field) == v)]
    rules += [(f"{field} % {m} != 0", lambda c, m=m: _value(c, field) % m != 0) for m in MODULI]
    rules += [(f"{field} == 1", lambda c: _value(c, field) == 1),
              (f"{field} > 1", lambda c: _value(c, field) > 1)]
    other = {"L": "S", "S": "L", "T": "S"}.get(field)
    if other and hasattr(case, other):
        rules += [(f"{field} > {other}", lambda c: _value(c, field) > _value(c, other)),
                  (f"{field} < {other}", lambda c: _value(c, field) < _value(c, other)),
                  (f"{field} != {other}", lambda c: _value(c, field) != _value(c, other))]
    return rules


def _rule(field, case, fails, passes) -> str:
    """The first candidate rule true on every failing case and false on every passing one."""
    v = _value(case, field)
    if isinstance(v, bool):
        return f"only {'with' if v else 'without'} {field}"
    if isinstance(v, int) and not isinstance(v, bool):
        thresholds = sorted({_value(c, field) for c in fails + passes})
        rules = _int_rules(field, case)
        rules += [(f"{field} >= {t}", lambda c, t=t: _value(c, field) >= t) for t in thresholds]
        rules += [(f"{field} <= {t}", lambda c, t=t: _value(c, field) <= t) for t in thresholds]
        for text, holds in rules:
            if all(holds(c) for c in fails) and not any(holds(c) for c in passes):
                return f"only when {text}"
    failing = sorted({repr(_value(c, field)) for c in fails})
    if len(failing) == 1:
        return f"only with {field}={failing[0]}"
    family = _family([_value(c, field) for c in fails], [_value(c, field) for c in passes])
    if family:
        return f"only with {family} {field}s ({field} in {{{', '.join(failing)}}})"
    return f"only with {field} in {{{', '.join(failing)}}}"


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


def _observations(field, rows):
    fail_vals = [repr(v) for (lab, _, v, _, o) in rows if lab == field and o == "fails"]
    pass_vals = [repr(v) for (lab, _, v, _, o) in rows if lab == field and o == "passes"]
    other = [f"{o[len('other:'):]} fails first with {v!r}" for (lab, _, v, _, o) in rows
             if lab == field and o.startswith("other:")]
    parts = []
    if fail_vals:
        parts.append(f"also fails with {_listed(fail_vals)}")
    if pass_vals:
        parts.append(f"passes with {_listed(pass_vals)}")
    return "; ".join(parts + other)


def explain(check, target, case, name: str = "", output: str | None = None) -> str:
    """The "depends on" section for a failing ``case`` of ``check`` on ``target`` (``output``:
    the output that failed; a variant failing first on another one is another bug)."""
    start = time.monotonic()
    with record.silenced():
        rows, cut = _run_variants(check, target, case, start + MAX_SECONDS, output)
    depends, independent, untried, hidden = [], [], [], []
    labels = list(dict.fromkeys(lab for lab, *_ in rows))
    for label in labels:
        mine = [r for r in rows if r[0] == label]
        outcomes = {r[4] for r in mine} - {"skip"}
        known = outcomes & {"fails", "passes"}
        if not outcomes:
            untried.append(label)
        elif not known:
            hidden.append(label)
        elif known == {"fails"}:
            independent.append(label)
        else:
            field = mine[0][1]
            fails = [case] + [r[3] for r in mine if r[4] == "fails"]
            passes = [r[3] for r in mine if r[4] == "passes"]
            depends.append(f"    {label}: fails {_rule(field, case, fails, passes)} "
                           f"({_observations(label, mine)})")
    head = (f"  depends on (triage: {len(rows)} variants of this case, one field changed at a time, "
            f"{time.monotonic() - start:.1f} s{'; stopped at the budget' if cut else ''}):")
    lines = [head] + (depends or ["    none of the fields varied (the failure stays with every variant that ran)"])
    if independent:
        lines.append(f"  does not depend on: {', '.join(independent)} (every variant tried fails too)")
    if untried:
        lines.append(f"  not varied (refused or beyond the contract): {', '.join(untried)}")
    if hidden:
        lines.append(f"  hidden by another failure when varied: {', '.join(hidden)}")
    return "\n".join(lines)
