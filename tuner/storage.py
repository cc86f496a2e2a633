"""Optuna storage on the knowledge base's URL: heartbeats that fail a killed worker's trials (and retry them without
what the killed attempt measured), and SQLite transactions serialised so that workers never pop one trial twice."""

from __future__ import annotations

import os
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
    describe a run that never finished. Parameters and the retry history are kept."""

    def __init__(self, max_retry: int) -> None:
        self.max_retry = max_retry

    def __call__(self, study, trial) -> None:
        import optuna

        history = [*trial.system_attrs.get("retry_history", []), trial.number]
        if len(history) > self.max_retry:
            return
        attrs = {k: v for k, v in trial.system_attrs.items() if not k.startswith("constraints")}
        attrs.update(failed_trial=trial.system_attrs.get("failed_trial", trial.number), retry_history=history)
        study.add_trial(optuna.create_trial(state=optuna.trial.TrialState.WAITING, params=trial.params,
                                            distributions=trial.distributions, system_attrs=attrs))


def storage(db_url: str):  # -> optuna.storages.RDBStorage
    import warnings

    import optuna
    from optuna.storages import RDBStorage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if db_url.startswith("sqlite") else {
        "pool_pre_ping": True}
    st = RDBStorage(db_url, engine_kwargs=kwargs, heartbeat_interval=heartbeat_s(), grace_period=grace_s(),
                    heartbeat_stale_trial_callback=_RetryStale(max_retry=2))
    if db_url.startswith("sqlite"):
        _serialise_sqlite(st.engine)
    return st


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
