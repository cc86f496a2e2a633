"""Prompt / workload JSONL files: one request per line, `{"prompt": "...", "output_len"?, "domain"?, "arrival_s"?}`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dspark_core.errors import DSparkError
from dspark_core.jsonl import read_jsonl as _read_jsonl


class PromptRecord(BaseModel):
    """One line of a prompt file (DESIGN.md section 3)."""

    model_config = ConfigDict(extra="allow")

    prompt: str = Field(min_length=1)  # the request text
    output_len: int | None = Field(None, ge=1, le=1_048_576)  # tokens to generate (bench uses --max-new-tokens)
    domain: str | None = None  # chat | code | math | mixed
    arrival_s: float | None = Field(None, ge=0.0, allow_inf_nan=False)  # arrival time for workload replays


def read_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) of every non-blank line of a JSONL file, through the bounded reader
    (dspark_core/jsonl.py: a regular file, lines <= 4 MiB, nesting <= 64 levels); any bad line is one DSparkError
    naming the file and the line."""
    return _read_jsonl(path)


def load_prompts(path: str | Path, limit: int | None = None) -> list[PromptRecord]:
    """Read a JSONL prompt file; one-line DSparkError naming the file and line for any bad line."""
    p = Path(path)
    if not p.exists():
        raise DSparkError(f"prompt file {p} not found; pass a JSONL file with one {{\"prompt\": ...}} per line")
    records: list[PromptRecord] = []
    for n, obj in read_jsonl(p):
        try:
            records.append(PromptRecord.model_validate(obj))
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(x) for x in err["loc"]) or "line"
            raise DSparkError(f"{p}:{n}: {loc}: {err['msg']} (each line needs a non-empty \"prompt\")") from None
        if limit is not None and len(records) >= limit:
            break
    if not records:
        raise DSparkError(f"prompt file {p} has no prompts; add lines like {{\"prompt\": \"def f(\"}}")
    return records
