"""AIConfigurator's database as the simulator's cost source (the `aic` extra; CI installs it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from profiler.build import build_profile
from tuner.aic import aic_perf, catalog, installed_version, resolve
from tuner.perf import Efficiency, Hardware, ModelShape, PerfModel

ROOT = Path(__file__).resolve().parents[2]
needs_aic = pytest.mark.skipif(installed_version() != catalog()["version"],
                               reason="the aic extra (aiconfigurator-core 0.12.0) is not installed")


def base(model: str, gpu: str, **kw) -> tuple[PerfModel, object]:
    p = build_profile(model, gpu, "chat", measure=False)
    return PerfModel(ModelShape.from_profile(p), Hardware.from_profile(p), Efficiency.prior(p.hw), **kw), p


def test_a_gpu_aic_has_not_measured_is_priced_by_the_roofline_with_the_reason():
    perf, p = base("qwen3", "l4")
    target, why = resolve(p)
    assert target is None and "L4" in why
    got, why = aic_perf(perf, p)
    assert got is perf and got.cost_source == "roofline" and why


@needs_aic
def test_plain_decode_steps_are_aics_per_op_sum():
    perf, p = base("Qwen3-8B", "h100")
    sim, why = aic_perf(perf, p)
    assert not why and sim.cost_source == "aic:h100_sxm/sglang/0.5.14"
    for batch, ctx in ((1, 1024), (8, 4096), (64, 2048)):
        ops = sim.aic.engine.decode_step_per_op(batch, ctx, 2)  # AIC prices context ctx + 1
        ours = sim.step(batch, ctx + 1, batch).seconds * 1e3
        assert ours == pytest.approx(sum(o[1] for o in ops), rel=0.03)


@needs_aic
def test_a_verify_step_reads_each_requests_kv_once():
    sim, _ = aic_perf(*base("Qwen3-8B", "h100"))
    plain = sim.step(8, 2048, 8).seconds
    verify = sim.step(64, 2048, 8).seconds  # 8 requests x (gamma 7 + 1) rows
    as_rows = sim.step(64, 2048, 64).seconds  # what pricing each row as its own request would charge
    assert plain < verify < as_rows
    assert sim.prefill(8 * 1024, 1024, 8).seconds > 5 * plain


@needs_aic
def test_the_drafter_costs_a_fraction_of_the_target_and_grows_with_its_head():
    sim, _ = aic_perf(*base("Qwen3-8B", "h100"))
    none = sim.draft_step(8, 7, 2048, 1, "none")
    markov = sim.draft_step(8, 7, 2048, 1, "markov", 256)
    assert 0 < none < markov < sim.step(64, 2048, 8).seconds
    assert sim.draft_step(8, 7, 2048, 2, "markov", 256) > markov


@needs_aic
def test_a_weight_dtype_aic_has_not_measured_is_scaled_from_the_nearest_measured_one():
    """FP8 / int8 on Ampere (bf16 is all it timed), int4 on Hopper (FP8 is nearest): AIC's price of the nearest
    measured format times the roofline's dtype ratio, one scale per case."""
    for gpu, dtype, ref in (("a100", "fp8", "bf16"), ("a100", "int8", "bf16"), ("h100", "int4", "fp8"),
                            ("h100", "int8", "fp8")):
        b, profile = base("Qwen3-8B", gpu, weights_dtype=dtype)
        got, why = aic_perf(b, profile)
        assert why == "" and got.cost_source.endswith(f"({dtype} as {ref} x roofline ratio)")
        bf16, _ = aic_perf(*base("Qwen3-8B", gpu, weights_dtype=ref))
        roof_bf16, _ = base("Qwen3-8B", gpu, weights_dtype=ref)
        for tokens in (1, 8, 64):
            want = b.step(tokens, 2048, tokens).seconds * bf16.step(tokens, 2048, tokens).seconds \
                / roof_bf16.step(tokens, 2048, tokens).seconds
            assert got.step(tokens, 2048, tokens).seconds == pytest.approx(want, rel=1e-9)
        assert got.kv_capacity_tokens(0.9) == b.kv_capacity_tokens(0.9)  # memory is the dtype's own


@needs_aic
def test_a_dtype_aic_lacks_is_its_nearest_timed_variant_times_the_roofline_ratio():
    """FP8 KV with MLA (DeepSeek-V3: AIC has no FP8 context-MLA table) and FP8 on Ampere: AIC's price of the nearest
    variant it timed, scaled once by the roofline's ratio (prefill too), never the bare roofline beside AIC's."""
    perf, p = base("DeepSeek-V3", "h200", weights_dtype="fp8", kv_dtype="fp8", tp=8)
    got, why = aic_perf(perf, p)
    assert not why and got.cost_source == "aic:h200_sxm/sglang/0.5.14 (fp8 KV as auto KV x roofline ratio)"
    for cost, ref, roof, mine in ((got.step(8, 2048, 8), got.ref.step(8, 2048, 8), got.ref_roofline.step(8, 2048, 8),
                                   perf.step(8, 2048, 8)),
                                  (got.prefill(2048, 2048, 1), got.ref.prefill(2048, 2048, 1),
                                   got.ref_roofline.prefill(2048, 2048, 1), perf.prefill(2048, 2048, 1))):
        assert cost.seconds == pytest.approx(ref.seconds * mine.seconds / roof.seconds, rel=1e-9)
    ampere, _ = aic_perf(*base("Qwen3-8B", "a100", weights_dtype="fp8", kv_dtype="fp8_e4m3"))
    assert ampere.cost_source == "aic:a100_sxm/sglang/0.5.10 (fp8 as bf16, fp8_e4m3 KV as auto KV x roofline ratio)"
    layout, why = aic_perf(*base("Llama-3.1-8B", "h100", tp=3))  # a layout the engine refuses too
    assert layout.cost_source == "roofline" and "divisible" in why and "/" not in why.split(": ", 1)[1]


@needs_aic
def test_an_aic_study_marks_a_point_aic_cannot_price_infeasible():
    from tuner.objective import SimulateEvaluator
    from tuner.space import engine_defaults

    p = build_profile("Llama-3.1-8B", "h100", "chat", measure=False)
    ev = SimulateEvaluator(p, n_requests=24, repeats=1, cost="aic")
    got = ev.evaluate({**engine_defaults(), "weights.dtype": "bf16", "kv.dtype": "bf16", "parallel.tp": 3}, seed=0)
    assert not got.feasible and got.why.startswith("AIC cannot price this point: ") and "divisible" in got.why


def test_the_report_says_which_source_priced_the_study_and_how_many_points_were_scaled():
    from types import SimpleNamespace

    from tuner.report import cost_line

    def t(cost):
        return SimpleNamespace(user_attrs={"cost_source": cost} if cost else {})

    aic = "aic:h200_sxm/sglang/0.5.14"
    trials = [t(aic), t(aic + " (fp8 KV as auto KV x roofline ratio)"), t("none"), t(None)]
    line = cost_line(trials, trials[1])
    assert line.startswith(f"Priced by {aic}; 1 of 2 trials at a dtype AIC has not timed") and "MIXED" not in line
    assert "MIXED" in cost_line([t(aic), t("roofline")], trials[0])
    e5m2, _ = aic_perf(*base("Qwen3-8B", "h100", weights_dtype="fp8", kv_dtype="fp8_e5m2"))
    e4m3, _ = aic_perf(*base("Qwen3-8B", "h100", weights_dtype="fp8", kv_dtype="fp8_e4m3"))
    assert e5m2.cost_source == e4m3.cost_source == "aic:h100_sxm/sglang/0.5.14"  # one byte either way


@needs_aic
def test_simulated_trials_name_their_cost_source():
    from tuner.objective import SimulateEvaluator
    from tuner.space import engine_defaults

    p = build_profile("Qwen3-8B", "h100", "chat", measure=False)
    params = {**engine_defaults(), "weights.dtype": "bf16", "kv.dtype": "bf16"}
    ev = SimulateEvaluator(p, n_requests=24, repeats=1, cost="aic")
    got = ev.evaluate(params, seed=0)
    assert got.feasible and got.extra["cost_source"] == "aic:h100_sxm/sglang/0.5.14"
    assert "aic:h100_sxm/sglang/0.5.14" in ev.describe()
    roof = SimulateEvaluator(p, n_requests=24, repeats=1).evaluate(params, seed=0)
    assert roof.extra["cost_source"] == "roofline"
    assert got.metrics["throughput"] != roof.metrics["throughput"]


def test_cost_aic_on_an_unmeasured_gpu_is_one_line(capsys, tmp_path):
    import cli

    code = cli.main(["tune", "--model", "qwen3", "--gpu", "l4", "--cost", "aic", "--trials", "1",
                     "--db", f"sqlite:///{tmp_path / 'kb.sqlite'}", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and not (tmp_path / "b").exists()
    assert "--cost aic" in err.strip().splitlines()[-1] and "L4" in err


@needs_aic
def test_the_roofline_meets_issue_18_against_aics_own_estimate():
    """benchmarks/bench_vs_aic.py's set: the roofline alone within the issue's bounds of AIC's run_static."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_vs_aic

    out = bench_vs_aic.run(None)
    assert len(out["rows"]) >= 28 and not out["skipped"]
    r = out["roofline"]
    assert r["tpot_mape"] <= 0.08 and r["tpot_mape_fp8"] <= 0.10, json.dumps(r)
    assert 1 / 1.3 <= r["worst_ratio"] <= 1.3 and r["throughput_spearman"] >= 0.97, json.dumps(r)
    assert out["per_op_max_dev"] <= 0.03 and out["sim_aic"]["tpot_mape"] <= 0.03


@needs_aic
def test_roofline_priors_are_what_the_kernel_tables_give():
    """tuner/catalog/roofline.yaml is generated by benchmarks/aic_kernel_facts.py --write, not edited by hand."""
    import yaml

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import aic_kernel_facts as f

    from tuner.perf import PRIORS

    rows = [f.facts(gpu, v["system"], v["database"]) for gpu, v in catalog()["systems"].items()]
    assert yaml.safe_load(PRIORS.read_text())["architectures"] == \
        yaml.safe_load(yaml.safe_dump({"architectures": f.priors(rows)}))["architectures"]


@needs_aic
def test_an_engine_aic_timed_is_priced_with_its_own_tables_and_nvfp4_natively():
    """A TensorRT-LLM deployment reads TRT-LLM's kernel tables (an nvfp4 checkpoint on B200 at nvfp4, which AIC
    measured there); an engine AIC has no tables for (HF transformers) reads SGLang's."""
    perf, p = base("DeepSeek-V3", "b200", weights_dtype="nvfp4", tp=8)
    for engine, want in (("trtllm", "aic:b200_sxm/trtllm/1.3.0rc20"), ("vllm", "aic:b200_sxm/vllm/0.24.0"),
                         ("transformers", "aic:b200_sxm/sglang/0.5.14"), ("sglang", "aic:b200_sxm/sglang/0.5.14")):
        target, why = resolve(p, engine)
        assert target is not None and target.source() == want, why
    trt, why = aic_perf(perf, p, "trtllm")
    assert not why and trt.cost_source == "aic:b200_sxm/trtllm/1.3.0rc20"  # measured: not scaled from fp8
    sgl, _ = aic_perf(perf, p, "sglang")
    assert trt.step(4, 2048, 1).seconds != sgl.step(4, 2048, 1).seconds
    h100, q = base("DeepSeek-V3", "h100", weights_dtype="nvfp4", tp=8)  # Hopper: no FP4 kernels timed
    scaled, _ = aic_perf(h100, q, "trtllm")
    assert scaled.cost_source == "aic:h100_sxm/trtllm/1.3.0rc20 (nvfp4 as fp8 x roofline ratio)"


@needs_aic
def test_aic_covers_a_model_its_tables_time_only_quantised_and_refuses_unmeasured_shapes(monkeypatch):
    """TRT-LLM's B200 tables hold DeepSeek-R1's experts in fp8 and nvfp4 only: the model is covered (its published
    rows are priced by AIC, not the roofline); a model no dtype prices (SmolLM2's 64-wide heads) is refused with
    AIC's own first line."""
    import tuner.aic as aic

    p = build_profile("DeepSeek-R1", "b200", "chat", measure=False, gpus=8)
    target, why = aic.covers(p, "trtllm")
    assert target is not None and target.source() == "aic:b200_sxm/trtllm/1.3.0rc20", why
    tried: list[str] = []

    def untimed(target, tp, weights, kv, moe):  # noqa: ANN001, ANN202 - AIC refusing every dtype
        tried.append(weights)
        raise RuntimeError("perf database error: GEMM data missing")

    monkeypatch.setattr(aic, "handle", untimed)
    target, why = aic.covers(p, "trtllm")
    assert target is None and "shapes (perf database error: GEMM data missing)" in why
    assert tried == list(aic.COVER_DTYPES)
