"""The measure objective: run the bundled engine on this device and record what really happened.

The target is the profile's model when it is a runnable checkpoint folder here (a real Hugging Face
checkpoint on a GPU machine), else the project's tiny reference target; prompts come from the
workload's JSONL file, else from the held-out prompts of the preset's domain (chat prompts for `chat`, code outside
the standard library for every other preset). One target is loaded
once and shared by every trial; each trial builds an Engine with the trial's parameters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from profiler.schema import Profile
from tuner.errors import TunerError
from tuner.objective import Evaluation, Evaluator
from tuner.space import SearchSpace

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "prompts"
HELDOUT_PROMPTS = {"chat": PROMPTS_DIR / "heldout_chat.jsonl", "code": PROMPTS_DIR / "heldout_code.jsonl"}
MACHINE_SHARE = 0.8  # of the profiled memory an exported engine may take (the OS and the server keep the rest)


def _checkpoint(profile: Profile) -> Path:
    from dspark_core.config import ASSETS

    src = profile.model.source or ""
    p = Path(src)
    if p.is_file() and p.name == "config.json":
        p = p.parent
    if src and (p / "config.json").is_file() and any(p.glob("*.safetensors")):
        return p
    if not src:  # no model named: the tiny reference target
        return ASSETS / "target"
    raise TunerError(f"cannot measure {profile.model.name or src} here: no checkpoint folder; pass --mode simulate "
                     "or --model PATH to a Hugging Face checkpoint folder")


def preset_prompts(workload: str) -> Path:
    """The held-out prompts a measured trial of workload preset `workload` runs: its domain's where there are
    some (a chat deployment's best block is not a code deployment's: RESULTS.md, issue 42), else code."""
    return HELDOUT_PROMPTS.get(workload, HELDOUT_PROMPTS["code"])


class MeasureEvaluator(Evaluator):
    """Real runs of dspark_core.Engine: throughput, TTFT / TPOT percentiles, tau."""

    mode = "measure"

    def __init__(self, profile: Profile, n_prompts: int = 8, max_new_tokens: int = 48,
                 trial_limit_s: float = 60.0, dtype: str | None = None, compile: bool = False) -> None:
        from dspark_core.config import EngineConfig
        from dspark_core.modeling.checkpoint import load_model
        from dspark_core.modeling.tokenizer import Tokenizer

        self.profile = profile
        self.path = _checkpoint(profile)
        self.base = EngineConfig()
        self.base.model.path = str(self.path)
        self.fixed_dtype = dtype  # every trial runs the weights in this dtype (None: in the trial's weights.dtype)
        if dtype is not None:
            self.base.weights.dtype = dtype  # type: ignore[assignment]
        self.dtype = self.base.weights.dtype  # the dtype `target` holds
        self.target = load_model(self.path, self.base.device, self.dtype)
        self.tokenizer = Tokenizer.load(self.path, self.target.arch.eos_ids)
        self.prompts = self._prompts(n_prompts)
        self.max_new_tokens = max_new_tokens
        self.trial_limit_s = trial_limit_s  # a configuration slower than this is measured on what it did by then
        self.compile = compile  # trials run compiled decode / verify steps (compiled before each is timed)
        self._sps: dict[tuple[str, int], Any] = {}  # (weights dtype, batch tokens) -> measured SPS table

    def target_for(self, dtype: str):  # -> LeanModel
        """The target in the weights dtype a trial runs: one copy is held and reloaded when the dtype changes (two
        copies of a large model may not fit), so a trial never runs other weights than its parameters say."""
        from dspark_core.modeling.checkpoint import load_model

        if dtype != self.dtype:
            self.target = None  # free the old copy before the new one is read
            self.target, self.dtype = load_model(self.path, self.base.device, dtype), dtype
        return self.target

    def _dtype(self, params: dict[str, Any]) -> str:
        """The weights dtype a trial of `params` runs."""
        return self.fixed_dtype or str(params["weights.dtype"])

    def _prompts(self, n: int) -> list[str]:
        from dspark_core.cli.prompts import load_prompts

        wl = self.profile.workload.name or ""
        path = Path(wl) if wl.endswith(".jsonl") and Path(wl).is_file() else preset_prompts(wl)
        if not path.is_file():
            raise TunerError(f"no prompts to measure with: {path} is missing; pass --workload FILE.jsonl")
        return [r.prompt for r in load_prompts(path, limit=n)]

    def describe(self) -> str:
        steps = "compiled" if self.compile else "eager"
        return (f"measured with dspark_core on this device ({self.path.name}, {len(self.prompts)} prompts x "
                f"{self.max_new_tokens} new tokens, {steps} steps)")

    def config(self, params: dict[str, Any]):  # -> EngineConfig
        """The exported engine config of `params` (tuner/engine_config.py), as run here: the bundled engine on
        this device with the drafter it finds for the tuned head (the tiny target's committed one), as many KV
        slots as prompts (more are never used by this measurement, and allocating and SPS-profiling 1024 of them
        cost ~30 s), the bench's output length."""
        from dspark_core.drafters.dspark_runtime import drafter_folder
        from tuner.engine_config import tuned_engine_config

        cfg = tuned_engine_config(self.profile, params, None, model_path=str(self.path))
        if cfg.spec.enabled and cfg.drafter.method in ("dspark", "hybrid"):
            cfg.drafter.path = str(drafter_folder(cfg))
        cfg.device = self.base.device
        cfg.compile = self.compile
        cfg.compile_budget_s = float("inf")  # trials share one target and its compiled step: never a budget spent by
        # earlier trials' shapes (the bundle keeps its own budget: its engine compiles only its own)
        cfg.weights.dtype = self._dtype(params)  # type: ignore[assignment]
        cfg.batch.max_requests = min(cfg.batch.max_requests, len(self.prompts))
        cfg.parallel = type(cfg.parallel)()  # the bundled engine runs one device
        cfg.sampling.max_new_tokens = self.max_new_tokens
        return cfg

    def exported_misfit(self, params: dict[str, Any]) -> str:
        """Why the engine `params` export (all `batch.max_requests` slots of `model.max_seq_len` positions, not the
        few this measurement allocates) would not fit this machine's memory ("" when it fits): such a bundle could
        not be served where it was tuned. The budget is MACHINE_SHARE of the profiled memory."""
        from dspark_core.memory import GIB, HEADROOM_FRACTION, gib
        from dspark_core.preflight import engine_parts

        total_gb = self.profile.hw.memory_gb
        if not total_gb:
            return ""
        full = self.config(params)
        full.batch.max_requests = int(params["batch.max_requests"])
        parts = engine_parts(full, None, with_drafter=full.spec.enabled)
        need = int(sum(parts.values()) * (1 + HEADROOM_FRACTION))
        budget = int(total_gb * GIB * MACHINE_SHARE)
        if need <= budget:
            return ""
        return (f"the exported engine ({full.batch.max_requests} requests x {full.model.max_seq_len} positions) "
                f"needs about {gib(need)} ({', '.join(f'{k} {gib(v)}' for k, v in parts.items())}), over "
                f"{MACHINE_SHARE:.0%} of this machine's {total_gb:g} GB")

    def drafter_path(self, params: dict[str, Any]) -> str | None:
        """The DSpark drafter measured for `params` (None: speculation off, or a method without one)."""
        return self.config(params).drafter.path

    def evaluate(self, params: dict[str, Any], seed: int = 0) -> Evaluation:
        from dspark_core.engine import Engine
        from dspark_core.engine_parts import warm_steps
        from dspark_core.errors import DSparkError

        try:
            why = self.exported_misfit(params)
            if why:
                return Evaluation({}, False, why)
            cfg = self.config(params)
            cfg.sampling.seed = seed
            engine = Engine(cfg, target=self.target_for(cfg.weights.dtype), tokenizer=self.tokenizer)
            warm_steps(engine)  # a trial measures serving, not compiling (as `serve` warms at start-up)
            gen = engine.generate(self.prompts, cfg.sampling, time_limit_s=self.trial_limit_s)
        except (DSparkError, TunerError) as e:  # TunerError: a learned choice without its policy
            return Evaluation({}, False, str(e))
        st = gen.stats
        ttft = [o.ttft_s * 1e3 for o in gen.outputs if getattr(o, "ttft_s", None) is not None]
        ttft += [st.seconds * 1e3] * (len(self.prompts) - len(gen.outputs))  # never admitted before the cut
        tpot = [(o.latency_s - o.ttft_s) / max(1, len(o.token_ids) - 1) * 1e3 for o in gen.outputs
                if getattr(o, "latency_s", None) is not None and len(o.token_ids) > 1]
        metrics = {"throughput": st.tokens_per_s, "tau": st.tau,
                   "ttft_p99_ms": float(np.percentile(ttft, 99)) if ttft else st.seconds * 1e3,
                   "tpot_p99_ms": float(np.percentile(tpot, 99)) if tpot else
                   st.seconds * 1e3 / max(1, st.generated_tokens / max(1, st.requests)),
                   "verify_tokens_per_step": st.verify_tokens_per_step}
        if st.cut:
            metrics["cut_requests"] = float(st.cut)  # stopped at the time limit: figures cover what ran
        return Evaluation(metrics, True, extra={"position_acceptance": st.position_acceptance})

    def sps_table(self, params: dict[str, Any]):
        from dspark_core.verification.verify_scheduler import profile_target_sps

        gamma = int(params["spec.block_size"])
        budget = min(int(params["batch.max_tokens"]), int(params["batch.max_requests"]) * (gamma + 1))
        dtype = self._dtype(params)
        if (dtype, budget) not in self._sps:
            self._sps[dtype, budget] = profile_target_sps(self.target_for(dtype), max(2, budget))
        return self._sps[dtype, budget]


def can_compile(arch: str | None) -> str:
    """Why torch.compile cannot build the engine's steps on this machine ("" when it can): inductor writes C++ for a
    CPU, which needs a compiler, and Triton kernels for a GPU."""
    import importlib.util
    import shutil

    if arch in (None, "cpu"):
        if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
            return "no C++ compiler on PATH (inductor builds a CPU's steps with one; install g++)"
        return ""
    return "" if importlib.util.find_spec("triton") is not None else "Triton is not installed"


def resolve_compile(asked: bool | None, arch: str | None, mode: str = "measure") -> bool:
    """Whether a measured study's trials (and its bundle) run compiled steps: as asked (`--compile` where they cannot
    be built, or for a study that runs no engine here, is one TunerError line), else wherever they can be: the
    compiled step is the engine's fast path (RESULTS.md, issue 41), and a study must measure what the bundle runs."""
    if mode != "measure":
        if asked is not None:
            raise TunerError(f"--{'' if asked else 'no-'}compile: only a measured study (--mode measure, or this "
                             f"machine's device) runs the bundled engine's steps; this study is {mode}")
        return False
    why = can_compile(arch)
    if asked and why:
        raise TunerError(f"--compile: {why}; drop --compile to measure the eager engine")
    return why == "" if asked is None else asked


def steps_line(compiled: bool) -> str:
    """The start-up line of a measured study: which steps its trials run, and what compiling them costs."""
    if not compiled:
        return "trials run the bundled engine's eager steps"
    return ("trials run the bundled engine's compiled steps (each new step shape compiles once before its trial is "
            "timed: seconds to a minute each, cached on disk)")


def check_resumed_compile(asked: bool | None, mode: str, compiled: bool, name: str) -> None:
    """`--compile/--no-compile` on a resumed study: one TunerError line where it would change what the study measures
    (its stored trials ran the other steps) or where the study runs no engine here."""
    if asked is None:
        return
    if mode != "measure":
        resolve_compile(asked, None, mode)
    if asked != compiled:
        raise TunerError(f"study {name} measured {'compiled' if compiled else 'eager'} steps; drop "
                         f"--{'no-' if compiled else ''}compile to resume it, or give a new --study")


def start_dtype(profile: Profile, space: SearchSpace, compile: bool = False) -> tuple[str | None, str]:
    """(the weights dtype a measured CPU study's screen starts from, one line saying why): the dtype whose measured
    verify step runs faster on this CPU (dspark_core/modeling/dtype_choice.py, the steps-per-second table the
    schedulers use), when the study searches `weights.dtype` among fp32 and bf16. The screen compares the methods at
    its start point, and which method pays depends on the dtype (fp32 verification costs more against drafting:
    RESULTS.md, issue 42's `tune --gpu cpu` table), so the methods are compared in the dtype the bundle will run.
    `compile`: the trials run compiled steps, so those are timed, at the block the screen starts from. (None, "")
    where nothing is measured: a GPU, a fixed dtype, or a space without both."""
    from dspark_core.config import EngineConfig
    from dspark_core.modeling.dtype_choice import CANDIDATES, fastest_dtype

    d = space.distributions.get("weights.dtype")
    if profile.hw.arch != "cpu" or d is None or not set(CANDIDATES) <= set(getattr(d, "choices", ())):
        return None, ""
    cfg = EngineConfig()
    cfg.model.path = str(_checkpoint(profile))
    cfg.device, cfg.compile, cfg.compile_budget_s = "cpu", compile, float("inf")
    block = space.warm_start.get("spec.block_size", space.fixed.get("spec.block_size"))
    if block:
        cfg.spec.block_size = int(block)
    return fastest_dtype(cfg)
