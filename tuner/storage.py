"""Optuna storage on the knowledge base's URL: heartbeats that fail a killed worker's trials (and retry them without
what the killed attempt measured), SQLite transactions serialised so that workers never pop one trial twice, and a
new database's tables created by whichever of two tuners gets there first. The storage class itself (worker
identity, a heartbeat that survives the database failing) is tuner/storage_rdb.py."""

from __future__ import annotations

import os
from functools import cache
from typing import Any


def heartbeat_s() -> int:
    """Workers record a heartbeat this often (env DSPARK_HEARTBEAT_S, default 5)."""
    return int(os.environ.get("DSPARK_HEARTBEAT_S", "5"))


def grace_s() -> int:
    """A RUNNING trial silent this long is stale (env DSPARK_HEARTBEAT_GRACE_S, default 15)."""
    return int(os.environ.get("DSPARK_HEARTBEAT_GRACE_S", "15"))


class _RetryStale:
    """Optuna's RetryHeartbeatStaleTrialCallback without what the killed attempt measured: its constraints
    (Optuna would keep them over the retry's own, with a warning) and its user attributes (metrics, feasible)
    describe a run that never finished, and its worker is not the retry's. Parameters and the retry history are
    kept."""

    def __init__(self, max_retry: int) -> None:
        self.max_retry = max_retry

    def __call__(self, study, trial) -> None:
        import optuna

        history = [*trial.system_attrs.get("retry_history", []), trial.number]
        if len(history) > self.max_retry:
            return
        from tuner.worker_identity import ATTR

        attrs = {k: v for k, v in trial.system_attrs.items() if not k.startswith("constraints") and k != ATTR}
        attrs.update(failed_trial=trial.system_attrs.get("failed_trial", trial.number), retry_history=history)
        study.add_trial(optuna.create_trial(state=optuna.trial.TrialState.WAITING, params=trial.params,
                                            distributions=trial.distributions, system_attrs=attrs))


CREATE_ATTEMPTS = 8  # tries to open the storage while another process creates Optuna's tables on a new database


def storage(db_url: str):  # -> optuna.storages.RDBStorage
    """The study storage on `db_url`. Two tuners that open a new database at once both create Optuna's tables
    (create_all checks, then creates: not atomic), and the later one fails with "table ... already exists":
    it retries, and finds the tables the other made."""
    import time
    import warnings

    import optuna

    from tuner.storage_faults import StorageFault, is_storage_fault, reason
    from tuner.storage_rdb import storage_class

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    _quiet_query_fallback()
    kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if db_url.startswith("sqlite") else {
        "pool_pre_ping": True}
    for attempt in range(CREATE_ATTEMPTS):
        try:
            st = storage_class()(db_url, engine_kwargs=kwargs, heartbeat_interval=heartbeat_s(),
                                  grace_period=grace_s(), heartbeat_stale_trial_callback=_RetryStale(max_retry=2))
            break
        except Exception as e:
            from sqlalchemy.exc import IntegrityError, ProgrammingError

            if not (is_storage_fault(e) or isinstance(e, (IntegrityError, ProgrammingError))):
                raise
            if attempt == CREATE_ATTEMPTS - 1:
                from kb.db import _redact

                raise StorageFault(f"cannot open the study storage in {_redact(db_url)}: {reason(e)}; check the "
                                   "database, then run the command again") from None
            time.sleep(0.1 * (attempt + 1))  # another process is creating the tables: let it finish
    if db_url.startswith("sqlite"):
        _serialise_sqlite(st.engine)
    return st


@cache
def _quiet_query_fallback() -> None:
    """Drop Optuna's "Caught an error from sqlalchemy ... Falling back to a slower alternative" warning: it logs any
    OperationalError of a trial query (with its SQL, over many lines) before retrying it, so a database that failed
    printed that text above our one line; when the fallback works it was noise too."""
    import logging

    logging.getLogger("optuna.storages._rdb.storage").addFilter(
        lambda record: not str(record.msg).startswith("Caught an error from sqlalchemy"))


def _serialise_sqlite(engine) -> None:
    """Make every SQLite transaction take the write lock when it begins (BEGIN IMMEDIATE).

    Optuna pops a queued trial by reading its state and then setting it RUNNING; PostgreSQL locks the row
    (SELECT ... FOR UPDATE), SQLite ignores FOR UPDATE and pysqlite begins a transaction only at the first
    write, so two workers could both pop one trial and the second failed with "Cannot tell a COMPLETE trial".
    This is SQLAlchemy's documented recipe for serialisable SQLite transactions."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # pysqlite: leave BEGIN to us

    @event.listens_for(engine, "begin")
    def _begin_immediate(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened by RDBStorage's own set-up predate the listeners


def stop_heartbeats() -> int:
    """Stop this process's Optuna heartbeat threads; returns how many were still running.

    Optuna's heartbeat thread is not a daemon and stops only in its context manager's exit. A Ctrl-C that
    lands inside `Thread.start()` (its wait for the thread to start is interruptible, and under load that
    wait is long) leaves a thread that beats forever and an interpreter that never exits after printing
    "interrupted". The thread's own stop event is in its arguments; setting it ends the loop within one beat."""
    import threading

    from optuna.storages._heartbeat import HeartbeatThread

    n = 0
    for t in threading.enumerate():
        if getattr(t, "_target", None) is HeartbeatThread._record_heartbeat and t.is_alive():
            t._args[2].set()  # (trial_id, heartbeat, stop_event)
            n += 1
    return n
