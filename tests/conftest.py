"""Shared fixtures: a fresh knowledge-base URL on SQLite, and on PostgreSQL when CI provides one."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

# Triton kernels run in the interpreter on CPU; set before anything imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")
from collections.abc import Iterator

import pytest

PG_URL = os.environ.get("DSPARK_TEST_PG_URL")
SLOW = os.environ.get("DSPARK_SLOW_CHECKS") == "1"  # benchmarks/slow_checks.sh: the checks kept out of the suite


def _uses_postgres(item: pytest.Item) -> bool:
    """Whether a test opens the CI PostgreSQL server (marked, or through the pg_url / db_url[postgres] fixtures)."""
    callspec = getattr(item, "callspec", None)
    return ("postgres" in item.keywords or "pg_url" in getattr(item, "fixturenames", ())
            or (callspec is not None and callspec.params.get("db_url") == "postgres"))


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ARG001 - pytest's hook signature
    """Tests marked `slow` (a minute or more, covered in part by faster ones) run only from
    benchmarks/slow_checks.sh, so the README's suite stays within its time. The README runs the suite on two
    pytest-xdist workers (`--dist loadgroup`): every test of the one PostgreSQL server runs on one worker, in
    turn, because one of them restarts that server."""
    group = pytest.mark.xdist_group("postgres")
    skip = pytest.mark.skip(reason="a slow check: bash benchmarks/slow_checks.sh runs it")
    for item in items:
        if _uses_postgres(item):
            item.add_marker(group)
        if "slow" in item.keywords and not SLOW:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_db(tmp_path, monkeypatch) -> None:
    """Never touch the user's real knowledge base from a test."""
    monkeypatch.setenv("DSPARK_DB", f"sqlite:///{tmp_path / 'kb.sqlite'}")
    monkeypatch.delenv("DSPARK_RULES", raising=False)


def _pg_database() -> Iterator[str]:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"dspark_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _pg_or_skip() -> Iterator[str]:
    """A fresh PostgreSQL database's URL: skipped without a server here, a failure under CI (which starts one)."""
    if not PG_URL:
        if os.environ.get("CI"):
            pytest.fail("CI must export DSPARK_TEST_PG_URL (see .ci/run)")
        pytest.skip("no PostgreSQL here: set DSPARK_TEST_PG_URL (CI does)")
    yield from _pg_database()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path) -> Iterator[str]:
    """A URL of an empty database, once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'kb-test.sqlite'}"
        return
    yield from _pg_or_skip()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL of an empty PostgreSQL database (see _pg_or_skip)."""
    yield from _pg_or_skip()


@pytest.fixture(scope="session")
def folder() -> Path:
    """The real pretrained target SmolLM2-135M (`models fetch`): skipped when absent, fetched under CI."""
    import os

    from dspark_core.modeling.models_fetch import fetch, local_folder

    name = "smollm2-135m"
    if local_folder(name) is None:
        if not os.environ.get("CI"):
            pytest.skip(f"{name} not fetched: python cli.py models fetch {name}")
        fetch(name)
    return local_folder(name)
