"""The tuner's RDBStorage: Optuna's, with the worker's identity written in the transaction that makes a trial
RUNNING, a heartbeat that survives the database failing, and no blind retries of a trial's creation on SQLite.

- Identity: a trial never runs without it (tuner/worker_identity.py), so a tuner on this machine fails the trial of
  a dead worker at once; written when `ask` creates a trial and when it pops a queued one (WAITING -> RUNNING).
- Heartbeat: a beat that cannot be written is skipped (the worker's own next write fails the same way and is
  reported as one line, tuner/trial_run.py), instead of the thread dying with a traceback on stderr.
- Creation: Optuna retries a failed trial creation five times with random sleeps (deadlocks between database
  servers' clients); SQLite serialises writers (tuner/storage.py), so there a failure is final, and a full disk
  is reported at once instead of after up to eight seconds of sleeping.

Optuna 5's own code where it is restated here (pinned in pyproject.toml: optuna>=5,<6).
"""

from __future__ import annotations

from functools import cache


@cache
def storage_class():  # -> type[optuna.storages.RDBStorage]
    from datetime import datetime

    from optuna.storages import RDBStorage
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session
    from optuna.trial import FrozenTrial, TrialState
    from sqlalchemy.exc import IntegrityError

    from tuner.storage_faults import is_storage_fault
    from tuner.worker_identity import ATTR, current

    class Storage(RDBStorage):
        def record_heartbeat(self, trial_id: int) -> None:
            try:
                super().record_heartbeat(trial_id)
            except Exception as e:
                if not is_storage_fault(e):
                    raise

        def _identify(self, session, trial_id: int) -> None:  # noqa: ANN001 - a SQLAlchemy session
            self._set_trial_attr_without_commit(session, models.TrialSystemAttributeModel, trial_id, ATTR, current())

        def _get_prepared_new_trial(self, study_id, template_trial, session):  # noqa: ANN001, ANN202
            """A new trial: one that `ask` creates RUNNING gets its worker's identity in the same transaction."""
            trial = super()._get_prepared_new_trial(study_id, template_trial, session)
            if template_trial is None:
                self._identify(session, trial.trial_id)
            return trial

        def _create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> FrozenTrial:
            if not self.url.startswith("sqlite"):
                return super()._create_new_trial(study_id, template_trial)
            with _create_scoped_session(self.scoped_session) as session:  # one attempt: see the module docstring
                models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
                trial = self._get_prepared_new_trial(study_id, template_trial, session)
                if template_trial is not None:
                    import copy

                    frozen = copy.deepcopy(template_trial)
                    frozen.number, frozen.datetime_start, frozen._trial_id = (trial.number, trial.datetime_start,
                                                                             trial.trial_id)
                    return frozen
                return FrozenTrial(number=trial.number, state=trial.state, value=None, values=None,
                                   datetime_start=trial.datetime_start, datetime_complete=None, params={},
                                   distributions={}, user_attrs={}, system_attrs={}, intermediate_values={},
                                   trial_id=trial.trial_id)

        def set_trial_state_values(self, trial_id: int, state: TrialState, values=None) -> bool:  # noqa: ANN001
            """RDBStorage's, plus the worker's identity in the transaction that pops a queued trial."""
            if state != TrialState.RUNNING or values is not None:
                return super().set_trial_state_values(trial_id, state, values)
            try:
                with _create_scoped_session(self.scoped_session) as session:
                    trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
                    self.check_trial_is_updatable(trial_id, trial.state)
                    if trial.state != TrialState.WAITING:
                        return False
                    trial.state = state
                    trial.datetime_start = datetime.now()
                    self._identify(session, trial_id)
            except IntegrityError:
                return False
            return True

    return Storage
