"""Round logs: what the engine saw and got in each round, as JSON lines (train-policy, train-gamma-policy read them).

Line 1 is a header: the SPS table the engine priced rounds with and the block length. Every further line is one
round (a plain step too, with nothing drafted, so that a plain step's real cost is on record): the load (running,
queued), per request the calibrated confidences, draft entropies, rolling acceptance, text features and context length
the schedulers saw, how many tokens it drafted, verified and had accepted, and the round's measured seconds with its
verify batch in tokens. Logging with `verify_all` gives full information: a shorter verify length l would have
committed min(l, accepted) + 1 tokens (the acceptance test of each position uses the same random draw whatever l is),
so any stopping rule can be priced on the log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pydantic import BaseModel, ConfigDict, ValidationError

from dspark_core.errors import DSparkError
from dspark_core.verification.sps import SpsTable, SpsTableFile


class LogHeader(BaseModel):
    """First line of a round log."""

    model_config = ConfigDict(extra="forbid")

    kind: str = "dspark-round-log"  # marks the file
    block_size: int  # spec.block_size of the run
    scheduler: str  # the logging run's spec.scheduler (verify_all = full information)
    sps: SpsTableFile  # the table the engine priced batches with

    def sps_table(self) -> SpsTable:
        return SpsTable.from_probes(zip(self.sps.sample_batch_tokens, self.sps.sample_steps_per_sec, strict=True),
                                    self.sps.max_batch_tokens)


class RoundRecord(BaseModel):
    """One speculative round of the whole batch."""

    model_config = ConfigDict(extra="forbid")

    running: int  # requests in the round
    waiting: int  # requests queued behind them
    confidence: list[list[float]]  # [request][position]: calibrated c_k of the drafted tokens
    entropy: list[list[float]]  # [request][position]: draft entropy in nats ([] rows when the drafter gave none)
    recent_acceptance: list[float]  # [request]: rolling per-position acceptance before the round
    verified: list[int]  # [request]: draft tokens verified
    accepted: list[int]  # [request]: accepted prefix of the verified drafts
    drafted: list[int] = []  # [request]: tokens drafted this round (logs before this field: = verified)
    text: list[list[float]] = []  # [request]: gamma_policy.TEXT_FEATURES of its committed tokens before the round
    context: list[int] = []  # [request]: committed tokens (prompt included) before the round: its attention span
    batch_tokens: int  # sum(verified + 1)
    seconds: float  # the round, from the first gamma() call to observe()


@dataclass
class RoundLog:
    """Appends rounds to a JSONL file; opened lazily so an engine that never speculates writes nothing."""

    path: Path
    block_size: int
    scheduler: str
    sps: SpsTable  # the table the engine prices batches with (the header records it)
    _fh: IO[str] | None = field(default=None, repr=False)

    def header(self) -> LogHeader:
        table = SpsTableFile.model_validate(self.sps.to_dict())
        return LogHeader(block_size=self.block_size, scheduler=self.scheduler, sps=table)

    def __post_init__(self) -> None:
        """Appending to an existing file is allowed only when it is a round log of the same setting."""
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return
        with self.path.open(encoding="utf-8", errors="replace") as fh:
            first = fh.readline()
        try:
            old = LogHeader.model_validate(json.loads(first))
        except (ValidationError, json.JSONDecodeError, TypeError):
            raise DSparkError(f"spec.round_log {self.path} exists and is not a round log; give a new path") from None
        if old != self.header():
            raise DSparkError(f"spec.round_log {self.path} holds rounds of another setting (block size, scheduler or "
                              "SPS table); give a new path")

    def write(self, record: RoundRecord) -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fresh = not self.path.exists() or self.path.stat().st_size == 0
            self._fh = self.path.open("a", encoding="utf-8")
            if fresh:
                self._fh.write(self.header().model_dump_json() + "\n")
        self._fh.write(record.model_dump_json() + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_log(path: str | Path) -> tuple[LogHeader, list[RoundRecord]]:
    """Header and rounds of one log; one clear error naming the file and line on bad input (read through the
    bounded JSONL reader: a regular file, capped line and file sizes and nesting; NaN as the engine writes it)."""
    from dspark_core.jsonl import parse_line
    from dspark_core.userfiles import JSONL_FILE_BYTES, JSONL_LINE_BYTES, iter_lines

    p = Path(path)
    if not p.is_file():
        raise DSparkError(f"round log {p} not found; set spec.round_log in the engine config of a run (bench "
                          "--config, serve --config) to write one")
    header, rounds = None, []
    for i, raw in iter_lines(p, JSONL_LINE_BYTES, JSONL_FILE_BYTES, "a round log"):
        if not raw.strip():
            continue
        value = parse_line(raw, p, i, allow_nan=True)
        try:
            if header is None:
                header = LogHeader.model_validate(value)
            else:
                rounds.append(RoundRecord.model_validate(value))
        except (ValidationError, TypeError) as e:
            what = "a round-log header" if header is None else "a round record"
            raise DSparkError(f"{p}:{i} is not {what} ({str(e).splitlines()[0]})") from None
    if header is None:
        raise DSparkError(f"round log {p} is empty")
    return header, rounds
