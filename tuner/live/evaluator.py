"""The live objective: each trial starts the engine with the trial's launch files, drives the profiled workload
through it with loadgen (a closed loop at the profiled concurrency) and reads its own /metrics for tau.

A trial whose launch files equal the running server's reuses that server (no restart); one that differs from it
only in settings the engine takes hot (params.yaml `hot`: our `serve --reconfigurable` changes its verify-length
settings between requests) reconfigures it; any other stops it and starts its own. A server that exits before it is
healthy, never becomes healthy or dies under load costs one failed trial whose reason (`startup_failed`,
`startup_timeout`, `died`) is stored with it; every server is stopped when the evaluator closes, and
tuner/live/process.py stops those a killed tuner left.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from tuner.live.devices import Lease, exclusive_waiting, from_env, group_size, lease, seen_by
from tuner.live.engines import Found, LiveEngine, engine_class
from tuner.live.process import Launch, Server, ServerFailed, free_port, reap_orphans, state_dir
from tuner.objective import Evaluation, Evaluator

WARMUP_REQUESTS = 4  # sent (and discarded) after each start: lazy allocations, first-call compilation
SWEEP = (0.5, 0.7, 0.85, 1.0)  # --load sweep: open-loop rates as fractions of the closed loop's request rate
DYING_S = 3.0  # how long a server that stopped answering gets to finish exiting before it counts as hung


class LiveEvaluator(Evaluator):
    """Real serving engines under the profiled workload, measured from the client side."""

    mode = "live"

    def __init__(self, spec) -> None:  # noqa: ANN001 - tuner.study.StudySpec
        from tuner.measure import _checkpoint

        self.spec = spec
        self.profile = spec.profile_model()
        self.path = _checkpoint(self.profile)
        cls = engine_class(spec.engine)
        self.engine: LiveEngine = cls(self.profile, self.path, spec.engine_python, spec.draft)
        self.found: Found = self.engine.locate()
        have = f"{self.found.package} {self.found.version}"
        if spec.engine_version and have != spec.engine_version:
            from tuner.errors import TunerError

            raise TunerError(f"this study was measured on {spec.engine_version} and {self.found.python} has {have}; "
                             "resume it where that version is, or start a new --study")
        reap_orphans()  # servers a killed tuner left behind
        self._work: Path | None = None
        self._measured: dict[str, Evaluation] = {}  # launch key -> what its server measured in this run
        self.server: Server | None = None
        self.serving: str | None = None  # the launch key the running server serves now (reconfigurations move it)
        self.server_starts = 0
        self.reconfigurations = 0
        self.trials = 0
        wl = self.profile.workload
        self.concurrency = int(spec.live_concurrency or wl.concurrency or 8)
        self.requests = int(spec.live_requests or max(16, 3 * self.concurrency))
        self.max_tokens = spec.live_max_tokens
        self.startup_s = spec.startup_seconds
        self.workload = wl.path or wl.name or wl.domain or "chat"  # loadgen's requests: the preset or the JSONL file
        if wl.path and not Path(wl.path).is_file():
            from tuner.errors import TunerError

            raise TunerError(f"the study's workload file {wl.path} is gone; restore it or profile another workload")
        self.gpus = 1  # devices the trial's server uses (tok/s are per GPU)
        self.devices = from_env()  # --devices: this machine's devices the study's servers share (None: one server)
        self.lease: Lease | None = None  # the devices the running server holds
        self.alone = False  # lease this machine exclusively: no other study's server runs beside (confirmations)
        if self.devices is not None and self.engine.cpu:  # a CPU's "devices" side by side share its cores
            import os

            self.engine.threads = max(1, (os.cpu_count() or 1) // len(self.devices))
        self._sim = None

    def describe(self) -> str:
        return (f"measured live on {self.found.package} {self.found.version} ({self.path.name}, "
                f"{self.requests} requests per trial, {self.concurrency} clients)")

    @property
    def target(self):  # noqa: ANN201 - the bundled engine's target (export checks a shipped drafter on it)
        return self.engine.target()  # type: ignore[attr-defined]

    def drafter_path(self, params: dict[str, Any]) -> str | None:
        """The DSpark drafter a live dspark trial ran (None: another engine, or speculation off)."""
        if self.spec.engine != "dspark":
            return None
        return self.engine.config(params).drafter.path  # type: ignore[attr-defined]

    def sps_table(self, params: dict[str, Any]):
        if hasattr(self.engine, "sps_table"):
            return self.engine.sps_table(params)
        return self.simulator().sps_table(params)

    def simulator(self):  # -> SimulateEvaluator: the prediction each trial is reported against
        if self._sim is None:
            from tuner.objective import SimulateEvaluator

            self._sim = SimulateEvaluator(self.profile, repeats=1, cost=self.spec.cost,
                                          calibration=self.spec.calibration)
        return self._sim

    def predicted(self, params: dict[str, Any]) -> dict[str, float] | None:
        try:
            ev = self.simulator().evaluate(params, seed=self.spec.seed)
        except Exception:  # noqa: BLE001 - a prediction is a report column, never a reason to lose the trial
            return None
        return {k: round(float(v), 4) for k, v in ev.metrics.items()} if ev.feasible else None

    def evaluate(self, params: dict[str, Any], seed: int = 0) -> Evaluation:
        self.trials += 1
        if self._work is None:
            self._work = Path(tempfile.mkdtemp(prefix="trials-", dir=_mkdir(state_dir() / "runs")))
        folder = self._work / f"trial-{self.trials}"
        folder.mkdir()
        launch = self.engine.write(folder, params, free_port(), self.found)
        self.gpus = 1 if self.engine.cpu else int(params.get("parallel.tp", 1))
        key = launch.key()
        if key in self._measured:  # the same server as an earlier trial of this run: its measurement stands
            ev = self._measured[key]
            return Evaluation(dict(ev.metrics), ev.feasible, ev.why, {**ev.extra, "same_server": True})
        from tuner.targets import replicas

        need = group_size(int(params.get("parallel.tp", 1)), replicas(self.profile, params))
        ev = self.run_launch(launch, folder, seed, self.predicted(params), need)
        ev.extra["server_key"] = key[:12]
        if ev.feasible or ev.extra.get("fail_kind") != "died":  # a death may be chance: measure it again
            self._measured[key] = ev
        return ev

    def remeasure(self, params: dict[str, Any], seed: int = 0) -> Evaluation:
        """`params` measured again on a server of its own (not read back from this run, not a running server)."""
        self.stop()
        self._measured.clear()
        return self.evaluate(params, seed)

    def load(self, seed: int = 0) -> None:
        """The trial's load once more on the running server, measuring nothing (an --isolate neighbour)."""
        self._drive(self.requests, self.concurrency, seed)

    def idle(self) -> None:
        """Between trials, waiting on another worker: stop the kept server (and free its devices) when a measurement
        elsewhere on this machine waits to run alone. Kept, it would hold the machine's shared lease while the
        trial this process waits on queues behind that exclusive lease, which waits on it: a deadlock."""
        if self.lease is not None and exclusive_waiting():
            self.stop()

    def run_launch(self, launch: Launch, folder: Path, seed: int = 0, predicted: dict[str, float] | None = None,
                   need: int = 1) -> Evaluation:
        """Measure the server `launch` starts (or the running one, when its launch files are the same); `need`:
        the devices it uses (TP x replicas), leased from --devices."""
        base: dict[str, Any] = {"engine": f"{self.found.package} {self.found.version}", "cost_source": "measured live"}
        if predicted:
            base["predicted"] = predicted
        self.idle()  # a measurement elsewhere on this machine waits to run alone: no server kept for it to wait on
        running = self.server is not None and self.server.exited() is None
        reused = running and self.serving == launch.key()
        if running and not reused and self.server.launch.restart_key() == launch.restart_key():  # type: ignore[union-attr]
            why = self.engine.reconfigure(self.server.url, launch)  # type: ignore[union-attr]
            if why is None:
                self.reconfigurations += 1
                self.serving, reused, base["reconfigured"] = launch.key(), True, True
            else:
                base["reconfigure_failed"] = why  # a restart then gives the trial its own server
        if not reused:
            self.stop()
            env = {}
            if self.devices is not None:
                from tuner.errors import TunerError

                try:
                    self.lease = lease(self.devices, need, exclusive=self.alone)
                except TunerError as e:
                    return Evaluation({}, False, f"devices: {e}", {**base, "fail_kind": "devices"})
                env = self.lease.env
            self.server = Server(launch, folder / "server.log", env)
            self.serving = launch.key()
            self.server_starts += 1
            try:
                base["startup_s"] = round(self.server.wait_healthy(self.startup_s), 2)
                self._check_devices()
                self._drive(WARMUP_REQUESTS, min(self.concurrency, WARMUP_REQUESTS), seed + 10_000)
            except ServerFailed as e:
                return self._failed(e, base)
        base.update(server_starts=self.server_starts, reused_server=reused)
        if self.lease is not None:
            base["devices"] = list(self.lease.devices)
        try:
            return self._measure(seed, base)
        except ServerFailed as e:
            return self._failed(e, base)

    def _failed(self, e: ServerFailed, base: dict[str, Any]) -> Evaluation:
        if self.lease is not None:
            base["devices"] = list(self.lease.devices)
        log = self._keep_log()
        self.stop()
        return Evaluation({}, False, f"{e.kind}: {e.why}", {**base, "fail_kind": e.kind, "server_log": log,
                                                            "server_starts": self.server_starts})

    def _check_devices(self) -> None:
        """The server and its engine's processes see exactly their group (a launch script that sets its own
        visible devices would run on another group's): a failed trial when they do not."""
        if self.lease is None or self.server is None:
            return
        want = self.lease.env
        seen = seen_by(self.server.proc.pid)
        wrong = {k: v for k, v in seen.items() if v != want[k]}
        if wrong or not seen:
            got = ", ".join(f"{k}={v}" for k, v in (wrong or seen).items()) or "no visible-devices variable"
            raise ServerFailed("devices", f"the server was given devices {want['CUDA_VISIBLE_DEVICES']} and "
                               f"runs with {got}")

    def _keep_log(self) -> str | None:
        if self.server is None or not self.server.log_path.is_file():
            return None
        dst = _mkdir(state_dir() / "logs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{self.server.proc.pid}.log"
        shutil.copy2(self.server.log_path, dst)
        return str(dst)

    def _target(self):  # -> live.loadgen.Target
        from live.loadgen import Target

        assert self.server is not None
        return Target.parse(self.server.url + "/v1", None, timeout_s=max(60.0, self.spec.trial_seconds),
                            api_key=self.engine.api_key)

    def _drive(self, n: int, concurrency: int, seed: int):  # -> (records, seconds)
        from live.loadgen import run
        from live.traffic import plan_requests
        from profiler.errors import ProfileError

        try:
            target = self._target()
        except ProfileError as e:
            self._check_alive(wait_s=DYING_S)  # a server that stopped answering may be exiting: its status says why
            raise ServerFailed("died", f"the server answers /health but not /v1/models: {e}") from None
        plan = plan_requests(self.workload, n, self.max_tokens, seed)
        records, wall = run(target, plan, None, concurrency, self.spec.trial_seconds)
        self._check_alive()
        return target, records, wall

    def _check_alive(self, wait_s: float = 0.0) -> None:
        assert self.server is not None
        rc = self.server.exited(wait_s)
        if rc is not None:
            raise ServerFailed("died", f"the server exited with status {rc} under load: {self.server.reason()}")

    def _measure(self, seed: int, base: dict[str, Any]) -> Evaluation:
        """The closed loop at the profiled concurrency; with `live_load: sweep`, then open-loop Poisson rates at
        fractions of the closed loop's request rate, scored at the highest rate that meets the SLOs."""
        from live.monitor import scrape

        assert self.server is not None
        before = _try(lambda: scrape(self.server.url + "/metrics"))
        run = self._summarise(*self._drive(self.requests, self.concurrency, seed))
        after = _try(lambda: scrape(self.server.url + "/metrics"))
        if isinstance(run, Evaluation):
            return Evaluation(run.metrics, run.feasible, run.why, base)
        metrics, extra = run, dict(base)
        if self.spec.live_load == "sweep":
            metrics, extra["sweep"] = self._sweep(metrics, seed)
        if before is not None and after is not None:
            from kb.deployments import window

            w = window(before, after)
            if w.get("tau"):
                metrics["tau"] = float(w["tau"])
            if w.get("position_acceptance"):
                extra["position_acceptance"] = w["position_acceptance"]
        return Evaluation(metrics, True, "", extra)

    def _summarise(self, target, records, wall):  # noqa: ANN001 - -> metrics | Evaluation (nothing completed)
        from live.loadgen import Run

        s = Run(target.host, target.model, "", "", wall, records).summary()
        if not s["completed"]:
            err = next((r.error or f"HTTP {r.status}" for r in records if not r.complete), "none sent")
            return Evaluation({}, False, f"no request completed ({s['failed']} failed: {err})")
        metrics = {"throughput": s["output_tokens_per_s"] / self.gpus,
                   "ttft_p99_ms": s["ttft_ms"]["p99"], "tpot_p99_ms": (s["tpot_ms"] or {"p99": 0.0})["p99"],
                   "tau": 1.0, "requests_per_s": s["requests_per_s"]}
        if s["failed"] or s["rejected_429"]:
            metrics["failed_requests"] = float(s["failed"] + s["rejected_429"])
        return metrics

    def _sweep(self, closed: dict[str, float], seed: int) -> tuple[dict[str, float], list[dict[str, float]]]:
        """Open-loop rates below the closed loop's capacity: the highest that meets the SLOs sets the figures
        (the lowest rate's when none does, which then misses them)."""
        from live.loadgen import run
        from live.traffic import plan_requests, poisson_arrivals

        points = []
        for i, f in enumerate(SWEEP):
            rate = max(1e-3, closed["requests_per_s"] * f)
            plan = plan_requests(self.workload, self.requests, self.max_tokens, seed + 100 + i)
            target = self._target()
            records, wall = run(target, plan, poisson_arrivals([(rate, float("inf"))], len(plan), seed + i), 0,
                                self.spec.trial_seconds)
            self._check_alive()
            got = self._summarise(target, records, wall)
            if isinstance(got, Evaluation):
                continue
            points.append({"rate": round(rate, 3), **got})
        ok = [p for p in points if self._meets(p)]
        best = max(ok, key=lambda p: p["rate"]) if ok else (min(points, key=lambda p: p["rate"]) if points else None)
        if best is None:
            return closed, points
        return {k: v for k, v in best.items() if k != "rate"} | {"rate_at_slo": best["rate"]}, points

    def _meets(self, m: dict[str, float]) -> bool:
        return (not self.spec.slo_tpot_ms or m["tpot_p99_ms"] <= self.spec.slo_tpot_ms) and \
            (not self.spec.slo_ttft_ms or m["ttft_p99_ms"] <= self.spec.slo_ttft_ms)

    def stop(self) -> None:
        """Stop the running server and free its devices."""
        if self.server is not None:
            self.server.stop()
            self.server, self.serving = None, None
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def close(self) -> None:
        """Stop the server and remove the trial folders (failed starts keep their logs under state_dir()/logs)."""
        self.stop()
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def _try(fn):  # noqa: ANN001, ANN202 - a scrape that may not exist (an engine without /metrics)
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None
