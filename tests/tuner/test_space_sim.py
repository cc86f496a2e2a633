"""Search space from a plan, the performance model and the simulator."""

from __future__ import annotations

from optuna.distributions import CategoricalDistribution, IntDistribution

from kb.match import Plan
from tests.tuner.fixtures import plan, profile
from tuner.acceptance import acceptance_for, expected_tau
from tuner.objective import SimulateEvaluator
from tuner.perf import Hardware, ModelShape, PerfModel
from tuner.space import space_from_plan, unrestricted_space


def test_plan_becomes_distributions_fixed_and_warm_start():
    s = space_from_plan(plan())
    assert s.distributions["spec.block_size"] == IntDistribution(2, 12)
    assert isinstance(s.distributions["spec.scheduler"], CategoricalDistribution)
    assert s.fixed == {"spec.head": "markov"} and s.warm_start == {"spec.block_size": 7}
    full = s.params_of({"spec.block_size": 5, "spec.scheduler": "prefix", "batch.max_requests": 8})
    assert full["spec.head"] == "markov" and full["spec.block_size"] == 5 and "kv.dtype" in full


def test_int_range_with_excluded_values_becomes_categorical():
    p = Plan.model_validate({"space": {"spec.block_size": {"kind": "range", "low": 2, "high": 6, "exclude": [4],
                                                           "type": "int", "rules": ["x"], "why": ""}}})
    assert space_from_plan(p).distributions["spec.block_size"].choices == (2, 3, 5, 6)


def test_unrestricted_space_uses_registry_domains():
    u = unrestricted_space(plan())
    assert u.distributions["spec.block_size"] == IntDistribution(1, 16)
    assert u.distributions["spec.head"].choices == ("none", "markov", "rnn")


def test_perf_model_memory_bound_decode_and_tp():
    p = profile()
    perf = PerfModel(ModelShape.from_profile(p), Hardware.from_profile(p))
    one = perf.step(1, 1024)
    assert one.bound == "memory"
    # a bf16 8B decode step reads ~16 GB at ~2.7 TB/s effective: about 6 ms
    assert 0.004 < one.seconds < 0.01
    assert perf.step(64, 1024, 1).seconds < 2 * one.seconds  # verifying 64 tokens costs little more
    tp2 = PerfModel(perf.shape, perf.hw, tp=2)
    assert tp2.step(1, 1024).seconds < one.seconds
    assert PerfModel(perf.shape, perf.hw, weights_dtype="fp8").step(1, 1024).seconds < one.seconds


def test_prior_acceptance_reproduces_the_paper_tau():
    p = profile()
    acc = acceptance_for(p, "markov")
    assert abs(acc.tau(7) - 3.503) < 0.01 and "Table 1" in acc.source  # chat mean, Qwen3-8B, gamma 7
    none = acceptance_for(p, "none")
    assert none.tau(7) < acc.tau(7)
    assert expected_tau([1.0, 1.0]) == 3.0


def test_simulator_speculation_beats_plain_and_is_deterministic():
    ev = SimulateEvaluator(profile(), n_requests=24)
    s = space_from_plan(plan())
    base = s.params_of({"spec.block_size": 7, "spec.scheduler": "prefix", "batch.max_requests": 16})
    a = ev.evaluate(base, seed=1)
    b = ev.evaluate(base, seed=1)
    assert a.metrics == b.metrics
    plain = ev.evaluate({**base, "spec.enabled": False}, seed=1)
    assert a.metrics["throughput"] > 1.5 * plain.metrics["throughput"]
    assert a.metrics["tau"] > 2.5 and plain.metrics["tau"] == 1.0
    # a trial is the mean of two request samples; seed 1 uses samples 2 and 3, which no other seed uses
    one = SimulateEvaluator(profile(), n_requests=24, repeats=1)
    pair = [one.evaluate(base, seed=k).metrics["throughput"] for k in (2, 3)]
    assert abs(a.metrics["throughput"] - sum(pair) / 2) < 1e-6 * a.metrics["throughput"] and pair[0] != pair[1]
    sps = ev.sps_table(base)
    assert list(sps.sample_batch_tokens) == sorted(set(sps.sample_batch_tokens))
    assert sps.sample_steps_per_sec[0] >= sps.sample_steps_per_sec[-1]


def test_fp8_without_fp8_cores_runs_weight_only_and_fp8_kv_is_infeasible():
    """Ampere runs FP8 checkpoints as W8A16 (vLLM's Marlin): half the weight bytes at the BF16 compute rate, so a
    memory-bound decode gets faster; an FP8 KV cache there is not modelled and is refused."""
    p = profile()
    p.hw.fp8 = False
    ev = SimulateEvaluator(p, n_requests=8)
    params = space_from_plan(plan()).params_of({"spec.block_size": 4, "spec.scheduler": "verify_all",
                                                "batch.max_requests": 8})
    w8a16, bf16 = ev.evaluate({**params, "weights.dtype": "fp8"}), ev.evaluate({**params, "weights.dtype": "bf16"})
    assert w8a16.feasible and w8a16.metrics["throughput"] > bf16.metrics["throughput"]
    r = ev.evaluate({**params, "kv.dtype": "fp8_e4m3"})
    assert not r.feasible and "FP8" in r.why


def test_kernel_knobs_take_declared_values_and_only_where_observable():
    p = Plan.model_validate({"space": {
        "kernel.rmsnorm.num_warps": {"kind": "range", "low": 1, "high": 8, "type": "int", "rules": ["k"], "why": ""},
        "kernel.verify_greedy.BLOCK_V": {"kind": "range", "low": 1000, "high": 9000, "type": "int", "rules": ["k"],
                                         "why": ""}},
        "prefer": {"kernel.rmsnorm.num_warps": {"value": 4, "rules": ["k"]}}})
    assert not [n for n in space_from_plan(p).distributions if n.startswith("kernel.")]
    assert space_from_plan(p).defaults["kernel.rmsnorm.num_warps"] == 4  # the rule's preference is used
    dists = space_from_plan(p, tune_kernels=True).distributions
    for d in dists.values():
        assert all(v & (v - 1) == 0 for v in d.choices)  # powers of two only
    assert set(dists["kernel.rmsnorm.num_warps"].choices) <= {1, 2, 4, 8}


def test_closed_loop_throughput_is_read_between_ramp_up_and_drain():
    ev = SimulateEvaluator(profile())  # the tuner default: six requests per client of the closed loop
    assert ev.n_requests == 6 * 16
    base = space_from_plan(plan()).params_of({"spec.block_size": 7, "spec.scheduler": "prefix",
                                              "batch.max_requests": 16})
    m = ev.evaluate({**base, "spec.markov_rank": 256}, seed=0)
    window, makespan = m.extra["steady_window_s"], m.extra["makespan_s"]
    assert 0.4 * makespan < window < makespan
    # the drain (fewer clients than the loop's width while the last requests finish) lowers tokens / makespan
    assert m.metrics["throughput"] > m.extra["makespan_throughput"]
    runs = [ev.evaluate({**base, "spec.markov_rank": 256}, seed=s) for s in range(6)]
    steady = [r.metrics["throughput"] for r in runs]
    whole = [r.extra["makespan_throughput"] for r in runs]
    assert max(steady) / min(steady) < max(whole) / min(whole)  # the drain's stragglers no longer decide it


def test_offline_batches_keep_tokens_over_makespan():
    from tuner.acceptance import acceptance_for
    from tuner.simulate import simulate

    ev = SimulateEvaluator(profile())
    base = space_from_plan(plan()).params_of({"spec.block_size": 7, "spec.scheduler": "prefix",
                                              "batch.max_requests": 16})
    params = {**base, "spec.markov_rank": 256}
    r = simulate(params, profile(), ev.perf(params), acceptance_for(profile(), "markov"), requests=[(100, 50)] * 8)
    assert r.throughput == r.extra["makespan_throughput"] == 8 * 50 / r.extra["makespan_s"]


def test_a_decode_worker_skips_the_prefill_and_clients_outnumbering_requests_are_avoided():
    """simulate(decode_only=True): a disaggregated decode worker's prompts arrive prefilled, so its TTFT holds no
    prefill forward; a closed loop of more clients than the old 384-request cap simulates 3 requests per client."""
    from kb.match import match_profile
    from profiler.build import build_profile

    prof = build_profile("Qwen3-8B", "h100", "chat", measure=False, gpus=2)
    space = space_from_plan(match_profile([], prof))
    first = {k: d.choices[0] if hasattr(d, "choices") else d.low for k, d in space.distributions.items()}
    params = space.params_of({**first, "spec.enabled": False, "batch.max_requests": 64})
    both = SimulateEvaluator(prof, cost="roofline").evaluate(params, seed=0)
    decode = SimulateEvaluator(prof, cost="roofline", decode_only=True).evaluate(params, seed=0)
    assert decode.metrics["ttft_p99_ms"] < both.metrics["ttft_p99_ms"]
    assert decode.metrics["throughput"] > both.metrics["throughput"]
    busy = prof.model_copy(update={"workload": prof.workload.model_copy(update={"concurrency": 416})})
    assert SimulateEvaluator(busy, cost="roofline").n_requests == 3 * 416
    assert SimulateEvaluator(prof, cost="roofline").n_requests == min(384, 6 * (prof.workload.concurrency or 16))
