"""The tuned speculative method in each serving engine's own terms: SGLang's `--speculative-algorithm` and its
flags, vLLM's `speculative_config`, and which drafter checkpoint each loads (issue 37, part 3).

Names and rules, read from the released code (benchmarks/spec_published/engine_facts.md):
- SGLang 0.5.23 (`arg_groups/fields/spec.py`): builtins EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, DFLASH, DSPARK; NEXTN
  aliases EAGLE (`spec_registry._RESERVED_ALIASES`); it has no suffix decoding. `--speculative-adaptive` with a
  per-batch-size `--speculative-adaptive-config` runs for EAGLE / EAGLE3 (so NEXTN) only, topk 1, no attention DP
  (`adaptive_spec_params.adaptive_unsupported_reason`); `--speculative-num-steps` must be one of its candidate steps
  and the draft tokens are then steps + 1 (`speculative_hook._init_adaptive_speculative_params`). NGRAM verifies a
  breadth-10 tree by default: breadth 1 makes it the chain the simulator prices. DFLASH takes its verify window
  (K + 1) as `--speculative-dflash-block-size`. DeepSeek-style targets load their MTP module from the target
  checkpoint when no draft path is given (`_handle_eagle_family`, MTP_IN_TARGET below).
- vLLM 0.33.0 (`vllm/config/speculative.py`): methods dspark, dflash, eagle3, mtp (the model-specific `deepseek_mtp`
  etc. are deprecated aliases of it), draft_model, ngram, suffix; mtp without `model` loads the target's own
  module. `num_speculative_tokens_per_batch_size` ([lo, hi, K], from 1) is dropped with data parallelism, and on
  Model Runner V1 for methods outside ngram / eagle / eagle3 / mtp / draft_model / dflash: suffix forces V1
  (`vllm/config/vllm.py`), so it gets none.
"""

from __future__ import annotations

import json
from typing import Any

from profiler.schema import Profile

SGLANG_ALGORITHM = {"dspark": "DSPARK", "dflash": "DFLASH", "eagle3": "EAGLE3", "mtp": "NEXTN",
                    "draft_model": "STANDALONE", "ngram": "NGRAM"}  # suffix: SGLang 0.5.23 has none
SGLANG_ADAPTIVE = ("eagle3", "mtp")  # EAGLE3 and NEXTN (= EAGLE): the only algorithms adaptive steps run for
SGLANG_STEPPED = ("eagle3", "mtp", "draft_model")  # EAGLE-family workers: --speculative-num-steps / topk / tokens
VLLM_NO_SCHEDULE = ("suffix",)  # forced onto Model Runner V1, which drops the batch-size schedule for it
CHECKPOINT_METHODS = ("dspark", "dflash", "eagle3", "draft_model")  # a separate drafter checkpoint to load
# architectures SGLang 0.5.23 loads the MTP module of from the target checkpoint (speculative_hook.py
# _handle_eagle_family); any other MTP target names its own checkpoint as the draft
MTP_IN_TARGET = ("DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM", "Glm4MoeForCausalLM",
                 "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",
                 "BailingMoeV2_5ForCausalLM", "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration",
                 "HYV3ForCausalLM", "HYV4ForCausalLM", "Qwen4ExpForConditionalGeneration")
ADAPTIVE_FILE = "sglang_adaptive.json"  # the bundle file --speculative-adaptive-config names
METHOD_NAMES = {"dspark": "DSpark drafter", "dflash": "DFlash drafter", "eagle3": "EAGLE-3 head",
                "draft_model": "draft model", "mtp": "MTP module"}


def method_of(p: dict[str, Any]) -> str:
    """The tuned speculative method (spec.method; DSpark when a study predates the choice)."""
    return str(p.get("spec.method") or "dspark")


def architecture(profile: Profile) -> str:
    """The target's Hugging Face architecture (catalogue config.json, else the checkpoint folder's), or ""."""
    from pathlib import Path

    src = Path(profile.model.source or "")
    cfg = (src if src.is_dir() else src.parent) / "config.json"
    if profile.model.source and cfg.is_file():
        try:
            return str((json.loads(cfg.read_text()).get("architectures") or [""])[0])
        except ValueError:
            return ""
    try:
        from profiler.catalog import resolve_model

        entry, _ = resolve_model(profile.model.name or "")
    except Exception:  # noqa: BLE001 - a model outside the catalogue: no architecture known
        return ""
    return str((entry.config.get("architectures") or [""])[0])


def drafter_checkpoint(profile: Profile, method: str, bundled_or_id: str | None) -> str | None:
    """The checkpoint `method` drafts with: DSpark's as the bundle names it (`bundled_or_id`: tuner/targets.py
    draft_ref), else the profile's drafter when it is of that method, else the model's published one (None: none)."""
    if method == "dspark":
        return bundled_or_id
    if method not in CHECKPOINT_METHODS:
        return None
    d = profile.drafter
    if d.method == method and d.checkpoint:
        return d.checkpoint
    from profiler.catalog import published_drafter

    pub = published_drafter(profile.model.name, method)
    return pub.id if pub is not None else None


def sglang_spec(profile: Profile, p: dict[str, Any], draft: str | None, bundled: bool,
                schedule: list[list[int]] | None, attn_dp: bool) -> dict[str, Any]:
    """The SGLang template's speculative values: algorithm (None: SGLang cannot run the method), draft, steps and
    the adaptive config (the batch-size schedule) where SGLang runs it."""
    from tuner.schedule import sglang_adaptive_config

    method = method_of(p)
    k = int(p["spec.block_size"])
    needs_draft = method in CHECKPOINT_METHODS
    draft = drafter_checkpoint(profile, method, draft) if needs_draft else None
    adaptive = bool(schedule) and method in SGLANG_ADAPTIVE and not attn_dp
    return {"method": method, "sglang_algorithm": SGLANG_ALGORITHM.get(method),
            "needs_draft": needs_draft, "draft_bundled": bundled and method == "dspark" and draft is not None,
            "draft_path": draft if not (bundled and method == "dspark") else None,
            "draft_what": METHOD_NAMES.get(method, method),
            "draft_is_model": method == "mtp" and architecture(profile) not in MTP_IN_TARGET,
            "is_dspark": method == "dspark", "stepped": method in SGLANG_STEPPED, "is_ngram": method == "ngram",
            "is_dflash": method == "dflash", "steps": k, "draft_tokens": k + 1,
            "adaptive": adaptive, "adaptive_file": ADAPTIVE_FILE,
            "adaptive_config": sglang_adaptive_config(schedule) if adaptive and schedule else None}


def vllm_spec(profile: Profile, p: dict[str, Any], draft: str | None, schedule: list[list[int]] | None,
              dp: int) -> dict[str, Any]:
    """vLLM's speculative_config for the tuned method (the drafter's path is put in by vllm.sh), with the
    batch-size schedule where vLLM keeps it."""
    from tuner.schedule import vllm_schedule

    method = method_of(p)
    needs_draft = method in CHECKPOINT_METHODS
    spec: dict[str, Any] = {"method": method, **({"model": draft} if draft and needs_draft else {}),
                            "num_speculative_tokens": int(p["spec.block_size"])}
    if method == "dspark":
        spec["enable_adaptive_verification"] = p["spec.scheduler"] != "verify_all"
    if method == "suffix":  # the proposal settings a measured study tuned (vllm/config/speculative.py names)
        for key, name in (("drafter.suffix_spec_factor", "suffix_decoding_max_spec_factor"),
                          ("drafter.suffix_min_prob", "suffix_decoding_min_token_prob")):
            if key in p:
                spec[name] = float(p[key])
    if schedule and method not in VLLM_NO_SCHEDULE and dp <= 1:
        spec.update(vllm_schedule(schedule))
    return spec
