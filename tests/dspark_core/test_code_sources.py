"""Code prompts for drafter training (issue 42): third-party packages without the held-out benchmark's, and windows
that end at a `def` line, the benchmark's prompt shape."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

from dspark_core.errors import DSparkError
from dspark_core.training import code_sources
from dspark_core.training.code_sources import BENCH_PACKAGES, code_windows, site_sources

ROOT = Path(__file__).resolve().parents[2]


def chars(text: str) -> list[int]:  # a tokenizer of one token per character: windows read back as text
    return [ord(c) for c in text]


def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site, stdlib = tmp_path / "site", tmp_path / "stdlib"
    stdlib.mkdir()
    body = "import os\n\n\nclass A:\n    x = 1\n\n    def run(self, n):\n        return n + 1\n" * 4
    for pkg in ("alpha", "beta", "click", "_private"):
        for i in range(40):
            (site / pkg / "sub").mkdir(parents=True, exist_ok=True)
            (site / pkg / "sub" / f"m{i}.py").write_text(body)
    (site / "alpha" / "huge.py").write_text("x = 1\n" * (code_sources.MAX_FILE_BYTES // 6 + 1))
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"purelib": str(site), "stdlib": str(stdlib)})
    return site


def test_site_sources_leave_out_the_benchmark_packages_and_split_by_path(tmp_path, monkeypatch) -> None:
    fake_site(tmp_path, monkeypatch)
    train, held = site_sources(heldout=False), site_sources(heldout=True)
    assert set(train) == {"alpha", "beta"}  # click is the benchmark's, _private is not a package's code
    names = {p for files in train.values() for p in files}
    assert not names & {p for files in held.values() for p in files}
    assert sum(map(len, train.values())) + sum(map(len, held.values())) == 80  # huge.py skipped unread
    site = tmp_path / "site"
    assert all(code_sources._site_heldout(p.relative_to(site).as_posix()) for files in held.values() for p in files)


def test_the_benchmark_prompts_come_from_the_packages_training_leaves_out() -> None:
    bench = [json.loads(line) for line in (ROOT / "benchmarks/prompts/heldout_code.jsonl").read_text().splitlines()]
    assert {row["source"].split("/")[0] for row in bench} <= set(BENCH_PACKAGES)


def test_def_windows_end_at_a_def_line_and_the_rest_are_windows(tmp_path, monkeypatch) -> None:
    fake_site(tmp_path, monkeypatch)
    groups = site_sources(heldout=False)
    rows = code_windows(chars, groups, count=10, length=40, seed=0, def_fraction=0.5)
    assert rows.shape == (10, 40)
    texts = ["".join(map(chr, r)) for r in rows.tolist()]
    assert all(t.endswith("    def run(self, n):\n") for t in texts[:5])
    assert code_windows(chars, groups, count=10, length=40, seed=0, def_fraction=0.5).equal(rows)  # seeded


def test_too_long_a_window_is_one_clear_error(tmp_path, monkeypatch) -> None:
    fake_site(tmp_path, monkeypatch)
    groups = site_sources(heldout=False)
    with pytest.raises(DSparkError, match="shorter --prompt-len"):
        code_windows(chars, groups, count=4, length=10_000, seed=0, def_fraction=0.0)
    with pytest.raises(DSparkError, match="no code sources"):
        code_windows(chars, {}, count=4, length=10, seed=0, def_fraction=0.0)
