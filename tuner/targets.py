"""Tuned parameters -> the values the SGLang and vLLM templates need (flag names pinned in catalog/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from profiler.schema import Profile

CATALOG = Path(__file__).parent / "catalog"

# our parameter values -> serving-stack spellings (None: leave the stack's default)
KV_DTYPE = {"auto": None, "bf16": None, "fp16": None, "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
SGLANG_QUANT = {"auto": None, "bf16": None, "fp16": None, "fp32": None, "fp8": "fp8", "int8": "w8a8_int8",
                "int4": "awq_marlin", "nvfp4": "modelopt_fp4"}
VLLM_QUANT = {"auto": None, "bf16": None, "fp16": None, "fp32": None, "fp8": "fp8", "int8": "compressed-tensors",
              "int4": "awq_marlin", "nvfp4": "modelopt_fp4"}
SGLANG_ATTENTION = {"torch": "torch_native", "triton": "triton", "flashinfer": "flashinfer", "fa3": "fa3",
                    "fa4": "fa4", "trtllm_mha": "trtllm_mha", "aiter": "aiter"}
VLLM_ATTENTION = {"triton": "TRITON_ATTN", "flashinfer": "FLASHINFER", "fa3": "FLASH_ATTN", "fa4": "FLASH_ATTN",
                  "trtllm_mha": "FLASHINFER", "aiter": "ROCM_AITER_FA"}
# SGLang picks the DSpark verify scheduler with SGLANG_RAGGED_VERIFY_MODE (ragged_verify.py): `compact` is
# the confidence-budget planner (lagged budget + top-K, our async_topk; the closest to prefix), `static`
# verifies the whole block. SGLang main has no static-threshold scheduler.
SGLANG_VERIFY_MODE = {"verify_all": "static", "threshold": "static", "prefix": "compact", "async_topk": "compact"}


def _source(name: str) -> str:
    path = CATALOG / name
    if not path.exists():
        return "not pinned"
    import yaml

    first = next(iter((yaml.safe_load(path.read_text()) or {}).get("sources", {}).values()), {})
    return f"{first.get('repo', '?')} {first.get('path', name)} @ {str(first.get('commit', '?'))[:12]}"


def model_path(profile: Profile) -> str:
    src = profile.model.source or ""
    if src and (Path(src).exists() or "/" in src and not src.startswith("catalog")):
        return src
    return profile.model.name or "MODEL"


def _common(profile: Profile, p: dict[str, Any]) -> dict[str, Any]:
    return {"model_path": model_path(profile), "tp": int(p["parallel.tp"]), "dp": int(p["parallel.dp"]),
            "ep": int(p["parallel.ep"]), "mem_fraction": float(p["memory.fraction_static"]),
            "max_requests": int(p["batch.max_requests"]), "max_tokens": int(p["batch.max_tokens"]),
            "kv_cache_dtype": KV_DTYPE.get(p["kv.dtype"]), "spec_enabled": bool(p["spec.enabled"]),
            "block_size": int(p["spec.block_size"]), "draft_model_path": p.get("drafter.path") or ""}


def sglang_context(profile: Profile, p: dict[str, Any]) -> dict[str, Any]:
    return {**_common(profile, p), "chunked_prefill": int(p.get("batch.chunked_prefill") or 0),
            "cuda_graph_max_bs": int(p.get("batch.cuda_graph_max_bs") or 0),
            "quantization": SGLANG_QUANT.get(p["weights.dtype"]),
            "attention_backend": SGLANG_ATTENTION.get(p["attention.backend"]) if p["attention.backend"] != "torch"
            else None,
            "verify_mode": SGLANG_VERIFY_MODE[p["spec.scheduler"]],
            "scheduler_note": _scheduler_note(p["spec.scheduler"]),
            "align_to_graph": bool(p.get("spec.align_verify_to_graph", False)),
            "sglang_source": _source("sglang_args.yaml")}


def _scheduler_note(name: str) -> str:
    return {"verify_all": "verify the whole block (static)",
            "threshold": "SGLang main has no threshold scheduler: verify-all (static) is the nearest",
            "prefix": "SGLang's compact planner (lagged budget + top-K) is the nearest to Algorithm 1",
            "async_topk": "compact = the confidence-budget planner (lagged budget + global top-K)"}[name]


def vllm_context(profile: Profile, p: dict[str, Any]) -> dict[str, Any]:
    ctx = _common(profile, p)
    spec = {"method": "dspark", "model": ctx["draft_model_path"] or "DRAFT_MODEL_PATH",
            "num_speculative_tokens": ctx["block_size"],
            "enable_adaptive_verification": p["spec.scheduler"] != "verify_all"}
    return {**ctx, "quantization": VLLM_QUANT.get(p["weights.dtype"]),
            "attention_backend": VLLM_ATTENTION.get(p["attention.backend"]),
            "speculative_config_json": json.dumps(spec, indent=2), "vllm_source": _source("vllm_args.yaml")}


def sts_payload(profile: Profile, p: dict[str, Any], calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    """SGLang's DSparkStsCalibration for block length gamma: a measured calibration when one exists, else
    identity temperatures. STS is fitted left to right, so the first gamma temperatures of a longer
    calibration are exactly the calibration of a gamma-token block."""
    gamma = int(p["spec.block_size"])
    temps = (calibration or {}).get("temperatures") or []
    if len(temps) >= gamma:
        out = dict(calibration)
        for key in ("temperatures", "ece_before", "ece_after"):
            if isinstance(out.get(key), list):
                out[key] = out[key][:gamma]
        return out
    return {"temperatures": [1.0] * gamma, "dataset": "identity (no drafter calibrated for this model here)",
            "num_samples": 0, "ece_before": [], "ece_after": []}


def measured_calibration(head: str) -> dict[str, Any] | None:
    """The STS calibration shipped with the bundled engine's drafter for `head` (the tiny target's)."""
    from dspark_core.config import ASSETS

    path = ASSETS / "drafters" / head / "sts.json"
    return json.loads(path.read_text()) if path.is_file() else None
