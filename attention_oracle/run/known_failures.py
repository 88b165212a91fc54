"""Known failures: one mechanism for the suite's findings and the user's ``--known-failures`` file.

Entries are data. The suite's own are ``known_failures.toml`` beside this module, each citing
its docs/FINDINGS.md ID; a kernel author keeps theirs in a file of their own (TOML or JSON),
read by the same loader::

    [[known]]
    implementation = "mypkg.attention"        # or a list; "*" for any; shell-style globs
    check = "sdpa.gradient_agreement"         # or a list; globs: "sdpa.*" (must name a check)
    where = {dtype = "float16", causal = true}  # optional: field = value (a list: any of;
                                              # a string value may be a glob: "finfo_min*")
    reason = "fp16 dq accumulates in fp16, tracked in mypkg#12"

    [[known]]
    implementation = "mypkg.attention"
    check = "sdpa.forward_agreement"
    where = "L % 32 != 0 and not causal"      # optional: an expression over the case's fields
    device = "cpu"                            # optional: "cpu" / "cuda"
    signature = {outputs = ["out"], rows = "fully_masked"}   # optional (default: any output)
    reason = "tail tile reads one key too many"

``signature`` (``judge/known.py``): ``outputs`` the outputs it excuses (names matched exactly:
a failure outside a signature that names its output but for case or punctuation says so),
``rows`` a row selector
of the check's area (SDPA: ``fully_masked``, ``finfo_min``; without it every element of those
outputs), ``confirm`` an ``area.check`` that must pass on the same case in a fresh process (a
mechanism finding). Only the elements inside the signature are excused: the Judge re-judges
the rest by the rule, and a failure there fails the test ("outside the known signature of
Fn"). An example whose failures all lie inside is counted in the report's "known" column; the
search goes on. ``scope = "test"`` makes the whole test a non-strict xfail instead (checks that
exist to expose one failure: F1, misaligned inputs). ``finding`` names the docs/FINDINGS.md ID
(required for the suite's entries).

Only agreement failures (``OracleMismatch``) are excused; an exception is still a failure. An
entry that matched no failure in a run that exercised its check is *stale*: listed at the end
of the run and in the JSON report, so fixed bugs do not stay exempted.
"""
from __future__ import annotations

import ast
import dataclasses
import fnmatch
import functools
import json
import os
import sys

from attention_oracle.checks import catalogue
from attention_oracle.judge import known, record

BUILTIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "known_failures.toml")
_USER: list = []  # the user's entries in this process (set once per run by the plugin)
_KEYS = {"implementation", "check", "where", "reason", "device", "finding", "scope", "signature"}
_SIGNATURE_KEYS = {"outputs", "rows", "confirm"}
SCOPES = ("example", "test")
_FUNCTIONS = {"len": len, "min": min, "max": max, "abs": abs}
_NODES = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub,
          ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Compare,
          ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is,
          ast.IsNot, ast.Name, ast.Load, ast.Constant, ast.Tuple, ast.List, ast.Subscript,
          ast.Call, ast.IfExp)
_GLOB = "*?["


class KnownFailuresError(ValueError):
    """The file is unreadable or an entry is malformed (names the file and the entry)."""


@dataclasses.dataclass(frozen=True)
class Entry:
    index: int                 # position in the file, 0-based
    implementations: tuple     # names or globs
    checks: tuple              # ``area.check`` names or globs
    reason: str
    where: dict | str | None = None
    device: str | None = None
    source: str = ""
    finding: str = ""
    scope: str = "example"
    signature: known.Signature = known.Signature()

    @property
    def label(self) -> str:
        return f"{os.path.basename(self.source)}#{self.index + 1}"

    @property
    def builtin(self) -> bool:
        return os.path.abspath(self.source) == BUILTIN

    def describe(self) -> str:
        where = "" if self.where is None else f" where {self.where}"
        return (f"{self.label}: {'|'.join(self.implementations)} {'|'.join(self.checks)}{where}, "
                f"excusing {self.signature.describe()} ({self.reason})")

    def names(self, impl: str, check: str, device: str) -> bool:
        """Whether the entry covers this implementation, check and device (not the case)."""
        return (any(fnmatch.fnmatchcase(impl, p) for p in self.implementations)
                and any(fnmatch.fnmatchcase(check, p) for p in self.checks)
                and (self.device is None or self.device == device))

    def applies(self, case) -> bool:
        if self.where is None:
            return True
        fields = case_fields(case)
        if isinstance(self.where, dict):
            return all(_field_matches(fields, k, v) for k, v in self.where.items())
        try:
            return bool(_evaluate(self.where, fields))
        except Exception as exc:  # e.g. a comparison of a string field with a number
            raise KnownFailuresError(f"--known-failures {self.source}, entry {self.index + 1}: where = "
                                     f"{self.where!r} fails on a case: {type(exc).__name__}: {exc} "
                                     f"(case {case.to_json() if hasattr(case, 'to_json') else fields})") from None

    def active(self) -> known.Active:
        return known.Active(self.label, self.finding or self.label, self.reason, self.signature)


def case_fields(case) -> dict:
    """The names a predicate may use: the case's dataclass fields plus ``rank`` and ``function``."""
    fields = dataclasses.asdict(case) if dataclasses.is_dataclass(case) else dict(vars(case))
    for extra in ("rank", "function"):
        if hasattr(case, extra):
            fields[extra] = getattr(case, extra)
    return fields


def _field_matches(fields: dict, key: str, want) -> bool:
    if key not in fields:
        return False
    have = fields[key]
    if isinstance(have, tuple):
        have = list(have)
    options = want if isinstance(want, list) and not isinstance(have, list) else [want]
    return any(have == w or (isinstance(have, str) and isinstance(w, str)
                             and fnmatch.fnmatchcase(have, w)) for w in options)


def _compile(expr: str, where: str):
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise KnownFailuresError(f"{where}: where = {expr!r} is not an expression: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            raise KnownFailuresError(f"{where}: where = {expr!r} uses {type(node).__name__}, "
                                     f"not allowed (fields, constants, comparisons, and/or/not, "
                                     f"arithmetic, len/min/max/abs)")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name)
                                                and node.func.id in _FUNCTIONS):
            raise KnownFailuresError(f"{where}: where = {expr!r} calls something other than "
                                     f"{sorted(_FUNCTIONS)}")
    return compile(tree, "<where>", "eval")


_COMPILED: dict = {}


def _evaluate(expr: str, fields: dict):
    code = _COMPILED.get(expr) or _COMPILED.setdefault(expr, _compile(expr, "where"))
    try:
        return eval(code, {"__builtins__": {}, **_FUNCTIONS}, dict(fields))
    except NameError:  # a field this case does not have (another area's case)
        return False


# ----------------------------------------------------------------------------- loading


def _read(path: str):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise KnownFailuresError(f"--known-failures {path}: {exc.strerror}") from None
    if path.endswith(".json"):
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise KnownFailuresError(f"--known-failures {path}: invalid JSON: {exc}") from None
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        return tomllib.loads(raw.decode())
    except tomllib.TOMLDecodeError as exc:
        raise KnownFailuresError(f"--known-failures {path}: invalid TOML: {exc}") from None


def _names(value, key: str, where: str) -> tuple:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise KnownFailuresError(f"{where}: {key!r} must be a non-empty string or list of strings")
    return tuple(value)


def _all_check_names() -> list[str]:
    return [c.full_name for c in catalogue.all_checks()]


def _existing_checks(checks: tuple, where: str) -> None:
    """Every name is a check of the catalogue, every glob matches one."""
    names = _all_check_names()
    for c in checks:
        if not any(fnmatch.fnmatchcase(n, c) for n in names):
            raise KnownFailuresError(f"{where}: check {c!r} names no existing check; checks: "
                                     f"{', '.join(names)}")


def _known_fields(checks: tuple) -> set | None:
    """Fields of the case classes the checks name (None when a glob spans areas)."""
    areas = {c.split(".", 1)[0] for c in checks}
    if any(any(ch in a for ch in _GLOB) for a in areas) or not areas <= set(catalogue.areas()):
        return None
    names = set()
    for area in areas:
        names |= {f.name for f in dataclasses.fields(catalogue.case_class(area))}
    return names | {"rank", "function"}


def _predicate(raw: dict, checks: tuple, where: str):
    predicate = raw.get("where")
    fields = _known_fields(checks)
    if isinstance(predicate, dict):
        if fields is not None and set(predicate) - fields:
            raise KnownFailuresError(f"{where}: where names unknown field(s) "
                                     f"{sorted(set(predicate) - fields)}; the case has {sorted(fields)}")
    elif isinstance(predicate, str):
        code = _compile(predicate, where)
        if fields is not None and set(code.co_names) - fields - set(_FUNCTIONS):
            raise KnownFailuresError(f"{where}: where names unknown field(s) "
                                     f"{sorted(set(code.co_names) - fields - set(_FUNCTIONS))}; "
                                     f"the case has {sorted(fields)}")
    elif predicate is not None:
        raise KnownFailuresError(f"{where}: 'where' must be a table of field = value or an expression string")
    return predicate


def _signature(raw, checks: tuple, where: str) -> known.Signature:
    if raw is None:
        return known.Signature()
    if not isinstance(raw, dict) or set(raw) - _SIGNATURE_KEYS:
        raise KnownFailuresError(f"{where}: 'signature' must be a table with keys among "
                                 f"{sorted(_SIGNATURE_KEYS)}")
    outputs = _names(raw.get("outputs", [known.ANY]), "signature.outputs", where)
    rows = raw.get("rows")
    if rows is not None:
        areas = {c.split(".", 1)[0] for c in checks}
        for area in areas:
            if rows not in known.selectors(area):
                raise KnownFailuresError(f"{where}: signature.rows {rows!r} is no row selector of "
                                         f"{area!r} (it has {list(known.selectors(area))})")
    confirm = raw.get("confirm")
    if confirm is not None:
        if not isinstance(confirm, str) or confirm not in _all_check_names():
            raise KnownFailuresError(f"{where}: signature.confirm {confirm!r} names no existing check")
    return known.Signature(outputs, rows, confirm)


def _entry(raw, index: int, path: str, builtin: bool) -> Entry:
    where = f"--known-failures {path}, entry {index + 1}"
    if not isinstance(raw, dict):
        raise KnownFailuresError(f"{where}: an entry is a table/object, got {type(raw).__name__}")
    unknown = set(raw) - _KEYS
    if unknown:
        raise KnownFailuresError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    for key in ("implementation", "check", "reason") + (("finding",) if builtin else ()):
        if key not in raw:
            raise KnownFailuresError(f"{where}: missing {key!r}")
    if not isinstance(raw["reason"], str) or not raw["reason"].strip():
        raise KnownFailuresError(f"{where}: 'reason' must be a non-empty string")
    checks = _names(raw["check"], "check", where)
    predicate = _predicate(raw, checks, where)
    device = raw.get("device")
    if device not in (None, "cpu", "cuda"):
        raise KnownFailuresError(f"{where}: 'device' must be \"cpu\" or \"cuda\"")
    scope = raw.get("scope", "example")
    if scope not in SCOPES:
        raise KnownFailuresError(f"{where}: 'scope' must be one of {list(SCOPES)}")
    finding = str(raw.get("finding", ""))
    _existing_checks(checks, where)
    signature = _signature(raw.get("signature"), checks, where)
    reason = raw["reason"].strip()
    if finding and builtin:
        reason = f"{reason}: docs/FINDINGS.md {finding}"
    return Entry(index, _names(raw["implementation"], "implementation", where), checks, reason,
                 predicate, device, path, finding, scope, signature)


def load(path: str, builtin: bool = False) -> list[Entry]:
    """Parse and validate the file; raises KnownFailuresError naming the file and the entry.
    ``builtin``: the suite's own file (every entry names its finding)."""
    data = _read(path)
    items = data.get("known", None) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise KnownFailuresError(f"--known-failures {path}: expected a list of entries "
                                 f"([[known]] tables in TOML, {{\"known\": [...]}} or [...] in JSON)")
    return [_entry(raw, i, path, builtin) for i, raw in enumerate(items)]


@functools.lru_cache(maxsize=1)
def builtin() -> tuple[Entry, ...]:
    """The suite's own entries (``known_failures.toml``)."""
    return tuple(load(BUILTIN, builtin=True))


def install(entries: list[Entry]) -> None:
    """The user's entries for this process (``--known-failures``)."""
    _USER[:] = entries


def user_entries() -> list[Entry]:
    return list(_USER)


def entries() -> list[Entry]:
    """Every entry: the suite's, then the user's."""
    return list(builtin()) + list(_USER)


# ----------------------------------------------------------------------------- matching


def _device_type(device) -> str:
    return getattr(device, "type", str(device))


def reason(impl: str, check: str, device) -> str:
    """The reason a whole test is a known failure (a ``scope = "test"`` entry; '' if none)."""
    dev = _device_type(device)
    for e in entries():
        if e.scope == "test" and e.names(impl, check, dev):
            return e.reason
    return ""


def matching(impl: str, check: str, device, case) -> list[Entry]:
    """The example-scope entries covering this implementation, check, device and case."""
    dev = _device_type(device)
    return [e for e in entries()
            if e.scope == "example" and e.names(impl, check, dev) and e.applies(case)]


def activated(impl: str, check: str, device, case):
    """The context in which a check call runs under the entries matching it
    (:func:`judge.known.activate`); it yields the call's :class:`judge.known.Call`."""
    return known.activate([e.active() for e in matching(impl, check, device, case)])


def case_reason(impl: str, check: str, device, case) -> str:
    """The reason of the first example-scope entry covering this case ('' if none)."""
    found = matching(impl, check, device, case)
    return f"{found[0].reason} ({found[0].label})" if found else ""


def record_match(entry_labels) -> None:
    """The entries that excused a failing example (for the stale-entry report)."""
    for label in dict.fromkeys(entry_labels):
        record.record_known_entry(label)


def stale(entries_: list[Entry], matched, ran: set, device: str) -> tuple[list[Entry], list[Entry]]:
    """(stale, not exercised): entries that matched no failure although a test of their
    implementation and check ran on ``device`` (``ran``: {(impl, check)}), and entries none of
    whose tests ran."""
    stale_, idle = [], []
    for e in entries_:
        if e.label in matched or e.scope == "test":
            continue
        exercised = any(e.names(i, c, device) for (i, c) in ran)
        (stale_ if exercised else idle).append(e)
    return stale_, idle


def summary(entries_: list[Entry], matched: dict, ran: set, device: str) -> dict:
    """The JSON form: every entry with the failures it absorbed, the stale ones, the idle ones
    (the suite's idle entries are left out: most are for another device)."""
    stale_, idle = stale(entries_, matched, ran, device)
    shown = [e for e in entries_ if not e.builtin or e.label in matched or e in stale_]
    return {"file": next((e.source for e in entries_ if not e.builtin), ""),
            "entries": [{"label": e.label, "finding": e.finding, "implementation": list(e.implementations),
                         "check": list(e.checks), "where": e.where, "reason": e.reason,
                         "signature": e.signature.describe(),
                         "matched": matched.get(e.label, 0)} for e in shown],
            "stale": [e.label for e in stale_],
            "not_exercised": [e.label for e in idle if not e.builtin]}


def render(entries_: list[Entry], matched: dict, ran: set, device: str) -> list[str]:
    """Terminal lines: one per entry that absorbed failures, one per stale entry."""
    stale_, idle = stale(entries_, matched, ran, device)
    users = [e for e in entries_ if not e.builtin]
    lines = [f"known failures: {len(entries_) - len(users)} of the suite's, {len(users)} from "
             f"your file"]
    for e in entries_:
        if e.label in matched:
            lines.append(f"  matched {matched[e.label]} failing example(s): {e.describe()}")
    for e in stale_:
        lines.append(f"  STALE (no failure matched it; remove it if the bug is fixed): {e.describe()}"
                     if not e.builtin else f"  no failure matched the suite's {e.label} ({e.finding})")
    idle = [e for e in idle if not e.builtin]
    if idle:
        lines.append(f"  not exercised in this run: {', '.join(e.label for e in idle)}")
    return lines
