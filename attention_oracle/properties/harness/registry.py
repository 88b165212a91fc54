"""The registry of checks: each check declares its area, the cases it runs on and what it needs.

A check is declared next to its body::

    @declare("sdpa", cases=dict(rank=3))
    def rank3_equals_rank4(judge, case): ...

and the name ``declare`` returns is a :class:`Check`: called as ``check(target, case)`` it builds
the :class:`~attention_oracle.properties.harness.judge.Judge` of that (check, target, case) and
runs the body with it. Everything else reads the declaration: the conformance tests are
generated from it (:func:`conformance_tests`: ``test_<check>(impl[, variant])``), replay and the
regression corpus look checks up by name (:func:`check`), and the negative controls, the
calibration tools and ``benchmarks/rule_calibration.py`` get a check's cases from
:func:`strategy`.

An area (``sdpa``, ``dsa``, ``index``) is a cases module and its checks modules. The cases module
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
import importlib
import types
from collections.abc import Callable, Mapping

_AREAS = {
    "sdpa": ("attention_oracle.properties.sdpa.cases:SdpaCase", "attention_oracle.properties.sdpa.checks"),
    "dsa": ("attention_oracle.properties.dsa.cases:DsaCase", "attention_oracle.properties.dsa.checks"),
    "index": ("attention_oracle.properties.index.cases:IndexCase", "attention_oracle.properties.index.checks"),
}
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
        from attention_oracle.properties.harness.judge import Judge
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


def register(area: str, case_class: str, checks_module: str) -> None:
    """Add an area: its Case class (``module:Class``, in the area's cases module) and the module
    whose import declares its checks."""
    _AREAS[area] = (case_class, checks_module)


def _import(path: str):
    module, _, attr = path.partition(":")
    mod = importlib.import_module(module)
    return getattr(mod, attr) if attr else mod


def areas() -> list[str]:
    return sorted(_AREAS)


def _known(area: str) -> None:
    if area not in _AREAS:
        raise ValueError(f"unknown area {area!r}; known: {areas()}")


def case_class(area: str):
    _known(area)
    return _import(_AREAS[area][0])


def _cases_module(area: str):
    _known(area)
    return importlib.import_module(_AREAS[area][0].partition(":")[0])


def checks(area: str) -> Mapping[str, Check]:
    """Every check of ``area`` ({name: Check}, in declaration order)."""
    _known(area)
    _import(_AREAS[area][1])
    return declared(area)


def check(name: str) -> Check:
    """``area.check`` -> the check."""
    area, _, fn = name.partition(".")
    table = checks(area)
    if fn not in table:
        raise ValueError(f"unknown check {name!r}; {area} has {sorted(table)}")
    return table[fn]


def variants(check_name: str) -> tuple[str, ...]:
    """The variants a check runs in (``area.check``): DSA checks run on NoPE and RoPE cases
    (``("nope", "rope")``), the others in one (``("",)``). Test ids carry the variant
    (``test_forward_agreement[fast-nope]``)."""
    return check(check_name).variants


def strategy(check_name: str, target_or_caps, variant: str = ""):
    """The Hypothesis strategy of the cases ``check_name`` (``area.check``) runs on, drawn within
    ``target_or_caps`` (a Target, a Capabilities, or a tuple of dtypes); ``variant`` one of
    :func:`variants` (``""`` is the area's default: RoPE for DSA).

    The one lookup the conformance tests, the negative controls, ``tools/calibrate.py`` and
    ``benchmarks/rule_calibration.py`` share."""
    return check(check_name).strategy(target_or_caps, variant)


# ----------------------------------------------------------------------------- conformance tests


def conformance_tests(area: str) -> dict[str, Callable]:
    """``{test_<check>: test}`` for every check of ``area``: a conformance module puts them in
    its namespace (``globals().update(...)``) and pytest collects them there. Each takes the
    ``impl`` fixture (and ``variant``, parametrized, where the area has several), carries
    ``oracle_check`` (the name the report rows and known-failure files use) and the check's
    markers."""
    return {f"test_{c.name}": _test_of(c) for c in checks(area).values()}


def _test_of(spec: Check) -> Callable:
    import pytest

    from attention_oracle.properties.harness.runner import run_declared

    if spec.variants == ("",):
        def test(impl):
            run_declared(spec, impl)
    else:
        def test(impl, variant):
            run_declared(spec, impl, variant)
        test = pytest.mark.parametrize("variant", spec.variants)(test)
    test.__name__ = test.__qualname__ = f"test_{spec.name}"
    summary = (spec.__doc__ or "").strip().splitlines()
    test.__doc__ = f"{spec.full_name}: {summary[0]}" if summary else spec.full_name
    test.oracle_check = spec.full_name
    for marker in spec.markers + ((BEYOND_MARKER,) if spec.beyond else ()):
        test = getattr(pytest.mark, marker)(test)
    return test
