"""Bounded reads of the files a user hands us (rule YAML, workload / prompt JSONL): regular files only, byte caps.

Why: a FIFO named `rules/x.yaml` blocks `open()` forever, a device never ends, a 150 MB "prompt" line goes on to a
tokenizer that can take minutes or abort. Every reader of user data goes through here, so each such file is
refused with one line (`FILE[:LINE]: what; how to fix`) before anything heavy runs. This module imports nothing
else of the project but `dspark_core.errors`, so every layer (kb, profiler, live) can use it.

Caps (bytes; chosen far above real files, far below what hangs):
  RULE_FILE_BYTES  1 MiB    one rules/*.yaml (the shipped catalogue is ~170 KB in 11 files)
  RULES_DIR_BYTES  2 MiB    all rule files of a folder together (parse + validation take ~1-2 s per MiB)
  JSONL_LINE_BYTES 4 MiB    one request of a workload / prompt file (~1M tokens, past any model's context)
  JSONL_FILE_BYTES 256 MiB  a whole workload / prompt file, read line by line
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

from dspark_core.errors import DSparkError

MiB = 1 << 20
RULE_FILE_BYTES = 1 * MiB
RULES_DIR_BYTES = 2 * MiB
JSONL_LINE_BYTES = 4 * MiB
JSONL_FILE_BYTES = 256 * MiB


class UserFileError(DSparkError):
    """A user file refused or unreadable: one line `FILE[:LINE]: reason`; `reason` says what and how to fix."""

    def __init__(self, path: str | os.PathLike[str], reason: str, line: int | None = None) -> None:
        self.path, self.reason, self.line = str(path), reason, line
        super().__init__(f"{self.path}:{line}: {reason}" if line else f"{self.path}: {reason}")


def mib(n: int) -> str:
    """Bytes as a short figure for messages: MiB, or bytes below one."""
    return f"{n / MiB:.3g} MiB" if n >= MiB else f"{n} bytes"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a special file"


def regular_size(path: str | os.PathLike[str]) -> int:
    """The size of a regular file (symlinks followed), without opening it; anything else is one UserFileError."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserFileError(path, "no such file; check the path") from None
    except OSError as e:
        raise UserFileError(path, f"cannot read ({e.strerror}); check the path and its permissions") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserFileError(path, f"is {_kind(st.st_mode)}, not a regular file; pass a plain file")
    return st.st_size


def open_regular(path: str | os.PathLike[str], cap: int, what: str) -> BinaryIO:
    """A binary reader of a regular file no larger than `cap` bytes. Checked with stat before opening and
    again on the open descriptor (the path may be swapped for a FIFO in between: O_NONBLOCK keeps open() from
    blocking on one). `what` names the file's role in the refusal ("a rule file")."""
    regular_size(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UserFileError(path, f"cannot read ({e.strerror}); check the path and its permissions") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserFileError(path, f"is {_kind(st.st_mode)}, not a regular file; pass a plain file")
        if st.st_size > cap:
            raise UserFileError(path, f"is {mib(st.st_size)}, over the {mib(cap)} cap for {what}; split or "
                                      "shorten it")
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_capped(path: str | os.PathLike[str], cap: int, what: str) -> bytes:
    """All bytes of a regular file of at most `cap` bytes (a file that grows past it while read is refused)."""
    f = open_regular(path, cap, what)
    with f:
        try:
            data = f.read(cap + 1)
        except OSError as e:
            raise UserFileError(path, f"cannot read ({e.strerror}); check the file") from None
    if len(data) > cap:
        raise UserFileError(path, f"is over the {mib(cap)} cap for {what}; split or shorten it")
    return data


def iter_lines(path: str | os.PathLike[str], line_cap: int = JSONL_LINE_BYTES, file_cap: int = JSONL_FILE_BYTES,
               what: str = "a JSONL file") -> Iterator[tuple[int, bytes]]:
    """(1-based line number, bytes without the line break) of a regular file, one line in memory at a time; a line
    over `line_cap` bytes is refused before it is read whole, a file over `file_cap` before its first line. Lines
    end at \\n (a \\r before it is dropped), as JSON Lines defines them."""
    f = open_regular(path, file_cap, what)
    n = total = 0
    with f:
        while True:
            n += 1
            try:
                raw = f.readline(line_cap + 3)  # room for the line break ("\r\n") and one byte over the cap
            except OSError as e:
                raise UserFileError(path, f"cannot read ({e.strerror}); check the file", n) from None
            if not raw:
                return
            total += len(raw)
            if total > file_cap:
                raise UserFileError(path, f"is over the {mib(file_cap)} cap for {what}; split it", n)
            line = raw.removesuffix(b"\n").removesuffix(b"\r")
            if len(line) > line_cap:
                raise UserFileError(path, f"line longer than {mib(line_cap)}, the cap for one line of {what}; "
                                          "shorten it or split it into several lines", n)
            yield n, line
