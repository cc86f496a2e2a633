"""The performance model of one target (or drafter) forward on a piece of hardware (DESIGN.md section 5).

step(B tokens, context L) = max(FLOPs / (peak * eff_c), bytes / (bandwidth * eff_m)) + overhead, where
bytes = weights read once + KV read for every token's context + activations, FLOPs = 2 * active params *
B + the attention term. Tensor parallelism divides both and adds two all-reduces per layer. eff_c,
eff_m and overhead are calibrated from measurements (`calibrate`); `Efficiency.default()` is the prior
used for hardware that is not here, and every output that uses it says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from profiler.schema import Profile

DTYPE_BYTES = {"auto": 2.0, "fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0,
               "int8": 1.0, "int4": 0.5, "nvfp4": 0.5}
# which of the profile's weight_bytes figures a weight dtype occupies (fp32 is twice bf16)
STORED_FORMAT = {"auto": "bf16", "fp32": "bf16", "fp16": "bf16", "nvfp4": "int4"}
# which datasheet peak a weight dtype computes at (weight-only int4 dequantises to bf16)
COMPUTE_PEAK = {"auto": "bf16", "fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int8": "int8",
                "int4": "bf16", "nvfp4": "fp4"}


@dataclass(frozen=True)
class Efficiency:
    """Fractions of datasheet peaks reached, plus fixed costs; calibrated per device."""

    compute: float = 0.55  # achieved / peak tensor FLOPs on large GEMMs
    memory: float = 0.80  # achieved / datasheet bandwidth on streaming reads
    overhead_s: float = 2.5e-5  # per forward: launch, scheduling, sampling (with CUDA graphs)
    per_layer_s: float = 4.0e-6  # per decoder layer: kernel launches that graphs do not hide
    round_s: float = 0.0  # per engine round (host-side scheduling, verification, bookkeeping); 0 on GPU priors
    round_request_s: float = 0.0  # per running request and engine round (host-side per-request work)
    draft_scale: float = 1.0  # measured / modelled drafter forward time (calibrated on a real drafter)
    draft_request_s: float = 0.0  # per drafting request and drafter call: host-side per-request drafter work
    source: str = "prior"  # "prior" or "calibrated: <how>"

    @staticmethod
    def default() -> Efficiency:
        return Efficiency()


@dataclass(frozen=True)
class ModelShape:
    """What the model contributes to a step's cost (read from the profile's model section)."""

    params_active: float  # parameters touched per token
    params_total: float  # all parameters (weight bytes)
    num_layers: int
    hidden: int
    attn_width: int  # num_heads * head_dim (query side)
    kv_bytes_per_token_bf16: float  # over all layers
    vocab: int
    stored_bytes: tuple[tuple[str, float], ...] = ()  # the profile's weight bytes per format (bf16, fp8, int8,
    # int4: embeddings stay bf16, quantised layers carry their scales); empty: params x bytes per weight

    @staticmethod
    def from_profile(p: Profile) -> ModelShape:
        m = p.model
        missing = [k for k in ("params_active", "params_total", "num_layers", "hidden_size", "vocab_size")
                   if getattr(m, k) is None]
        if missing:
            from tuner.errors import TunerError

            raise TunerError(f"the profile's model lacks {', '.join(missing)}; profile a model first "
                             "(dspark profile --model NAME)")
        heads, hd = m.num_heads or 1, m.head_dim or (m.hidden_size // max(1, m.num_heads or 1))
        kv = (m.kv_bytes_per_token.bf16 if m.kv_bytes_per_token and m.kv_bytes_per_token.bf16 else
              2 * m.num_layers * (m.num_kv_heads or heads) * hd * 2)
        stored = tuple((k, float(v)) for k, v in (m.weight_bytes.model_dump().items() if m.weight_bytes else ())
                       if v)
        return ModelShape(m.params_active, m.params_total, m.num_layers, m.hidden_size, heads * hd, kv,
                          m.vocab_size, stored)


@dataclass(frozen=True)
class Hardware:
    peak_flops: dict[str, float]  # dtype -> FLOP/s (dense)
    bandwidth: float  # bytes/s
    memory_bytes: float
    interconnect_bw: float  # bytes/s per GPU for all-reduce
    allreduce_latency_s: float
    name: str = ""
    measured: bool = False  # peaks come from this device's microbenchmarks

    @staticmethod
    def from_profile(p: Profile) -> Hardware:
        hw = p.hw
        if hw.bandwidth_gbs is None and not (hw.measured and hw.measured.bandwidth_gbs):
            from tuner.errors import TunerError

            raise TunerError(f"hardware profile {hw.name or '?'} has no memory bandwidth; pick a catalogue GPU "
                             "(--gpu h100) or run --gpu auto")
        peaks = {}
        pt = hw.peak_tflops
        for dt in ("bf16", "fp16", "fp8", "int8", "fp4"):
            v = getattr(pt, dt, None) if pt else None
            if v:
                peaks[dt] = v * 1e12
        measured = bool(hw.measured and (hw.measured.bandwidth_gbs or hw.measured.tflops_bf16))
        if hw.measured and hw.measured.tflops_bf16:
            peaks.setdefault("bf16", hw.measured.tflops_bf16 * 1e12)
        if hw.measured and hw.measured.tflops_fp32:
            peaks["fp32"] = hw.measured.tflops_fp32 * 1e12
        base = peaks.get("bf16") or peaks.get("fp16") or peaks.get("fp32") or 1e12
        for dt in ("bf16", "fp16", "fp8", "int8", "fp4"):
            peaks.setdefault(dt, base)  # no faster path: runs at the bf16 rate
        peaks.setdefault("fp32", base / 2)  # datasheets rarely list dense fp32 tensor rates
        bw = (hw.measured.bandwidth_gbs if hw.measured and hw.measured.bandwidth_gbs else hw.bandwidth_gbs) * 1e9
        link = (hw.interconnect or "").lower()
        ic = (hw.interconnect_gbs or (450.0 if "nvlink" in link else 32.0)) * 1e9
        lat = 8e-6 if "nvlink" in link or "xgmi" in link else 25e-6
        return Hardware(peaks, bw, (hw.memory_gb or 16.0) * 1e9, ic, lat, hw.name or "", measured)


@dataclass(frozen=True)
class StepCost:
    seconds: float
    flops: float
    bytes: float
    bound: str  # "compute" | "memory"


@dataclass
class PerfModel:
    """Step times of the target and the drafter for one (model, hardware, dtype, TP) choice."""

    shape: ModelShape
    hw: Hardware
    eff: Efficiency = field(default_factory=Efficiency.default)
    weights_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    tp: int = 1
    cuda_graph_max_bs: int = 0  # forwards with at most this many tokens skip the per-layer launch cost

    def weight_bytes(self) -> float:
        """Bytes the weights occupy: the profile's figure for the format when it has one (profiler/model.py)."""
        key = STORED_FORMAT.get(self.weights_dtype, self.weights_dtype)
        stored = dict(self.shape.stored_bytes).get(key)
        if stored is not None:
            return stored * (2.0 if self.weights_dtype == "fp32" else 1.0)
        return self.shape.params_total * DTYPE_BYTES.get(self.weights_dtype, 2.0)

    def kv_bytes_per_token(self) -> float:
        return self.shape.kv_bytes_per_token_bf16 * DTYPE_BYTES.get(self.kv_dtype, 2.0) / 2.0

    def step(self, tokens: int, context: float, requests: int = 1) -> StepCost:
        """One target forward over `tokens` new tokens of `requests` requests at mean `context`."""
        s, tp = self.shape, self.tp
        flops = 2.0 * s.params_active * tokens + 4.0 * s.num_layers * s.attn_width * context * tokens
        weight_read = s.params_active if tokens == 1 else min(s.params_total, s.params_active * max(1, tokens))
        bytes_ = (weight_read * DTYPE_BYTES.get(self.weights_dtype, 2.0)
                  + requests * context * self.kv_bytes_per_token()
                  + tokens * s.hidden * 2.0 * 4 * s.num_layers)
        # a weight format without a peak of its own on this GPU runs weight-only (FP8 on Ampere: Marlin W8A16)
        peak = self.hw.peak_flops.get(COMPUTE_PEAK.get(self.weights_dtype, "bf16")) or self.hw.peak_flops["bf16"]
        t_c = flops / tp / (peak * self.eff.compute)
        t_m = bytes_ / tp / (self.hw.bandwidth * self.eff.memory)
        comm = 0.0
        if tp > 1:
            per = 2.0 * tokens * s.hidden * 2.0 * (tp - 1) / tp
            comm = 2 * s.num_layers * (self.hw.allreduce_latency_s + per / self.hw.interconnect_bw)
        launch = self.eff.overhead_s
        if not (self.cuda_graph_max_bs and tokens <= self.cuda_graph_max_bs):
            launch += self.eff.per_layer_s * s.num_layers
        return StepCost(max(t_c, t_m) + comm + launch, flops, bytes_, "compute" if t_c > t_m else "memory")

    def draft_step(self, requests: int, gamma: int, context: float, draft_layers: int, head: str,
                   markov_rank: int = 256) -> float:
        """One DSpark drafter forward: `draft_layers` target-width layers over gamma positions per request,
        the shared LM head over gamma positions, and the sequential head (gamma dependent steps)."""
        s = self.shape
        layer_params = max(1.0, (s.params_active - 2 * s.vocab * s.hidden) / s.num_layers)
        params = draft_layers * layer_params
        tokens = requests * gamma
        flops = 2.0 * (params + s.vocab * s.hidden) * tokens + 4.0 * draft_layers * s.attn_width * context * tokens
        bytes_ = (params + s.vocab * s.hidden) * 2.0 + requests * context * 2 * draft_layers * s.attn_width * 2.0
        peak = self.hw.peak_flops["bf16"]
        t = max(flops / self.tp / (peak * self.eff.compute), bytes_ / self.tp / (self.hw.bandwidth * self.eff.memory))
        t += self.eff.overhead_s + self.eff.per_layer_s * draft_layers
        if head != "none":
            # gamma dependent steps: low-rank bias r x V per position (Markov) plus the gated cell (RNN)
            head_flops = 2.0 * markov_rank * s.vocab * tokens * (2 if head == "rnn" else 1)
            head_bytes = markov_rank * s.vocab * 2.0 * (2 if head == "rnn" else 1)
            t += gamma * self.eff.per_layer_s + max(head_flops / (peak * self.eff.compute),
                                                    head_bytes * gamma / (self.hw.bandwidth * self.eff.memory))
        return t * self.eff.draft_scale + self.eff.draft_request_s * requests

    def sps(self, batch_tokens: int, context: float, requests: int | None = None) -> float:
        """Target steps per second at `batch_tokens` verify tokens (SGLang's SpsCostTable)."""
        return 1.0 / self.step(batch_tokens, context, requests or batch_tokens).seconds

    def kv_capacity_tokens(self, memory_fraction: float) -> float:
        """Tokens of KV that fit after the weights, per GPU group of `tp` devices."""
        free = self.hw.memory_bytes * self.tp * memory_fraction - self.weight_bytes()
        return max(0.0, free / self.kv_bytes_per_token())
