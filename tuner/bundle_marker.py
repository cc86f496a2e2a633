"""The bundle marker (`.dspark-bundle.json`): which files of an `--out` folder dspark-tune wrote, never trusted.

The marker decides what a new export may replace or remove, so a marker that someone edited (or that another
tool wrote) must never reach outside its folder: each name it lists has to be a plain file name directly inside
the bundle (no separator, no `.` / `..`, no control character, not the marker or a staging name) whose resolved
path is still directly inside the bundle, so a symbolic link to anywhere else is refused, never followed nor
deleted. A marker that breaks this is one TunerError line naming the entry, before anything is touched.
"""

from __future__ import annotations

import json
import os
import unicodedata
from pathlib import Path

from tuner.errors import TunerError

MARKER = ".dspark-bundle.json"  # what dspark-tune wrote into this folder
STAGING = ".dspark-staging-"  # prefix of a bundle being written (left behind only by a kill)
LEGACY = {"dspark.yaml", "sglang.sh", "sps.json", "sts.json", "vllm.json", "vllm.sh", "report.md",
          "provenance.json", "kernels.json"}  # a bundle written before the marker existed
NAME_MAX = 255  # bytes in one file name on every file system we write to


def shown(path: object, limit: int = 120) -> str:
    """A path as one short line: escaped when it holds control characters, shortened in the middle when long."""
    text = str(path)
    if not text.isprintable():
        text = ascii(text)[1:-1]
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-limit // 3:]} ({len(text)} characters)"


def name_problem(folder: Path, name: object) -> str | None:
    """Why `name` may not be a bundle entry of `folder` (None: it may). `folder` is already resolved."""
    if not isinstance(name, str):
        return "is not a file name"
    if name in ("", ".", ".."):
        return "is not a file name"
    if "/" in name or "\\" in name or (os.altsep and os.altsep in name):
        return "holds a path separator"
    if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in name):
        return "holds a control character"
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        return "is longer than a file name can be"
    if name == MARKER or name.startswith(STAGING):
        return "is the marker's own or a staging name"
    path = folder / name
    try:
        resolved = Path(os.path.realpath(path))
    except (OSError, ValueError):
        return "cannot be resolved"
    if resolved.parent != folder:
        return f"points outside the bundle (to {shown(resolved)})" if path.is_symlink() else "is not inside it"
    return None


def _checked(folder: Path, names: list[object], where: str) -> set[str]:
    """`names` as a set, or one TunerError line on the first entry that is not a plain name inside `folder`."""
    for name in names:
        why = name_problem(folder, name)
        if why is not None:
            entry = ascii(name) if isinstance(name, str) else f"a {type(name).__name__}"
            raise TunerError(f"--out {shown(folder)}: {where} lists {entry}, which {why}; dspark-tune never writes "
                             f"such an entry, so the marker was edited or is not ours: check the folder, then remove "
                             f"{MARKER} or pass another --out")
    return {str(n) for n in names}


def owned_files(folder: Path) -> set[str] | None:
    """The names dspark-tune wrote into the resolved `folder` (from its marker; a marker-less older bundle by its
    provenance.json), or None when `folder` is not a bundle. A marker listing anything but plain names inside
    `folder` is one TunerError line."""
    marker = folder / MARKER
    if marker.is_symlink():
        raise TunerError(f"--out {shown(folder)}: its {MARKER} is a symbolic link, which dspark-tune never writes: "
                         "check the folder, then remove the link or pass another --out")
    if marker.is_file():
        try:
            data = json.loads(marker.read_text())
            files = data.get("files", [])
        except (OSError, ValueError, AttributeError):
            return None
        if not isinstance(files, list):
            return None
        return _checked(folder, files, MARKER)
    prov = folder / "provenance.json"
    try:
        legacy = not prov.is_symlink() and "study" in json.loads(prov.read_text())
    except (OSError, ValueError, TypeError):
        return None
    names = {p.name for p in folder.iterdir() if not p.name.startswith(STAGING)}
    plots = {n for n in names if n.endswith(".png")}
    if not (legacy and names <= LEGACY | plots):
        return None
    return _checked(folder, sorted(names), "the older bundle (provenance.json, no marker)")
