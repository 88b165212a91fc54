"""The registry of checks: each check declares its area, the cases it runs on and what it needs.

A check is declared next to its body::

    @declare("sdpa", cases=dict(rank=3))
    def rank3_equals_rank4(judge, case): ...

and the name ``declare`` returns is a :class:`Check`: called as ``check(target, case)`` it builds
the :class:`~attention_oracle.judge.judge.Judge` of that (check, target, case) and
runs the body with it. Everything else reads the declaration: the conformance tests are
generated from it (``attention_oracle.conformance.declared_tests``: ``test_<check>(impl[, variant])``),
and replay, the regression corpus, the negative controls and the calibration tools look checks
up by name in the catalogue (``attention_oracle.checks.catalogue``: ``check``, ``strategy``).

An area (``sdpa``, ``dsa``, ``index``) is a package under ``checks/``: a cases module, its checks
modules and its triage variations; its ``__init__`` imports them and hands the floors above an
:class:`Area` (:func:`register`), so that nothing below or above names an area. The cases module
offers ``VARIANTS`` ({variant: strategy parameters}: DSA runs each check on NoPE and RoPE
cases; ``DEFAULT_VARIANT``, where given, is the one ``""`` names, else the first), ``strategy(target_or_caps, params)``, ``function_for(params)`` (the
public function the cases call), ``REQUIREMENTS`` ({requirement: caps -> why it is unmet, ''
if it is met}) and ``unsupported_for(check, target_or_caps, params)`` (why the target's declared
capabilities exclude the check, its declared ``requires`` included; '' if they do not). A check's strategy
parameters are its variant's, updated with its own ``cases``.
"""
from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Mapping

from attention_oracle.judge.judge import Judge

_DECLARED: dict[str, dict[str, Check]] = {}
BEYOND_MARKER = "beyond_contract"


@dataclasses.dataclass(eq=False)
class Check:
    """One declared check. ``body(judge, case)`` raises OracleMismatch on a failure (through the
    judge) and ``Refused`` when the implementation refuses the case.

    ``cases``: parameters of the area's case strategy (``rank=3``, ``empty_rows=True``,
    ``dout_layouts=(...)``, ``varlen=True``); ``requires``: what it needs the target to declare
    (names in the area's ``REQUIREMENTS``: ``"misaligned"``, ``"masks"``, ...; skipped, with the
    reason, where not declared); ``needs``: public functions it calls beyond the one its cases
    call (skipped, with that reason, where not offered); ``markers``: pytest
    markers of its test (``full_size``, ...); ``beyond``: it checks inputs beyond the contract
    (a clear error naming the argument also passes; marked ``beyond_contract``);
    ``isolate_on_cuda``: on CUDA each example runs in a fresh process (a kernel faulting on the
    device must not poison the run's context)."""

    area: str
    name: str
    body: Callable
    cases: Mapping = dataclasses.field(default_factory=dict)
    requires: tuple = ()
    needs: tuple = ()
    markers: tuple = ()
    beyond: bool = False
    isolate_on_cuda: bool = False

    def __post_init__(self):
        functools.update_wrapper(self, self.body)  # __name__, __module__, __qualname__, __doc__

    @property
    def full_name(self) -> str:
        """The name it reports under: ``area.check`` (``sdpa.strided_dout``)."""
        return f"{self.area}.{self.name}"

    @property
    def ISOLATE_ON_CUDA(self) -> bool:  # noqa: N802 (the attribute the runner reads on any check)
        return self.isolate_on_cuda

    def __call__(self, target, case) -> None:
        self.body(Judge(self.full_name, target, case), case)

    def __repr__(self) -> str:
        return f"<check {self.full_name}>"

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(_cases_module(self.area).VARIANTS)

    def params(self, variant: str = "") -> dict:
        """The strategy parameters of ``variant`` ('' = the area's default variant)."""
        table = _cases_module(self.area).VARIANTS
        if variant not in table:
            if variant:
                raise ValueError(f"{self.full_name} has variants {sorted(table)}, not {variant!r}")
            variant = getattr(_cases_module(self.area), "DEFAULT_VARIANT", next(iter(table)))
        return {**table[variant], **self.cases}

    def strategy(self, target_or_caps, variant: str = ""):
        """The cases it runs on, drawn within ``target_or_caps`` (a Target, a Capabilities, or a
        tuple of dtypes)."""
        return _cases_module(self.area).strategy(target_or_caps, self.params(variant))

    def function(self, variant: str = "") -> str:
        """The public function its cases call."""
        return _cases_module(self.area).function_for(self.params(variant))

    def unsupported(self, target_or_caps, variant: str = "") -> str:
        """Why the target's declared capabilities exclude it ('' if they do not)."""
        return _cases_module(self.area).unsupported_for(self, target_or_caps, self.params(variant))


def declare(area: str, *, cases: Mapping | None = None, requires: tuple = (), needs: tuple = (),
            markers: tuple = (), beyond: bool = False, isolate_on_cuda: bool = False):
    """Decorator: register ``body(judge, case)`` as the check ``area.<body name>``."""
    def wrap(body: Callable) -> Check:
        spec = Check(area, body.__name__, body, dict(cases or {}), tuple(requires), tuple(needs),
                     tuple(markers), beyond, isolate_on_cuda)
        _DECLARED.setdefault(area, {})[spec.name] = spec
        return spec
    return wrap


def declared(area: str) -> Mapping[str, Check]:
    """The checks declared in ``area`` ({name: Check}, in declaration order), without importing
    anything: a read-only live view (a checks module's ``CHECKS`` is one, and sees the checks
    its companion modules declare after it)."""
    return types.MappingProxyType(_DECLARED.setdefault(area, {}))


@dataclasses.dataclass
class Area:
    """An area as it hands itself to the floors above: its name, its cases module (``VARIANTS``,
    ``strategy``, ``function_for``, ``unsupported_for``, ``REQUIREMENTS``) and Case class (the
    cases module registers them when it is imported), and its triage variations (its ``triage``
    module sets them: ``variations``, [(label, rule field, maker(case, target) -> [(value,
    changes)])], and ``within(caps, case)``, whether a varied case stays inside a declaration),
    and its covering grid (its ``grid`` module sets ``grid``: see :class:`Grid`)."""

    name: str
    cases: types.ModuleType
    case_class: type
    variations: tuple = ()
    within: Callable | None = None
    grid: Callable | None = None  # (check, target_or_caps, params) -> Grid (its grid module sets it)


@dataclasses.dataclass(frozen=True)
class Grid:
    """A check's covering grid, as its area's grid module describes it: ``factors`` ({dimension:
    values}, in order), ``constraints`` ([(dimensions, predicate(row) -> bool)]: a row of the
    array must satisfy each predicate once it holds those dimensions) and ``build(row)`` (the
    Case of a full row)."""

    factors: Mapping
    constraints: tuple
    build: Callable


_AREAS: dict[str, Area] = {}


def register(area: Area) -> Area:
    """Add an area (its cases module does, when it is imported: every Check of the area exists
    only after that)."""
    _AREAS[area.name] = area
    return area


def registered(name: str) -> Area:
    if name not in _AREAS:
        raise ValueError(f"unknown area {name!r}; known: {sorted(_AREAS)}")
    return _AREAS[name]


def _cases_module(area: str):
    return registered(area).cases
