"""Tuned parameters -> the values the SGLang and vLLM templates need.

Flag names are those the released engines accept (tuner/catalog/releases.yaml, pinned from sglang 0.5.23 and
vllm 0.33.0 by benchmarks/pin_peer_args.py; benchmarks/interop_check.py runs the bundles through both). A flag
is exported only when it does something under the exported configuration: SGLang's SPS table, STS file and
graph-tier alignment only act when its ragged verify mode is not `static`.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from profiler.schema import Profile
from tuner.engine_config import model_ref

CATALOG = Path(__file__).parent / "catalog"
BUNDLED_DRAFTER = "drafter"  # folder of a drafter shipped inside the bundle (relative to the bundle)

# our parameter values -> serving-stack spellings (None: leave the stack's default)
KV_DTYPE = {"auto": None, "bf16": None, "fp16": None, "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
SGLANG_QUANT = {"auto": None, "bf16": None, "fp16": None, "fp32": None, "fp8": "fp8", "int8": "compressed-tensors",
                "int4": "awq_marlin", "nvfp4": "modelopt_fp4"}
VLLM_QUANT = {"auto": None, "bf16": None, "fp16": None, "fp32": None, "fp8": "fp8", "int8": "compressed-tensors",
              "int4": "awq_marlin", "nvfp4": "modelopt_fp4"}
SGLANG_ATTENTION = {"torch": "torch_native", "triton": "triton", "flashinfer": "flashinfer", "fa3": "fa3",
                    "fa4": "fa4", "trtllm_mha": "trtllm_mha", "trtllm_mla": "trtllm_mla", "flashmla": "flashmla",
                    "aiter": "aiter"}
VLLM_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # --dtype (others: the checkpoint's)
DRAFTED_METHODS = ("dspark", "dflash", "eagle3", "draft_model")  # vLLM methods that load a draft checkpoint
VLLM_ATTENTION = {"triton": "TRITON_ATTN", "flashinfer": "FLASHINFER", "fa3": "FLASH_ATTN", "fa4": "FLASH_ATTN",
                  "trtllm_mha": "FLASHINFER", "aiter": "ROCM_AITER_FA"}
# an MLA model (DeepSeek-V2/V3, Kimi-K2) runs vLLM's MLA backends only (vllm/v1/attention/backends/registry.py:
# FLASHMLA, FLASHINFER_MLA, CUTLASS_MLA, TRITON_MLA, ROCM_AITER_MLA); a tuned SGLang backend with no MLA
# counterpart named here (fa3: SGLang's FA3 runs MLA, vLLM's FLASH_ATTN does not) leaves vLLM its own MLA default
VLLM_ATTENTION_MLA = {"trtllm_mla": "FLASHINFER_MLA", "flashmla": "FLASHMLA", "triton": "TRITON_MLA",
                      "aiter": "ROCM_AITER_MLA"}
# SGLang picks the DSpark verify scheduler with SGLANG_RAGGED_VERIFY_MODE (speculative/ragged_verify.py): `compact`
# is the confidence-budget planner (lagged budget + top-K, our async_topk; the closest to prefix), `static`
# verifies the whole block. SGLang has no static-threshold scheduler.
# Neither peer has a learned verify length or block length: those run in the bundled engine only.
SGLANG_VERIFY_MODE = {"verify_all": "static", "threshold": "static", "prefix": "compact", "async_topk": "compact",
                      "learned": "compact"}
# fusion.* -> vLLM 0.33 compilation_config.pass_config fields (vllm/config/compilation.py PassConfig)
VLLM_PASSES = {"fusion.norm_quant": "fuse_norm_quant", "fusion.act_quant": "fuse_act_quant",
               "fusion.attn_quant": "fuse_attn_quant", "fusion.allreduce_rmsnorm": "fuse_allreduce_rms",
               "fusion.qk_norm_rope": "enable_qk_norm_rope_fusion", "fusion.rope_kvcache": "fuse_rope_kvcache",
               "fusion.rope_kvcache_mla": "fuse_rope_kvcache_cat_mla",
               "fusion.mla_dual_rmsnorm": "fuse_mla_dual_rms_norm"}
SGLANG_DRAFT_KV = {"auto": None, "bf16": "bf16", "fp8": "fp8_e4m3"}  # --speculative-draft-kv-cache-dtype
GPUS_PER_NODE = 8  # a TP group wider than this spans nodes (SGLang --nnodes)
VLLM_HEADS = ("none", "markov")  # vLLM 0.33's Qwen3DSparkModel implements the vanilla Markov head only
VLLM_ACTIVATION_FACTOR = 2  # bf16 bytes per activation element in vLLM's profiling run


@cache
def _source(name: str) -> str:
    """The pinned releases a catalogue file names (one line for the scripts' comments); read once per process:
    releases.yaml is large and every export and live trial asks."""
    path = CATALOG / name
    if not path.exists():
        return "not pinned"
    import yaml

    data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    pins = data.get("packages") or {}
    if pins:
        return ", ".join(f"{k} {v['version']}" for k, v in pins.items())
    first = next(iter(data.get("sources", {}).values()), {})
    return f"{first.get('repo', '?')} {first.get('path', name)} @ {str(first.get('commit', '?'))[:12]}"


def draft_ref(profile: Profile, bundled: bool) -> str | None:
    """The drafter the scripts start with: the bundle's own copy, the profile's checkpoint (a published model id
    or a folder), or None (the user must name one: DRAFT_MODEL_PATH)."""
    if bundled:
        return BUNDLED_DRAFTER
    return profile.drafter.id or None


def replicas(profile: Profile, p: dict[str, Any]) -> int:
    """Data-parallel replicas: parallel.dp, where 0 means every replica of the tuned TP the devices hold."""
    dp, tp = int(p.get("parallel.dp", 1)), int(p["parallel.tp"])
    return max(1, (profile.hw.count or tp) // tp) if dp == 0 else dp


# weight formats the engines load only from a checkpoint quantised offline (FP8 they quantise at load from bf16)
PREQUANTIZED = {"int8": "int8 (W8A8, compressed-tensors: e.g. an llm-compressor export)",
                "int4": "int4 (AWQ, run by awq_marlin: an AutoAWQ export)",
                "nvfp4": "nvfp4 (ModelOpt FP4: a TensorRT Model Optimizer export)"}


def prequantized(p: dict[str, Any]) -> dict[str, Any]:
    """The scripts' words when the tuned weight format needs a pre-quantised checkpoint: the profiled model id is
    the bf16 base, so MODEL_PATH must name one (the script refuses to start without it, and says why)."""
    dtype = str(p.get("weights.dtype"))
    if dtype not in PREQUANTIZED:
        return {"needs_prequantized": False, "prequantized": ""}
    return {"needs_prequantized": True, "prequantized": f"weights: {PREQUANTIZED[dtype]}; the profiled model id is "
                                                       "its bf16 base, which the engine would refuse to load as that "
                                                       "format"}


def _common(profile: Profile, p: dict[str, Any], bundled: bool, max_seq_len: int) -> dict[str, Any]:
    draft = draft_ref(profile, bundled)
    return {**prequantized(p), "model_path": model_ref(profile), "tp": int(p["parallel.tp"]),
            "dp": replicas(profile, p),
            "ep": int(p["parallel.ep"]), "mem_fraction": float(p["memory.fraction_static"]),
            "max_requests": int(p["batch.max_requests"]), "max_tokens": int(p["batch.max_tokens"]),
            "page_size": int(p.get("memory.page_size") or 1), "max_seq_len": max_seq_len,
            "kv_cache_dtype": KV_DTYPE.get(p["kv.dtype"]), "spec_enabled": bool(p["spec.enabled"]),
            "block_size": int(p["spec.block_size"]), "head": p["spec.head"],
            "draft_bundled": bundled and draft is not None, "draft_path": draft if not bundled else None,
            "draft_block": int(profile.drafter.block_size or 0),
            "llama_target": (profile.model.family or "").startswith("llama"),
            "scheduler": p["spec.scheduler"],
            "learned_block": p.get("spec.gamma_policy") == "learned"}  # the peers draft the static block instead


def sglang_context(profile: Profile, p: dict[str, Any], bundled: bool = False, max_seq_len: int = 0,
                   schedule: list[list[int]] | None = None) -> dict[str, Any]:
    """`schedule`: the tuned draft length per batch-size range (tuner/method_schedule.py), exported as SGLang's
    adaptive config where SGLang runs one for the method."""
    from tuner.spec_targets import CHECKPOINT_METHODS, method_of, sglang_spec

    dspark = method_of(p) == "dspark"
    mode = SGLANG_VERIFY_MODE[p["spec.scheduler"]] if dspark else "static"
    quant = SGLANG_QUANT.get(p["weights.dtype"])
    tp = int(p["parallel.tp"])
    dp_attention = bool(p.get("parallel.dp_attention")) and tp > 1  # one attention replica per TP rank
    common = _common(profile, p, bundled, max_seq_len)
    spec = sglang_spec(profile, p, draft_ref(profile, bundled), bundled, schedule, dp_attention)
    return {**common, **spec, "chunked_prefill": int(p.get("batch.chunked_prefill") or 0),
            "cuda_graph_max_bs": int(p.get("batch.cuda_graph_max_bs") or 0), "quantization": quant,
            # the draft inherits --quantization unless told otherwise; drafters (DSpark, EAGLE-3 heads, draft
            # models) ship in bf16; an MTP module is part of the (quantised) target
            "draft_quantization": "unquant" if quant and method_of(p) in CHECKPOINT_METHODS else None,
            "attention_backend": SGLANG_ATTENTION.get(p["attention.backend"]) if p["attention.backend"] != "torch"
            else None,
            "verify_mode": mode, "ragged": mode != "static",
            "scheduler_note": _scheduler_note(p["spec.scheduler"]),
            "align_to_graph": bool(p.get("spec.align_verify_to_graph", False)) and mode == "compact",
            "attn_dp_size": tp if dp_attention else 0,
            "nnodes": -(-tp // GPUS_PER_NODE), "gpus_per_node": GPUS_PER_NODE,
            "draft_kv_dtype": SGLANG_DRAFT_KV.get(str(p.get("spec.draft_kv_dtype", "auto"))),
            "schedule_conservativeness": p.get("batch.schedule_conservativeness"),
            "fusion_flags": _sglang_fusion_flags(profile, p),
            "sglang_source": _source("releases.yaml")}


def _sglang_fusion_flags(profile: Profile, p: dict[str, Any]) -> list[str]:
    """SGLang's spellings of the planned fusions (sglang 0.5.23 arg_groups/fields/exec_.py); a fusion the plan does
    not mention keeps SGLang's default."""
    flags = []
    allreduce = p.get("fusion.allreduce_rmsnorm")
    if allreduce is not None and int(p["parallel.tp"]) > 1:
        if profile.hw.arch == "cdna3":
            flags += ["--enable-aiter-allreduce-fusion"] if allreduce else []
        else:
            flags += ["--flashinfer-allreduce-fusion-backend", "auto"] if allreduce else \
                ["--enforce-disable-flashinfer-allreduce-fusion"]
    qk = p.get("fusion.qk_norm_rope")
    if qk is not None:
        flags.append("--enable-fused-qk-norm-rope" if qk else "--no-enable-fused-qk-norm-rope")
    return flags


def _scheduler_note(name: str) -> str:
    return {"verify_all": "verify the whole block (static)",
            "threshold": "SGLang has no threshold scheduler: verify-all (static) is the nearest",
            "prefix": "SGLang's compact planner (lagged budget + top-K) is the nearest to Algorithm 1",
            "async_topk": "compact = the confidence-budget planner (lagged budget + global top-K)",
            "learned": "SGLang has no learned scheduler (policy.json runs in dspark.sh only): the compact planner "
                       "(lagged budget + top-K) is the nearest"}[name]


def vllm_memory_utilization(profile: Profile, p: dict[str, Any]) -> float:
    """vLLM's --gpu-memory-utilization for SGLang's tuned static fraction.

    SGLang's --mem-fraction-static covers weights and the KV pool and leaves activations outside it; vLLM's
    fraction covers everything it allocates, activations included (it profiles a forward of
    max_num_batched_tokens at start-up). So vLLM gets the static fraction plus the activation peak of such a
    forward: the widest MLP activation and the residual stream per token, and the verify logits."""
    mem = (profile.hw.memory_gb or 0) * 2**30
    m = profile.model
    if not mem or not m.hidden_size:
        return float(p["memory.fraction_static"])
    tp = int(p["parallel.tp"])
    tokens = int(p["batch.max_tokens"])
    width = 2 * (m.intermediate_size or 4 * m.hidden_size) / tp + 4 * m.hidden_size
    verify = int(p["batch.max_requests"]) * (int(p["spec.block_size"]) + 1)
    act = tokens * width * VLLM_ACTIVATION_FACTOR + verify * (m.vocab_size or 0) / tp * 4
    return round(min(0.98, float(p["memory.fraction_static"]) + act / mem), 3)


def _cpu_build() -> dict[str, Any]:
    """vLLM's CPU build in tuner/catalog/engines.yaml."""
    import yaml

    return yaml.safe_load((CATALOG / "engines.yaml").read_text())["vllm"]["builds"]["cpu"]


def vllm_cpu_kv_space_gib(profile: Profile, p: dict[str, Any], max_seq_len: int) -> int:
    """VLLM_CPU_KVCACHE_SPACE (GiB) for vLLM's CPU build: the KV of max_num_seqs full-length requests (and as much
    again for a draft model's cache), at least 1 GiB. vLLM's CPU worker sizes its KV pool from this variable, not
    from --gpu-memory-utilization."""
    m = profile.model
    per_token = 2 * (m.num_layers or 32) * (m.num_kv_heads or 8) * (m.head_dim or 128) * 4  # fp32 worst case
    need = max(1, -(-per_token * max(1, max_seq_len) * int(p["batch.max_requests"]) * 2 // 2**30))
    if not profile.hw.memory_gb:
        return need
    # never more than the machine holds beside the weights: vLLM then runs fewer sequences at once (its scheduler
    # waits for KV blocks) instead of failing to allocate the pool
    weights_gib = (m.params_total or 0) * 4 / 2**30
    return max(1, min(need, int(profile.hw.memory_gb * 0.8 - weights_gib)))


def vllm_context(profile: Profile, p: dict[str, Any], bundled: bool = False, max_seq_len: int = 0,
                 draft_model: str | None = None, schedule: list[list[int]] | None = None) -> dict[str, Any]:
    """`draft_model`: the small autoregressive draft of `spec.method: draft_model` (tune --draft); `schedule`: the
    tuned draft length per batch-size range (vLLM's num_speculative_tokens_per_batch_size)."""
    from tuner.spec_targets import METHOD_NAMES, drafter_checkpoint, method_of, vllm_spec

    ctx = _common(profile, p, bundled, max_seq_len)
    method = method_of(p)
    draft = draft_ref(profile, bundled)  # None: vllm.sh puts DRAFT_MODEL_PATH in, or refuses to start
    if method == "draft_model" and draft_model:
        draft = draft_model
    elif method != "dspark":
        draft = drafter_checkpoint(profile, method, None)
    if method != "dspark":
        ctx.update(draft_bundled=False, draft_path=draft)
    passes = {field: bool(p[name]) for name, field in VLLM_PASSES.items() if p.get(name) is not None}
    needs_draft = method in DRAFTED_METHODS
    tp = int(p["parallel.tp"])
    ctx["dp_attention"] = False
    if bool(p.get("parallel.dp_attention")) and tp > 1 and profile.model.num_experts:
        # SGLang's DP attention (one attention replica per TP rank, experts across them) is vLLM's data-parallel
        # attention: tp 1, dp = the ranks; the MoE layers run over all of them, tensor-parallel, or with
        # --enable-expert-parallel expert-parallel over all of them (vLLM docs, "Data Parallel Deployment"): vLLM
        # has no EP group smaller than the ranks, so an SGLang EP of 2..ranks-1 is vLLM's EP over all ranks
        ranks = tp * ctx["dp"]
        ctx.update(tp=1, dp=ranks, ep=ranks if int(p.get("parallel.ep") or 1) > 1 else 1, dp_attention=True,
                   sglang_ep=int(p.get("parallel.ep") or 1))
    spec = vllm_spec(profile, p, draft, schedule, ctx["dp"]) if p.get("spec.enabled", True) else {}  # {}: plain
    cpu = profile.hw.arch == "cpu"
    return {**ctx, "quantization": VLLM_QUANT.get(p["weights.dtype"]), "method": method, "needs_draft": needs_draft,
            "draft_what": METHOD_NAMES.get(method, method),
            "schedule": spec.get("num_speculative_tokens_per_batch_size"),
            "dtype": VLLM_DTYPE.get(p["weights.dtype"]), "cpu": cpu,
            "cpu_kv_space_gib": vllm_cpu_kv_space_gib(profile, p, max_seq_len) if cpu else 0,
            "enforce_eager": cpu and bool(_cpu_build().get("enforce_eager")),
            "attention_backend": (VLLM_ATTENTION_MLA if profile.model.attention == "mla" else VLLM_ATTENTION
                                  ).get(p["attention.backend"]),
            "gpu_memory_utilization": vllm_memory_utilization(profile, p),
            "vllm_head_ok": p["spec.head"] in VLLM_HEADS or method != "dspark",
            "compilation_config": json.dumps({"pass_config": passes}, sort_keys=True) if passes else None,
            "speculative_config_json": json.dumps(spec, indent=2), "vllm_source": _source("releases.yaml")}


def sts_payload(profile: Profile, p: dict[str, Any], calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    """SGLang's DSparkStsCalibration for block length gamma: a measured calibration when one exists, else
    identity temperatures. STS is fitted left to right, so the first gamma temperatures of a longer
    calibration are exactly the calibration of a gamma-token block."""
    gamma = int(p["spec.block_size"])
    temps = (calibration or {}).get("temperatures") or []
    if len(temps) >= gamma:
        out = dict(calibration or {})
        for key in ("temperatures", "ece_before", "ece_after"):
            if isinstance(out.get(key), list):
                out[key] = out[key][:gamma]
        return out
    return {"temperatures": [1.0] * gamma, "dataset": "identity (no drafter calibrated for this model here)",
            "num_samples": 0, "ece_before": [], "ece_after": []}


def measured_calibration(drafter_folder: Path | None) -> dict[str, Any] | None:
    """The STS calibration shipped beside a drafter (sts.json), if any."""
    if drafter_folder is None:
        return None
    path = Path(drafter_folder) / "sts.json"
    return json.loads(path.read_text()) if path.is_file() else None
