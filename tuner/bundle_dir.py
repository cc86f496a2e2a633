"""The bundle folder (`--out DIR`): checked before any trial runs, written so that nothing the user owns is lost.

A bundle folder holds a marker (`.dspark-bundle.json`) listing the files dspark-tune wrote there. `--out` may
name a new folder, an empty one, or a previous bundle; any other non-empty folder (`--out .` in a project, a
home directory) is refused, because its files are not ours to replace. Symbolic links are followed: the bundle
goes where the link points, and the link stays.

A new folder is staged beside its final path and renamed into place (all or nothing). An existing one is
staged inside itself (same file system) and each bundle file is then renamed over its old version; files of
the previous bundle that the new one no longer has are removed, files the marker does not list are never
touched, and a name the user owns is refused before anything moves. The marker itself is never trusted: a name
that is not a plain file name directly inside the bundle, or a link out of it, is refused before anything is
touched (tuner/bundle_marker.py). A path the file system refuses (a link loop, a name too long, a file on the
way) is one line too.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from tuner.bundle_marker import LEGACY, MARKER, NAME_MAX, STAGING, owned_files, shown  # noqa: F401 - re-exported
from tuner.errors import TunerError

# what an OSError on the --out path means for the user, by errno
_PATH_ERRORS = {errno.ENAMETOOLONG: "a name in it is longer than the file system allows (255 bytes), or the whole "
                                    "path is: pass a shorter --out",
                errno.ELOOP: "it goes through a symbolic link loop: fix the link or pass another --out",
                errno.ENOTDIR: "a part of it is a file, not a folder: pass a folder path",
                errno.EEXIST: "a part of it is a file, not a folder: pass a folder path",  # mkdir(exist_ok) on a file
                errno.EACCES: "permission denied: pass a writable --out",
                errno.EPERM: "permission denied: pass a writable --out",
                errno.EROFS: "the file system is read-only: pass a writable --out"}


def target_of(out: Path) -> Path:
    """Where the bundle really goes: `out` with symbolic links (dangling ones too), `.` and `..` resolved."""
    return Path(os.path.realpath(Path(out).expanduser()))


def _path_error(out: Path, e: OSError) -> TunerError:
    why = _PATH_ERRORS.get(e.errno or 0, f"cannot create or write it ({e.strerror or e}): pass a writable --out")
    return TunerError(f"--out {shown(out)}: {why}")


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
        raise TunerError(f"cannot write into {shown(folder)} for --out {shown(out)} ({e.strerror}); pass a writable "
                         "--out") from None


def check_out(out: Path) -> Path:
    """The resolved bundle folder, or one TunerError line: not a folder, not writable, a path the file system
    refuses (a link loop, a name too long, a file on the way), a folder of files dspark-tune did not write, or a
    marker that lists anything but plain names inside it. Creates nothing but the missing parents."""
    try:
        return _check_out(out)
    except ValueError:  # os functions refuse an embedded NUL
        raise TunerError(f"--out {shown(out)}: a path cannot hold a NUL character; pass another --out") from None
    except OSError as e:
        raise _path_error(out, e) from None


def _check_out(out: Path) -> Path:
    real = target_of(out)
    if any(p.is_symlink() for p in (real, *real.parents)):  # realpath stops resolving inside a loop
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
    if len(real.name.encode("utf-8", "surrogateescape")) > NAME_MAX:  # fails here, not in the final rename
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
    if real.exists() and not real.is_dir():
        raise TunerError(f"--out {shown(out)} exists and is not a folder; pass a folder path")
    if real.is_dir():
        if owned_files(real) is None:
            names = _foreign(real)
            if names:
                listed = ", ".join(shown(n, 40) for n in names[:3]) + \
                    (f" and {len(names) - 3} more" if len(names) > 3 else "")
                raise TunerError(f"--out {shown(out)} ({shown(real)}) holds files dspark-tune did not write "
                                 f"({listed}); pass a new or empty folder, or a previous bundle")
        _probe(real, out)
        return real
    parent = real.parent
    parent.mkdir(parents=True, exist_ok=True)
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
    clash = sorted(n for n in new if os.path.lexists(real / n) and n not in old)  # a dangling link is a file
    if clash:
        raise TunerError(f"--out {shown(out)} already holds {', '.join(shown(n, 40) for n in clash[:3])}, which "
                         "dspark-tune did not write; move it away or pass another --out")
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
    for leftover in real.glob(f"{STAGING}*"):  # a killed earlier export's staging folder or marker
        if leftover != stage and not leftover.is_symlink():
            _remove(leftover)
