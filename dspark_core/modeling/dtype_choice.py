"""`weights.dtype: fastest`: on a CPU, run the weights in the dtype whose measured step is quicker.

Which dtype is faster on a CPU depends on the CPU, not the model. With AVX512-BF16 (or AMX) oneDNN packs bf16
weights and half the bytes stream in about half the time; on an AVX2-only CPU bf16 has no native path and a
9-token verify step costs 4-8x a decode step (benchmarks/step_limit.py), so fp32 wins. Rather than guess from
flags, this loads the target in each candidate dtype with the engine's linear kernel, profiles its steps per
second (`profile_target_sps`, the table the schedulers use) at the step the engine runs most (its verify length,
or one token for plain decoding), compiled where the engine compiles its steps (`compile`: compiling moves each
dtype's step by its own factor, e.g. on an AVX2 CPU bf16's verify-9 step 1.6x slower compiled and fp32's level:
RESULTS.md, the step limit on AVX2), and keeps the faster. On a GPU the answer is bf16 without measuring.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dspark_core.config import EngineConfig

CANDIDATES = ("fp32", "bf16")  # the CPU dtypes the engine computes in natively (fp16 has no fast CPU path)


def step_tokens(config: EngineConfig) -> int:
    """Tokens per request of the step the engine runs most: its verify length when it speculates, else 1."""
    spec_on = config.spec.enabled and config.drafter.method != "plain"
    return config.spec.block_size + 1 if spec_on else 1


def fastest_dtype(config: EngineConfig, repeats: int = 5) -> tuple[str, str]:
    """(the dtype to run, one line saying why) for `config`'s target on its device."""
    import torch

    from dspark_core.engine_parts import step_sizes
    from dspark_core.errors import DSparkError
    from dspark_core.modeling.checkpoint import load_model
    from dspark_core.modeling.compiled import attach
    from dspark_core.modeling.cpu_linear import apply_kernel
    from dspark_core.verification.verify_scheduler import profile_target_sps

    device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if not device.startswith("cpu"):
        return "bf16", f"weights.dtype fastest: bf16 on {device}"
    t = step_tokens(config)
    speed: dict[str, tuple[float, str]] = {}  # dtype -> (steps/s at t tokens, linear kernel)
    for name in CANDIDATES:
        model = load_model(config.model.path, "cpu", name)
        try:
            kernel = apply_kernel(model, config.weights.cpu_kernel)
        except DSparkError:  # cpu_kernel onednn where oneDNN cannot pack this dtype: not a candidate
            continue
        if config.compile:  # time the step the engine will run: compiling moves each dtype's cost differently
            attach(model, step_sizes(config), config.compile_budget_s)
        speed[name] = (profile_target_sps(model, max(2, t), repeats=repeats).lookup(t), kernel)
        del model
    if not speed:
        raise DSparkError(f"weights.dtype fastest: no dtype runs with weights.cpu_kernel {config.weights.cpu_kernel} "
                          "on this CPU; use cpu_kernel auto")
    best = max(speed, key=lambda k: speed[k][0])
    others = ", ".join(f"{k} {v[0]:.1f}" for k, v in speed.items() if k != best) or "no other dtype runs"
    steps = "compiled" if config.compile else "eager"
    return best, (f"weights.dtype fastest: {best} ({speed[best][0]:.1f} {steps} steps/s of {t} tokens with "
                  f"{speed[best][1]} linears; {others}; measured on this {torch.backends.cpu.get_cpu_capability()} "
                  "CPU)")
