"""Every reader kb/catalog/params.yaml names for a parameter really reads it: changing the value changes what that
reader does. sglang / vllm: the rendered launch script; simulator: the simulated metrics; engine: the bundled
engine's code reads the config field (a static check: the attribute is used outside dspark_core/config.py).
A reader that is not listed is not checked here; `rules lint` fails a rule on a parameter with no reader."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from kb.params import all_params
from tests.tuner.fixtures import QWEN3_8B_H100
from tuner.launch import SGLANG_TEMPLATE, VLLM_TEMPLATES
from tuner.launch import template_env as _env
from tuner.space import engine_defaults

ROOT = Path(__file__).resolve().parents[2]
COMMON = {"study": "s", "trial_number": 0, "mode": "simulate", "hw_name": "H100-SXM", "model_name": "Qwen3-8B"}
# a base where every reader is active: speculation on, a ragged scheduler, TP 2, a MoE-free dense model
BASE = {"spec.scheduler": "prefix", "parallel.tp": 2, "spec.block_size": 5, "batch.max_requests": 8,
        "batch.max_tokens": 4096}
# parameter -> (value, other value) that the reader must tell apart (defaults otherwise)
PAIRS: dict[str, tuple[Any, Any]] = {
    "spec.enabled": (True, False), "spec.block_size": (5, 3), "spec.head": ("markov", "rnn"),
    "spec.scheduler": ("prefix", "verify_all"), "spec.confidence_threshold": (0.1, 0.9),
    "spec.max_verify_tokens": (16, 1), "spec.fallback_acceptance": (0.0, 0.9), "spec.adaptive_gamma": (False, True),
    "spec.draft_layers": (1, 8), "spec.markov_rank": (16, 1024), "spec.draft_kv_dtype": ("auto", "fp8"),
    "spec.method": ("dspark", "ngram"), "spec.gamma_policy": ("static", "learned"),
    "batch.max_requests": (8, 2), "batch.max_tokens": (4096, 256), "batch.timeout_ms": (0.0, 200.0),
    "batch.chunked_prefill": (0, 256), "batch.cuda_graph_max_bs": (0, 64), "memory.fraction_static": (0.9, 0.2),
    "kv.dtype": ("auto", "fp8_e4m3"), "weights.dtype": ("auto", "fp8"), "attention.backend": ("fa3", "flashinfer"),
    "parallel.tp": (2, 1), "parallel.ep": (1, 2), "parallel.dp": (1, 2), "spec.align_verify_to_graph": (False, True),
    "batch.schedule_conservativeness": (1.0, 0.3), "memory.page_size": (16, 64), "parallel.dp_attention": (False, True),
    "fusion.norm_quant": (False, True), "fusion.act_quant": (False, True), "fusion.attn_quant": (False, True),
    "fusion.allreduce_rmsnorm": (False, True), "fusion.qk_norm_rope": (False, True),
    "fusion.rope_kvcache": (False, True), "fusion.rope_kvcache_mla": (False, True),
    "fusion.mla_dual_rmsnorm": (False, True),
    "drafter.suffix_spec_factor": (1.0, 8.0), "drafter.suffix_min_prob": (0.1, 0.02),
    "drafter.suffix_corpus": ("none", "auto"),
}
# scheduler-specific knobs are only read by the scheduler that uses them
# (and the static fraction only once the KV pool, not the 16 clients, limits the running requests: at 0.2 of one
# H100 Qwen3-8B's bf16 weights leave ~5k KV tokens of its 80 GiB)
CONTEXT = {"spec.confidence_threshold": {"spec.scheduler": "threshold"},
           "memory.fraction_static": {"parallel.tp": 1, "batch.max_requests": 16},
           "drafter.suffix_spec_factor": {"spec.method": "suffix"},
           "drafter.suffix_min_prob": {"spec.method": "suffix"}, "drafter.suffix_corpus": {"spec.method": "suffix"}}


# the MoE layout (attention DP, EP) is read on a MoE model, and priced by AIC's tables (the roofline prices a layout as
# TP): those parameters' readers run on Qwen3-30B-A3B on two H200s
MOE = ("parallel.ep", "parallel.dp_attention")


def _with(name: str, value: Any) -> dict[str, Any]:
    return {**engine_defaults(), **BASE, **CONTEXT.get(name, {}), name: value}


# the learned choices run the profile's policy files: any committed pair serves to see that the simulator reads them
POLICIES = {"verify_policy": str(ROOT / "dspark_core/assets/smollm2-135m/policy_cpu_bf16_markov.json"),
            "gamma_policy": str(ROOT / "dspark_core/assets/smollm2-135m/gamma_cpu_bf16_markov.json")}


@cache
def _profile(moe: bool = False):
    from profiler.schema import Profile

    if moe:
        from profiler.build import build_profile

        return build_profile("Qwen3-30B-A3B", "h200", "chat", measure=False, gpus=2)
    return Profile.model_validate({**QWEN3_8B_H100, "drafter": {**QWEN3_8B_H100.get("drafter", {}), **POLICIES}})


def _render(reader: str, params: dict[str, Any], moe: bool = False) -> str:
    from tuner.targets import sglang_context, vllm_context

    env = _env()
    if reader == "sglang":
        return env.get_template(SGLANG_TEMPLATE).render(**COMMON, **sglang_context(_profile(moe), params))
    ctx = vllm_context(_profile(moe), params)
    return "".join(env.get_template(t).render(**COMMON, **ctx) for t in VLLM_TEMPLATES)


@cache
def _simulate(items: tuple[tuple[str, Any], ...], moe: bool = False) -> tuple:
    from tuner.objective import SimulateEvaluator

    ev = SimulateEvaluator(_profile(moe), n_requests=24, repeats=1, cost="aic" if moe else "roofline")
    e = ev.evaluate(dict(items), seed=0)
    return (e.feasible, e.why, tuple(sorted((k, round(v, 6)) for k, v in e.metrics.items())))


@cache
def _engine_sources() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "dspark_core").rglob("*.py") if p.name != "config.py")


CASES = [(name, reader) for name, spec in sorted(all_params().items()) for reader in spec.readers]


def test_every_parameter_has_a_pair_and_a_reader() -> None:
    assert set(PAIRS) == set(all_params()), set(all_params()) ^ set(PAIRS)
    assert all(spec.readers for spec in all_params().values())


@pytest.mark.parametrize(("name", "reader"), CASES)
def test_reader_reads_the_parameter(name: str, reader: str) -> None:
    a, b = PAIRS[name]
    moe = name in MOE
    if reader in ("sglang", "vllm"):
        assert _render(reader, _with(name, a), moe) != _render(reader, _with(name, b), moe), f"{reader} ignores {name}"
    elif reader == "simulator":
        if moe:
            pytest.importorskip("aiconfigurator_core")
        assert _simulate(tuple(sorted(_with(name, a).items())), moe) != \
            _simulate(tuple(sorted(_with(name, b).items())), moe), f"the simulator ignores {name}"
    else:
        section, _, key = name.partition(".")
        used = re.search(rf"\.{section}\.{key}\b|\bspec\.{key}\b" if section == "spec" else rf"\.{section}\.{key}\b",
                         _engine_sources())
        assert used, f"no engine code reads config.{section}.{key}"
