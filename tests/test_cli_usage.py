"""Usage errors through the real entry point (`python cli.py ...` in a subprocess): one line on stderr, exit 2.

typer >= 0.24 raises its bundled copy of click's exceptions, which `except click.ClickException` does not
catch; these run the installed typer, whichever it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAT = "benchmarks/prompts/heldout_chat.jsonl"  # a real prompt file, so the usage error is the method's


def dspark(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *argv], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=120)


def commands() -> list[list[str]]:
    """Every leaf command of the app, as its words (`["rules", "search"]`)."""
    from typer.main import get_command

    import cli

    cli._register()

    def walk(cmd, path: list[str]):
        subs = getattr(cmd, "commands", None)
        if not subs:
            yield path
            return
        for name, sub in subs.items():
            yield from walk(sub, [*path, name])

    return list(walk(get_command(cli.app), []))


def assert_one_line_usage_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("error: ")
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.parametrize("words", commands(), ids=" ".join)
def test_every_command_refuses_an_unknown_option_in_one_line(words, tmp_path):
    r = dspark(*words, "--no-such-option", env={"DSPARK_DB": f"sqlite:///{tmp_path / 'kb.sqlite'}"})
    assert_one_line_usage_error(r, "--no-such-option", " ".join(words))


CASES = [  # the findings, each once: argv, words the line must hold
    (["tune", "--trials", "0"], ["--trials"]),
    (["tune", "--workers", "0"], ["--workers"]),
    (["tune", "--trials"], ["--trials"]),
    (["profile", "--gpus", "abc"], ["--gpus"]),
    (["export"], ["--study"]),
    (["bench", "--max-new-tokens", "0"], ["--max-new-tokens"]),
    (["train-policy", "no-such-log.jsonl"], ["round log no-such-log.jsonl not found"]),
    (["train-policy", "no-such-log.jsonl", "--drop", "bias"], ["cannot drop bias", "recent_acceptance"]),
    (["train-gamma-policy", "no-such-log.jsonl"], ["round log no-such-log.jsonl not found"]),
    (["bench", "--prompts", CHAT, "--methods", "dspark_markov@x"], ["block suffix 'x' must be 1..16, 'learned'"]),
    (["bench", "--prompts", CHAT, "--methods", "ngram@4"], ["a block suffix applies to DSpark methods"]),
    (["no-such-command"], ["no-such-command"]),
    (["--no-such-option"], ["--no-such-option"]),
]


@pytest.mark.parametrize(("argv", "needles"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_usage_is_one_line_and_exit_2(argv, needles, tmp_path):
    r = dspark(*argv, env={"DSPARK_DB": f"sqlite:///{tmp_path / 'kb.sqlite'}"})
    assert_one_line_usage_error(r, *needles)


def test_version_prints_and_exits_0():
    r = dspark("--version")
    assert r.returncode == 0 and r.stdout.startswith("dspark-tune ") and not r.stderr.strip()


def test_help_still_exits_0():
    r = dspark("tune", "--help")
    assert r.returncode == 0 and "--trials" in r.stdout and not r.stderr.strip()
