"""The engine configuration: one pydantic model, exported by the tuner as `dspark.yaml`.

Nested sections mirror the dotted parameter names of `kb/catalog/params.yaml` (`spec.block_size` is
`config.spec.block_size`, `batch.max_requests` is `config.batch.max_requests`, `kernel.<name>.<knob>` is
`config.kernel[name][knob]`), so a tuned parameter set is applied with `apply_params`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dspark_core.atomic import atomic_write_text
from dspark_core.errors import DSparkError
from dspark_core.paths import ASSETS, MODEL_ASSETS
from dspark_core.verification.sampling import SamplingParams


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSection(_Section):
    """The target checkpoint (Hugging Face layout: config.json + *.safetensors + tokenizer.json)."""

    path: str = str(ASSETS / "target")  # target checkpoint folder
    tokenizer: str | None = None  # tokenizer.json folder if not the checkpoint folder
    max_seq_len: int = Field(2048, ge=16)  # KV-cache positions per request (prompt + generation + block)


class DrafterSection(_Section):
    """Which drafter proposes tokens and where its weights live."""

    method: Literal["plain", "ar_draft", "ngram", "suffix", "dspark", "hybrid"] = "ar_draft"  # plain = none
    path: str | None = None  # drafter checkpoint folder or model id (ar_draft: an HF model; dspark: a DSpark
    # drafter); unset on the tiny target: its committed one (`drafter_path`)
    ngram_max: int = Field(4, ge=1)  # prompt lookup: longest suffix n-gram to match
    ngram_min: int = Field(1, ge=1)  # prompt lookup: shortest suffix n-gram to match
    suffix_depth: int = Field(24, ge=2, le=64)  # suffix decoding: tree depth (match + draft tokens), vLLM's 24
    suffix_spec_factor: float = Field(1.0, ge=0.0, le=16.0)  # suffix: draft <= ceil(factor x match length) tokens
    suffix_min_prob: float = Field(0.1, ge=0.0, le=1.0)  # suffix: stop below this estimated draft probability
    suffix_cache_tokens: int = Field(8192, ge=0, le=1_000_000)  # suffix: finished-output tokens in the global tree
    suffix_window: int = Field(4096, ge=64, le=1_000_000)  # suffix: a request's tree indexes its last this many tokens
    suffix_calibration: str = "auto"  # suffix: ratios -> measured acceptance (`calibrate-suffix` JSON); auto = the
    # target's committed suffix_calibration.json when there is one, none = the raw ratios
    suffix_corpus: str = "auto"  # suffix: a frozen tree of the target's own outputs (`build-suffix-corpus` JSON);
    # auto = the target's committed suffix_corpus.json when there is one, none = no corpus
    draft_vocab: int | None = Field(None, ge=0, le=1 << 20)  # dspark / hybrid: draft over the N most frequent target
    # tokens (the drafter's draft_vocab.json) + the context's; unset = 8192 where that file exists, 0 = whole vocabulary


class SpecSection(_Section):
    """Speculative decoding parameters (`spec.*`)."""

    enabled: bool = True  # speculative decoding on (false = plain decoding)
    block_size: int = Field(7, ge=1, le=16)  # gamma: draft tokens proposed per round
    head: Literal["none", "markov", "rnn"] = "markov"  # sequential head on the parallel backbone
    scheduler: Literal["verify_all", "threshold", "prefix", "async_topk", "learned"] = "verify_all"  # verify length
    confidence_threshold: float = Field(0.5, ge=0.0, le=1.0)  # threshold scheduler: min prefix survival
    max_verify_tokens: int = Field(16, ge=1, le=16)  # cap on verified draft tokens per request and round
    fallback_acceptance: float = Field(0.0, ge=0.0, le=1.0)  # rolling acceptance floor for plain fallback
    adaptive_gamma: bool = False  # regulator moves each request's block within [1, block_size] by its acceptance
    align_verify_to_graph: bool = False  # pad verify lengths up to the CUDA-graph token bucket
    sps_path: str | None = None  # SGLang SpsCostTable JSON (prefix scheduler); None = profile at start
    sts_path: str | None = None  # SGLang DSparkStsCalibration JSON (confidence temperatures)
    policy_path: str | None = None  # learned scheduler's policy JSON (`train-policy`); required by scheduler=learned
    round_log: str | None = None  # JSONL file each speculative round is appended to (`train-policy` reads it)
    # block per round: block_size; the learned pick in 0..it (the DSpark drafter's rounds: `learned_gamma`); or a
    # seeded uniform draw in 0..it (explore: logging for train-gamma-policy, every block length on the same traffic,
    # interleaved round by round)
    gamma_policy: Literal["static", "learned", "explore"] = "static"
    gamma_policy_path: str | None = None  # learned block-length policy JSON (`train-gamma-policy`)


# spec fields a running engine takes between requests (Engine.reconfigure, `serve --reconfigurable`): how many
# drafted tokens are verified and the policy files behind it; not what sizes the drafter, the KV cache or the SPS table
HOT_SPEC = ("scheduler", "confidence_threshold", "max_verify_tokens", "fallback_acceptance", "adaptive_gamma",
            "gamma_policy", "policy_path", "gamma_policy_path")


class BatchSection(_Section):
    """Batching (`batch.*`)."""

    max_requests: int = Field(8, ge=1, le=4096)  # max running requests per step
    max_tokens: int = Field(8192, ge=64, le=1048576)  # token budget per forward (prefill + decode tokens)
    timeout_ms: float = Field(0.0, ge=0.0, le=1000.0)  # how long the batcher waits to fill a batch
    chunked_prefill: int = Field(0, ge=0, le=65536)  # prefill chunk size in tokens (0 = off)
    mixed_prefill_tokens: int = Field(64, ge=0, le=65536)  # admissions of up to this many prompt tokens prefill
    # in the running batch's verify step (compiled CPU steps; 0 = never; results/issue42_amx_mixed_prefill_step.json)
    cuda_graph_max_bs: int = Field(0, ge=0, le=1024)  # largest batch captured in a CUDA graph (0 = none)


class MemorySection(_Section):
    """Memory (`memory.*`)."""

    fraction_static: float = Field(0.85, ge=0.3, le=0.98)  # fraction of GPU memory for weights + KV pool
    page_size: int = Field(1, ge=1, le=256)  # KV-cache page size in tokens


class KVSection(_Section):
    """KV cache (`kv.*`)."""

    dtype: Literal["auto", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"] = "auto"  # KV dtype (auto = weights')


class WeightsSection(_Section):
    """Weights (`weights.*`)."""

    # auto: fp32 on a CPU, bf16 on a GPU; fastest: on a CPU the dtype whose measured step is quicker
    # (modeling/dtype_choice.py), resolved before the target loads
    dtype: Literal["auto", "fastest", "fp32", "bf16", "fp16", "fp8", "int8", "int4", "nvfp4"] = "auto"
    # CPU linear kernel: onednn = weights pre-packed by oneDNN (modeling/cpu_linear.py), torch = nn.Linear (MKL);
    # auto = onednn where this CPU packs the dtype
    cpu_kernel: Literal["auto", "onednn", "torch"] = "auto"


class AttentionSection(_Section):
    """Attention kernels (`attention.*`)."""

    backend: Literal["torch", "triton", "flashinfer", "fa3", "fa4", "trtllm_mha", "trtllm_mla", "flashmla",
                     "aiter"] = "torch"  # attention kernel implementation


class ParallelSection(_Section):
    """Parallelism (`parallel.*`); the bundled engine runs tp = ep = dp = 1, serving stacks use the rest."""

    tp: int = Field(1, ge=1, le=64)  # tensor-parallel size
    ep: int = Field(1, ge=1, le=64)  # expert-parallel size (MoE)
    dp: int = Field(1, ge=0, le=64)  # data-parallel replicas (0 = hw.count // tp, as many as the devices hold)
    dp_attention: bool = False  # data-parallel attention beside TP/EP MLP (MoE, MLA)


class EngineConfig(_Section):
    """The whole engine config (= dspark.yaml)."""

    device: str = "auto"  # auto | cpu | cuda | cuda:N
    seed: int = 0  # global seed (model init, sampling defaults)
    compile: bool = False  # decode / verify steps through torch.compile in shape buckets (modeling/compiled.py)
    compile_budget_s: float = Field(900.0, ge=0.0)  # seconds of compiling after which new shapes run eager
    model: ModelSection = Field(default_factory=ModelSection)  # target checkpoint
    drafter: DrafterSection = Field(default_factory=DrafterSection)  # draft method and weights
    spec: SpecSection = Field(default_factory=SpecSection)  # speculative decoding (spec.*)
    batch: BatchSection = Field(default_factory=BatchSection)  # batching (batch.*)
    memory: MemorySection = Field(default_factory=MemorySection)  # memory (memory.*)
    kv: KVSection = Field(default_factory=KVSection)  # KV cache (kv.*)
    weights: WeightsSection = Field(default_factory=WeightsSection)  # weights (weights.*)
    attention: AttentionSection = Field(default_factory=AttentionSection)  # attention (attention.*)
    parallel: ParallelSection = Field(default_factory=ParallelSection)  # parallelism (parallel.*)
    kernel: dict[str, dict[str, int]] = Field(default_factory=dict)  # kernel.<name>.<knob> Triton configs
    kernel_file: str | None = None  # kernels.json of tune-kernels winners (relative to dspark.yaml)
    sampling: SamplingParams = Field(default_factory=SamplingParams)  # default sampling of `generate`


GAMMA_POLICY_METHODS = ("dspark",)  # the drafters a learned block-length policy models (what it is fitted on)


def learned_gamma(config: EngineConfig) -> bool:
    """Whether the learned block-length policy picks each round's block: `spec.gamma_policy: learned` with the DSpark
    drafter. Its acceptance model and its drafting cost are fitted on the DSpark drafter's logged rounds
    (`train-gamma-policy`); n-gram's, suffix's and the hybrid's drafts and costs are not what it models (a measured
    study that carried it to them read suffix 83 and the hybrid 80 tok/s against 91 and 109 at the static block:
    benchmarks/RESULTS.md), so they draft the static block."""
    return config.spec.gamma_policy == "learned" and config.drafter.method in GAMMA_POLICY_METHODS


def drafter_path(config: EngineConfig, method: str | None = None) -> str | None:
    """`drafter.path`, or when unset the committed drafter for `method` (default `drafter.method`) of the tiny
    reference target or of a fetched model (`models fetch`): its AR draft model (ar_draft) or its DSpark drafter
    for `spec.head` (dspark); else None."""
    if config.drafter.path:
        return config.drafter.path
    root = committed_assets(config.model.path)
    if root is None:
        return None
    method = method or config.drafter.method
    if method == "ar_draft" and root != ASSETS:  # a fetched model's slim draft, assembled with its embedding
        from dspark_core.modeling.checkpoint import checkpoint_folder
        from dspark_core.training.train_ar import ensure_draft

        full = ensure_draft(root.name, checkpoint_folder(config.model.path))
        return str(full) if full is not None else None
    committed = {"ar_draft": root / "draft", "dspark": root / "drafters" / config.spec.head,
                 "hybrid": root / "drafters" / config.spec.head}
    path = committed.get(method)
    return str(path) if path is not None and path.is_dir() else None


def committed_assets(model_path: str) -> Path | None:
    """The folder of committed drafters for a target: the tiny target's, or `assets/<name>` of a fetched model."""
    from dspark_core.modeling.models_fetch import name_of

    try:
        if Path(model_path).resolve() == (ASSETS / "target").resolve():
            return ASSETS
    except OSError:
        return None
    name = name_of(model_path)
    return MODEL_ASSETS / name if name is not None else None


def committed_file(choice: str, model_path: str, file: str) -> Path | None:
    """A file setting that takes `none`, `auto` or a path (drafter.suffix_calibration, drafter.suffix_corpus): None
    for `none`, the target's committed `file` for `auto` (None when it has none), else the path given."""
    if choice == "none":
        return None
    if choice == "auto":
        assets = committed_assets(model_path)
        path = assets / file if assets is not None else None
        return path if path is not None and path.is_file() else None
    return Path(choice)


def has_param(name: str) -> bool:
    """Whether dotted parameter `name` is a field of the engine's config (kernel.* knobs always are); the others
    are read by the simulator or the serving stacks' launch scripts only (kb/catalog/params.yaml `readers`)."""
    section, _, key = name.partition(".")
    if section == "kernel":
        return True
    field = EngineConfig.model_fields.get(section)
    sub = field.annotation if field is not None else None
    return isinstance(sub, type) and issubclass(sub, BaseModel) and key in sub.model_fields


def apply_params(config: EngineConfig, params: dict[str, Any]) -> EngineConfig:
    """A copy of `config` with dotted parameters set, e.g. `{"spec.block_size": 7, "kernel.k.BLOCK": 64}`."""
    data = config.model_dump()
    for name, value in params.items():
        parts = name.split(".")
        node = data
        free = parts[0] == "kernel"  # open-ended maps: create nested keys on demand
        for part in parts[:-1]:
            if free:
                node = node.setdefault(part, {})
                continue
            if not isinstance(node, dict) or part not in node:
                raise DSparkError(f"unknown engine parameter {name!r}: no section {part!r}")
            node = node[part]
        if not free and parts[-1] not in node:
            raise DSparkError(f"unknown engine parameter {name!r}; see dspark_core/config.py for the fields")
        node[parts[-1]] = value
    return _validate(data, "parameters")


def _validate(data: Any, where: str) -> EngineConfig:
    try:
        return EngineConfig.model_validate(data or {})
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        msg = f"bad engine config in {where}: {loc}: {err['msg']} (fix the value or remove the key)"
        raise DSparkError(msg) from None


def load_config(path: str | os.PathLike[str]) -> EngineConfig:
    """Read a dspark.yaml; one-line DSparkError for a missing file, bad YAML or a bad field."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise DSparkError(f"engine config {p} not found; export one with `tune` or write a dspark.yaml")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise DSparkError(f"engine config {p}{line} is not valid YAML; fix the syntax") from None
    if data is not None and not isinstance(data, dict):
        raise DSparkError(f"engine config {p} must be a YAML mapping of sections (spec:, batch:, ...)")
    config = _validate(data, str(p))
    # files a bundle ships beside dspark.yaml are named relative to it; a drafter folder too when it is there
    drafter = config.drafter.path
    if drafter and not Path(drafter).is_absolute() and (p.parent / drafter).is_dir():
        config.drafter.path = str(p.parent / drafter)
    for section, key in (("spec", "sps_path"), ("spec", "sts_path"), ("spec", "policy_path"),
                         ("spec", "gamma_policy_path"), (None, "kernel_file"), ("drafter", "suffix_calibration"),
                         ("drafter", "suffix_corpus")):
        owner = getattr(config, section) if section else config
        value = getattr(owner, key)
        if value and value not in ("auto", "none") and not Path(value).is_absolute():
            setattr(owner, key, str(p.parent / value))
    return config


def save_config(config: EngineConfig, path: str | os.PathLike[str]) -> Path:
    """Write `config` as YAML atomically (temp file + os.replace); returns the path."""
    import yaml

    return atomic_write_text(path, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
