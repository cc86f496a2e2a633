"""The measure evaluator runs the real engine on the tiny reference target."""

from __future__ import annotations

import pytest

from profiler.schema import Profile
from tuner.measure import MeasureEvaluator
from tuner.space import engine_defaults


@pytest.fixture(scope="module")
def evaluator() -> MeasureEvaluator:
    import torch

    torch.set_num_threads(1)
    return MeasureEvaluator(Profile.model_validate({"hw": {"arch": "cpu", "name": "cpu"}}), n_prompts=3,
                            max_new_tokens=12)


def test_plain_run_reports_real_latencies(evaluator):
    params = {**engine_defaults(), "spec.enabled": False, "batch.max_requests": 2}
    ev = evaluator.evaluate(params)
    m = ev.metrics
    assert ev.feasible and m["throughput"] > 0 and m["tau"] == 1.0
    assert 0 < m["tpot_p99_ms"] < m["ttft_p99_ms"] + 10_000
    # with 2 slots for 3 prompts the third request waits: its TTFT is at least one other's latency
    assert m["ttft_p99_ms"] > 0


def test_measured_sps_table_is_valid(evaluator):
    sps = evaluator.sps_table({**engine_defaults(), "spec.block_size": 3, "batch.max_requests": 2})
    assert sps.max_batch_tokens == 8 and all(s > 0 for s in sps.sample_steps_per_sec)


def test_a_trial_runs_the_weights_dtype_it_names(evaluator):
    """The target is loaded once per dtype: a bf16 trial runs bf16 weights, the next fp32 trial fp32 ones."""
    import torch

    base = {**engine_defaults(), "spec.enabled": False, "batch.max_requests": 3}
    assert evaluator.evaluate({**base, "weights.dtype": "bf16"}).feasible
    assert evaluator.target.embed.weight.dtype == torch.bfloat16 and evaluator.dtype == "bf16"
    assert evaluator.sps_table({**base, "weights.dtype": "bf16", "spec.block_size": 1}).max_batch_tokens == 6
    assert evaluator.evaluate({**base, "weights.dtype": "auto"}).feasible
    assert evaluator.target.embed.weight.dtype == torch.float32


def test_a_configuration_whose_exported_engine_would_not_fit_this_machine_is_infeasible(evaluator):
    """Measured with a few slots, exported with all of them: a bundle tuned here must be servable here. The tiny
    target's KV at 4096 slots x its context outgrows a 1 GB machine; 2 slots do not."""
    evaluator.profile.hw.memory_gb = 1.0
    try:
        big = evaluator.evaluate({**engine_defaults(), "spec.enabled": False, "batch.max_requests": 4096})
        assert not big.feasible and big.why.startswith("the exported engine (4096 requests x ") and "1 GB" in big.why
        assert evaluator.evaluate({**engine_defaults(), "spec.enabled": False, "batch.max_requests": 2}).feasible
    finally:
        evaluator.profile.hw.memory_gb = None


def test_a_preset_workload_measures_its_own_domain():
    """A chat deployment is measured on chat prompts, a code one on code, other presets on code."""
    from dspark_core.cli.prompts import load_prompts
    from tuner.measure import preset_prompts

    assert {r.domain for r in load_prompts(preset_prompts("chat"))} == {"chat"}
    assert preset_prompts("code") == preset_prompts("math") != preset_prompts("chat")
    assert preset_prompts("code").is_file()


def test_a_cpu_study_screens_the_methods_in_the_dtype_this_cpu_runs_faster():
    """The screen compares the methods at its start point, so a measured CPU study starts in the dtype whose verify
    step measured faster here (tuner/measure.start_dtype), not in fp32 whatever the CPU; nothing is measured on a GPU,
    for a fixed dtype or where fp32 and bf16 are not both searched."""
    from kb.match import Plan, SpaceEntry
    from tuner.design import start_point
    from tuner.measure import start_dtype
    from tuner.study import StudySpec

    cpu = Profile.model_validate({"hw": {"arch": "cpu", "name": "cpu"}})
    entry = SpaceEntry(kind="choices", choices=["fp32", "bf16", "int8"], type="cat", rules=["r"], why="w")
    plan = Plan(space={"weights.dtype": entry}).model_dump(mode="json")
    spec = StudySpec(profile=cpu.model_dump(mode="json"), plan=plan, mode="measure", deploy="dspark")
    dtype, why = start_dtype(cpu, spec.space())  # measured on the tiny target
    assert dtype in ("fp32", "bf16") and "steps/s of" in why and "CPU" in why
    for picked in ("bf16", "fp32"):
        started = spec.model_copy(update={"start_dtype": picked})
        assert start_point(started.space())["weights.dtype"] == picked
        assert StudySpec.model_validate(started.model_dump(mode="json")).start_dtype == picked  # stored with it
    assert start_point(spec.space())["weights.dtype"] == "fp32"  # stored before it: the first choice, as it was
    gpu = Profile.model_validate({"hw": {"arch": "hopper", "name": "h100"}})
    assert start_dtype(gpu, spec.space()) == (None, "")
    bf16_only = Plan(space={"weights.dtype": entry.model_copy(update={"choices": ["bf16", "int8"]})})
    narrow = spec.model_copy(update={"plan": bf16_only.model_dump(mode="json")})
    assert start_dtype(cpu, narrow.space()) == (None, "")
