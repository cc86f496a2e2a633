"""Speculative rounds priced method by method as the engines run them (tuner/methods.py), and the per-batch-size
draft-length schedule built on them (tuner/schedule.py)."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest

from profiler.build import build_profile
from tuner.acceptance import acceptance_of
from tuner.methods import Drafting, EngineCosts, costs_table, draft_net, engine_costs, round_cost
from tuner.perf import ModelShape, PerfModel
from tuner.schedule import batch_schedule, k_at, sglang_adaptive_config, vllm_schedule


@cache
def _perf(model: str = "qwen3-8b", gpu: str = "h100") -> PerfModel:
    """The roofline kernel model of `model` on one `gpu` (no AIC: the test holds without the extra)."""
    from tuner.space import engine_defaults

    p = build_profile(model, gpu, "chat", measure=False, entropy=False)
    from tuner.objective import SimulateEvaluator

    return SimulateEvaluator(p, n_requests=4, repeats=1, cost="roofline").perf_why(engine_defaults())[0]


def _costs(**kw: float) -> EngineCosts:
    base = EngineCosts(engine="sglang", round_s=0.0, request_s=0.0, draft_step_s=0.0, host_lookup_s=20e-6,
                       eager_layer_s=30e-6, graphs=True, graph_max_bs=48, graph_max_tokens=0, max_running=48)
    return replace(base, **kw)


def test_sequential_drafts_cost_one_forward_per_step_a_block_drafter_one_in_all() -> None:
    """EAGLE-3 pays an extend forward and K - 1 steps, so its draft time grows about linearly in K; DFlash's one
    parallel forward grows far less from K = 1 to 7."""
    perf, c = _perf(), _costs()
    eagle = [round_cost(perf, c, Drafting("eagle3"), 8, k, 1024).draft_s for k in (1, 4, 7)]
    block = [round_cost(perf, c, Drafting("dflash", layers=5), 8, k, 1024).draft_s for k in (1, 4, 7)]
    assert eagle[0] < eagle[1] < eagle[2] and eagle[2] > 4 * eagle[0]
    assert block[2] < 2 * block[0]


def test_verify_rows_host_lookups_and_the_plain_round() -> None:
    perf, c = _perf(), _costs()
    r = round_cost(perf, c, Drafting("eagle3"), 8, 3, 1024)
    assert r.rows == 8 * 4 and r.verify_s > round_cost(perf, c, Drafting("none"), 8, 0, 1024).verify_s
    tree = round_cost(perf, c, Drafting("eagle3", topk=4, draft_tokens=16), 8, 3, 1024)
    assert tree.rows == 8 * 16
    ngram = round_cost(perf, c, Drafting("ngram"), 8, 4, 1024)
    assert ngram.draft_s == pytest.approx(8 * 20e-6)  # a lookup per request, no GPU forward
    plain = round_cost(perf, _costs(round_s=1e-3), Drafting("none"), 8, 0, 1024)
    assert plain.fixed_s == 0.0 and plain.draft_s == 0.0  # a round without drafting pays no speculative constants


def test_fixed_costs_scale_with_requests_and_graph_coverage() -> None:
    """The fitted per-round and per-request constants are paid when drafting; past SGLang's 48 captured requests
    (or vLLM's 512 tokens) every layer pays its launches."""
    perf = _perf()
    d = Drafting("eagle3")
    c = _costs(round_s=100e-6, request_s=10e-6)
    assert round_cost(perf, c, d, 8, 3, 1024).fixed_s == pytest.approx(100e-6 + 80e-6)
    assert round_cost(perf, c, d, 64, 3, 1024).fixed_s == pytest.approx(100e-6 + 640e-6 + 30e-6 * 36)
    vllm = _costs(engine="vllm", graph_max_bs=0, graph_max_tokens=512)
    assert not vllm.eager(128, 512) and vllm.eager(128, 513)
    assert _costs(graphs=False).eager(1, 1)  # no graphs at all: every forward is eager


def test_mtp_module_is_one_target_layer_with_the_shared_head_eagle3_a_dense_layer() -> None:
    target = _perf("deepseek-v3", "h200").shape
    mtp = draft_net(target, Drafting("mtp"))
    assert mtp.num_layers == 1 and mtp.num_moe_layers == 1 and mtp.lm_head == target.lm_head
    layer = (target.params_active - target.lm_head - target.embed_in) / target.num_layers
    assert layer < mtp.params_active < layer + target.lm_head + 3 * target.hidden ** 2
    eagle = draft_net(_perf().shape, Drafting("eagle3", draft_vocab=32000))
    assert eagle.vocab == 32000 and eagle.num_layers == 1 and eagle.params_active < _perf().shape.params_active / 10
    with pytest.raises(AssertionError):
        draft_net(target, Drafting("draft_model"))  # a draft model is priced by its own shape


def test_engine_costs_read_the_fitted_table_and_fall_back_to_sglang() -> None:
    table = {"engines": {"sglang": {"round_us": 1.0, "graph_max_bs": 48, "max_running": 48},
                         "vllm": {"graph_max_tokens": 512, "graph_max_tokens_blackwell": 1024}},
             "fitted": {"sglang": {"round_us": 250, "request_us": 7}}}
    with costs_table(table):
        s = engine_costs("sglang")
        assert s.round_s == pytest.approx(250e-6) and s.request_s == pytest.approx(7e-6) and s.max_running == 48
        assert engine_costs("vllm", "blackwell").graph_max_tokens == 1024
        assert engine_costs("vllm", "hopper").graph_max_tokens == 512
        assert engine_costs("unknown").engine == "sglang"


def test_schedule_shortens_the_draft_under_load_and_exports_both_engines_forms() -> None:
    """On a MoE target verify gets dearer with the batch (more experts touched), so the best K never grows with
    the batch and eventually reaches a shorter draft; both engines' schedule forms cover 1..max_batch."""
    p = build_profile("qwen3-30b-a3b", "h100", "chat", measure=False, entropy=False)
    from tuner.objective import SimulateEvaluator
    from tuner.space import engine_defaults

    perf = SimulateEvaluator(p, n_requests=4, repeats=1, cost="roofline").perf_why(engine_defaults())[0]
    accept = acceptance_of(p, "eagle3", "markov", 1)
    sched = batch_schedule(perf, _costs(round_s=300e-6, request_s=20e-6), Drafting("eagle3"), accept, 6, 256, 1024)
    ks = [k for _, _, k in sched]
    assert sched[0][0] == 1 and sched[-1][1] == 256 and ks == sorted(ks, reverse=True) and ks[0] > ks[-1]
    assert all(a[1] + 1 == b[0] for a, b in zip(sched, sched[1:], strict=False))  # contiguous ranges
    assert k_at(sched, 1) == ks[0] and k_at(sched, 256) == ks[-1]
    v = vllm_schedule(sched)
    assert v["num_speculative_tokens_per_batch_size"] == sched and v["num_speculative_tokens"] == max(ks)
    cfg = sglang_adaptive_config(sched)
    assert all(k.isdigit() and isinstance(v["candidate_steps"], list) for k, v in cfg.items())


def test_draft_model_shape_is_the_small_models_own() -> None:
    small = ModelShape.from_profile(build_profile("qwen3-0.6b", "h100", "chat", measure=False, entropy=False))
    assert draft_net(_perf().shape, Drafting("draft_model", model=small)) is small
