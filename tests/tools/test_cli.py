"""The ``attention-oracle`` command as a tool: help that describes, the shipped contract, replay's
corpus."""
import json
import os
import subprocess
import sys

import pytest

from attention_oracle import cli
from attention_oracle.tools import replay

ENTRY = os.path.join(os.path.dirname(cli.__file__), "fixtures", "regressions")


def _run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "attention_oracle", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def test_help_describes_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command, (_, why) in cli.COMMANDS.items():
        assert f"  {command}" in out and why in out, command


def test_check_help_puts_the_suite_first():
    text = cli.check_help()
    lines = text.splitlines()
    assert len(lines) < 120, "check --help must not be pytest's 480 lines"
    for profile in cli.PROFILES:
        assert f"  {profile} " in text
    assert any("--impl=NAME" in line for line in lines[:60])
    assert "--pytest-help" in lines[-1]


def test_contract_prints_the_shipped_contract():
    proc = _run("contract")
    assert proc.returncode == 0
    with open(os.path.join(os.path.dirname(cli.__file__), "CONTRACT.md")) as f:
        assert proc.stdout == f.read()
    assert "1. Surface and signatures" in proc.stdout


def test_replay_saves_to_the_users_corpus(tmp_path):
    name = sorted(f for f in os.listdir(ENTRY) if f.endswith(".json"))[0]
    with open(os.path.join(ENTRY, name)) as f:
        entry = json.load(f)
    proc = _run("replay", "--impl", "oracle", "--check", entry["check"], "--save", "mine",
                json.dumps(entry["case"]), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    saved = tmp_path / ".hypothesis" / "corpus" / "mine.json"
    assert saved.exists(), proc.stdout
    assert not os.path.exists(os.path.join(ENTRY, "mine.json"))


def test_replay_imports_from_the_current_directory(tmp_path):
    (tmp_path / "mykernel.py").write_text("from attention_oracle.oracle import scaled_dot_product_attention  # noqa\n")
    name = next(f for f in sorted(os.listdir(ENTRY)) if f.startswith("sdpa"))
    with open(os.path.join(ENTRY, name)) as f:
        entry = json.load(f)
    proc = _run("replay", "--impl", "mykernel", "--check", entry["check"], json.dumps(entry["case"]),
                cwd=tmp_path)
    assert "unavailable" not in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--check", "sdpa.forward_agreement", "{bad"], "the case is not JSON"),
    (["--check", "sdpa.forward", '{"area": "sdpa"}'], "--check sdpa.forward: unknown check"),
    (["--check", "dsa.forward_agreement", '{"area": "sdpa"}'], "the case's area 'sdpa' is not dsa.forward_agreement's"),
    (["--check", "sdpa.forward_agreement", '{"area": "sdpa", "casual": true}'], "unknown field(s) ['casual']"),
    (["--check", "sdpa.forward_agreement", "[1]"], "must be a JSON object"),
    (["--file", "no-such-entry.json"], "--file no-such-entry.json: not a corpus entry"),
])
def test_replay_names_bad_input(capsys, args, message):
    """A misspelt check, field or file is a usage error naming it (exit 2), not a traceback, an
    "ERROR" read as the implementation's, or a replay of another case that passes."""
    with pytest.raises(SystemExit) as info:
        replay.main(["--impl", "oracle", *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
