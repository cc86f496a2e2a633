"""`--out`: never delete or overwrite a file dspark-tune did not write; follow symlinks; refuse early."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path

import pytest

from tuner.bundle_dir import MARKER, STAGING, check_out, write_bundle
from tuner.errors import TunerError


def builder(files: dict[str, str]):
    def build(folder: Path) -> None:
        for name, text in files.items():
            (folder / name).write_text(text)

    return build


BUNDLE = {"dspark.yaml": "a: 1\n", "report.md": "# r\n", "provenance.json": '{"study": "s"}\n'}


def test_new_folder_gets_the_bundle_and_a_marker(tmp_path):
    out = tmp_path / "deep" / "b"
    assert write_bundle(out, builder(BUNDLE)) == sorted(BUNDLE)
    assert json.loads((out / MARKER).read_text())["files"] == sorted(BUNDLE)
    assert not list(tmp_path.rglob("*staging*"))


def test_a_folder_of_user_files_is_refused_and_left_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(TunerError, match="did not write.*notes.txt"):
        write_bundle(tmp_path, builder(BUNDLE))
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_rewrite_keeps_user_files_and_drops_only_our_stale_ones(tmp_path):
    out = tmp_path / "b"
    write_bundle(out, builder({**BUNDLE, "kernels.json": "{}"}))
    (out / "my-notes.md").write_text("mine")
    write_bundle(out, builder({**BUNDLE, "dspark.yaml": "a: 2\n"}))
    assert (out / "my-notes.md").read_text() == "mine"
    assert (out / "dspark.yaml").read_text() == "a: 2\n"
    assert not (out / "kernels.json").exists()  # ours, and the new bundle has none
    assert json.loads((out / MARKER).read_text()) ["complete"] is True


def test_a_user_file_with_a_bundle_name_is_never_overwritten(tmp_path):
    out = tmp_path / "b"
    write_bundle(out, builder(BUNDLE))
    (out / "kernels.json").write_text("the user's")
    with pytest.raises(TunerError, match="kernels.json"):
        write_bundle(out, builder({**BUNDLE, "kernels.json": "{}", "dspark.yaml": "new"}))
    assert (out / "kernels.json").read_text() == "the user's"
    assert (out / "dspark.yaml").read_text() == "a: 1\n"  # nothing moved


def test_a_failing_build_leaves_the_old_bundle(tmp_path):
    out = tmp_path / "b"
    write_bundle(out, builder(BUNDLE))

    def boom(folder: Path) -> None:
        (folder / "dspark.yaml").write_text("half")
        raise RuntimeError("render failed")

    with pytest.raises(RuntimeError):
        write_bundle(out, boom)
    assert (out / "dspark.yaml").read_text() == "a: 1\n"
    assert not [p for p in out.iterdir() if p.name.startswith(STAGING)]


def test_symlink_is_followed_and_stays_a_link(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    write_bundle(link, builder(BUNDLE))
    assert link.is_symlink() and (real / "dspark.yaml").is_file()
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "made-on-demand")
    write_bundle(dangling, builder(BUNDLE))
    assert dangling.is_symlink() and (tmp_path / "made-on-demand" / "report.md").is_file()


def test_dot_and_dotdot(tmp_path, monkeypatch):
    work = tmp_path / "project"
    work.mkdir()
    (work / "cli.py").write_text("x")
    monkeypatch.chdir(work)
    for out in (Path("."), Path("..")):
        with pytest.raises(TunerError, match="did not write"):
            check_out(out)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    write_bundle(Path("."), builder(BUNDLE))
    assert (empty / "dspark.yaml").is_file()


def test_a_marker_less_older_bundle_is_recognised(tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    for name, text in BUNDLE.items():
        (out / name).write_text(text)
    (out / "pareto.png").write_bytes(b"png")
    write_bundle(out, builder({**BUNDLE, "dspark.yaml": "a: 3\n"}))
    assert (out / "dspark.yaml").read_text() == "a: 3\n" and not (out / "pareto.png").exists()


def test_unwritable_target_is_refused_before_anything(tmp_path, monkeypatch):
    def read_only(*_a, **_k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(TunerError, match="Read-only file system"):
        check_out(tmp_path / "b")


def test_a_file_is_not_a_folder(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(TunerError, match="not a folder"):
        check_out(tmp_path / "f")


def test_a_killed_exports_staging_folder_is_cleaned(tmp_path):
    out = tmp_path / "b"
    write_bundle(out, builder(BUNDLE))
    (out / f"{STAGING}abc").mkdir()
    check_out(out)  # ours: not a user file
    write_bundle(out, builder(BUNDLE))
    assert not [p for p in out.iterdir() if p.name.startswith(STAGING)]


def test_tune_refuses_a_user_folder_before_any_trial(tmp_path, capsys):
    import cli

    (tmp_path / "thesis.tex").write_text("mine")
    code = cli.main(["tune", "--model", "qwen3", "--gpu", "h100", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "thesis.tex" in err and "study" not in err
    assert [p.name for p in tmp_path.iterdir()] == ["thesis.tex"]
