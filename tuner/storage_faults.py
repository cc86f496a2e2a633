"""A study database that fails mid-study (disk full, file size limit, server restarted or gone): one line, not a
traceback from inside Optuna.

Optuna's `study.optimize` hides such a failure behind its own: when it cannot store a trial's result it re-reads
the trial and asserts on its state ("AssertionError: Should not reach." on SQLite, "UnboundLocalError:
updated_state" when the re-read fails too, as after a PostgreSQL restart). The tuner runs its trials itself
(tuner/trial_run.py) and turns any storage failure into `StorageFault`, a TunerError: the CLI prints it as one
line and exits 2 (a problem of the user's environment the user can fix, like the CLI's other user errors).
"""

from __future__ import annotations

import errno

from tuner.errors import TunerError


class StorageFault(TunerError):
    """The study's database failed; completed trials are kept and the study resumes once it works again."""


def _chain(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while e is not None and e not in out:
        out.append(e)
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return out


def is_storage_fault(e: BaseException) -> bool:
    """Whether `e` (or what caused it) is the database failing rather than a bug or a bad value."""
    import sqlite3

    from optuna.exceptions import StorageInternalError
    from sqlalchemy import exc

    kinds = (exc.OperationalError, exc.InterfaceError, exc.InternalError, exc.DisconnectionError,
             exc.PendingRollbackError, exc.TimeoutError, StorageInternalError, sqlite3.OperationalError,
             sqlite3.InterfaceError, sqlite3.DatabaseError)
    for x in _chain(e):
        if isinstance(x, kinds):
            return True
        if isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO):
            return True
    return False


def reason(e: BaseException) -> str:
    """The database's own words for the failure, one line (the innermost driver message)."""
    from optuna.exceptions import StorageInternalError

    for x in reversed(_chain(e)):
        if isinstance(x, StorageInternalError):
            continue
        text = str(getattr(x, "orig", None) or x).strip()
        if any(c.isalpha() for c in text):  # some wrappers say only "()"
            return " ".join(text.splitlines()[0].split())[:200]
    return type(e).__name__


def full(e: BaseException) -> bool:
    """Whether the failure is a full disk or a file size limit (waiting does not help)."""
    words = reason(e).lower()
    return any(w in words for w in ("full", "too large", "no space", "quota")) or any(
        isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) for x in _chain(e))


def lost_connection(e: BaseException) -> bool:
    """Whether the failure is the connection to a database server (restarted, gone): worth retrying shortly."""
    words = reason(e).lower()
    return any(w in words for w in ("connect", "server", "terminat", "shutdown", "closed", "refused", "timeout"))


def hint(e: BaseException) -> str:
    if full(e):
        return "free space on the database's disk (or raise the file size limit)"
    words = reason(e).lower()
    if lost_connection(e):
        return "check that the database server is up"
    if "i/o" in words:
        return "check the database's disk (full, a file size limit, or failing)"
    return "check the database"
