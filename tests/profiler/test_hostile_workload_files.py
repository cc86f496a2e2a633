"""Hostile workload / prompt JSONL files through every command that reads one: `profile --workload` (the
profiler's reader) and `generate` / `bench --prompts` (the engine's). Each is one line naming the file (and line),
exit 2, no traceback. A 50 MB prompt line used to reach the tokenizer, which needs ~150 bytes of memory per
character and aborts the process (SIGABRT) when an allocation fails: that case runs in a subprocess under a 4 GB
address-space limit, where the old behaviour dies by signal."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hostile_jsonl import main_within, write_hostile_jsonl, write_huge_line

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {  # the command line reading FILE
    "profile": ["profile", "--gpu", "h100", "--workload"],
    "generate": ["generate", "--prompts"],
    "bench": ["bench", "--prompts"],
}


@pytest.fixture(scope="module")
def huge_line(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_huge_line(tmp_path_factory.mktemp("huge"))




@pytest.mark.parametrize("command", list(COMMANDS))
def test_hostile_jsonl_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, huge_line: Path,
                                   command: str) -> None:
    for name, (path, says) in write_hostile_jsonl(tmp_path, huge_line).items():
        t = time.monotonic()
        code = main_within(20, [*COMMANDS[command], str(path)])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err, (name, err[-2000:])
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (name, err[-2000:])
        assert str(path) in lines[0] and says in lines[0], (name, lines[0])
        assert time.monotonic() - t < 5, (name, time.monotonic() - t)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize("argv", [["profile", "--model", "tiny", "--gpu", "h100", "--workload"],
                                  ["generate", "--prompts"]])
def test_huge_prompt_line_is_one_line_not_sigabrt(huge_line: Path, argv: list[str]) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "cli.py"), *argv, str(huge_line)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, preexec_fn=_limit_memory)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])  # -6 (SIGABRT) before the line cap
    assert r.stderr.strip() == f"error: {huge_line}:1: line longer than 4 MiB, the cap for one line of a JSONL " \
                               "file; shorten it or split it into several lines"
