"""What the engine builds from its config before it runs: the KV cache's dtype, the Triton kernels' configs and the
verify scheduler (dspark_core/engine.py calls these at start-up and on a live reconfigure), and the compiled steps
it meets, warmed before serving or timing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dspark_core.config import EngineConfig, learned_gamma
from dspark_core.drafters.base import VerifyAll, VerifyScheduler
from dspark_core.errors import DSparkError

if TYPE_CHECKING:
    from dspark_core.engine import Engine
    from dspark_core.modeling.model import KVCache, LeanModel

def kv_dtype(config: EngineConfig, target: LeanModel) -> torch.dtype:
    """The KV cache's dtype for `kv.dtype`: auto = the activations'; fp8 variants store keys and values in FP8
    with no scale (as vLLM's and SGLang's `--kv-cache-dtype fp8_*` without calibrated scales) and attend in the
    activation dtype."""
    return {"auto": target.dtype, "bf16": torch.bfloat16, "fp16": torch.float16,
            "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[config.kv.dtype]


def install_kernel_configs(config: EngineConfig, device: torch.device) -> None:
    """Triton configs: the config's `kernel.<name>.<knob>`, then a bundle's kernels.json for this GPU."""
    from dspark_core.kernels import spec as kspec

    if config.kernel:
        kspec.load_engine_params(config.kernel)
    if config.kernel_file:
        try:
            kspec.load_tuned_file(config.kernel_file, device)
        except ValueError as e:
            raise DSparkError(str(e)) from None


def build_scheduler(config: EngineConfig, target: LeanModel, cache: KVCache | None = None,
                    hidden_layers: tuple[int, ...] = ()) -> VerifyScheduler:
    """Plain `verify_all` when nothing regulates the verify length; else the engine scheduler of
    `dspark_core.verification.verify_scheduler` (confidence ranking, adaptive gamma, the plain-decoding fallback).
    `cache` / `hidden_layers`: the engine's idle KV cache and its drafter's layers, where the SPS probes run the
    engine's own compiled steps."""
    spec = config.spec
    if spec.scheduler == "verify_all" and not spec.adaptive_gamma and spec.fallback_acceptance == 0.0 \
            and spec.round_log is None and spec.gamma_policy != "explore" and not learned_gamma(config):
        return VerifyAll()  # nothing to regulate: every request drafts and verifies the full block
    from dspark_core.verification.verify_scheduler import build_verify_scheduler

    return build_verify_scheduler(config, target, cache=cache, hidden_layers=hidden_layers)


SHORT_VERIFY = (3, 5)  # tokens per row of the compiled step's short verifies (anchor + 2 or 4 drafts): step_sizes


def step_sizes(config: EngineConfig) -> tuple[int, ...]:
    """Tokens per row of the compiled step's graphs (modeling/compiled.py pads a step to the next size): 1 for
    decoding, the block + 1 for verification, and, where a prefix / async_topk scheduler chooses the verify length,
    the short verifies of SHORT_VERIFY below it. A compiled step's grid is dense, every row as long as the longest,
    and at 8 requests on two cores a 9-token verify is compute-bound (RESULTS.md: 8 x 9 tokens cost ~4x 8 x 1), so a
    scheduler needs cheaper sizes to choose when confidences are low (verify_scheduler.EngineScheduler._dense).
    Packed (a CPU's verify steps) only the real tokens run the GEMMs, but attention still spans the grid: 8 x 9 with
    one token a row costs 1.28x an 8 x 1 step, 8 x 3 1.06x (verification/grid_costs.py). A 5-token grid between them
    lets a round verify a strong row's first 4 drafts without paying the 9-token grid: chat at 8 requests, suffix
    with the prefix scheduler, 0.99-1.01x plain with it against 0.94-0.97x without, in runs side by side (RESULTS.md,
    "A 5-token verify grid")."""
    spec = config.spec
    if not spec.enabled or config.drafter.method == "plain":
        return (1,)
    full = spec.block_size + 1
    short = tuple(s for s in SHORT_VERIFY if s < full) if spec.scheduler in ("prefix", "async_topk") else ()
    return (1, *short, full)


def warm_steps(engine: Engine, max_rows: int | None = None) -> str:
    """Compile (or load from disk) every step shape `engine` meets, up to `max_rows` requests (default its
    `batch.max_requests`), before it serves or is timed; the warm line ("" for an eager engine). Its own step sizes:
    engines sharing a target (bench, a tuner's trials) share one step with the union of theirs."""
    step = engine.target.compiled
    if step is None:
        return ""
    rows = engine.config.batch.max_requests if max_rows is None else max_rows
    line = step.warm(engine.cache, rows, engine.hidden_layers, step_sizes(engine.config))
    warm = getattr(engine.drafter, "warm", None)  # a compiled DSpark drafter's backbone (alone or in the hybrid)
    extra = warm(rows) if warm is not None else ""
    return f"{line}; {extra}" if extra else line
