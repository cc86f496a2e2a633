"""`weights.dtype: fastest` (dspark_core/modeling/dtype_choice.py): the measured faster dtype, one line saying why."""

from __future__ import annotations

import pytest

from dspark_core.config import EngineConfig
from dspark_core.errors import DSparkError
from dspark_core.modeling import dtype_choice
from dspark_core.verification.sps import SpsTable


def _fake_sps(by_dtype: dict[str, float], seen: list[tuple[str, int]]):
    def profile(model, max_batch_tokens, **_):  # noqa: ANN001, ANN202
        name = {"torch.float32": "fp32", "torch.bfloat16": "bf16"}[str(model.dtype)]
        seen.append((name, max_batch_tokens))
        return SpsTable.from_probes([(1, by_dtype[name]), (max_batch_tokens, by_dtype[name] / 2)], max_batch_tokens)
    return profile


@pytest.mark.parametrize("faster", ["fp32", "bf16"])
def test_the_measured_faster_dtype_wins_at_the_verify_length(monkeypatch, faster: str) -> None:
    import dspark_core.verification.verify_scheduler as vs

    seen: list[tuple[str, int]] = []
    speeds = {"fp32": 10.0, "bf16": 5.0} if faster == "fp32" else {"fp32": 5.0, "bf16": 10.0}
    monkeypatch.setattr(vs, "profile_target_sps", _fake_sps(speeds, seen))
    cfg = EngineConfig(device="cpu")
    cfg.drafter.method = "ngram"  # type: ignore[assignment]
    cfg.spec.block_size = 4
    best, line = dtype_choice.fastest_dtype(cfg)
    assert best == faster and seen == [("fp32", 5), ("bf16", 5)]  # probed at the 5-token verify step
    assert line.startswith(f"weights.dtype fastest: {faster} (5.0 eager steps/s of 5 tokens") and "measured" in line


def test_a_compiling_engine_times_the_compiled_steps(monkeypatch) -> None:
    """The engine will run compiled steps, so those are what is timed: each candidate is compiled for the engine's
    step sizes before its probes (compiled and eager steps rank the dtypes differently on some CPUs)."""
    import dspark_core.modeling.compiled as compiled
    import dspark_core.verification.verify_scheduler as vs

    seen: list[tuple[str, int]] = []
    attached: list[str] = []
    monkeypatch.setattr(vs, "profile_target_sps", _fake_sps({"fp32": 5.0, "bf16": 10.0}, seen))
    monkeypatch.setattr(compiled, "attach", lambda model, sizes, budget: attached.append(str(model.dtype)))
    cfg = EngineConfig(device="cpu", compile=True)
    cfg.drafter.method = "ngram"  # type: ignore[assignment]
    best, line = dtype_choice.fastest_dtype(cfg)
    assert best == "bf16" and attached == ["torch.float32", "torch.bfloat16"] and len(seen) == 2
    assert "compiled steps/s" in line


def test_plain_decoding_is_measured_at_one_token_and_a_gpu_is_bf16_unmeasured(monkeypatch) -> None:
    cfg = EngineConfig(device="cpu")
    cfg.drafter.method = "plain"  # type: ignore[assignment]
    assert dtype_choice.step_tokens(cfg) == 1
    assert dtype_choice.fastest_dtype(EngineConfig(device="cuda"))[0] == "bf16"


def test_a_dtype_the_kernel_cannot_run_is_no_candidate(monkeypatch) -> None:
    import dspark_core.modeling.cpu_linear as cl
    import dspark_core.verification.verify_scheduler as vs

    seen: list[tuple[str, int]] = []
    monkeypatch.setattr(vs, "profile_target_sps", _fake_sps({"fp32": 1.0, "bf16": 9.0}, seen))
    real = cl.apply_kernel

    def kernel(model, choice):  # noqa: ANN001, ANN202 - bf16 as on an AVX2-only CPU
        if str(model.dtype) == "torch.bfloat16":
            raise DSparkError("weights.cpu_kernel onednn: oneDNN does not pack bfloat16 weights on this CPU")
        return real(model, choice)

    monkeypatch.setattr(cl, "apply_kernel", kernel)
    cfg = EngineConfig(device="cpu")  # cpu_kernel auto: fp32 runs on any CPU, packed or not
    best, line = dtype_choice.fastest_dtype(cfg)
    assert best == "fp32" and "no other dtype runs" in line and [s[0] for s in seen] == ["fp32"]


def test_the_engine_resolves_fastest_before_loading(monkeypatch) -> None:
    from dspark_core import engine as engine_mod

    monkeypatch.setattr(engine_mod, "fastest_dtype", lambda c: ("bf16", "line"))
    cfg = EngineConfig(device="cpu")
    cfg.weights.dtype = "fastest"  # type: ignore[assignment]
    cfg.drafter.method = "plain"  # type: ignore[assignment]
    eng = engine_mod.Engine(cfg)
    assert cfg.weights.dtype == "bf16" and str(eng.target.dtype) == "torch.bfloat16"
