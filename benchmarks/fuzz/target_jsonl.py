"""Fuzz target `jsonl`: the workload / prompt JSONL readers, fed arbitrary bytes as the file.

One input is written as `w.jsonl` and read by every reader of such a file: the engine's `load_prompts`
(`generate` / `bench --prompts`), the profiler's `read_requests` (`profile` / `loadgen --workload`), and the bounded
reader under both (`dspark_core.jsonl.read_jsonl`) once with its real caps and once with tiny ones (256-byte
lines, a 2 KiB file, depth 4), so the refusals are exercised at the sizes libFuzzer builds. Each may refuse with its
one-line user error (DSparkError, ProfileError); anything else escaping is a bug, and so is a value the reader
accepted that breaks what it promises: nesting within the cap and exactly what the depth scan measured, text
that encodes to UTF-8, finite numbers, no line longer than the cap.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from scratch import write

from dspark_core.cli.prompts import load_prompts
from dspark_core.errors import DSparkError
from dspark_core.jsonl import JSON_DEPTH, json_depth, read_jsonl
from profiler.errors import ProfileError
from profiler.workload import read_requests

ROOT = Path(__file__).resolve().parents[2]
MAX_LEN = 4096


def _seeds() -> list[bytes]:
    """Files `load_prompts` accepts (the profiler's reader refuses their extra fields, e.g. `source`): the committed
    held-out prompt files (their first lines) and small lines of every field, CRLF line ends, blank lines, escapes
    and brackets inside strings."""
    out = []
    for name in ("heldout_code.jsonl", "heldout_chat.jsonl"):
        lines = (ROOT / "benchmarks" / "prompts" / name).read_bytes().splitlines(keepends=True)
        out.append(b"".join(lines[:3])[:MAX_LEN])
    out += [b'{"prompt": "def f(x):", "output_len": 64, "domain": "code", "arrival_s": 0.25}\n',
            b'{"prompt": "hi"}\r\n\r\n{"prompt": "caf\\u00e9 \\ud83d\\ude00", "extra": [1, {"a": null}]}\n',
            b'{"prompt": "[{\\"x\\": \\"]\\\\\\"}"}\n']
    return out


SEEDS: list[bytes] = _seeds()
DICTIONARY: list[bytes] = [b'"prompt"', b'"output_len"', b'"domain"', b'"arrival_s"', b'"code"', b"NaN",
                           b"Infinity", b"-Infinity", b"1e999", b"\\ud800", b"\\udc00", b"\\ud83d\\ude00", b"\\\\",
                           b'\\"', b"[[[[", b"]]]]", b"{}", b"null", b"true", b"\r\n", b"9" * 40, b"1048577"]


def _depth(v: Any) -> int:
    """Reference nesting depth of a parsed value (recursive: only called on values within the cap)."""
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    return 0


def _check(v: Any) -> None:
    """What an accepted value promises: UTF-8-encodable text, finite numbers (walked; depth is within the cap)."""
    if isinstance(v, str):
        v.encode("utf-8")
    elif isinstance(v, float):
        assert math.isfinite(v), v
    elif isinstance(v, list):
        for x in v:
            _check(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            _check(k)
            _check(x)


def _lines(data: bytes) -> list[bytes]:
    """The file's lines as the reader splits them (at \\n, one \\r before it dropped)."""
    return [ln.removesuffix(b"\r") for ln in data.split(b"\n")]


def fuzz_one(data: bytes) -> None:
    """Every JSONL reader on `data`; accepted values must keep the reader's promises."""
    path = write("w.jsonl", data)
    lines = _lines(data)
    for caps in ({}, {"line_cap": 256, "file_cap": 2048, "depth": 4}):
        depth = caps.get("depth", JSON_DEPTH)
        try:
            for n, value in read_jsonl(path, **caps):
                raw = lines[n - 1]
                assert len(raw) <= caps.get("line_cap", 1 << 22) and raw.strip(), (n, raw[:80])
                found = _depth(value)
                assert found <= depth and found == json_depth(raw), (n, found, json_depth(raw), raw[:200])
                _check(value)
        except DSparkError:
            pass
    try:
        for rec in load_prompts(path):
            assert rec.prompt and (rec.arrival_s is None or math.isfinite(rec.arrival_s))
            json.dumps(rec.model_dump(), allow_nan=False)
    except DSparkError:
        pass
    try:
        for req in read_requests(path):
            assert req.prompt and (req.output_len is None or 1 <= req.output_len <= 1_048_576)
            json.dumps(req.model_dump(), allow_nan=False)
    except ProfileError:
        pass
