"""Every flag and key the SGLang and vLLM exports use is one the released engines accept.

tuner/catalog/releases.yaml is read off the released packages' own parsers (sglang 0.5.23, vllm 0.33.0) by
benchmarks/pin_peer_args.py; benchmarks/interop_check.py runs whole bundles through both engines. A deprecated
option counts as absent: the bundle must not make the engine warn.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.tuner.fixtures import plan, profile
from tuner.launch import SGLANG_TEMPLATE, VLLM_TEMPLATES
from tuner.launch import template_env as _env
from tuner.space import space_from_plan
from tuner.targets import (
    KV_DTYPE,
    SGLANG_ATTENTION,
    SGLANG_QUANT,
    SGLANG_VERIFY_MODE,
    VLLM_ATTENTION,
    VLLM_ATTENTION_MLA,
    VLLM_PASSES,
    VLLM_QUANT,
    sglang_context,
    vllm_context,
)

CATALOG = Path(__file__).resolve().parents[2] / "tuner" / "catalog"
RELEASES = yaml.safe_load((CATALOG / "releases.yaml").read_text())
SG, VL = RELEASES["sglang"], RELEASES["vllm"]


def _accepted(side: dict) -> set[str]:
    return {f for flags in side["flags"].values() for f in flags} - set(side["deprecated"])


SGLANG_FLAGS = _accepted(SG)
VLLM_FLAGS = _accepted(VL)
COMMON = {"study": "s", "trial_number": 0, "mode": "simulate", "hw_name": "H100-SXM", "model_name": "Qwen3-8B"}


def _variants():
    base = space_from_plan(plan()).params_of({"spec.block_size": 7, "spec.scheduler": "prefix",
                                              "batch.max_requests": 32})
    for sched, wd, kv, attn, tp, ep, extra in itertools.product(
            ["verify_all", "threshold", "prefix", "async_topk"], ["auto", "fp8", "int8", "int4", "nvfp4"],
            ["auto", "fp8_e4m3", "fp8_e5m2"], ["torch", "fa3", "flashinfer", "triton", "trtllm_mha", "aiter"],
            [1, 4, 16], [1, 2], [True, False]):
        yield {**base, "spec.scheduler": sched, "weights.dtype": wd, "kv.dtype": kv, "attention.backend": attn,
               "parallel.tp": tp, "parallel.ep": ep, "parallel.dp": tp, "batch.chunked_prefill": 4096 * extra,
               "batch.cuda_graph_max_bs": 160 * extra, "spec.align_verify_to_graph": extra, "spec.enabled": extra,
               "spec.draft_kv_dtype": "fp8" if extra else "bf16", "batch.schedule_conservativeness": 0.3,
               "parallel.dp_attention": extra, **{name: extra for name in VLLM_PASSES}}


def test_pins_are_the_releases():
    assert RELEASES["packages"]["sglang"]["version"] == "0.5.23"
    assert RELEASES["packages"]["vllm"]["version"] == "0.33.0"


def test_choice_mappings_are_pinned_values():
    assert {v for v in SGLANG_QUANT.values() if v} <= set(SG["choices"]["quantization"])
    assert {v for v in KV_DTYPE.values() if v} <= set(SG["choices"]["kv_cache_dtype"])
    assert set(SGLANG_ATTENTION.values()) <= set(SG["choices"]["attention_backend"])
    assert "unquant" in SG["choices"]["speculative_draft_model_quantization"]
    assert {v for v in VLLM_QUANT.values() if v} <= set(VL["choices"]["quantization"])
    assert {v for v in KV_DTYPE.values() if v} <= set(VL["choices"]["kv_cache_dtype"])
    assert set(VLLM_ATTENTION.values()) <= set(VL["choices"]["attention_backend"])
    assert set(VLLM_ATTENTION_MLA.values()) <= set(VL["choices"]["attention_backend"])
    assert "dspark" in VL["speculative_methods"]
    assert set(SGLANG_VERIFY_MODE.values()) <= set(SG["ragged_verify_modes"])
    assert set(VLLM_PASSES.values()) <= set(VL["pass_config_fields"])  # vllm/config/compilation.py PassConfig


@pytest.mark.parametrize("i", range(0, 2160, 97))
def test_rendered_flags_exist(i):
    params = list(_variants())[i]
    env = _env()
    sg = env.get_template(SGLANG_TEMPLATE).render(**COMMON, **sglang_context(profile(), params))
    used = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", sg))
    assert used and used <= SGLANG_FLAGS, used - SGLANG_FLAGS
    vctx = vllm_context(profile(), params)
    vs = env.get_template(VLLM_TEMPLATES[1]).render(**COMMON, **vctx)
    used = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", vs))
    assert used and used <= VLLM_FLAGS, used - VLLM_FLAGS
    if vctx["compilation_config"]:
        assert set(json.loads(vctx["compilation_config"])["pass_config"]) <= set(VL["pass_config_fields"])
    spec = json.loads(env.get_template(VLLM_TEMPLATES[0]).render(**COMMON, **vctx))
    if params.get("spec.enabled", True):
        assert set(spec) <= set(VL["speculative_config_fields"]) and spec["method"] == "dspark"
    else:
        assert spec == {} and "--speculative-config" not in vs  # plain decoding names no method


def test_sts_payload_truncates_a_longer_calibration_to_gamma():
    from tuner.targets import sts_payload

    cal = {"temperatures": [1.0, 0.5, 2.0, 0.8], "dataset": "d", "num_samples": 10,
           "ece_before": [0.1, 0.2, 0.3, 0.4], "ece_after": [0.05, 0.1, 0.1, 0.2]}
    params = {"spec.block_size": 3}
    got = sts_payload(profile(), params, cal)
    assert got["temperatures"] == [1.0, 0.5, 2.0] and got["ece_after"] == [0.05, 0.1, 0.1]
    assert sts_payload(profile(), params)["temperatures"] == [1.0, 1.0, 1.0]
