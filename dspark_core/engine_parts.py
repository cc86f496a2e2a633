"""What the engine builds from its config before it runs: the KV cache's dtype, the Triton kernels' configs and the
verify scheduler (dspark_core/engine.py calls these at start-up and on a live reconfigure)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dspark_core.config import EngineConfig
from dspark_core.drafters.base import VerifyAll, VerifyScheduler
from dspark_core.errors import DSparkError

if TYPE_CHECKING:
    from dspark_core.modeling.model import LeanModel

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


def build_scheduler(config: EngineConfig, target: LeanModel) -> VerifyScheduler:
    """Plain `verify_all` when nothing regulates the verify length; else the engine scheduler of
    `dspark_core.verification.verify_scheduler` (confidence ranking, adaptive gamma, the plain-decoding fallback)."""
    spec = config.spec
    if spec.scheduler == "verify_all" and not spec.adaptive_gamma and spec.fallback_acceptance == 0.0 \
            and spec.round_log is None and spec.gamma_policy == "static":
        return VerifyAll()  # nothing to regulate: every request drafts and verifies the full block
    from dspark_core.verification.verify_scheduler import build_verify_scheduler

    return build_verify_scheduler(config, target)
