"""`--out` against hostile folders, through `tune` and `export`: a marker (`.dspark-bundle.json`) that lists anything
but plain names inside the bundle, symbolic links out of it, and paths the file system refuses are one line, exit 2,
and not one file anywhere is touched (a marker listing `..` used to delete the user's files beside the bundle)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.tuner.fixtures import refused
from tuner.bundle_dir import MARKER, write_bundle


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root`, links not followed: kind, content hash or link target, mode, mtime."""
    out: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            p = Path(folder) / name
            st = p.lstat()
            if p.is_symlink():
                out[str(p.relative_to(root))] = ("link", os.readlink(p), st.st_mtime_ns)
            elif p.is_file():
                out[str(p.relative_to(root))] = ("file", hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mode,
                                                 st.st_mtime_ns)
            else:
                out[str(p.relative_to(root))] = ("dir", st.st_mode, st.st_mtime_ns)
    return out


@pytest.fixture
def users_files(tmp_path) -> Path:
    """The issue's folder: the user's files beside and above a previous bundle `parent/b`."""
    root = tmp_path / "root"
    (root / "parent" / "important").mkdir(parents=True)
    (root / "parent" / "notes.txt").write_text("mine")
    (root / "parent" / "important" / "data.txt").write_text("precious")
    (root / "outside.txt").write_text("also mine")
    (root / "parent" / "b").mkdir()
    (root / "parent" / "b" / "dspark.yaml").write_text("a: 1\n")
    return root




HOSTILE = ["..", ".", "", "/", "/etc/passwd", "../notes.txt", "../important", "important/../..", "sub/x", "a\\b",
           "a\nb", "a\rb", "a\u2028b", "a\x00b", "\x1b[2J", MARKER, ".dspark-staging-x", "x" * 300, 42, None,
           ["dspark.yaml"]]


@pytest.mark.parametrize("name", HOSTILE, ids=[ascii(n)[:20] for n in HOSTILE])
def test_a_hostile_marker_is_one_line_and_touches_nothing(name, users_files, capsys):
    bundle = users_files / "parent" / "b"
    (bundle / MARKER).write_text(json.dumps({"files": ["dspark.yaml", name], "complete": True}))
    before = snapshot(users_files)
    line = refused(capsys, "tune", "--model", "qwen3", "--gpu", "h100", "--trials", "1", "--out", str(bundle))
    assert MARKER in line and "lists" in line, line
    line = refused(capsys, "export", "--study", "any", "--out", str(bundle))
    assert MARKER in line, line
    assert snapshot(users_files) == before


@pytest.mark.parametrize("target", ["parent/notes.txt", "parent/important", "outside.txt", "/etc/hostname"])
def test_a_marker_entry_linking_outside_is_refused_not_followed_nor_deleted(target, users_files, capsys):
    bundle = users_files / "parent" / "b"
    dest = Path(target) if target.startswith("/") else users_files / target
    (bundle / "report.md").symlink_to(dest)
    (bundle / MARKER).write_text(json.dumps({"files": ["dspark.yaml", "report.md"], "complete": True}))
    before = snapshot(users_files)
    line = refused(capsys, "tune", "--model", "qwen3", "--gpu", "h100", "--out", str(bundle))
    assert "points outside the bundle" in line, line
    assert snapshot(users_files) == before and (bundle / "report.md").is_symlink()


def test_a_marker_that_is_a_link_is_refused(users_files, capsys):
    bundle = users_files / "parent" / "b"
    elsewhere = users_files / "parent" / "notes.json"
    elsewhere.write_text(json.dumps({"files": ["dspark.yaml"]}))
    (bundle / MARKER).symlink_to(elsewhere)
    before = snapshot(users_files)
    assert "symbolic link" in refused(capsys, "tune", "--model", "qwen3", "--gpu", "h100", "--out", str(bundle))
    assert snapshot(users_files) == before


def test_an_older_bundle_with_a_link_out_is_refused(users_files, capsys):
    """A marker-less bundle (provenance.json) is recognised by its names: a link among them is checked the same."""
    bundle = users_files / "parent" / "b"
    (bundle / "provenance.json").write_text(json.dumps({"study": "s"}))
    (bundle / "report.md").symlink_to(users_files / "parent" / "notes.txt")
    before = snapshot(users_files)
    assert "points outside" in refused(capsys, "tune", "--model", "qwen3", "--gpu", "h100", "--out", str(bundle))
    assert snapshot(users_files) == before


def test_a_link_between_bundle_files_is_replaced_not_followed(tmp_path):
    """A marker entry that is a link to another entry of the same bundle stays allowed: the link itself is replaced,
    its target is rewritten only as a bundle file of its own."""
    out = tmp_path / "b"
    write_bundle(out, lambda f: [(f / n).write_text(n) for n in ("a.txt", "b.txt")])
    (out / "b.txt").unlink()
    (out / "b.txt").symlink_to(out / "a.txt")
    write_bundle(out, lambda f: (f / "a.txt").write_text("new"))
    assert (out / "a.txt").read_text() == "new" and not os.path.lexists(out / "b.txt")


def _loop(root: Path) -> Path:
    (root / "l1").symlink_to(root / "l2")
    (root / "l2").symlink_to(root / "l1")
    return root / "l1"


def _long(root: Path) -> Path:
    return root / ("x" * 300)


def _long_inside(root: Path) -> Path:
    return root / ("x" * 300) / "b"


def _through_file(root: Path) -> Path:
    (root / "f").write_text("a file")
    return root / "f" / "b"


def _through_loop(root: Path) -> Path:
    return _loop(root) / "b"


def _nul(root: Path) -> Path:
    return Path(f"{root}/a\0b")


@pytest.mark.parametrize("make", [_loop, _long, _long_inside, _through_file, _through_loop, _nul],
                         ids=["symlink-loop", "300-char-name", "300-char-folder", "through-a-file",
                              "through-a-loop", "nul"])
def test_an_out_path_the_file_system_refuses_is_one_line(make, tmp_path, capsys):
    root = tmp_path / "root"
    root.mkdir()
    out = make(root)
    before = snapshot(root)
    for argv in (["tune", "--model", "qwen3", "--gpu", "h100", "--out", str(out)],
                 ["export", "--study", "any", "--out", str(out)]):
        line = refused(capsys, *argv)
        assert "--out" in line and len(line) < 400, line  # (a NUL: the option parser refuses it first)
    assert snapshot(root) == before
