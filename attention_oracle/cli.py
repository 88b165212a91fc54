"""The ``attention-oracle`` command (also ``python -m attention_oracle``).

``check`` runs the conformance modules shipped inside the installed package with the suite's
pytest plugin and a pytest configuration of its own (``conformance/suite.ini``), so nothing of
the current directory (its ``conftest.py``, ``tests``, ``fixtures`` or ``benchmarks`` packages)
is mixed into the run: the suite's own modules all live under the ``attention_oracle`` name.
``check`` and ``replay`` import ``--impl`` modules from the current directory too, as
``python -m`` would.

The subcommands' modules are imported only when their command runs: ``--help`` and
``contract`` answer without importing torch.
"""
from __future__ import annotations

import contextlib
import io
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

COMMANDS = {
    "check": ("--impl NAME [options] [pytest options]",
              "judge an implementation with the conformance suite (any pytest option passes through)"),
    "replay": ("--impl NAME --check AREA.CHECK 'CASE-JSON' [--save NAME]",
               "re-run one case a failure printed; --save adds it to your regression corpus"),
    "contract": ("", "print the contract every implementation is judged by (docs/CONTRACT.md)"),
    "dispatch": ("[--json FILE]", "which PyTorch SDPA backend each call takes, rank 3 against rank 4"),
    "calibrate": ("[--examples N] [--out DIR]",
                  "how far correct kernels and negative controls sit from the agreement rule's bound"),
    "corpus": ("pull DIR [--from redis://HOST:PORT/N]",
               "write the failures a fuzz campaign shared on its Redis server into DIR as corpus files"),
}

PROFILES = {
    "ci": "deterministic, sized for 2 CPU cores (the default when CI is set)",
    "dev": "quick (the default on a CPU)",
    "gpu": "more and larger examples, bf16 (the default with a GPU)",
    "fuzz": "thousands of examples per check, shared example database (--oracle-fuzz-db)",
}


def usage() -> str:
    width = max(len(c) for c in COMMANDS)
    lines = ["usage: attention-oracle <command> [options]", "",
             "The verification suite for attention kernels: judges an implementation of SDPA and",
             "DeepSeek Sparse Attention against a float64 oracle.", "", "commands:"]
    lines += [f"  {c.ljust(width)}  {why}" for c, (_, why) in COMMANDS.items()]
    lines += ["", "`attention-oracle <command> --help` describes each one.", "",
              "examples:",
              "  attention-oracle check --impl mypackage.attention -n 2",
              "  attention-oracle check --impl mypackage.attention --hypothesis-profile gpu --oracle-report r.json",
              "  attention-oracle replay --impl mypackage.attention --check sdpa.forward_agreement '{...}'"]
    return "\n".join(lines)


def _import_from_cwd() -> None:
    """``--impl`` modules resolve as ``python -m`` would, from the current directory too (xdist
    workers and isolated replays inherit it through PYTHONPATH)."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH")) if p)


def _pytest_args() -> list[str]:
    return [os.path.join(HERE, "conformance"), "-c", os.path.join(HERE, "conformance", "suite.ini"),
            "--rootdir", HERE, "-p", "attention_oracle.plugin", "-p", "no:cacheprovider"]


def _suite_options_help() -> str:
    """The suite's own options, as pytest's help prints them (the ``attention-oracle`` group)."""
    import pytest

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        pytest.main(_pytest_args() + ["--help"])
    text = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(text) if line.startswith("attention-oracle:")), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(text)) if text[i] and not text[i].startswith(" ")),
               len(text))
    return "\n".join(text[start:end])


def check_help() -> str:
    head = ["usage: attention-oracle check --impl NAME [options] [pytest options]", "",
            COMMANDS["check"][1] + ".", "",
            "--impl NAME: a built-in (oracle, fast, torch, torch-math, torch-flash, torch-efficient,",
            "torch-cudnn, torch-flex), a module (package.module) or an attribute (package.module:Name)",
            "offering some of the contract's functions; repeatable.", "",
            "profiles (--hypothesis-profile NAME):"]
    head += [f"  {name.ljust(5)} {why}" for name, why in PROFILES.items()]
    head += ["", "useful pytest options: -n N (workers), -k EXPR (select checks), -x (stop at the first",
             "failure), -m 'not beyond_contract' (inputs inside the contract only)", ""]
    tail = ["", "All of pytest's options: attention-oracle check --pytest-help"]
    return "\n".join(head + [_suite_options_help()] + tail)


def check(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        print(check_help())
        return 0
    import pytest

    if "--pytest-help" in argv:
        return int(pytest.main(_pytest_args() + ["--help"]))
    _import_from_cwd()
    args = _pytest_args()
    if any(a == "-n" or a.startswith("-n") or a.startswith("--numprocesses") for a in argv):
        args += ["--dist", "load"]  # not loadgroup: it hangs after a crashed worker is replaced (docs/FINDINGS.md F22)
    return int(pytest.main(args + list(argv)))


def contract(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print("usage: attention-oracle contract\n\n" + COMMANDS["contract"][1])
        return 0
    with open(os.path.join(HERE, "CONTRACT.md")) as f:
        sys.stdout.write(f.read())
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "check":
        return check(rest)
    if command == "contract":
        return contract(rest)
    if command == "replay":
        _import_from_cwd()
        from .tools import replay
        return replay.main(rest)
    if command == "dispatch":
        from .tools import dispatch
        return dispatch.main(rest)
    if command == "calibrate":
        from .tools import calibrate
        return calibrate.main(rest)
    if command == "corpus":  # --from defaults to the campaign's database
        from .run import corpus
        return corpus.main(rest, default_source=os.environ.get("ORACLE_FUZZ_DB"))
    print(f"attention-oracle: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
    return 2
