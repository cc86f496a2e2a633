"""Study lifecycle on the knowledge base's own database (Optuna RDBStorage on the same URL).

Everything a worker needs to rebuild the objective (profile, plan, mode, objectives, SLOs) is
stored in the study's user attributes, so a study resumes by name after Ctrl-C or kill -9, several
processes (`--workers N`) or machines (one PostgreSQL URL) work on it together, and `export`
re-exports it later. RUNNING trials of a killed worker are failed and retried: at once when the worker ran on
this machine (tuner/worker_identity.py), else by Optuna's heartbeat; completed trials are committed one by one and
never lost. The database failing mid-study (disk full, server restarted) ends the run with one line and leaves the
study consistent (tuner/trial_run.py, tuner/storage_faults.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from kb.match import Plan
from profiler.schema import Profile
from tuner.errors import TunerError
from tuner.objective import OBJECTIVES, Evaluator, SimulateEvaluator
from tuner.space import SearchSpace, closed_loop_clients, methods_decide, space_from_plan
from tuner.storage import _RetryStale, grace_s, heartbeat_s, stop_heartbeats, storage  # noqa: F401 - the study's storage, re-exported
from tuner.study_guards import beyond_target, enqueued_twice, measured_twice  # noqa: F401 - re-exported
from tuner.trial_run import fail_dead, faults_as_one_line, quiet_interrupts, run_trial

ROOT = Path(__file__).resolve().parent.parent
SPEC_ATTR = "dspark_spec"


class StudySpec(BaseModel):
    """How to rebuild a study's objective in any process (stored with the study)."""

    profile: dict[str, Any]  # the Profile as JSON
    profile_id: int | None = None
    plan: dict[str, Any]  # the kb Plan as JSON
    plan_id: int | None = None
    mode: Literal["simulate", "measure", "live"] = "simulate"
    cost: Literal["roofline", "aic"] = "roofline"  # simulate: what prices a forward (tuner/perf.py, tuner/aic.py)
    objectives: list[str] = ["throughput", "tpot_p99"]
    slo_ttft_ms: float | None = None  # p99 TTFT limit (constraint)
    slo_tpot_ms: float | None = None  # p99 TPOT limit (constraint)
    seed: int = 0
    n_requests: int | None = None  # simulated requests per trial (None: 6 x concurrency, 48..384)
    trial_seconds: float = 60.0  # measure mode: a trial's generation stops after this long (figures cover what ran)
    trial_tokens: int = 48  # measure mode: new tokens each of a trial's requests generates
    compile: bool = False  # measure mode: trials run compiled decode / verify steps, and dspark.yaml exports them
    start_dtype: str | None = None  # measure mode on a CPU: the weights dtype the screen starts from (measured faster)
    tool_version: str = ""
    # live (tune --engine): the serving engine launched per trial and how it is driven
    engine: str | None = None  # tuner/live/engines.py ENGINES: dspark, vllm, sglang
    engine_python: str | None = None  # the interpreter that has the engine (None: found on PATH)
    engine_version: str | None = None  # what the study found and measured (checked again on resume)
    draft: str | None = None  # the autoregressive draft model of `spec.method: draft_model`
    live_concurrency: int | None = None  # closed-loop clients (None: the profiled concurrency)
    live_requests: int | None = None  # requests per trial (None: 3 x clients, at least 16)
    live_max_tokens: int | None = None  # cap on each request's output tokens (None: the workload's lengths)
    live_load: Literal["closed", "sweep"] = "closed"  # closed loop, or then open-loop rates (throughput at SLO)
    startup_seconds: float = 600.0  # a server not healthy after this long is a failed trial
    hot_trials: int = 2  # live, after the screen: trials that vary only hot settings on each newly started server
    prior: dict[str, Any] | None = None  # live: the simulated optimum of the same space, run after trial 0
    calibration: dict[str, Any] | None = None  # simulate: live trials' time scale on this hardware (scale, source)
    deploy: Literal["sglang", "vllm", "both", "dspark"] | None = None  # engines the bundle is for (None: stored before
    # it; dspark: the bundled engine only)
    cluster: dict[str, Any] | None = None  # tune --serving: the deployment this study tuned a server of (cluster_tune)

    def profile_model(self) -> Profile:
        return Profile.model_validate(self.profile)

    def identity(self) -> dict[str, Any]:
        """What makes two specs the same study: the model, the hardware by name and count, the workload as
        profiled, the plan and (simulated: a new measurement of it is a new study) the acceptance; not the figures a
        measurement of this machine moves from run to run (measured bandwidth, a CPU's entropy), so resuming a
        measured study re-profiles without a false mismatch."""
        p = self.profile_model()
        wl = p.workload.model_dump(mode="json", exclude={"entropy"})
        hw = {"name": p.hw.name, "arch": p.hw.arch, "count": p.hw.count}
        accept = {"accept": p.accept.model_dump(mode="json")} if self.mode == "simulate" else {}
        planned = {"cluster": self.cluster} if self.cluster else {}
        return {"model": p.model.model_dump(mode="json"), "hw": hw, "workload": wl, "plan": self.plan, **accept,
                **planned}

    def decode_worker(self) -> bool:
        """The study tunes a disaggregated deployment's decode worker (its prompts arrive prefilled)."""
        return bool(self.cluster) and self.cluster["chosen"]["mode"] == "disagg"

    def plan_model(self) -> Plan:
        return Plan.model_validate(self.plan)

    def space(self) -> SearchSpace:
        """The searched space: kernel knobs only when measuring on a GPU, where they can be observed."""
        profile, plan = self.profile_model(), self.plan_model()
        gpu_measure = self.mode == "measure" and profile.hw.arch not in (None, "cpu")
        space = methods_decide(space_from_plan(plan, tune_kernels=gpu_measure), plan)
        space.running_cap = 0 if self.mode == "live" else closed_loop_clients(profile.workload)
        if self.mode == "measure":  # the bundled engine runs: plain, n-gram, suffix, DSpark and the hybrid
            from tuner.bundled_methods import has_corpus, measured_space
            from tuner.engine_config import model_ref

            space = measured_space(space, self.deploy, plan, profile.drafter.block_size, has_corpus(model_ref(profile)))
            if self.start_dtype and "weights.dtype" in space.distributions:  # tuner/measure.py start_dtype
                space.warm_start["weights.dtype"] = self.start_dtype
            return space
        from tuner.deploy import restrict
        from tuner.live.space import engine_space

        if self.mode == "live":  # what the measured engine runs, and the bundle's engines too
            return restrict(engine_space(space, self), self.deploy)
        from tuner.space import fixed_at_start, with_plain

        if self.cost != "aic":  # the roofline prices a MoE server as TP whatever its EP (tuner/perf.py)
            space = fixed_at_start(space, ("parallel.ep",))
        chosen = profile.drafter.chosen  # an explicit --drafter is the method the user asked for
        return restrict(space, self.deploy) if chosen not in (None, "auto") else with_plain(restrict(space,
                                                                                                   self.deploy))


def directions(objectives: list[str]) -> list[str]:
    unknown = [o for o in objectives if o not in OBJECTIVES]
    if unknown:
        raise TunerError(f"unknown objective {unknown[0]!r}; choose from {', '.join(OBJECTIVES)}")
    return [OBJECTIVES[o][1] for o in objectives]


def make_evaluator(spec: StudySpec) -> Evaluator:
    if spec.mode == "simulate":
        return SimulateEvaluator(spec.profile_model(), n_requests=spec.n_requests, cost=spec.cost,
                                 calibration=spec.calibration, decode_only=spec.decode_worker())
    if spec.mode == "live":
        from tuner.live.evaluator import LiveEvaluator

        return LiveEvaluator(spec)
    from tuner.measure import MeasureEvaluator

    return MeasureEvaluator(spec.profile_model(), max_new_tokens=spec.trial_tokens, trial_limit_s=spec.trial_seconds,
                            compile=spec.compile)


NAME_MAX = 128  # study names: Optuna's column holds 512 characters on every backend; ours stay well inside it


def check_name(name: str) -> str:
    """A study name the database, the shell and `export --study` all take: one line TunerError otherwise."""
    if not name or len(name) > NAME_MAX or not name.isprintable() or name != name.strip():
        shown = repr(name[:40] + ("..." if len(name) > 40 else ""))
        raise TunerError(f"--study {shown}: a study name is 1 to {NAME_MAX} printable characters without "
                         "leading or trailing spaces")
    return name


def _join_new(st, name: str, spec: StudySpec):  # -> optuna.Study
    """A study another process is creating: wait until its spec is stored, then check it is the same study."""
    import optuna

    for _ in range(50):
        study = optuna.load_study(study_name=name, storage=st)
        if SPEC_ATTR in study.user_attrs:
            return open_study_checked(study, name, spec)
        time.sleep(0.1)
    raise TunerError(f"study {name!r} was created by another process that never stored its settings; "
                     "pick another --study name")


def open_study_checked(study, name: str, spec: StudySpec | None):  # -> optuna.Study
    stored = StudySpec.model_validate(study.user_attrs[SPEC_ATTR])
    if spec is not None and (spec.identity() != stored.identity() or spec.mode != stored.mode
                             or spec.objectives != stored.objectives):
        raise TunerError(f"study {name!r} exists with another profile, mode or objectives; resume it "
                         "with --study and no --model/--gpu/--objective, or pick a new --study name")
    if spec is not None and spec.mode == "simulate" and spec.cost != stored.cost:
        raise TunerError(f"study {name!r} was simulated with the {stored.cost} cost model, this run would use "
                         f"{spec.cost}; resume it with --cost {stored.cost} or pick a new --study name")
    return study


def open_study(db_url: str, name: str, spec: StudySpec | None):  # -> optuna.Study
    """Load study `name`, or create it from `spec` (warm start enqueued once, here)."""
    import optuna

    check_name(name)
    st = storage(db_url)
    names = {s.study_name for s in optuna.get_all_study_summaries(st)}
    if name in names:
        study = optuna.load_study(study_name=name, storage=st)
        if SPEC_ATTR not in study.user_attrs:
            if spec is None:
                raise TunerError(f"study {name!r} was not made by dspark-tune (no settings stored); pick another")
            return _join_new(st, name, spec)
        return open_study_checked(study, name, spec)
    if spec is None:
        raise TunerError(f"no study named {name!r} in this database; list them with 'dspark studies list'")
    try:
        study = optuna.create_study(study_name=name, storage=st, directions=directions(spec.objectives))
    except optuna.exceptions.DuplicatedStudyError:  # another process created it a moment ago: join it
        return _join_new(st, name, spec)
    study.set_metric_names([OBJECTIVES[o][2] for o in spec.objectives])  # what optuna-dashboard shows
    study.set_user_attr(SPEC_ATTR, spec.model_dump(mode="json"))
    space = spec.space()
    if space.distributions:
        from tuner.design import start_point

        first = start_point(space)
        study.enqueue_trial(first, skip_if_exists=True)  # trial 0: the rules' preferred point
        method = space.distributions.get("spec.method")
        if spec.mode == "simulate" and method is not None and "plain" in method.choices and \
                first.get("spec.method") != "plain":  # trial 1: the same without speculation, which may win
            study.enqueue_trial({**first, "spec.method": "plain"}, skip_if_exists=True)
        if spec.cluster:  # trial 2: the server the cluster plan priced (tune --serving)
            from tuner.cluster_tune import planned_point

            study.enqueue_trial(planned_point(space, spec.cluster, first), skip_if_exists=True)
    return study


LIVE_ATTRS = ("engine", "devices", "predicted", "startup_s", "server_starts", "reused_server", "fail_kind",
              "server_log", "sweep", "server_key", "same_server", "reconfigured", "reconfigure_failed")
INFEASIBLE = 1e3  # constraint value of a configuration that does not run: worse than any relative SLO miss


def slo_constraints(ev: Any, slo_tpot_ms: float | None, slo_ttft_ms: float | None) -> dict[str, float]:
    """Optuna constraint values (<= 0 is met) of one evaluation.

    SLO misses are relative to their limit (p99 / limit - 1), so a TTFT and a TPOT miss add up on one
    scale and TPE (which ranks infeasible trials by the sum of positive constraints) and the screen can
    tell a near miss from a far one; a configuration that does not run at all is INFEASIBLE."""
    if not ev.feasible:
        return {"feasible": INFEASIBLE}
    out = {"feasible": 0.0}
    if slo_tpot_ms:
        out["slo_tpot"] = ev.metrics["tpot_p99_ms"] / slo_tpot_ms - 1.0
    if slo_ttft_ms:
        out["slo_ttft"] = ev.metrics["ttft_p99_ms"] / slo_ttft_ms - 1.0
    return out


def objective_fn(space: SearchSpace, evaluator: Evaluator, spec: StudySpec, target: int | None = None
                 ) -> Callable[[Any], Any]:
    def objective(trial) -> Any:
        import optuna

        if target is not None and beyond_target(trial, target):
            raise optuna.TrialPruned(f"the study already holds its {target} trials")
        twin = enqueued_twice(trial, set(space.distributions))
        if twin is not None:
            raise optuna.TrialPruned(f"trial {twin} already runs this enqueued configuration")
        params = space.suggest(trial)
        if spec.mode == "live":  # servers in parallel (--devices): no two measure one configuration
            same = measured_twice(trial, target)
            if same is not None:
                trial.set_user_attr("duplicate_of", same)
                raise optuna.TrialPruned(f"trial {same} measures this configuration")
        ev = evaluator.evaluate(params, seed=spec.seed)
        trial.set_user_attr("mode", evaluator.mode)
        trial.set_user_attr("feasible", ev.feasible)
        if ev.extra.get("cost_source"):  # what priced this trial's forwards (aic:..., roofline, measured)
            trial.set_user_attr("cost_source", ev.extra["cost_source"])
        for key in LIVE_ATTRS:  # a live trial: the engine, its start, the simulator's prediction, a failure's kind
            if key in ev.extra:
                trial.set_user_attr(key, ev.extra[key])
        for key, value in slo_constraints(ev, spec.slo_tpot_ms, spec.slo_ttft_ms).items():
            trial.set_constraint(key, value)
        if not ev.feasible:
            trial.set_user_attr("why", ev.why)
            return tuple(0.0 if OBJECTIVES[o][1] == "maximize" else 1e9 for o in spec.objectives)
        trial.set_user_attr("metrics", ev.metrics)
        if ev.extra.get("position_acceptance"):  # measured: the report plots it
            trial.set_user_attr("position_acceptance", list(ev.extra["position_acceptance"]))
        return tuple(ev.metrics[OBJECTIVES[o][0]] for o in spec.objectives)

    return objective


def make_sampler(seed: int, worker: int = 0, liar: bool = False):  # -> optuna.samplers.BaseSampler
    """TPE; `liar`: running trials count as bad ones (Optuna's constant liar), so servers measuring side by side
    are given different configurations."""
    import optuna

    return optuna.samplers.TPESampler(seed=seed * 1009 + worker, multivariate=True, n_startup_trials=8,
                                      constant_liar=liar)


def live(study) -> int:
    """Completed trials plus those running now: what a worker counts against the study's target before it starts
    another trial. A trial whose worker is gone is failed first, never counted (tuner/trial_run.py `fail_dead`:
    at once for a dead process of this machine, by the heartbeat for others)."""
    from optuna.trial import TrialState

    fail_dead(study)
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)))


def run_worker(db_url: str, name: str, target: int, worker: int = 0, timeout: float | None = None,
               callback: Callable[[Any, Any], None] | None = None) -> int:
    """Add trials to study `name` in this process until it holds `target` completed or running ones (shared by
    every worker and machine on the study, so N workers end at N trials, not N times N), or `timeout`
    seconds pass; returns how many trials this process ran. Worker 0 runs, or resumes, the coordinate screen
    first; the others, and every trial after the screen, are TPE's."""
    import optuna

    with faults_as_one_line(name):
        study = optuna.load_study(study_name=name, storage=storage(db_url), sampler=None)
    spec = StudySpec.model_validate(study.user_attrs[SPEC_ATTR])
    study.sampler = make_sampler(spec.seed, worker, liar=spec.mode == "live")
    space = spec.space()
    evaluator = make_evaluator(spec)
    if not space.distributions:
        target = min(target, 1)  # nothing to search: one evaluation of the fixed plan
    objective = objective_fn(space, evaluator, spec, target)
    callbacks = [callback] if callback else None
    deadline = None if timeout is None else time.time() + timeout

    def full() -> bool:
        return live(study) >= target or (deadline is not None and time.time() >= deadline)

    ran = 0
    try:
        with quiet_interrupts(), faults_as_one_line(name):
            if worker == 0 and space.distributions:
                from tuner.design import screen
                from tuner.live.order import hot_knobs

                ran = screen(study, space, objective, target, lambda t: trial_rank(t, maximizes(spec)), callbacks,
                             done=full, starts=[spec.prior] if spec.prior else None,
                             hot=hot_knobs(evaluator, space), hot_moves=spec.hot_trials,
                             idle=getattr(evaluator, "idle", None))
            last: list[Any] = []
            while not full():
                run_trial(study, objective, [*(callbacks or []), lambda _s, t: last.append(t)])
                ran += 1
                if last:
                    from tuner.live.order import hot_siblings

                    hot_siblings(study, space, evaluator, last[-1], spec.hot_trials)
            stop = getattr(evaluator, "stop", None)
            if stop is not None:  # its server and devices: a trial another worker waits to run may need them
                stop()
            wait_for_others(study, deadline)
    finally:
        stop_heartbeats()  # a Ctrl-C inside Optuna's heartbeat start leaves a thread that blocks the exit
        close = getattr(evaluator, "close", None)
        if close is not None:  # a live study's running server stops here, even on Ctrl-C
            close()
    return ran


def wait_for_others(study, deadline: float | None, poll_s: float = 0.5) -> None:
    """Block while trials other workers run on this study (the target is met by counting them), so what this
    process exports next has their results: two tuners on one study both end with its completed trials. A trial
    whose worker is gone is failed by `live` (fail_dead) and stops the wait; so do `deadline` and Ctrl-C."""
    from optuna.trial import TrialState

    said = False
    while deadline is None or time.time() < deadline:
        live(study)  # fails the trials of dead workers first
        others = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not others:
            return
        if not said:
            print(f"waiting for {len(others)} trial(s) another worker runs on study {study.study_name!r}",
                  file=sys.stderr, flush=True)
            said = True
        time.sleep(poll_s)


def completed(study) -> list[Any]:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def run(db_url: str, name: str, trials: int, workers: int = 1, timeout: float | None = None,
        on_progress: Callable[[int, Any], None] | None = None):  # -> optuna.Study
    """Bring study `name` to `trials` completed trials with `workers` processes (this one included)."""
    import optuna

    with faults_as_one_line(name):
        study = optuna.load_study(study_name=name, storage=storage(db_url))
        fail_orphans(study)
        fail_dead(study)  # a worker killed a moment ago: its trial is neither running nor counted
        remaining = max(0, trials - len(completed(study)))
    if remaining == 0:
        return study
    from tuner.live.process import die_with_parent

    procs = [subprocess.Popen([sys.executable, "-m", "tuner.worker", db_url, name, str(trials), str(i),
                               str(timeout) if timeout else "none"], cwd=str(ROOT), preexec_fn=die_with_parent)
             for i in range(1, min(workers, remaining))]  # a worker (and so its servers) stops with the tuner

    def cb(st, _trial) -> None:
        if on_progress:
            on_progress(len(completed(st)), st)

    try:
        with faults_as_one_line(name):
            run_worker(db_url, name, trials, 0, timeout, cb)
            while any(p.poll() is None for p in procs):
                time.sleep(0.3)
                if on_progress:
                    on_progress(len(completed(study)), study)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)
    failed = [p.returncode for p in procs if p.returncode and p.returncode not in (-15, 130)]
    if failed:
        raise TunerError(f"{len(failed)} worker process(es) failed (exit {failed[0]}); completed trials are "
                         f"kept: resume with --study {name}")
    with faults_as_one_line(name):
        return optuna.load_study(study_name=name, storage=storage(db_url))


def fail_orphans(study) -> int:
    """Fail RUNNING trials a killed worker left before its first heartbeat.

    Optuna fails stale trials by their heartbeat; a worker killed between creating a trial and its
    heartbeat thread's first beat (under load this window includes the objective's first suggestions)
    leaves one with no heartbeat at all, which Optuna never counts as stale and which would stay RUNNING
    forever. A live worker beats within one interval of starting a trial, so a trial older than the grace
    period without a beat is an orphan.
    """
    from datetime import datetime, timedelta

    from optuna.storages._rdb.models import TrialHeartbeatModel
    from optuna.trial import TrialState
    from sqlalchemy import select

    cutoff = datetime.now() - timedelta(seconds=grace_s())
    old = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
           if t.datetime_start is not None and t.datetime_start < cutoff]
    if not old:
        return 0
    rdb = getattr(study._storage, "_backend", study._storage)
    ids = [t._trial_id for t in old]
    with rdb.engine.connect() as conn:
        beating = set(conn.execute(select(TrialHeartbeatModel.trial_id)
                                   .where(TrialHeartbeatModel.trial_id.in_(ids))).scalars())
    n = 0
    for t in old:
        if t._trial_id not in beating:
            study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            n += 1
    return n


def feasible_trials(study) -> list[Any]:
    """Completed trials that run at all and meet every SLO constraint."""
    return [t for t in completed(study) if miss(t) == 0]


def miss(t) -> float:
    """How far a trial is from meeting its constraints (0: it meets them); Optuna's own infeasibility score."""
    return sum(v for v in t.constraints.values() if v > 0) if t.values else float("inf")


def trial_rank(t, maximize: bool = True) -> tuple[int, float]:
    """A total order on trials, higher is better: those meeting every constraint by their first objective,
    above the rest by how little they miss. Lets the screen walk out of an SLO-infeasible start."""
    m = miss(t)
    if m > 0:
        return (0, -m)
    return (1, t.values[0] if maximize else -t.values[0])


def maximizes(spec: StudySpec) -> bool:
    """Whether the study's first objective is maximised."""
    return OBJECTIVES[spec.objectives[0]][1] == "maximize"


def best_trial(study, spec: StudySpec):  # -> FrozenTrial | None
    """The exported trial: highest first objective among the SLO-feasible Pareto front; in a live study whose
    finalists were measured again (tuner/live/confirm.py), the finalist with the highest mean throughput."""
    ok = feasible_trials(study)
    if not ok:
        return None
    if spec.mode == "live":
        from tuner.live.confirm import CONFIRM_ATTR, confirmed_throughput

        again = study.user_attrs.get(CONFIRM_ATTR) or {}
        scored = [(v, t) for t in ok if (v := confirmed_throughput(t, again)) is not None]
        if scored:
            return max(scored, key=lambda vt: (vt[0], -vt[1].number))[1]
    return max(ok, key=lambda t: (trial_rank(t, maximizes(spec)), -t.number))
