"""A private scratch folder per fuzzing process: the readers under test take paths, so each input is written there."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path


@cache
def scratch_dir() -> Path:
    """A fresh temporary folder for this process, removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="dspark-fuzz-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def write(name: str, data: bytes, folder: str = "") -> Path:
    """`data` written to `name` (inside sub-folder `folder`) of the scratch folder; returns its path."""
    base = scratch_dir() / folder if folder else scratch_dir()
    base.mkdir(exist_ok=True)
    path = base / name
    path.write_bytes(data)
    return path
