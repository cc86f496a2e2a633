"""Profile: what rules match and what the tuner models (DESIGN.md section 3).

Field paths (``model.params_total``, ``hw.arch``, ...) are the vocabulary of rule conditions,
so they are kept stable; every field is optional because a profile may describe only part of
the picture (a GPU without a model, say) and a rule on a missing field simply does not fire.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict

GIB = 2**30  # bytes in the GiB that hw.memory_gb counts

ModelArch = Literal["dense", "moe"]
Attention = Literal["mha", "gqa", "mqa", "mla"]
HwArch = Literal["ampere", "ada", "hopper", "blackwell", "cdna3", "cpu"]  # CDNA4 (MI350X/MI355X) rows use cdna3
DrafterMethod = Literal["dspark", "dflash", "eagle3", "mtp", "draft_model", "ngram", "suffix"]
Domain = Literal["chat", "code", "math", "mixed"]
Bound = Literal["memory", "compute"]
Quality = Literal["standard", "relaxed"]  # accuracy floor of a deployment (see WorkloadProfile.quality)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class WeightBytes(_Strict):
    bf16: float | None = None  # bytes of all weights stored in bf16
    fp8: float | None = None  # ... in fp8 (one byte per weight, plus scales)
    int8: float | None = None  # ... in int8
    int4: float | None = None  # ... in int4 (half a byte per weight, plus group scales)


class KvBytes(_Strict):
    bf16: float | None = None  # KV-cache bytes per token over all layers, bf16
    fp8: float | None = None  # ... fp8


class Flops(_Strict):
    prefill: float | None = None  # FLOPs per token for prefill at the profile's mean prompt length
    decode: float | None = None  # FLOPs per generated token at the profile's mean context
    linear: float | None = None  # context-independent part: 2 x active matrix parameters
    attn_per_ctx: float | None = None  # decode attention FLOPs per token per context token (f(L) = linear + this*L)


class ModelProfile(_Strict):
    name: str | None = None  # catalogue or folder name, e.g. "Qwen3-8B"
    family: str | None = None  # qwen3, llama, mistral, gemma2, deepseek_v3, ...
    arch: ModelArch | None = None  # dense or mixture of experts
    source: str | None = None  # where the architecture came from (catalogue row, path, ONNX file)
    params_total: float | None = None  # all parameters, embeddings included
    params_active: float | None = None  # parameters touched per token (MoE: routed top-k only)
    num_layers: int | None = None  # decoder layers
    hidden_size: int | None = None  # model width
    intermediate_size: int | None = None  # dense MLP width (per expert for MoE: moe_intermediate_size)
    num_heads: int | None = None  # query heads
    num_kv_heads: int | None = None  # key/value heads
    head_dim: int | None = None  # per-head width
    vocab_size: int | None = None  # tokenizer vocabulary
    attention: Attention | None = None  # mha / gqa / mqa / mla
    num_experts: int | None = None  # routed experts per MoE layer (0 for dense)
    experts_per_token: int | None = None  # routed experts chosen per token
    max_context: int | None = None  # max_position_embeddings
    tied_embeddings: bool | None = None  # LM head shares the embedding matrix
    params_embedding: float | None = None  # input embedding parameters (vocab x hidden)
    num_moe_layers: int | None = None  # decoder layers with a routed MLP (0 for dense)
    expert_params: float | None = None  # parameters of one routed expert
    shared_expert_params: float | None = None  # always-on shared expert parameters per MoE layer
    kv_lora_rank: int | None = None  # MLA latent width (the KV cache holds this + the RoPE key)
    kv_state_bytes: float | None = None  # bf16 per-request cache state that does not grow with context (linear-
    # attention recurrent + conv state, DeepSeek-V4's sliding window); kv_bytes_per_token is the growing part
    linear_attn_layers: int | None = None  # layers without a KV cache (Qwen3-Next's Gated DeltaNet)
    mtp_modules: int | None = None  # MTP modules the config declares (num_nextn_predict_layers)
    sliding_window: int | None = None  # local attention window of the sliding layers, if any
    dtype: str | None = None  # checkpoint dtype from config.json (torch_dtype / dtype)
    census_source: str | None = None  # where model.ops came from: export, cache, catalog, onnx file
    weight_bytes: WeightBytes | None = None
    kv_bytes_per_token: KvBytes | None = None
    flops_per_token: Flops | None = None
    ops: dict[str, int] | None = None  # operator census of one decoder layer: rmsnorm, swiglu, rope, ...


class Measured(_Strict):
    bandwidth_gbs: float | None = None  # measured device copy bandwidth
    tflops_bf16: float | None = None  # measured bf16 GEMM throughput
    tflops_fp16: float | None = None  # measured fp16 GEMM throughput
    tflops_fp32: float | None = None  # measured fp32 GEMM throughput


class PeakTflops(_Strict):
    bf16: float | None = None  # dense datasheet peak, not the sparse figure
    fp16: float | None = None
    fp8: float | None = None
    int8: float | None = None
    fp4: float | None = None  # Blackwell NVFP4 / MXFP4 dense


class HwProfile(_Strict):
    name: str | None = None  # catalogue name, e.g. "H100-SXM"
    vendor: str | None = None  # nvidia / amd / cpu vendor
    arch: HwArch | None = None  # microarchitecture family
    sm: int | None = None  # CUDA compute capability x10 (90 = sm_90); 0 for non-CUDA
    count: int | None = None  # devices available to one server (TP / EP upper bound)
    memory_gb: float | None = None  # device memory per GPU in GiB (the datasheet's "80 GB" HBM is 80 GiB)
    bandwidth_gbs: float | None = None  # datasheet memory bandwidth
    peak_tflops: PeakTflops | None = None
    fp8: bool | None = None  # native FP8 tensor cores (sm_89+, CDNA3)
    num_sms: int | None = None  # SMs (CUs on AMD, cores on a CPU)
    l2_mb: float | None = None  # last-level on-chip cache
    interconnect: str | None = None  # nvlink / pcie / xgmi / none
    interconnect_gbs: float | None = None  # per-GPU bidirectional interconnect bandwidth
    measured: Measured | None = None  # microbenchmark ceilings on the local device
    cpu_capability: str | None = None  # a CPU's torch.backends.cpu.get_cpu_capability() (AVX2, AVX512, ...)


class Lengths(_Strict):
    mean: float | None = None
    p50: float | None = None
    p99: float | None = None


class Slo(_Strict):
    ttft_ms: float | None = None  # p99 time to first token
    tpot_ms: float | None = None  # p99 time per output token


class Entropy(_Strict):
    mean: float | None = None  # target's mean next-token entropy (nats) on the workload
    p90: float | None = None


class WorkloadProfile(_Strict):
    name: str | None = None  # preset or file name
    path: str | None = None  # a JSONL file's absolute path: the requests a live study replays (tune --engine)
    domain: Domain | None = None
    prompt_len: Lengths | None = None  # tokens
    output_len: Lengths | None = None  # tokens
    concurrency: int | None = None  # simultaneous requests in flight
    request_rate: float | None = None  # requests per second (None: closed loop at `concurrency`)
    slo: Slo | None = None
    entropy: Entropy | None = None
    temperature: float | None = None  # sampling temperature (0 = greedy)
    quality: Quality | None = None  # accuracy floor: standard (None) = 8-bit weights at most; relaxed = 4-bit allowed


class AcceptProfile(_Strict):
    drafter: str | None = None  # which drafter was measured
    gamma: int | None = None  # block length of the measurement
    tau: float | None = None  # accepted tokens per round incl. the bonus token at `gamma`
    tau_at_gamma: dict[str, float] | None = None  # tau per block length, keys are str(gamma)
    position_acceptance: list[float] | None = None  # P(accept k | accepted k-1), k = 1..gamma
    confidence_ece: float | None = None  # ECE of calibrated prefix survival
    source: str | None = None  # "measured: <command>" or "prior: <paper section>"
    domain: str | None = None  # workload domain of the measurement (code, chat, ...)
    per_head: dict[str, list[float]] | None = None  # measured position_acceptance per sequential head (same gamma)
    method: DrafterMethod | None = None  # the drafting method these figures belong to (drafter.method when published)


class DrafterProfile(_Strict):
    """The DSpark drafter checkpoint the deployment will run (profiler/catalog/drafters.yaml, a folder, or none):
    a checkpoint fixes its head and depth and caps the block it can draft, so the plan searches only those."""

    chosen: str | None = None  # what --drafter said: auto (None), none, or a folder
    id: str | None = None  # Hugging Face model id or folder of the checkpoint (None: none chosen, train one)
    source: str | None = None  # where its architecture is documented
    heads: list[str] | None = None  # sequential heads available (a checkpoint has one; the tiny drafters all three)
    layers: int | None = None  # draft transformer layers
    block_size: int | None = None  # block it was trained for: the longest it can draft
    markov_rank: int | None = None  # r of its Markov head
    confidence_head: bool | None = None  # it has a trained confidence head (SGLang's compact / cap-accept need one)
    # learned policies trained on this drafter's round logs on this hardware (bundled engine only; the tuner offers
    # spec.scheduler / spec.gamma_policy `learned` only with one): train-policy / train-gamma-policy JSON
    verify_policy: str | None = None  # learned verify length (spec.scheduler: learned)
    gamma_policy: str | None = None  # learned block length (spec.gamma_policy: learned)
    # every method (profiler/catalog/drafters.yaml). `id` stays the DSpark checkpoint the bundle deploys (set only
    # for method dspark); `checkpoint` names any method's drafter
    method: DrafterMethod | None = None  # how it drafts: dspark | dflash | eagle3 | mtp | draft_model | ngram | suffix
    checkpoint: str | None = None  # the drafter's Hugging Face id or folder, any method (MTP: the target's own)
    draft_hidden: int | None = None  # width of the draft network (EAGLE-3: the target's hidden size)
    draft_intermediate: int | None = None  # MLP width of the draft layer (EAGLE-3)
    draft_vocab: int | None = None  # LM-head vocabulary of the draft (EAGLE-3's d2t; the target's when full)
    draft_model: str | None = None  # draft_model: the catalogue name of the small model (its profile prices it)
    mtp_modules: int | None = None  # MTP: modules the checkpoint ships (chained for deeper drafts)
    trained_steps: int | None = None  # draft tokens per round it was trained for (DSpark block, EAGLE-3 TTT steps)
    target_layers: list[int] | None = None  # target layers whose hidden states it reads (HF numbering)
    available: list[str] | None = None  # methods this deployment can run: the model's published drafters' + ngram,
    # suffix, none


class Derived(_Strict):
    decode_bound: Bound | None = None  # what bounds decode at workload concurrency on this hw
    ridge_batch: float | None = None  # batch tokens where decode turns compute-bound (weights-only roofline)
    verify_budget: float | None = None  # draft tokens each request can verify before a step turns compute-bound
    # (weights touched + the batch's KV vs FLOPs at decode_batch and decode_context; 0 when already compute-bound)
    weights_fit_bf16: bool | None = None  # bf16 weights fit on one device with KV headroom
    min_tp_bf16: int | None = None  # smallest TP (power of two) that fits bf16 weights
    min_tp_fp8: int | None = None  # ... fp8 weights
    min_tp_int4: int | None = None  # ... int4 weights
    weights_fit_fp8: bool | None = None  # fp8 weights fit on one device with KV headroom
    decode_batch: int | None = None  # batch (tokens per decode step) the derived figures assume
    decode_context: float | None = None  # mean context length per decoded token assumed
    arith_intensity: float | None = None  # decode FLOPs per byte at decode_batch (bf16 weights and KV)
    ridge_intensity: float | None = None  # hardware FLOPs per byte where compute = memory time (bf16)
    decode_step_ms: float | None = None  # roofline time of one bf16 decode step at decode_batch on min_tp_bf16 GPUs
    kv_capacity_tokens: float | None = None  # bf16 KV tokens that fit beside bf16 weights at min_tp_bf16
    sglang_static_fraction: float | None = None  # SGLang's own --mem-fraction-static default on this GPU at sglang_tp
    sglang_chunked_prefill: int | None = None  # SGLang's own --chunked-prefill-size default there
    sglang_graph_bs: int | None = None  # SGLang's own decode CUDA-graph max batch there
    sglang_tp: int | None = None  # TP those defaults were resolved at: the smallest 8-bit weights fit in


class Profile(_Strict):
    model: ModelProfile = ModelProfile()
    hw: HwProfile = HwProfile()
    workload: WorkloadProfile = WorkloadProfile()
    accept: AcceptProfile = AcceptProfile()
    accept_methods: dict[str, AcceptProfile] | None = None  # measured acceptance of n-gram / suffix / hybrid on this
    # workload's domain (bench --record-acceptance; the bundled engine's methods without a drafter of their own)
    drafter: DrafterProfile = DrafterProfile()
    derived: Derived = Derived()
    notes: list[str] | None = None  # how names were resolved and what was estimated or skipped

    def content_hash(self) -> str:
        """Stable hash of the content, used to deduplicate stored profiles."""
        blob = json.dumps(self.model_dump(mode="json", exclude_none=True), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
