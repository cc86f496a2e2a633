"""Shared fixtures: a throw-away database and census cache per test."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFIGS = Path(__file__).parent / "configs"


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the user's database or census cache."""
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DSPARK_DB", f"sqlite:///{tmp_path / 'kb.sqlite'}")
