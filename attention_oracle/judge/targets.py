"""Implementations under test ("targets"): built-in names and any importable namespace.

A target is a namespace offering any subset of the docs/CONTRACT.md "1. Surface and signatures" functions. It is named
either as a built-in (``oracle``, ``fast``, ``torch``, ``torch-math``, ``torch-flash``,
``torch-efficient``, ``torch-cudnn``, ``torch-flex``) or as ``package.module`` /
``package.module:attribute`` (the attribute may be an object or a zero-argument factory).
Calls go through :meth:`Target.call`, which records them for the report and turns a refusal
(``NotImplementedError``) into :class:`Refused`. At load, every offered function's signature is
checked against :mod:`attention_oracle.contract`; a function that breaks it is kept in
``Target.broken`` and every check of it fails with the reason (:class:`ContractViolation`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import torch

from attention_oracle import contract, oracle
from attention_oracle.judge import record
from attention_oracle.judge.adapters.torch_flex import TorchFlex
from attention_oracle.judge.adapters.torch_sdpa import BACKENDS, TorchSDPA, backend_available, limits
from attention_oracle.judge.capabilities import Capabilities, declared

ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BUILTINS = ("oracle", "fast", "torch", "torch-math", "torch-flash", "torch-efficient",
            "torch-cudnn", "torch-flex")


class Refused(Exception):
    """The implementation raised NotImplementedError: reported as unsupported, not failed."""


class ContractViolation(TypeError):
    """An offered function's signature breaks the contract: each of its checks fails with this."""


@dataclass
class Target:
    name: str
    namespace: object = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtypes: tuple = ALL_DTYPES
    unavailable: str = ""  # non-empty: why this target cannot run on this machine
    broken: dict = field(default_factory=dict)  # function -> why its signature breaks the contract
    capabilities: Capabilities | None = None  # None: the namespace's declaration (or everything)

    def __post_init__(self):
        if self.namespace is not None and not self.broken:
            self.broken = contract.signature_problems(self.namespace)
        caps = self.capabilities or declared(self.namespace)
        if tuple(self.dtypes) != ALL_DTYPES:  # an explicit dtypes argument narrows the declaration
            caps = caps.narrowed(dtypes=tuple(d for d in caps.dtypes if d in self.dtypes))
        self.capabilities = caps
        self.dtypes = caps.dtypes

    def function(self, fname: str):
        return getattr(self.namespace, fname, None) if self.namespace is not None else None

    def offers(self, fname: str) -> bool:
        return callable(self.function(fname))

    def call(self, fname: str, *args, **kwargs):
        fn = self.function(fname)
        if fn is None:
            raise AttributeError(f"{self.name} does not offer {fname}")
        if fname in self.broken:
            raise ContractViolation(f"{self.name}.{self.broken[fname]}")
        try:
            result = fn(*args, **kwargs)
        except NotImplementedError as exc:
            record.record_call(fname, refused=True, reason=str(exc)[:200])
            raise Refused(f"{self.name}.{fname} refused: {exc}") from exc
        record.record_call(fname, refused=False)
        return result


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _interpreted() -> bool:
    import os
    return os.environ.get("TRITON_INTERPRET") == "1"


def load(name: str, device: torch.device | None = None) -> Target:
    """Resolve a target name; never raises for a missing library (the Target says why)."""
    device = device or default_device()
    if name == "oracle":
        return Target(name, oracle, device, capabilities=Capabilities(
            default_scale=True, index_dtypes=(torch.int32, torch.int64), deterministic=True))
    if name == "fast":
        try:
            # imported on demand: after the plugin has chosen the interpreter, and a broken
            # build of the kernels must not stop the other targets' checks
            from attention_oracle import fast
        except Exception as exc:  # a broken build is a failure to report, not a crash of the run
            return Target(name, None, device, unavailable=f"import fast failed: {exc!r}")
        # Triton's interpreter computes bf16 wrongly (FACTS.md): keep bf16 away from it.
        dtypes = (torch.float32, torch.float16) if _interpreted() else ALL_DTYPES
        return Target(name, fast, device, capabilities=Capabilities(
            dtypes=dtypes, default_scale=True,
            functions={"scaled_dot_product_attention": {"max_head_dim": 256}},
            index_dtypes=(torch.int32, torch.int64), deterministic=fast.sdpa.deterministic(),
            deterministic_on_request=fast.sdpa.deterministic_on_request(),
            size="interpreted" if _interpreted() else "native"))
    if name == "torch":
        return Target(name, TorchSDPA(None), device, capabilities=_torch_capabilities(None, device))
    if name.startswith("torch-") and name != "torch-flex":
        backend = name[len("torch-"):]
        if backend not in BACKENDS:
            return Target(name, None, device, unavailable=f"unknown torch backend {backend!r}")
        ok, why = backend_available(backend, device)
        return Target(name, TorchSDPA(backend), device, unavailable="" if ok else why,
                      capabilities=_torch_capabilities(backend, device))
    if name == "torch-flex":
        try:
            from torch.nn.attention import flex_attention  # noqa: F401
        except ImportError as exc:
            return Target(name, None, device, unavailable=f"flex_attention missing: {exc}")
        # flex_attention's backward needs CUDA (compiled): forward only on the CPU
        return Target(name, TorchFlex(), device, capabilities=Capabilities(
            ranks=(4,), gradients=device.type == "cuda"))
    return _load_namespace(name, device)


def _torch_capabilities(backend: str | None, device: torch.device) -> Capabilities:
    """PyTorch's SDPA through ``backend`` (None: the default dispatch): the limits of the backend
    it forces on this device (``adapters.torch_sdpa.LIMITS``: dtypes, head dims, masks, causal,
    ranks, GQA, layouts), so that the draws land inside them; bitwise deterministic on the CPU;
    on CUDA the fused backwards (FlashAttention-2, EFFICIENT, cuDNN) accumulate with atomics,
    so determinism is not claimed."""
    return Capabilities.from_declaration(limits(backend, device.type),
                                         Capabilities(deterministic=device.type == "cpu"))


def _load_namespace(name: str, device: torch.device) -> Target:
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return Target(name, None, device, unavailable=f"cannot import {module_name!r}: {exc}")
    namespace = module
    if attr:
        try:
            namespace = getattr(module, attr)
        except AttributeError:
            return Target(name, None, device, unavailable=f"{module_name} has no attribute {attr!r}")
        if isinstance(namespace, type) or (callable(namespace) and not _offers_any(namespace)):
            namespace = namespace()
    return Target(name, namespace, device)


CONTRACT_FUNCTIONS = contract.FUNCTIONS


def _offers_any(ns) -> bool:
    return any(callable(getattr(ns, f, None)) for f in CONTRACT_FUNCTIONS)


def parse_names(cli: list[str] | None, env: str | None) -> list[str]:
    """Names from --impl (repeatable, comma-separated allowed) or ORACLE_IMPL; else all built-ins."""
    names: list[str] = []
    for chunk in (cli or []) + ([env] if env else []):
        names += [n.strip() for n in chunk.split(",") if n.strip()]
    return list(dict.fromkeys(names)) or list(BUILTINS)
