"""One trial, run the way `study.optimize(objective, n_trials=1, catch=())` runs it, but safe when the database fails
and with the worker's identity on the trial.

- The trial carries who runs it (tuner/worker_identity.py, written by tuner/storage.py in the transaction that makes
  it RUNNING), so a tuner on the same machine fails it at once when that process is gone (`fail_dead`) instead of
  counting it as running until its heartbeat goes stale.
- A database failure at any point (disk full, file size limit, server restarted) becomes one StorageFault line
  (tuner/storage_faults.py) after the trial is marked failed where the database still takes that; where it does
  not (a full disk), the trial stays RUNNING with its worker's identity and the next `tune` here fails it at once.
- Objective errors propagate as they do from Optuna (the trial is failed first); a pruned trial is PRUNED.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tuner.storage_faults import StorageFault, hint, is_storage_fault, lost_connection, reason
from tuner.worker_identity import ATTR, RUNNING_HERE, gone

FAIL_RETRY_S = 10.0  # how long a trial's FAIL is retried after a connection fault (a server restart takes seconds)


def fail_dead(study: Any) -> int:
    """Fail the study's RUNNING trials whose worker is gone: those of this machine whose process no longer exists
    (at once), and any whose heartbeat is stale (Optuna's rule, for other machines). Each is retried like a
    heartbeat-stale trial (tuner/storage.py `_RetryStale`). Returns how many this call failed by identity."""
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    with warnings.catch_warnings():  # as Optuna's optimize calls it: its experimental tag is no news
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    storage = study._storage
    retry = storage.get_heartbeat_stale_trial_callback() if hasattr(storage, "get_heartbeat_stale_trial_callback") \
        else None
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not gone(t.system_attrs.get(ATTR), t._trial_id):
            continue
        try:
            if not storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                continue
        except UpdateFinishedTrialError:  # another process failed it first
            continue
        n += 1
        if retry is not None:
            retry(study, copy.deepcopy(storage.get_trial(t._trial_id)))
    return n


def _fail_quietly(study: Any, trial_id: int, fault: BaseException) -> bool:
    """Mark the trial FAIL after a database fault; True when the database took it. A lost server connection is
    retried for a few seconds (a restarted server is back by then); anything else (a full disk) is tried once."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    deadline = time.monotonic() + (FAIL_RETRY_S if lost_connection(fault) else 0.0)
    while True:
        try:
            study._storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
            return True
        except UpdateFinishedTrialError:
            return True
        except Exception as e:
            if not is_storage_fault(e) or time.monotonic() >= deadline:
                return False
            time.sleep(0.5)


def _fail_orphans(study: Any) -> None:
    """After a fault inside ask(): the trial it had created is RUNNING with this process's identity but runs
    nowhere; fail it (and any dead worker's) once the server is back, retried for FAIL_RETRY_S."""
    deadline = time.monotonic() + FAIL_RETRY_S
    while True:
        try:
            fail_dead(study)
            return
        except Exception as e:
            if not is_storage_fault(e) or time.monotonic() >= deadline:
                return
            time.sleep(0.5)


def fault_line(study_name: str, e: BaseException, trial_number: int | None = None, stored: bool = True) -> str:
    """The one line a database fault ends the study with: what failed, what happened to the trial, what to do."""
    where = f" during trial {trial_number}" if trial_number is not None else ""
    if trial_number is None:
        trial = ""
    elif stored:
        trial = f"trial {trial_number} is marked failed; "
    else:
        trial = f"trial {trial_number} could not be marked failed: the next tune of this study fails it; "
    return (f"study {study_name}: the database failed{where} ({reason(e)}); {trial}completed trials are kept: "
            f"{hint(e)}, then resume with --study {study_name}")


@contextmanager
def quiet_interrupts() -> Iterator[None]:
    """Ctrl-C during a trial without Optuna's log of it: Optuna logs a trial stopped by KeyboardInterrupt as a
    failure with the whole traceback, twice per process; the CLI says "interrupted" in one line instead (the
    trial is failed either way). SIGINT first silences Optuna's warnings, then interrupts as Python does."""
    import signal
    import threading

    import optuna

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(_sig, _frame) -> None:
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextmanager
def faults_as_one_line(study_name: str) -> Iterator[None]:
    """Turn a database fault raised anywhere inside (reading trials, enqueueing the screen's moves) into one
    StorageFault line."""
    try:
        yield
    except StorageFault:
        raise
    except Exception as e:
        if is_storage_fault(e):
            raise StorageFault(fault_line(study_name, e)) from None
        raise


def run_trial(study: Any, objective: Callable[[Any], Any],
              callbacks: list[Callable[[Any, Any], None]] | None = None) -> Any:
    """Ask, evaluate and tell one trial (the oldest queued one first, as Optuna does); returns it frozen."""
    looping = study._thread_local.in_optimize_loop
    study._thread_local.in_optimize_loop = True  # what Optuna's optimize sets: ask() then expects the heartbeat
    try:
        return _run(study, objective, callbacks)
    finally:
        study._thread_local.in_optimize_loop = looping


def _run(study: Any, objective: Callable[[Any], Any], callbacks: list[Callable[[Any, Any], None]] | None) -> Any:
    import optuna
    from optuna.storages._heartbeat import get_heartbeat_thread
    from optuna.trial import TrialState

    try:
        with faults_as_one_line(study.study_name):
            fail_dead(study)
            trial = study.ask()
    except StorageFault:
        _fail_orphans(study)
        raise
    tid = trial._trial_id
    RUNNING_HERE.add(tid)
    error: BaseException | None = None
    try:
        try:
            with get_heartbeat_thread(tid, study._storage):
                try:
                    values, state = objective(trial), TrialState.COMPLETE
                except optuna.TrialPruned:
                    values, state = None, TrialState.PRUNED
                except (Exception, KeyboardInterrupt) as e:
                    values, state, error = None, TrialState.FAIL, e
            # skip_if_finished: a trial another worker failed meanwhile (its heartbeat went stale while this one could
            # not write) keeps that state and its retry; this result is dropped instead of raising
            study.tell(trial, values, state=state, skip_if_finished=True)
        except Exception as e:
            if not is_storage_fault(e):
                raise
            raise StorageFault(fault_line(study.study_name, e, trial.number, _fail_quietly(study, tid, e))) from None
        if error is not None and is_storage_fault(error):  # the objective's own writes failed; the trial is FAIL
            raise StorageFault(fault_line(study.study_name, error, trial.number)) from None
        if error is not None:
            raise error
        with faults_as_one_line(study.study_name):
            frozen = study._storage.get_trial(tid)
            for callback in callbacks or []:
                callback(study, copy.deepcopy(frozen))
        return frozen
    finally:
        RUNNING_HERE.discard(tid)
