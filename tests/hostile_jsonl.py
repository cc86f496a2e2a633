"""Hostile JSONL workload / prompt files, shared by the tests of every command that reads one (`loadgen
--workload`, `profile --workload`, `generate` / `bench --prompts`): each with the words its one-line error says."""

from __future__ import annotations

import os
from pathlib import Path

HUGE_BYTES = 50_000_000  # the smallest line size reported to abort the process (SIGABRT in the tokenizer)

CASES: dict[str, tuple[str | bytes, str]] = {  # name -> (content, what the one-line error says)
    "deep": ('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n", ":1: JSON nested 100001 levels deep"),
    "not_json": ('{"prompt": "a"}\n{"prompt": \n', ":2: not valid JSON"),
    "nan": ('{"prompt": "a", "arrival_s": NaN}\n', "NaN is not a JSON number"),
    "big_int": ('{"prompt": "a", "output_len": ' + "9" * 5000 + "}\n", "Exceeds the limit"),
    "surrogate": ('{"prompt": "a\\ud800b"}\n', "lone UTF-16 surrogate"),
    "latin1": (b'{"prompt": "caf\xe9"}\n', "not UTF-8"),
    "overflow": ('{"prompt": "a", "arrival_s": 1e999}\n', "1e999 is too large"),  # fuzzing: read as inf
}


def write_huge_line(folder: Path) -> Path:
    """One prompt line of HUGE_BYTES of ordinary words (write it once per module: it takes ~0.1 s)."""
    path = folder / "huge.jsonl"
    with open(path, "w") as f:
        f.write('{"prompt": "' + "hello world " * (HUGE_BYTES // 12) + '"}\n')
    return path


def write_hostile_jsonl(folder: Path, huge: Path) -> dict[str, tuple[Path, str]]:
    """name -> (a hostile JSONL file in `folder`, what its one-line error says): CASES, a FIFO and a folder named
    *.jsonl, and the `huge` line."""
    out = {}
    for name, (content, says) in CASES.items():
        path = folder / f"{name}.jsonl"
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        out[name] = (path, says)
    os.mkfifo(folder / "pipe.jsonl")
    out["pipe"] = (folder / "pipe.jsonl", "is a FIFO (named pipe), not a regular file")
    (folder / "dir.jsonl").mkdir()
    out["dir"] = (folder / "dir.jsonl", "is a folder, not a regular file")
    out["huge"] = (huge, ":1: line longer than 4 MiB")
    return out


def main_within(seconds: float, argv: list[str]) -> int:
    """cli.main(argv) in a daemon thread: a hang (a FIFO opened for reading, a YAML bomb) fails the test after
    `seconds` instead of blocking the run."""
    import threading

    import cli

    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(cli.main(argv)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"{argv} still running after {seconds} s"
    return result[0]
