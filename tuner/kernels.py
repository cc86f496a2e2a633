"""Kernel autotuning: one Optuna study per (kernel, shape bucket) on the local GPU; winners go to the KB.

Flow: `default_jobs` turns model dimensions into (kernel, representative shape) jobs, one per shape bucket;
`tune_kernel` searches the kernel's declared space (dspark_core.kernels.*.SPEC.space) with TPE, starting
from the architecture default so the winner is never worse than what the engine would launch anyway;
`save_results` upserts one `kernel_configs` row per (kernel, GPU, bucket); `lookup_kernel_configs` gives
the bundle / engine the `{kernel: {bucket: config}}` table that dspark_core.kernels.spec.load_tuned takes.

Timing is injected (`Timer`): `DoBenchTimer` measures with triton.testing.do_bench on CUDA and rejects a
config whose output disagrees with the torch reference; tests pass a fake timer to check the Optuna
wiring, storage and lookup on a CPU.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import TunerError

Timer = Callable[[str, Mapping[str, int], Mapping[str, int]], float]  # (kernel, shape, config) -> ms or inf


@dataclass(frozen=True)
class KernelJob:
    """One study: a kernel at a representative shape of one bucket."""

    kernel: str  # registry name
    shape: dict[str, int]  # e.g. {"batch": 64, "gamma": 8, "vocab": 151936}
    bucket: str  # the kernel's bucket key for `shape`


@dataclass
class KernelResult:
    """The winner of one study and the figures behind it."""

    kernel: str
    gpu: str
    bucket: str
    shape: dict[str, int]
    config: dict[str, int]  # best point of the space
    time_ms: float  # its measured time
    default_ms: float | None  # the architecture default's time (the first trial)
    torch_ms: float | None = None  # torch eager reference at the same shape, when measured
    n_trials: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def speedup_vs_torch(self) -> float | None:
        return self.torch_ms / self.time_ms if self.torch_ms and self.time_ms > 0 else None

    def as_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "gpu": self.gpu, "bucket": self.bucket, "shape": self.shape,
                "config": self.config, "time_ms": self.time_ms, "default_ms": self.default_ms,
                "torch_ms": self.torch_ms, "speedup_vs_torch": self.speedup_vs_torch(),
                "n_trials": self.n_trials}


def gpu_key(name: str) -> str:
    """Normalised GPU name used as the table key (the engine normalises the same way when it loads)."""
    from dspark_core.kernels.spec import gpu_key as key

    return key(name)


def local_gpu() -> tuple[str, str]:
    """(normalised key, device name) of CUDA device 0; TunerError if there is none."""
    import torch

    if not torch.cuda.is_available():
        raise TunerError("tune-kernels needs a CUDA GPU and this machine has none (torch.cuda.is_available() "
                         "is False); run it on the GPU you deploy to and export the bundle from there")
    name = torch.cuda.get_device_name(0)
    return gpu_key(name), name


def parse_kernels(names: Iterable[str] | None) -> list[str]:
    """Kernel names from repeated or comma-separated --kernels (all when empty); TunerError on unknown."""
    from dspark_core.kernels.registry import KERNEL_NAMES

    wanted = [n.strip() for item in (names or []) for n in item.split(",") if n.strip()]
    if not wanted:
        return list(KERNEL_NAMES)
    bad = [n for n in wanted if n not in KERNEL_NAMES]
    if bad:
        raise TunerError(f"unknown kernel(s) {', '.join(bad)} in --kernels; choose from {', '.join(KERNEL_NAMES)}")
    return list(dict.fromkeys(wanted))


def default_jobs(kernels: Iterable[str], batches: Iterable[int], *, gamma: int, vocab: int, hidden: int,
                 inter: int, rank: int) -> list[KernelJob]:
    """Representative shapes of one model: verification/head per request batch, norms/MLP per verify
    batch of batch * (gamma + 1) tokens. One job per (kernel, bucket); later duplicates are dropped."""
    from dspark_core.kernels.registry import get_entry

    jobs: dict[tuple[str, str], KernelJob] = {}
    for kernel in kernels:
        entry = get_entry(kernel)
        for b in batches:
            if b < 1:
                raise TunerError(f"batch size {b} in --batch must be >= 1")
            tokens = b * (gamma + 1)
            shape = {"verify_greedy": {"batch": b, "gamma": gamma, "vocab": vocab},
                     "verify_sample": {"batch": b, "gamma": gamma, "vocab": vocab},
                     "markov_head": {"batch": b, "vocab": vocab, "rank": rank},
                     "rmsnorm": {"rows": tokens, "hidden": hidden},
                     "swiglu": {"rows": tokens, "inter": inter}}[kernel]
            bucket = entry.bucket(shape)
            jobs.setdefault((kernel, bucket), KernelJob(kernel, shape, bucket))
    return list(jobs.values())


class DoBenchTimer:
    """Times a kernel config on the local GPU with triton.testing.do_bench (ms, median).

    Each config is first run once and checked against the torch reference; a config that fails to
    compile, runs out of shared memory or gives a wrong answer costs +inf (the study prunes it).
    `bench` is injectable so the input building and checking can be exercised off-GPU.
    """

    def __init__(self, device: str = "cuda", bench: Callable[[Callable[[], Any]], float] | None = None,
                 seed: int = 0) -> None:
        self.device = device
        self.seed = seed
        self._bench = bench
        self._inputs: dict[tuple[str, tuple[tuple[str, int], ...]], tuple[dict[str, Any], Any]] = {}

    def bench(self, fn: Callable[[], Any]) -> float:
        if self._bench is not None:
            return float(self._bench(fn))
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=100))

    def _prepared(self, kernel: str, shape: Mapping[str, int]) -> tuple[dict[str, Any], Any]:
        from dspark_core.kernels.registry import get_entry

        key = (kernel, tuple(sorted(shape.items())))
        if key not in self._inputs:
            entry = get_entry(kernel)
            inputs = entry.make_inputs(shape, self.device, self.seed)
            self._inputs.clear()  # one shape's inputs at a time: they can be gigabytes
            self._inputs[key] = (inputs, entry.run_torch(inputs))
        return self._inputs[key]

    def __call__(self, kernel: str, shape: Mapping[str, int], config: Mapping[str, int]) -> float:
        from dspark_core.kernels.registry import get_entry

        entry = get_entry(kernel)
        inputs, ref = self._prepared(kernel, shape)
        try:
            entry.check(entry.run_triton(inputs, config), ref, inputs)
        except AssertionError:
            return math.inf
        except Exception as e:  # compile errors, out of resources: an invalid point of the space
            if type(e).__name__ in ("CompilationError", "OutOfResources", "CompileTimeAssertionFailure",
                                    "PTXASError") \
                    or "out of resource" in str(e).lower():
                return math.inf
            raise
        return self.bench(lambda: entry.run_triton(inputs, config))

    def torch_ms(self, kernel: str, shape: Mapping[str, int]) -> float:
        """The torch eager reference at the same shape (the baseline the speedup is quoted against)."""
        from dspark_core.kernels.registry import get_entry

        entry = get_entry(kernel)
        inputs, _ = self._prepared(kernel, shape)
        return self.bench(lambda: entry.run_torch(inputs))


def plan_space(kernel: str, plan: Mapping[str, Any]) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """Narrow a kernel's declared space with a KB plan's `kernel.<name>.<knob>` entries (JSON of
    kb.match.Plan): fixed values, numeric ranges and choice sets filter the declared choices (a range
    means "the declared values inside it"); preferred values become the first trial. Returns
    (space, start); TunerError when a plan leaves a knob no value."""
    from dspark_core.kernels.registry import get_entry

    spec = get_entry(kernel).spec
    fixed, ranges, prefer = plan.get("fixed", {}), plan.get("space", {}), plan.get("prefer", {})
    space: dict[str, tuple[int, ...]] = {}
    start: dict[str, int] = {}
    for knob, choices in spec.space.items():
        param = f"kernel.{kernel}.{knob}"
        allowed = list(choices)
        entry = fixed.get(param) or ranges.get(param)
        if param in fixed:
            allowed = [c for c in allowed if c == int(fixed[param]["value"])]
        elif param in ranges:
            e = ranges[param]
            if e.get("choices") is not None:
                allowed = [c for c in allowed if c in {int(x) for x in e["choices"]}]
            else:
                lo, hi, excl = e.get("low"), e.get("high"), set(e.get("exclude") or [])
                allowed = [c for c in allowed
                           if (lo is None or c >= lo) and (hi is None or c <= hi) and c not in excl]
        if not allowed:
            rules = ", ".join(entry.get("rules", [])) if entry else "?"
            raise TunerError(f"the plan leaves {param} no value of the kernel's space {list(choices)} "
                             f"(rules: {rules}); fix the rule's range or the kernel's declared space")
        space[knob] = tuple(allowed)
        if param in prefer and int(prefer[param]["value"]) in allowed:
            start[knob] = int(prefer[param]["value"])
    return space, start


def _first_trial(space: Mapping[str, tuple[int, ...]], default: Mapping[str, int],
                 start: Mapping[str, int]) -> dict[str, int]:
    """The default config moved inside `space` (nearest allowed value per knob), with `start` on top."""
    out = {}
    for knob, choices in space.items():
        want = start.get(knob, default[knob])
        out[knob] = want if want in choices else min(choices, key=lambda c: (abs(c - want), c))
    return out


def tune_kernel(job: KernelJob, timer: Timer, *, gpu: str, arch: str, n_trials: int, seed: int = 0,
                storage: Any = None, space: Mapping[str, tuple[int, ...]] | None = None,
                start: Mapping[str, int] | None = None) -> KernelResult:
    """One Optuna study over the kernel's space (or a plan-narrowed `space`); the arch default (moved
    into the space, with `start` preferences on top) is enqueued as trial 0.

    Repeated points (TPE can propose a config twice in a small categorical space) reuse the first
    measurement; invalid configs (timer returns inf) are pruned. `storage` is an Optuna storage or URL
    (None = in memory); the study name is kernels/<gpu>/<kernel>/<bucket>/<space hash>, resumed if it
    exists (a changed space - new knobs, a plan's narrowing - starts a new study: Optuna cannot change the
    choices of a categorical parameter inside one study).
    """
    import optuna

    from dspark_core.kernels.registry import get_entry

    spec = get_entry(job.kernel).spec
    knobs = dict(space) if space is not None else dict(spec.space)
    default = _first_trial(knobs, spec.defaults.get(arch, spec.defaults["default"]), start or {})
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=f"kernels/{gpu}/{job.kernel}/{job.bucket}/{_space_tag(knobs)}",
        storage=storage, direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(8, max(1, n_trials // 3))),
        load_if_exists=True)
    study.enqueue_trial(default, skip_if_exists=True)
    seen: dict[tuple[tuple[str, int], ...], float] = {}

    def objective(trial: optuna.Trial) -> float:
        cfg = {knob: int(trial.suggest_categorical(knob, list(choices))) for knob, choices in knobs.items()}
        key = tuple(sorted(cfg.items()))
        if key not in seen:
            seen[key] = float(timer(job.kernel, job.shape, cfg))
        if not math.isfinite(seen[key]):
            raise optuna.TrialPruned(f"config {cfg} is invalid on this GPU")
        return seen[key]

    study.optimize(objective, n_trials=n_trials, gc_after_trial=False)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not done:
        raise TunerError(f"no valid config for kernel {job.kernel} at {job.bucket} on {gpu}: every trial failed "
                         "to compile or disagreed with the reference; check the Triton install")
    best = study.best_trial
    default_ms = seen.get(tuple(sorted(default.items())))
    return KernelResult(kernel=job.kernel, gpu=gpu, bucket=job.bucket, shape=dict(job.shape),
                        config={k: int(v) for k, v in best.params.items()}, time_ms=float(best.value),
                        default_ms=default_ms if default_ms is not None and math.isfinite(default_ms) else None,
                        n_trials=len(study.trials))


def _space_tag(space: Mapping[str, tuple[int, ...]]) -> str:
    """Short stable tag of a narrowed space (Optuna cannot resume a study whose choices changed)."""
    import hashlib

    return hashlib.sha1(json.dumps(sorted((k, list(v)) for k, v in space.items())).encode()).hexdigest()[:8]


def save_results(db: Any, results: Iterable[KernelResult], triton_version: str) -> int:
    """Upsert one kernel_configs row per (kernel, gpu, bucket) in one transaction; returns rows written."""
    from sqlalchemy import select

    from kb.models import utcnow
    from kb.models_kernels import KernelConfigRow

    n = 0
    with db.session() as s:
        for r in results:
            row = s.scalars(select(KernelConfigRow).where(
                KernelConfigRow.kernel == r.kernel, KernelConfigRow.gpu == r.gpu,
                KernelConfigRow.shape_bucket == r.bucket)).one_or_none()
            if row is None:
                row = KernelConfigRow(kernel=r.kernel, gpu=r.gpu, shape_bucket=r.bucket)
                s.add(row)
            row.shape, row.config, row.time_ms = dict(r.shape), dict(r.config), r.time_ms
            row.default_ms, row.torch_ms, row.n_trials = r.default_ms, r.torch_ms, r.n_trials
            row.triton_version, row.created_at = triton_version, utcnow()
            n += 1
    return n


def lookup_kernel_configs(db: Any, gpu: str, kernels: Iterable[str] | None = None,
                          ) -> dict[str, dict[str, dict[str, int]]]:
    """`{kernel: {bucket: config}}` tuned for `gpu` (a device name or its key): what a bundle carries
    as kernels.json and the engine hands to dspark_core.kernels.spec.load_tuned."""
    from sqlalchemy import select

    from kb.models_kernels import KernelConfigRow

    stmt = select(KernelConfigRow).where(KernelConfigRow.gpu == gpu_key(gpu))
    if kernels is not None:
        stmt = stmt.where(KernelConfigRow.kernel.in_(list(kernels)))
    out: dict[str, dict[str, dict[str, int]]] = {}
    with db.session() as s:
        for row in s.scalars(stmt.order_by(KernelConfigRow.kernel, KernelConfigRow.shape_bucket)):
            out.setdefault(row.kernel, {})[row.shape_bucket] = {k: int(v) for k, v in row.config.items()}
    return out


def run_tuning(jobs: list[KernelJob], timer: Timer, *, gpu: str, arch: str, n_trials: int, db: Any,
               triton_version: str, storage: Any = None, seed: int = 0, plan: Mapping[str, Any] | None = None,
               torch_timer: Callable[[str, Mapping[str, int]], float] | None = None,
               progress: Callable[[KernelJob], None] | None = None) -> list[KernelResult]:
    """Tune every job (inside the plan's kernel.* constraints when given), measure the torch baseline when
    given, store all winners; returns the results."""
    results = []
    for job in jobs:
        space, start = plan_space(job.kernel, plan) if plan is not None else (None, None)
        res = tune_kernel(job, timer, gpu=gpu, arch=arch, n_trials=n_trials, seed=seed, storage=storage,
                          space=space, start=start)
        if torch_timer is not None:
            res.torch_ms = float(torch_timer(job.kernel, job.shape))
        results.append(res)
        if progress is not None:
            progress(job)
    save_results(db, results, triton_version)
    return results


def kernels_json(db: Any, gpu: str, kernels: Iterable[str] | None = None) -> dict[str, Any]:
    """The bundle's kernels.json content for `gpu` (read back by dspark_core.kernels.spec.load_tuned_file)."""
    import triton

    return {"gpu": gpu_key(gpu), "triton": triton.__version__,
            "configs": lookup_kernel_configs(db, gpu, kernels)}
