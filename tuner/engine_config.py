"""Tuned parameters -> the bundled engine's config: one function for what `measure` runs and what `export`
writes as dspark.yaml, so the exported engine config is the one that was tuned.

The model is named the way both the engines and ours take it: a local checkpoint folder, else the Hugging Face
model id of the catalogue entry (never a web address), else the model's name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from profiler.schema import Profile
from tuner.errors import TunerError

HF_URL = re.compile(r"^https?://huggingface\.co/([^/\s]+)/([^/\s]+)")
SEQ_ALIGN = 256  # max_seq_len is rounded up to this many positions
# a learned choice -> the profile's policy field, the command that trains one, the engine field that runs it
# the speculative methods the bundled engine runs (spec.method -> its drafter.method); the others run in SGLang / vLLM
BUNDLED_METHODS = {"dspark": "dspark", "ngram": "ngram", "suffix": "suffix", "hybrid": "hybrid",
                   "plain": "plain"}  # plain: speculation off (a measured study's spec.method choice)
LEARNED = (("spec.scheduler", "verify_policy", "train-policy", "policy_path"),
           ("spec.gamma_policy", "gamma_policy", "train-gamma-policy", "gamma_policy_path"))


def model_ref(profile: Profile) -> str:
    """A checkpoint folder here, or a Hugging Face model id (`Qwen/Qwen3-8B`), or the model's name."""
    src = profile.model.source or ""
    p = Path(src)
    if src and p.exists():
        return str((p.parent if p.is_file() else p).resolve())
    m = HF_URL.match(src)
    if m:
        return f"{m.group(1)}/{m.group(2)}"
    return profile.model.name or "MODEL"


def max_seq_len(profile: Profile, gamma: int) -> int:
    """KV positions per request: the workload's p99 prompt + p99 output + one verify block, rounded up to
    SEQ_ALIGN, never beyond the model's context (the profile has already fitted the workload into it)."""
    wl = profile.workload
    p99 = ((wl.prompt_len.p99 if wl.prompt_len else None) or 0) + ((wl.output_len.p99 if wl.output_len else None) or 0)
    need = int(p99) + gamma + 1
    aligned = -(-max(need, 16) // SEQ_ALIGN) * SEQ_ALIGN
    ctx = profile.model.max_context
    return max(16, min(aligned, ctx)) if ctx else aligned


def learned_policies(profile: Profile, params: dict[str, Any]) -> dict[str, str]:
    """Engine field -> the profile's policy file for each learned choice in `params` (spec.scheduler /
    spec.gamma_policy `learned`); one line naming the fix when the profile has no such policy."""
    out = {}
    for param, field, trainer, key in LEARNED:
        if params.get(param) != "learned":
            continue
        path = getattr(profile.drafter, field)
        if not path:
            raise TunerError(f"{param} is 'learned' but the profile has no drafter.{field}: train one on this "
                             f"drafter's round logs with `python cli.py {trainer}` and commit it beside the drafters")
        out[key] = path
    return out


def tuned_engine_config(profile: Profile, params: dict[str, Any], drafter_path: str | None,
                        model_path: str | None = None):  # -> EngineConfig
    """The EngineConfig of a tuned parameter set: every engine parameter as tuned, the profile's model (or
    `model_path`, the checkpoint a measurement ran), a KV length that holds the workload, and when speculation is on
    DSpark (or the DSpark + suffix hybrid) with `drafter_path` (None: the engine's own drafter for the tuned head,
    the tiny target's), or the engine's n-gram lookup or suffix decoding; a method the engine does not run
    (BUNDLED_METHODS) is one TunerError line."""
    from dspark_core.config import EngineConfig, apply_params, has_param

    # the drafter design (a checkpoint's property) and the serving stacks' own switches are not engine fields
    cfg = apply_params(EngineConfig(), {k: v for k, v in params.items() if has_param(k)})
    cfg.model.path = model_path or model_ref(profile)
    cfg.model.max_seq_len = max_seq_len(profile, int(params.get("spec.block_size", cfg.spec.block_size)))
    method = BUNDLED_METHODS.get(str(params.get("spec.method") or "dspark"))
    if cfg.spec.enabled and method is None:
        raise TunerError(f"the bundled engine does not run {params.get('spec.method')} speculative decoding; "
                         f"it runs {', '.join(BUNDLED_METHODS)}")
    cfg.drafter.method = method if cfg.spec.enabled else "plain"
    cfg.drafter.path = drafter_path if cfg.spec.enabled and method in ("dspark", "hybrid") else None
    cfg.sampling.temperature = profile.workload.temperature or 0.0
    for key, path in learned_policies(profile, params).items():  # the policy files the learned choices run
        setattr(cfg.spec, key, path)
    return cfg
