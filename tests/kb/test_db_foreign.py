"""`--db` pointed at another application's database: refused with one line before a byte is written (it used to get
our tables silently); a new path, an empty file and our own databases keep working."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest
from sqlalchemy import create_engine, inspect, text

import cli
from kb.db import open_db
from kb.errors import KBError


def another_apps_file(path) -> str:
    conn = sqlite3.connect(path)
    conn.execute("create table notes (id integer primary key, body text)")
    conn.execute("insert into notes (body) values ('the user''s data')")
    conn.commit()
    conn.close()
    return f"sqlite:///{path}"


def fingerprint(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_another_applications_sqlite_file_is_refused_and_untouched(tmp_path, capsys):
    url = another_apps_file(tmp_path / "app.db")
    before = fingerprint(tmp_path)
    for argv in (["profile", "--model", "qwen3", "--db", url],
                 ["tune", "--model", "qwen3", "--gpu", "h100", "--trials", "1", "--db", url, "--out",
                  str(tmp_path / "b")],
                 ["studies", "list", "--db", url]):
        code = cli.main(argv)
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
        assert "another application" in lines[0] and "notes" in lines[0] and "--db" in lines[0], lines[0]
    assert fingerprint(tmp_path) == before  # same bytes, no -wal / -shm beside it, no bundle


def test_a_new_path_and_an_empty_file_work(tmp_path, capsys):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    for url in (f"sqlite:///{empty}", f"sqlite:///{tmp_path / 'new' / 'kb.sqlite'}"):
        assert cli.main(["profile", "--model", "qwen3", "--db", url]) == 0
        assert open_db(url).revision() is not None


def test_our_database_with_a_table_the_user_added_still_works(tmp_path):
    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    open_db(url).dispose()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("create table my_notes (x integer)"))
    engine.dispose()
    assert cli.main(["profile", "--model", "qwen3", "--db", url]) == 0


def test_a_database_of_only_optuna_studies_is_taken(tmp_path):
    """Optuna's tables share our URL by design (tuner/storage.py): a database holding only them is not foreign."""
    import optuna

    url = f"sqlite:///{tmp_path / 'studies.sqlite'}"
    optuna.create_study(study_name="theirs", storage=url)
    db = open_db(url)
    assert db.revision() is not None
    assert [s.study_name for s in optuna.get_all_study_summaries(url)] == ["theirs"]


def test_foreign_tables_are_refused_on_both_backends(db_url):
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("create table invoices (id integer primary key)"))
    try:
        with pytest.raises(KBError, match=r"did not create \(invoices\).*another application"):
            open_db(db_url)
        with engine.connect() as conn:
            assert inspect(conn).get_table_names() == ["invoices"]  # nothing of ours was created
    finally:
        engine.dispose()
