"""Whose database a `--db` URL names: dspark-tune's, a new one, or another application's (refused, untouched).

Opening a database migrates it, so pointing `--db` at another application's SQLite file used to add our tables to it
silently. A database is ours when it has our schema version table (`kb_schema_version`); one without it is taken
only when every table it has is one we create: the knowledge base's or Optuna's (studies share the URL by design,
tuner/storage.py), so an empty file, a new path and a database whose first migration was interrupted still work.
Anything else is refused before a single byte is written (checked before SQLite's WAL switch, which rewrites the
file header).
"""

from __future__ import annotations

from sqlalchemy import Engine, inspect

VERSION_TABLE = "kb_schema_version"  # our Alembic version table; Optuna's storage owns `alembic_version`
OPTUNA_VERSION_TABLES = {"alembic_version", "version_info"}


def _kb_tables() -> set[str]:
    import kb.models
    import kb.models_kernels
    import kb.models_live  # noqa: F401 - each registers its tables on Base

    return set(kb.models.Base.metadata.tables) | {VERSION_TABLE}


def _optuna_tables() -> set[str]:
    from optuna.storages._rdb import models

    return set(models.BaseModel.metadata.tables) | OPTUNA_VERSION_TABLES


def foreign_tables(engine: Engine) -> list[str]:
    """The tables of `engine`'s database that mark it as another application's (sorted; empty: it may be used)."""
    with engine.connect() as conn:
        names = {n for n in inspect(conn).get_table_names() if not n.startswith("sqlite_")}
        conn.rollback()
    if not names or VERSION_TABLE in names:
        return []
    unknown = names - _kb_tables()
    if unknown:
        unknown -= _optuna_tables()  # imported only when needed: Optuna is slow to import
    return sorted(unknown)
