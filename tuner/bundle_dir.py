"""The bundle folder (`--out DIR`): checked before any trial runs, written so that nothing the user owns is lost.

A bundle folder holds a marker (`.dspark-bundle.json`) listing the files dspark-tune wrote there. `--out` may
name a new folder, an empty one, or a previous bundle; any other non-empty folder (`--out .` in a project, a
home directory) is refused, because its files are not ours to replace. Symbolic links are followed: the bundle
goes where the link points, and the link stays.

A new folder is staged beside its final path and renamed into place (all or nothing). An existing one is
staged inside itself (same file system) and each bundle file is then renamed over its old version; files of
the previous bundle that the new one no longer has are removed, files the marker does not list are never
touched, and a name the user owns is refused before anything moves.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from tuner.errors import TunerError

MARKER = ".dspark-bundle.json"  # what dspark-tune wrote into this folder
STAGING = ".dspark-staging-"  # prefix of a bundle being written (left behind only by a kill)
LEGACY = {"dspark.yaml", "sglang.sh", "sps.json", "sts.json", "vllm.json", "vllm.sh", "report.md",
          "provenance.json", "kernels.json"}  # a bundle written before the marker existed


def target_of(out: Path) -> Path:
    """Where the bundle really goes: `out` with symbolic links (dangling ones too), `.` and `..` resolved."""
    return Path(os.path.realpath(Path(out).expanduser()))


def owned_files(folder: Path) -> set[str] | None:
    """The names dspark-tune wrote into `folder` (from its marker; a marker-less older bundle by its
    provenance.json), or None when `folder` is not a bundle."""
    marker = folder / MARKER
    if marker.is_file():
        try:
            data = json.loads(marker.read_text())
            return {str(n) for n in data.get("files", []) if isinstance(n, str) and "/" not in n}
        except (OSError, ValueError, AttributeError):
            return None
    prov = folder / "provenance.json"
    try:
        legacy = "study" in json.loads(prov.read_text())
    except (OSError, ValueError, TypeError):
        return None
    names = {p.name for p in folder.iterdir() if not p.name.startswith(STAGING)}
    plots = {n for n in names if n.endswith(".png")}
    return names if legacy and names <= LEGACY | plots else None


def _foreign(folder: Path) -> list[str]:
    """Entries of an existing folder that are not ours (sorted)."""
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith(STAGING) and p.name != MARKER)
    owned = owned_files(folder)
    if owned is None:
        return names
    return [n for n in names if n not in owned]


def _probe(folder: Path, out: Path) -> None:
    """Create and remove a file in `folder`: catches read-only file systems and permissions that os.access
    misreports."""
    try:
        fd, name = tempfile.mkstemp(prefix=STAGING, dir=folder)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise TunerError(f"cannot write into {folder} for --out {out} ({e.strerror}); pass a writable --out") from None


def check_out(out: Path) -> Path:
    """The resolved bundle folder, or one TunerError line: not a folder, not writable, or a folder of files
    dspark-tune did not write. Creates nothing but the missing parents."""
    real = target_of(out)
    if real.exists() and not real.is_dir():
        raise TunerError(f"--out {out} exists and is not a folder; pass a folder path")
    if real.is_dir():
        if owned_files(real) is None:
            names = _foreign(real)
            if names:
                shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                raise TunerError(f"--out {out} ({real}) holds files dspark-tune did not write ({shown}); pass a "
                                 "new or empty folder, or a previous bundle")
        _probe(real, out)
        return real
    parent = real.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TunerError(f"cannot create {parent} for --out {out} ({e.strerror}); pass a writable --out") from None
    _probe(parent, out)
    return real


def _write_marker(folder: Path, files: set[str], complete: bool) -> None:
    tmp = folder / f"{STAGING}marker"
    tmp.write_text(json.dumps({"files": sorted(files), "complete": complete,
                               "written_by": "dspark-tune export"}, indent=2) + "\n")
    os.replace(tmp, folder / MARKER)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def write_bundle(out: Path, build: Callable[[Path], None]) -> list[str]:
    """Run `build(folder)` on a staging folder, then put its files into `out` as described above; returns the
    bundle's file names. An exception in `build` leaves `out` as it was."""
    real = check_out(out)
    fresh = not real.exists()
    stage = Path(tempfile.mkdtemp(prefix=f".{real.name}.staging-" if fresh else STAGING,
                                  dir=real.parent if fresh else real))
    try:
        build(stage)
        new = {p.name for p in stage.iterdir()}
        if fresh:
            _write_marker(stage, new, True)
            try:
                os.rename(stage, real)  # all or nothing
                return sorted(new)
            except OSError:  # created meanwhile (another export): merge into it below
                real.mkdir(exist_ok=True)
                moved = Path(tempfile.mkdtemp(prefix=STAGING, dir=real))
                for name in new:
                    os.replace(stage / name, moved / name)
                shutil.rmtree(stage)
                stage = moved
        _commit(stage, real, new, out)
        return sorted(new)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _commit(stage: Path, real: Path, new: set[str], out: Path) -> None:
    """Rename the staged files over the previous bundle's, never over a file the user owns."""
    old = owned_files(real) or set()
    clash = sorted(n for n in new if (real / n).exists() and n not in old)
    if clash:
        raise TunerError(f"--out {out} already holds {', '.join(clash[:3])}, which dspark-tune did not write; "
                         "move it away or pass another --out")
    _write_marker(real, old | new, False)  # a kill from here on leaves a marker that still lists every file
    for name in sorted(new):
        src, dst = stage / name, real / name
        if src.is_dir():
            trash = stage / f"{STAGING}old-{name}"
            if dst.exists() or dst.is_symlink():
                os.replace(dst, trash)
            os.replace(src, dst)
            if trash.exists():
                _remove(trash)
        else:
            os.replace(src, dst)
    for name in sorted(old - new):
        _remove(real / name)
    _write_marker(real, new, True)
    for leftover in real.glob(f"{STAGING}*"):  # a killed earlier export's staging folder
        if leftover != stage:
            _remove(leftover)
