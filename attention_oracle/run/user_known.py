"""User-owned known failures: ``--known-failures FILE`` (TOML or JSON).

A kernel author keeps the failures they already know about in a file of their own, instead of
editing the suite's ``known_failures.py``. Each entry names an implementation, a check, an
optional predicate on the case's fields, and a reason::

    [[known]]
    implementation = "mypkg.attention"        # or a list; "*" for any
    check = "sdpa.gradient_agreement"         # or a list; shell-style globs: "sdpa.*"
    where = {dtype = "float16", causal = true}  # optional: field = value (a list: any of)
    reason = "fp16 dq accumulates in fp16, tracked in mypkg#12"

    [[known]]
    implementation = "mypkg.attention"
    check = "sdpa.forward_agreement"
    where = "L % 32 != 0 and not causal"      # optional: an expression over the case's fields
    reason = "tail tile reads one key too many"

JSON: ``{"known": [{...}, ...]}`` or a bare list of the same objects. An optional ``device``
(``"cpu"`` / ``"cuda"``) narrows an entry further.

An example that fails its check inside an entry is counted in the report's "known" column
(like the suite's own ``KNOWN_CASES``) and every other example of the test is still judged by
the rule: an entry exempts a class of inputs, never a check. Only agreement failures
(``OracleMismatch``) are exempted; an exception is still a failure. An entry that matched no
failure in a run that exercised its check is *stale*: it is listed at the end of the run and
in the JSON report, so fixed bugs do not stay exempted.
"""
from __future__ import annotations

import ast
import dataclasses
import fnmatch
import json
import os
import sys

from attention_oracle.checks import catalogue
from attention_oracle.judge import record

_ENTRIES: list = []  # the loaded entries of this process (set once per run by the plugin)
_KEYS = {"implementation", "check", "where", "reason", "device"}
_FUNCTIONS = {"len": len, "min": min, "max": max, "abs": abs}
_NODES = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub,
          ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Compare,
          ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is,
          ast.IsNot, ast.Name, ast.Load, ast.Constant, ast.Tuple, ast.List, ast.Subscript,
          ast.Call, ast.IfExp)


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

    @property
    def label(self) -> str:
        return f"{os.path.basename(self.source)}#{self.index + 1}"

    def describe(self) -> str:
        where = "" if self.where is None else f" where {self.where}"
        return (f"{self.label}: {'|'.join(self.implementations)} {'|'.join(self.checks)}{where} "
                f"({self.reason})")

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
        return bool(_evaluate(self.where, fields))


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
    return any(have == w for w in options)


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


def _known_fields(checks: tuple) -> set | None:
    """Fields of the case classes the checks name (None when a glob spans areas)."""
    areas = {c.split(".", 1)[0] for c in checks}
    if any(any(ch in a for ch in "*?[") for a in areas) or not areas <= set(catalogue.areas()):
        return None
    names = set()
    for area in areas:
        names |= {f.name for f in dataclasses.fields(catalogue.case_class(area))}
    return names | {"rank", "function"}


def _entry(raw, index: int, path: str) -> Entry:
    where = f"--known-failures {path}, entry {index + 1}"
    if not isinstance(raw, dict):
        raise KnownFailuresError(f"{where}: an entry is a table/object, got {type(raw).__name__}")
    unknown = set(raw) - _KEYS
    if unknown:
        raise KnownFailuresError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    for key in ("implementation", "check", "reason"):
        if key not in raw:
            raise KnownFailuresError(f"{where}: missing {key!r}")
    if not isinstance(raw["reason"], str) or not raw["reason"].strip():
        raise KnownFailuresError(f"{where}: 'reason' must be a non-empty string")
    checks = _names(raw["check"], "check", where)
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
    device = raw.get("device")
    if device not in (None, "cpu", "cuda"):
        raise KnownFailuresError(f"{where}: 'device' must be \"cpu\" or \"cuda\"")
    return Entry(index, _names(raw["implementation"], "implementation", where), checks,
                 raw["reason"].strip(), predicate, device, path)


def load(path: str) -> list[Entry]:
    """Parse and validate the file; raises KnownFailuresError naming the file and the entry."""
    data = _read(path)
    items = data.get("known", None) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise KnownFailuresError(f"--known-failures {path}: expected a list of entries "
                                 f"([[known]] tables in TOML, {{\"known\": [...]}} or [...] in JSON)")
    return [_entry(raw, i, path) for i, raw in enumerate(items)]


def install(entries: list[Entry]) -> None:
    _ENTRIES[:] = entries


def entries() -> list[Entry]:
    return list(_ENTRIES)


# ----------------------------------------------------------------------------- matching


def case_reason(impl: str, check: str, device: str, case) -> str:
    """The reason of the first entry covering this failure ('' if none); the match is recorded
    in the current test's sink (for the stale-entry report)."""
    for entry in _ENTRIES:
        if entry.names(impl, check, device) and entry.applies(case):
            record.record_known_entry(entry.label)
            return f"{entry.reason} ({entry.label})"
    return ""


def stale(entries: list[Entry], matched, ran: set, device: str) -> tuple[list[Entry], list[Entry]]:
    """(stale, not exercised): entries that matched no failure although a test of their
    implementation and check ran on ``device`` (``ran``: {(impl, check)}), and entries none of
    whose tests ran."""
    stale_, idle = [], []
    for e in entries:
        if e.label in matched:
            continue
        exercised = any(e.names(i, c, device) for (i, c) in ran)
        (stale_ if exercised else idle).append(e)
    return stale_, idle


def summary(entries: list[Entry], matched: dict, ran: set, device: str) -> dict:
    """The JSON form: every entry with the failures it absorbed, the stale ones, the idle ones."""
    stale_, idle = stale(entries, matched, ran, device)
    return {"file": entries[0].source if entries else "",
            "entries": [{"label": e.label, "implementation": list(e.implementations),
                         "check": list(e.checks), "where": e.where, "reason": e.reason,
                         "matched": matched.get(e.label, 0)} for e in entries],
            "stale": [e.label for e in stale_], "not_exercised": [e.label for e in idle]}


def render(entries: list[Entry], matched: dict, ran: set, device: str) -> list[str]:
    """Terminal lines: one per entry that absorbed failures, one per stale entry."""
    stale_, idle = stale(entries, matched, ran, device)
    lines = [f"known failures file: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"]
    for e in entries:
        if e.label in matched:
            lines.append(f"  matched {matched[e.label]} failing example(s): {e.describe()}")
    for e in stale_:
        lines.append(f"  STALE (no failure matched it; remove it if the bug is fixed): {e.describe()}")
    if idle:
        lines.append(f"  not exercised in this run: {', '.join(e.label for e in idle)}")
    return lines
