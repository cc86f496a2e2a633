"""Bounded JSON Lines: one JSON value per line, each line size- and depth-checked before `json.loads` sees it.

Why: `json.loads` recurses once per nesting level, so `[[[[...` 100k deep ends in a RecursionError traceback; a
huge line costs memory and time before any validation. The depth is measured by a linear scan that never
recurses (strings and escapes removed, then a running sum over the brackets), and the line is refused above
JSON_DEPTH. Values JSON does not have (NaN, Infinity), integers past Python's digit limit and lone UTF-16
surrogate escapes (not text, and the tokenizer cannot encode them) are one line each too; so is a float that
overflows to infinity (1e999).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

from dspark_core.userfiles import JSONL_FILE_BYTES, JSONL_LINE_BYTES, UserFileError, iter_lines

JSON_DEPTH = 64  # nesting levels of one line's value; a request is 1-2, json.loads recurses per level

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = tuple(1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256))
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def json_depth(raw: bytes) -> int:
    """The deepest bracket nesting of a JSON text, in linear time without recursion. Exact on valid JSON and on
    the valid prefix of invalid JSON (where json.loads recurses before it fails), so a bound on it bounds
    json.loads's recursion."""
    unescaped = _ESCAPE.sub(b"", raw)  # escapes only occur inside strings in (a valid prefix of) JSON
    outside = b"".join(unescaped.split(b'"')[::2])  # even pieces lie outside strings
    brackets = outside.translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; write a finite number or null")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 overflows to inf
        raise ValueError(f"{text[:40]} is too large for a number; write a finite number or null")
    return value


def parse_line(raw: bytes, path: str | os.PathLike[str], n: int | None, depth: int = JSON_DEPTH,
               allow_nan: bool = False) -> Any:
    """One line's JSON value (n=None: a whole JSON file); any problem is one UserFileError naming the file and
    line. `allow_nan`: read NaN / Infinity as Python's json writes them (the caller drops them)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserFileError(path, f"not UTF-8 text (byte {e.start + 1}); save the file as UTF-8", n) from None
    found = json_depth(raw)
    if found > depth:
        hint = " (a request is one object of strings and numbers)" if n else ""
        raise UserFileError(path, f"JSON nested {found} levels deep, over the cap of {depth}; flatten it{hint}", n)
    try:
        value = json.loads(text, parse_constant=None if allow_nan else _no_constant,
                           parse_float=float if allow_nan else _finite_float)
    except json.JSONDecodeError as e:
        what = "each line must be one JSON object" if n else "fix the JSON"
        raise UserFileError(path, f"not valid JSON ({e.msg} at column {e.colno}); {what}", n) from None
    except ValueError as e:  # NaN / Infinity / 1e999, or an integer past sys.get_int_max_str_digits()
        msg = str(e).split(";")[0].split(":")[0]
        raise UserFileError(path, f"not valid JSON ({msg}); write finite numbers of ordinary size", n) from None
    if _SURROGATE_ESCAPE.search(raw):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise UserFileError(path, "a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair) is not "
                                      "text; remove it or write the character itself", n) from None
    return value


def read_jsonl(path: str | os.PathLike[str], line_cap: int = JSONL_LINE_BYTES, file_cap: int = JSONL_FILE_BYTES,
               depth: int = JSON_DEPTH) -> Iterator[tuple[int, Any]]:
    """(line number, value) of every non-blank line of a JSONL file (a regular file of at most `file_cap` bytes,
    lines of at most `line_cap`); any problem is one UserFileError `FILE:LINE: what; how to fix`."""
    for n, raw in iter_lines(path, line_cap, file_cap, "a JSONL file"):
        if raw.strip():
            yield n, parse_line(raw, path, n, depth)
