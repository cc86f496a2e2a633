"""Hostile rule folders through the real entry points (`rules lint`, `kb sync`, `rules list`): deep nesting, a
billion laughs, a recursive alias, a FIFO / folder named *.yaml, a file or folder over its byte cap, too many rules
on one parameter. Each is one line naming the file, exit 2, no traceback, in seconds. Where the failure this guards
against is a hang (FIFO, billion laughs), the command runs in a subprocess or a thread, with a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import cli
from dspark_core.userfiles import RULE_FILE_BYTES, RULES_DIR_BYTES
from kb.lint import MAX_CONTRADICTIONS, MAX_PAIRS
from tests.hostile_jsonl import main_within
from tests.kb.helpers import rule

ROOT = Path(__file__).resolve().parents[2]
GOOD = [rule("ok.rule", [{"advise": "Still loads next to hostile files."}])]
LAUGHS = "".join(f"  x{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 10))
HOSTILE = {  # file name -> (content, what its one line says)
    "deep_flow.yaml": ("- " + "[" * 100_000 + "]" * 100_000 + "\n", "nested more than 64 levels"),
    "deep_rule.yaml": ("- id: deep\n  when: " + "{not: " * 100 + "{field: hw.arch, eq: hopper}" + "}" * 100 + "\n",
                       "nested more than 64 levels"),
    "laughs.yaml": ('- id: lol\n  x0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + LAUGHS
                    + "  when: {field: hw.arch, eq: *l9}\n", "once aliases are expanded"),
    "cycle.yaml": ("- id: cyc\n  tags: &c [1, *c]\n", "contains it"),
    "latin1.yaml": ("- id: caf\xe9\n".encode("latin-1"), "not UTF-8"),
    # found by fuzzing (benchmarks/fuzz/crashes/rules_yaml/): values a rule file may not hold, as JSON stores them
    "inf.yaml": ("- id: inf\n  when: {field: hw.sm, between: [0, .inf]}\n", "'.inf' is not a finite number"),
    "nul.yaml": ('- id: nul\n  title: "a \\0 b"\n', "NUL character"),
    "bigint.yaml": ("- id: big\n  priority: 0x" + "f" * 4000 + "\n", "past 64"),
    "binary.yaml": ("- id: bin\n  title: !!binary AAAA\n", "binary values are not allowed"),
}


def _folder(tmp_path: Path, files: dict[str, str | bytes], good: bool = True) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir(parents=True)
    if good:
        (folder / "good.yaml").write_text(yaml.safe_dump(GOOD, sort_keys=False))
    for name, content in files.items():
        (folder / name).write_bytes(content.encode() if isinstance(content, str) else content)
    return folder


def _cli(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    t = time.monotonic()
    r = subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT, env={**os.environ, "COLUMNS": "400"})
    return r, time.monotonic() - t


def _one_line(text: str, name: str) -> str:
    lines = [ln for ln in text.splitlines() if name in ln]
    assert len(lines) == 1, (name, text[-2000:])
    return lines[0]


def test_lint_gives_one_line_per_hostile_file_in_seconds(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {n: c for n, (c, _) in HOSTILE.items()})
    os.mkfifo(folder / "pipe.yaml")  # opening it for reading would block forever
    (folder / "dir.yaml").mkdir()
    with open(folder / "huge.yaml", "wb") as f:  # sparse: over the per-file cap without writing it
        f.truncate(RULE_FILE_BYTES + 1)
    r, took = _cli("rules", "lint", "--rules", str(folder))
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr, r.stderr[-2000:]
    assert took < 30, took
    for name, (_, says) in HOSTILE.items():
        assert says in _one_line(r.stdout, name)
    assert "not a regular file" in _one_line(r.stdout, "pipe.yaml")
    assert "not a regular file" in _one_line(r.stdout, "dir.yaml")
    assert "over the 1 MiB cap" in _one_line(r.stdout, "huge.yaml")
    assert "1 rules in" in r.stdout  # good.yaml still loaded




@pytest.mark.parametrize("name", ["laughs.yaml", "pipe.yaml"])
def test_kb_sync_refuses_hangs_in_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str) -> None:
    folder = _folder(tmp_path, {"laughs.yaml": HOSTILE["laughs.yaml"][0]} if name == "laughs.yaml" else {})
    if name == "pipe.yaml":
        os.mkfifo(folder / name)
    code = main_within(10, ["kb", "sync", "--rules", str(folder), "--db", f"sqlite:///{tmp_path / 'kb.sqlite'}"])
    line = capsys.readouterr().err.strip()
    assert code == 2 and len(line.splitlines()) == 1, line
    assert line.startswith("error: ") and f"{folder / name}" in line and "Traceback" not in line


@pytest.mark.parametrize("name", [n for n in HOSTILE if n != "laughs.yaml"])
def test_rules_list_names_file_and_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str) -> None:
    folder = _folder(tmp_path, {name: HOSTILE[name][0]}, good=False)
    code = cli.main(["rules", "list", "--rules", str(folder)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"{folder / name}" in err and HOSTILE[name][1] in err


def test_folder_over_its_byte_cap_is_refused_before_reading(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    folder = _folder(tmp_path, {})
    for i in range(38):  # 38 MB of sparse files, each under the per-file cap
        with open(folder / f"r{i:02d}.yaml", "wb") as f:
            f.truncate(1_000_000)
    t = time.monotonic()
    for argv in (["rules", "lint"], ["kb", "sync"]):
        code = cli.main([*argv, "--rules", str(folder)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and str(folder) in err
        assert f"over the {RULES_DIR_BYTES >> 20} MiB cap" in err
    assert time.monotonic() - t < 5


@pytest.mark.parametrize(("same", "stop"), [(False, f"after {MAX_CONTRADICTIONS} contradictions"),
                                            (True, f"after {MAX_PAIRS} pairs")])
def test_hundreds_of_rules_on_one_parameter_lint_in_seconds(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                            same: bool, stop: str) -> None:
    """Lint compares rules on one parameter pairwise: 600 of them were 180k comparisons (35 s on this CPU), a folder
    at the byte cap hours. Contradicting rules stop at MAX_CONTRADICTIONS findings, agreeing ones at MAX_PAIRS."""
    rules = [rule(f"r{i}", [{"param": "spec.block_size", "set": 4 if same else i % 16 + 1}],
                  when={"field": "hw.arch", "eq": "hopper"}) for i in range(300 if not same else 220)]
    folder = _folder(tmp_path, {"many.yaml": yaml.safe_dump(rules)}, good=False)
    t = time.monotonic()
    code = cli.main(["rules", "lint", "--rules", str(folder)])
    out = capsys.readouterr().out
    assert code == 2 and time.monotonic() - t < 15
    assert out.count("contradiction ") == (0 if same else MAX_CONTRADICTIONS)
    assert stop in _one_line(out, "lint stopped comparing rules") and "rules act on spec.block_size" in out


def test_too_many_rules_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    items = "".join(f"- {{id: r{i}}}\n" for i in range(2001))  # cheap to write, refused before validation
    folder = _folder(tmp_path, {"many.yaml": items}, good=False)
    code = cli.main(["rules", "list", "--rules", str(folder)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "many.yaml:1" in err and "cap of 2000 rules" in err


def test_rules_postgres_cannot_store_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                  db_url: str) -> None:
    """A NUL in a string used to reach PostgreSQL (DataError traceback), an .inf bound was stored as null and the
    stored rule could not be read back: refused at the file, with its line, on both databases."""
    for name in ("nul.yaml", "inf.yaml"):
        folder = _folder(tmp_path / name, {name: HOSTILE[name][0]})
        code = cli.main(["kb", "sync", "--rules", str(folder), "--db", db_url])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and f"{folder / name}:" in err and HOSTILE[name][1] in err
