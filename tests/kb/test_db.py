"""The knowledge base on SQLite and PostgreSQL: migrations, sync, storage (one parametrised module)."""

from __future__ import annotations

import pytest
from sqlalchemy import select, text

from kb.db import open_db
from kb.errors import KBError
from kb.loader import load_rules
from kb.match import match_profile
from kb.models import RuleRow, RuleVersionRow
from kb.store import get_plan, get_profile, latest_profile, save_plan, save_profile
from kb.sync import enabled_rules, sync_rules
from profiler.schema import Profile
from tests.kb.helpers import rule, write_rules

RULES = [
    rule("spec.a", [{"param": "spec.block_size", "range": [4, 16], "prefer": 7}],
         when={"field": "hw.arch", "eq": "hopper"}),
    rule("spec.b", [{"param": "spec.head", "choices": ["markov", "rnn"]}]),
]


def test_fresh_database_is_created_at_head(db_url):
    db = open_db(db_url)
    assert db.revision() == "0001" or db.revision() is not None
    before, after = db.migrate()
    assert before == after  # second migrate is a no-op
    db.dispose()


def test_sync_is_idempotent_versions_and_disables(db_url, tmp_path):
    folder = write_rules(tmp_path / "rules", RULES)
    db = open_db(db_url)
    first = sync_rules(db, load_rules(folder))
    assert sorted(first.added) == ["spec.a", "spec.b"]
    again = sync_rules(db, load_rules(folder))
    assert not again.touched and again.unchanged == 2

    changed = [dict(RULES[0], title="Changed title"), RULES[1]]
    write_rules(folder, changed)
    report = sync_rules(db, load_rules(folder))
    assert report.changed == ["spec.a"]
    with db.session() as s:
        row = s.get(RuleRow, "spec.a")
        assert row.version == 2 and row.title == "Changed title"
        versions = s.scalars(select(RuleVersionRow.version).where(RuleVersionRow.rule_id == "spec.a")).all()
        assert sorted(versions) == [1, 2]

    write_rules(folder, [RULES[1]])
    report = sync_rules(db, load_rules(folder))
    assert report.disabled == ["spec.a"]
    assert [r.rule.id for r in enabled_rules(db)] == ["spec.b"]
    with db.session() as s:
        assert s.get(RuleRow, "spec.a") is not None  # disabled, not deleted
    write_rules(folder, changed)
    assert sync_rules(db, load_rules(folder)).reenabled == ["spec.a"]
    db.dispose()


def test_sync_is_all_or_nothing(db_url, tmp_path, monkeypatch):
    folder = write_rules(tmp_path / "rules", RULES)
    db = open_db(db_url)
    loaded = load_rules(folder)

    import kb.sync as sync

    calls = {"n": 0}
    real = sync.RuleVersionRow

    def exploding(**kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("disk full")
        return real(**kw)

    monkeypatch.setattr(sync, "RuleVersionRow", exploding)
    with pytest.raises(RuntimeError):
        sync_rules(db, loaded)
    monkeypatch.undo()
    with db.session() as s:
        assert s.scalars(select(RuleRow)).all() == []  # nothing half-applied
    db.dispose()


def test_profiles_and_plans_round_trip(db_url, tmp_path):
    db = open_db(db_url)
    sync_rules(db, load_rules(write_rules(tmp_path / "rules", RULES)))
    p1 = Profile.model_validate({"hw": {"name": "H100-SXM", "arch": "hopper"}})
    p2 = Profile.model_validate({"hw": {"name": "A100-80GB", "arch": "ampere"}})
    id1 = save_profile(db, p1)
    id2 = save_profile(db, p2)
    assert id1 != id2 and latest_profile(db)[0] == id2
    assert save_profile(db, p1) == id1  # same content, same row; it becomes the latest
    assert latest_profile(db)[0] == id1
    assert get_profile(db, id1) == p1
    plan = match_profile(enabled_rules(db), p1)
    plan_id = save_plan(db, id1, plan.model_dump(mode="json"), plan.rule_refs())
    stored = get_plan(db, plan_id)
    assert stored["profile_id"] == id1 and stored["space"]["spec.block_size"]["low"] == 4
    assert {r["id"] for r in stored["rule_ids"]} == {"spec.a", "spec.b"}
    with pytest.raises(KBError, match="no stored profile with id 999"):
        get_profile(db, 999)
    db.dispose()


def test_newer_database_is_refused(db_url):
    db = open_db(db_url)
    with db.engine.begin() as conn:
        conn.execute(text("update kb_schema_version set version_num = '9999_future'"))
    db.dispose()
    with pytest.raises(KBError, match="newer than this dspark-tune"):
        open_db(db_url)


def test_older_database_is_upgraded(db_url):
    """A database at an older revision (simulated: an empty schema) is brought to head on open."""
    db = open_db(db_url, migrate=False)
    assert db.revision() is None
    before, after = db.migrate()
    assert before is None and after == db.revision()
    db.dispose()


def test_a_read_only_database_is_one_line(tmp_path, capsys):
    import cli

    path = tmp_path / "kb.sqlite"
    assert cli.main(["profile", "--model", "qwen3", "--db", f"sqlite:///{path}"]) == 0
    capsys.readouterr()
    ro = f"sqlite:///file:{path}?mode=ro&uri=true"  # permissions say nothing to root; SQLite's own read-only mode
    assert cli.main(["profile", "--model", "qwen3", "--db", ro]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: database") and "not writable" in err and "\n" not in err


def test_a_database_another_process_holds_locked_is_opened_again(tmp_path, monkeypatch):
    """`database is locked` while opening (a lock SQLite's busy handler does not wait for, as two tuners creating one
    file meet it) is retried; only the last attempt's lock is a one-line error."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    import kb.db as kdb

    monkeypatch.setattr("time.sleep", lambda _s: None)
    real, calls = kdb._check_writable, []

    def locked(engine, shown):  # noqa: ANN001, ANN202
        calls.append(shown)
        if len(calls) <= fails:
            raise OperationalError("PRAGMA user_version = 1", {}, sqlite3.OperationalError("database is locked"))
        return real(engine, shown)

    monkeypatch.setattr(kdb, "_check_writable", locked)
    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    fails = 2
    kdb.open_db(url).engine.dispose()
    assert len(calls) == 3
    calls.clear()
    fails = kdb.LOCKED_RETRIES
    with pytest.raises(KBError, match="database is locked"):
        kdb.open_db(url)
    assert len(calls) == kdb.LOCKED_RETRIES
