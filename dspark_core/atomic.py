"""Atomic file and folder writes: a temporary file (or folder) beside the target, then os.replace, so a crash or an
error never leaves a half-written file behind (the old one stays until the new one is complete)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], None]) -> Path:
    """Call `write(tmp_path)` on a temporary file beside `path`, then move it into place."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes owner-only files; the result is an ordinary file
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def replace_dir(path: str | os.PathLike[str], fill: Callable[[Path], None]) -> Path:
    """Call `fill(tmp_dir)` on a temporary folder beside `path`, then swap it into place (files 0644, folder 0755).
    The caller decides whether an existing `path` may be replaced; this only makes the replacement atomic."""
    dst = Path(path)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        fill(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes owner-only folders; checkpoints are shared files
        for f in tmp.iterdir():
            if f.is_file():
                os.chmod(f, 0o644)
        if dst.exists():
            old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
            os.replace(dst, old)
            os.replace(tmp, dst)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst
