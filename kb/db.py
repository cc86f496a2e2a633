"""One SQLAlchemy URL for everything: engine + sessions, created and migrated on first use.

Default: a SQLite file in the user's data directory (WAL mode). `--db URL` / $DSPARK_DB select
another, e.g. ``postgresql+psycopg://user@host/db``. Alembic owns the schema: a new database is
created at head, an older one is upgraded, a newer one is refused, another application's is refused untouched
(kb/db_owner.py). A database that fails in use (disk full, server gone) is one KBError line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.exc import (
    ArgumentError,
    DatabaseError,
    IntegrityError,
    InterfaceError,
    NoSuchModuleError,
    OperationalError,
    ProgrammingError,
)
from sqlalchemy.orm import Session, sessionmaker

from kb.db_owner import VERSION_TABLE  # noqa: F401 - re-exported (kb/migrations/env.py)
from kb.errors import KBError

MIGRATIONS = Path(__file__).parent / "migrations"


def default_url() -> str:
    """SQLite file under $XDG_DATA_HOME (or ~/.local/share)/dspark-tune/."""
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "dspark-tune"
    return f"sqlite:///{base / 'kb.sqlite'}"


def resolve_url(url: str | None) -> str:
    return url or os.environ.get("DSPARK_DB") or default_url()


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


@cache
def _alembic_revisions() -> tuple[str, tuple[str, ...]]:
    """(head revision, every known revision) from the migration scripts."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_alembic_config())
    return script.get_current_head() or "", tuple(r.revision for r in script.walk_revisions())


def _alembic_config():  # -> alembic.config.Config
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


@dataclass
class Database:
    """An engine on one URL plus a session factory; use `session()` for one transaction."""

    url: str
    engine: Engine
    sessions: sessionmaker[Session]

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error (nothing half-applied). On SQLite it
        takes the write lock when it begins, so two processes' read-then-write transactions (two tuners syncing the
        rules into a new database) run one after the other instead of both inserting. The database failing (disk
        full, server gone) is one KBError line."""
        with self.sessions() as s:
            try:
                if self.url.startswith("sqlite"):
                    s.connection().exec_driver_sql("BEGIN IMMEDIATE")  # pysqlite would begin at the first write
                yield s
                s.commit()
            except (OperationalError, InterfaceError) as e:
                _rollback(s)
                raise KBError(f"database {_redact(self.url)} failed: {_reason(e)}; {_hint(self.url, _reason(e))}"
                              ) from None
            except BaseException:
                _rollback(s)
                raise

    def revision(self) -> str | None:
        with self.engine.connect() as conn:
            if not inspect(conn).has_table(VERSION_TABLE):
                return None
            return conn.execute(text(f"select version_num from {VERSION_TABLE}")).scalar()

    def migrate(self) -> tuple[str | None, str]:
        """Upgrade to head; returns (revision before, revision after). Refuses a newer database."""
        from alembic import command

        head, known = _alembic_revisions()
        before = self.revision()
        if before is not None and before not in known:
            raise KBError(f"database {_redact(self.url)} has schema revision {before!r}, newer than this "
                          f"dspark-tune knows (head {head!r}); upgrade dspark-tune or use another --db")
        if before != head:
            try:
                with self.engine.begin() as conn:
                    if self.url.startswith("sqlite"):  # the write lock first: a second process opening a new
                        conn.exec_driver_sql("BEGIN IMMEDIATE")  # database waits here, then finds it at head
                    cfg = _alembic_config()
                    cfg.attributes["connection"] = conn
                    command.upgrade(cfg, "head")
            except (OperationalError, ProgrammingError, IntegrityError):
                if not self._migrated_by_another(head):
                    raise
        return before, head

    def _migrated_by_another(self, head: str, wait_s: float = 10.0) -> bool:
        """Whether another process brought the database to `head` (two tuners opening a new database at once both
        migrate it, and the later one's CREATE TABLE fails): waits for the other's migration to commit."""
        import time

        deadline = time.monotonic() + wait_s
        while True:
            try:
                if self.revision() == head:
                    return True
            except (OperationalError, ProgrammingError):
                pass
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def dispose(self) -> None:
        self.engine.dispose()


def _rollback(s: Session) -> None:
    try:
        s.rollback()
    except (OperationalError, InterfaceError):  # the connection is gone: nothing to roll back
        pass


def _reason(e: BaseException) -> str:
    text = str(getattr(e, "orig", e)).strip()
    return " ".join(text.splitlines()[0].split()) if text else type(e).__name__


def _hint(url: str, reason: str) -> str:
    """What to do about a database failure, by what the database said."""
    low = reason.lower()
    if "full" in low or "too large" in low or "no space" in low:
        return "free space on the database's disk, then run the command again"
    if url.startswith("sqlite"):
        if "not a database" in low:
            return "the file is not a valid SQLite database (corrupted?): move it away or pass another --db"
        return "check the file and its folder, or pass another --db"
    return "check that the server is running and the URL is right"


def _refuse_foreign(engine: Engine, shown: str) -> None:
    """One KBError line, before anything is written, when the database is another application's (kb/db_owner.py)."""
    from kb.db_owner import foreign_tables

    foreign = foreign_tables(engine)
    if foreign:
        listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise KBError(f"database {shown} holds tables dspark-tune did not create ({listed}) and no {VERSION_TABLE}: "
                      "it belongs to another application and was left untouched; pass --db with a new file or an "
                      "empty database")


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def _check_writable(engine: Engine, shown: str) -> None:
    """Take SQLite's write lock once: a read-only file, folder or `mode=ro` URL is one line here, not a traceback
    at the first write (file permissions alone say nothing when running as root)."""
    try:
        with engine.connect() as conn:  # rewrite the header's user_version with its own value, then roll back
            version = conn.exec_driver_sql("PRAGMA user_version").scalar()
            conn.exec_driver_sql(f"PRAGMA user_version = {int(version or 0)}")
            conn.rollback()
    except OperationalError as e:
        reason = str(getattr(e, "orig", e)).strip().splitlines()[0]
        if "readonly" in reason or "read-only" in reason or "unable to open" in reason:
            raise KBError(f"database {shown} is not writable ({reason}); dspark-tune stores profiles, plans and "
                          "studies in it: fix its permissions or pass another --db") from None
        raise


LOCKED_RETRIES = 5  # opens of a SQLite file another process is creating or migrating, before giving up


class _Locked(Exception):
    """SQLite answered `database is locked` while opening: a lock its busy handler does not wait for (a read that
    must become a write while another connection commits, WAL's busy snapshot), which only a retry resolves."""


def open_db(url: str | None = None, migrate: bool = True) -> Database:
    """Connect to the knowledge base, creating and migrating it on first use.

    Every failure a user can cause (bad URL, unreachable server, corrupted file, newer schema)
    becomes a one-line KBError naming the database and what to do. Two processes opening a new SQLite file at once
    can meet a lock no timeout waits for: the open is retried, LOCKED_RETRIES times with a growing pause.
    """
    import time

    for attempt in range(LOCKED_RETRIES - 1):
        try:
            return _open_once(url, migrate, last=False)
        except _Locked:
            time.sleep(0.25 * (attempt + 1))
    return _open_once(url, migrate, last=True)


def _open_once(url: str | None, migrate: bool, last: bool) -> Database:
    """One open_db attempt; _Locked (unless `last`) where SQLite says the database is locked."""
    url = resolve_url(url)
    shown = _redact(url)
    try:
        if url.startswith("sqlite"):
            path = url.split("///", 1)[1] if "///" in url else ""
            if path.startswith("file:"):  # SQLite URI filename (?mode=ro&uri=true): the path is between file: and ?
                path = path[len("file:"):].split("?", 1)[0]
            if path and path != ":memory:":
                try:
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise KBError(f"cannot create the folder for {shown}: {e.strerror}; pass --db with a "
                                  "writable path") from None
            engine = create_engine(url, connect_args={"timeout": 30})  # pragmas after the ownership check
        else:
            engine = create_engine(url, pool_pre_ping=True)
    except (ArgumentError, NoSuchModuleError) as e:
        raise KBError(f"invalid database URL {shown!r}: {str(e).splitlines()[0]}; use e.g. "
                      "sqlite:///path/kb.sqlite or postgresql+psycopg://user@host/db") from None
    except ModuleNotFoundError as e:
        raise KBError(f"database driver {e.name!r} for {shown} is not installed; pip install "
                      "'dspark-tune[postgres]' for PostgreSQL") from None
    db = Database(url, engine, sessionmaker(engine, expire_on_commit=False))
    try:
        _refuse_foreign(engine, shown)
        if url.startswith("sqlite"):
            engine.dispose()  # the check's connection predates the pragmas
            event.listen(engine, "connect", _sqlite_pragmas)
        if migrate:
            db.migrate()
        else:
            db.revision()
        if url.startswith("sqlite"):
            _check_writable(engine, shown)
    except KBError:
        engine.dispose()
        raise
    except (OperationalError, DatabaseError) as e:
        engine.dispose()
        reason = _reason(e)
        if url.startswith("sqlite") and "database is locked" in reason and not last:
            raise _Locked(reason) from None
        raise KBError(f"cannot use database {shown}: {reason}; {_hint(url, reason)}") from None
    return db
