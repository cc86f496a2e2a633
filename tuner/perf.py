"""The performance model of one target (or drafter) forward on a piece of hardware (DESIGN.md section 5).

Two forms of one roofline. For hardware that is not here (`Efficiency.prior`), a forward is the sum of its
kernels, each max(FLOPs / achieved peak, bytes / achieved bandwidth) plus the kernel's floor: the GEMMs (the
dense weights read once; a MoE layer reads only the experts its tokens touch, E(1 - (1 - k/E)^T) of them; the
LM head in bf16), attention (each request's KV read once), the elementwise kernels, and two all-reduces per layer
under tensor parallelism. The achieved fractions, floors and all-reduce costs are per-architecture figures read
off measured kernel tables (catalog/roofline.yaml). For this device (`calibrate`), the aggregate form
max(FLOPs / (peak * eff_c), bytes / (bandwidth * eff_m)) + overhead is fitted to timed forwards.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path

import yaml

from profiler.schema import GIB, HwProfile, Profile

DTYPE_BYTES = {"auto": 2.0, "fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0,
               "int8": 1.0, "int4": 0.5, "nvfp4": 0.5}
# which of the profile's weight_bytes figures a weight dtype occupies (fp32 is twice bf16)
STORED_FORMAT = {"auto": "bf16", "fp32": "bf16", "fp16": "bf16", "nvfp4": "int4"}
# which datasheet peak a weight dtype computes at (weight-only int4 dequantises to bf16)
COMPUTE_PEAK = {"auto": "bf16", "fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int8": "int8",
                "int4": "bf16", "nvfp4": "fp4"}
PRIORS = Path(__file__).parent / "catalog" / "roofline.yaml"


def _key(dtype: str) -> str:
    return "fp8" if dtype in ("fp8", "fp8_e4m3", "fp8_e5m2", "int8") else "bf16"


@dataclass(frozen=True)
class KernelCosts:
    """Measured kernel costs of one architecture (catalog/roofline.yaml): what a forward's kernels cost."""

    gemm: tuple[tuple[str, float, float, float], ...]  # (dtype, floor s, bandwidth fraction, compute fraction)
    attn_floor_s: float  # decode attention per layer: latency = floor + KV bytes / (fraction x bandwidth)
    attn_memory: float
    moe: tuple[tuple[str, int, int, int, int, float, float], ...]  # (dtype, hidden, inter, experts, topk, floor s,
    # fraction of bandwidth on the bytes of the experts uniform routing touches), per measured expert shape
    allreduce: tuple[tuple[int, tuple[tuple[float, float], ...]], ...]  # (TP, ((message bytes, seconds), ...))
    arch: str = ""

    def gemm_of(self, dtype: str) -> tuple[float, float, float]:
        """(floor s, bandwidth fraction, compute fraction) of a GEMM in `dtype` (bf16's where unmeasured)."""
        rows = {r[0]: r[1:] for r in self.gemm}
        return rows.get(_key(dtype), rows["bf16"])

    @lru_cache(maxsize=256)  # noqa: B019  (KernelCosts are a few immutable catalogue rows, cached for the process)
    def moe_of(self, dtype: str, hidden: int, inter: float, experts: int, topk: int) -> tuple[float, float]:
        """(floor s, bandwidth fraction) of a MoE layer: the measured expert shape nearest this one; the GEMM's
        where the architecture has no MoE table."""
        rows = [r for r in self.moe if r[0] == _key(dtype)] or [r for r in self.moe if r[0] == "bf16"]
        if not rows:
            floor, mem, _ = self.gemm_of(dtype)
            return 2 * floor, mem
        want = (hidden, max(1.0, inter), experts, topk)

        def dist(r: tuple) -> float:
            return sum(math.log(max(1.0, a) / max(1.0, b)) ** 2 for a, b in zip(r[1:5], want, strict=True))

        best = min(rows, key=dist)
        return best[5], best[6]

    def allreduce_s(self, tp: int, nbytes: float) -> float:
        """One all-reduce of `nbytes` over `tp` GPUs: the measured curve of the nearest TP size at or above,
        interpolated log-log (extrapolated at the ends' slopes)."""
        rows = sorted(self.allreduce)
        _, curve = next((r for r in rows if r[0] >= tp), rows[-1])
        xs = [math.log(b) for b, _ in curve]
        ys = [math.log(t) for _, t in curve]
        x = math.log(max(1.0, nbytes))
        i = min(max(1, bisect.bisect_left(xs, x)), len(xs) - 1)
        slope = (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])
        return math.exp(ys[i - 1] + slope * (x - xs[i - 1])) if x > xs[0] else math.exp(ys[0])


@cache
def kernel_costs(arch: str) -> KernelCosts | None:
    """The measured kernel costs of a GPU architecture, or None when the catalogue has none."""
    row = (yaml.safe_load(PRIORS.read_text()).get("architectures") or {}).get(arch)
    if not row:
        return None
    gemm = tuple((dt, row["gemm_floor_us"][dt] * 1e-6, row["gemm_memory"][dt], row["gemm_compute"][dt])
                 for dt in row["gemm_memory"])
    moe = tuple((dt, int(h), int(i), int(e), int(k), f * 1e-6, frac) for dt, rows in (row.get("moe") or {}).items()
                for h, i, e, k, f, frac in rows)
    ar = tuple((int(tp), tuple((float(b), us * 1e-6) for b, us in pts)) for tp, pts in row["allreduce_us"].items())
    return KernelCosts(gemm, row["attn"][0] * 1e-6, row["attn"][1], moe, ar, arch)


@dataclass(frozen=True)
class Efficiency:
    """Fractions of datasheet peaks reached, plus fixed costs; calibrated per device."""

    compute: float = 0.55  # achieved / peak tensor FLOPs on large GEMMs (aggregate form)
    memory: float = 0.80  # achieved / datasheet bandwidth on streaming reads (aggregate form)
    overhead_s: float = 2.5e-5  # per forward: launch, scheduling, sampling (with CUDA graphs)
    per_layer_s: float = 4.0e-6  # per decoder layer: kernel launches that graphs do not hide
    round_s: float = 0.0  # per engine round (host-side scheduling, verification, bookkeeping); 0 on GPU priors
    round_request_s: float = 0.0  # per running request and engine round (host-side per-request work)
    draft_scale: float = 1.0  # measured / modelled drafter forward time (calibrated on a real drafter)
    draft_request_s: float = 0.0  # per drafting request and drafter call: host-side per-request drafter work
    kernels: KernelCosts | None = None  # per-kernel costs of the architecture: the per-op form; None: aggregate
    source: str = "prior"  # "prior", "prior: <arch> kernel tables" or "calibrated: <how>"

    @staticmethod
    def default() -> Efficiency:
        return Efficiency()

    @staticmethod
    def prior(hw: HwProfile) -> Efficiency:
        """The prior for hardware that is not here: its architecture's measured kernel costs when catalogued."""
        k = kernel_costs(hw.arch or "")
        if k is None:
            return Efficiency()
        _, memory, compute = k.gemm_of("bf16")
        return Efficiency(compute=compute, memory=memory, kernels=k,
                          source=f"prior: {k.arch} kernel tables (tuner/catalog/roofline.yaml)")


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
    embed_in: float = 0.0  # input-embedding parameters a forward does not read (0 when tied to the LM head)
    lm_head: float = 0.0  # LM-head parameters (vocab x hidden), read in bf16 every forward
    num_experts: int = 0  # routed experts per MoE layer (0: dense)
    experts_per_token: int = 0  # routed experts each token picks
    expert_params: float = 0.0  # parameters of one routed expert
    num_moe_layers: int = 0  # layers with a routed MLP
    kv_shards: int = 0  # how many ways TP can split the KV (KV heads; 1 for MLA's latent); 0: any
    mlp_width: int = 0  # intermediate activations per token per layer (dense MLP, or k x expert width)
    expert_width: int = 0  # one routed expert's intermediate width (moe_intermediate_size)

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
        lm = float(m.vocab_size * m.hidden_size)
        embed = 0.0 if m.tied_embeddings else float(m.params_embedding or 0.0)
        k = int(m.experts_per_token or 0)
        width = (k * (m.intermediate_size or 0)) if m.num_experts else (m.intermediate_size or 0)
        shards = 1 if m.attention == "mla" else int(m.num_kv_heads or 0)
        return ModelShape(m.params_active, m.params_total, m.num_layers, m.hidden_size, heads * hd, kv,
                          m.vocab_size, stored, embed, lm, int(m.num_experts or 0), k, float(m.expert_params or 0.0),
                          int(m.num_moe_layers or 0), shards, int(width),
                          int(m.intermediate_size or 0) if m.num_experts else 0)

    def experts_touched(self, tokens: int) -> float:
        """Expected distinct experts `tokens` tokens route to in one MoE layer (uniform top-k routing)."""
        e, k = self.num_experts, self.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** max(1, tokens)) if e and k else 0.0

    def weight_params_read(self, tokens: int) -> tuple[float, float]:
        """(quantisable matrix parameters, bf16 LM-head parameters) a forward of `tokens` tokens reads."""
        routed_active = self.num_moe_layers * self.experts_per_token * self.expert_params
        dense = max(0.0, self.params_active - self.embed_in - self.lm_head - routed_active)
        routed = self.num_moe_layers * self.experts_touched(tokens) * self.expert_params
        return dense + routed, self.lm_head


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
        return Hardware(peaks, bw, (hw.memory_gb or 16.0) * GIB, ic, lat, hw.name or "", measured)


@dataclass(frozen=True)
class StepCost:
    seconds: float
    flops: float
    bytes: float
    bound: str  # "compute" | "memory"
    parts: tuple[tuple[str, float], ...] = ()  # seconds per kernel class (gemm, attention, elementwise, ...)


@dataclass
class PerfModel:
    """Step times of the target and the drafter for one (model, hardware, dtype, TP) choice. The roofline forms here
    price a server as TP over its `tp` GPUs whatever its `attn_dp` / `ep` (memory, `kv_capacity_tokens`, follows
    them); AIConfigurator's tables price those layouts (tuner/aic.py)."""

    shape: ModelShape
    hw: Hardware
    eff: Efficiency = field(default_factory=Efficiency.default)
    weights_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    tp: int = 1  # GPUs of the server (SGLang's --tp-size): attention TP x attention DP, MoE TP x EP
    cuda_graph_max_bs: int = 0  # forwards with at most this many tokens skip the per-layer launch cost
    attn_dp: int = 1  # attention data-parallel ranks (SGLang --enable-dp-attention); attention TP = tp / attn_dp
    ep: int = 1  # expert-parallel ranks of the MoE layers (--ep-size); MoE TP = tp / ep

    @property
    def cost_source(self) -> str:
        """What priced this model's forwards (reports and provenance name it)."""
        return "measured" if self.eff.source.startswith("calibrated") else "roofline"

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
        if self.eff.kernels is not None:
            return self._kernel_step(tokens, context, requests, self.eff.kernels)
        s, tp = self.shape, self.tp
        flops = 2.0 * s.params_active * tokens + 4.0 * s.num_layers * s.attn_width * context * tokens
        quant, lm = s.weight_params_read(tokens)
        bytes_ = ((quant + lm) * DTYPE_BYTES.get(self.weights_dtype, 2.0)
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
        return StepCost(max(t_c, t_m) + comm + self._launch(tokens), flops, bytes_,
                        "compute" if t_c > t_m else "memory")

    def _launch(self, tokens: int) -> float:
        launch = self.eff.overhead_s
        if not (self.cuda_graph_max_bs and tokens <= self.cuda_graph_max_bs):
            launch += self.eff.per_layer_s * self.shape.num_layers
        return launch

    def _kernel_step(self, tokens: int, context: float, requests: int, k: KernelCosts) -> StepCost:
        """The forward as the sum of its kernels: dense GEMMs, MoE experts, LM head, attention, elementwise,
        all-reduces; each max(compute, floor + bytes at the measured fraction of bandwidth)."""
        s, tp, hw, dt = self.shape, self.tp, self.hw, self.weights_dtype
        layers, moe_layers = s.num_layers, s.num_moe_layers
        peak_w = hw.peak_flops.get(COMPUTE_PEAK.get(dt, "bf16")) or hw.peak_flops["bf16"]
        peak_b, bw, wb = hw.peak_flops["bf16"], hw.bandwidth, DTYPE_BYTES.get(dt, 2.0)
        if peak_w <= peak_b:  # no tensor cores of the dtype's own (FP8 on Ampere): weight-only, at bf16's kernels
            dt = "bf16" if _key(dt) == "fp8" else dt
        floor, mem, comp = k.gemm_of(dt)
        floor_b, mem_b, comp_b = k.gemm_of("bf16")
        quant, lm = s.weight_params_read(tokens)
        routed = moe_layers * s.experts_touched(tokens) * s.expert_params  # expert weights the tokens touch
        dense = quant - routed
        t_dense = max(2.0 * tokens * dense / tp / (peak_w * comp),
                      (4 * layers + moe_layers) * floor + dense * wb / tp / (bw * mem))  # qkv, o, up, down, router
        t_lm = max(2.0 * tokens * lm / tp / (peak_b * comp_b), floor_b + lm * 2.0 / tp / (bw * mem_b))
        t_moe = 0.0
        if moe_layers:
            m_floor, m_mem = k.moe_of(dt, s.hidden, s.expert_width / tp, s.num_experts, s.experts_per_token)
            active = moe_layers * s.experts_per_token * s.expert_params
            t_moe = max(2.0 * tokens * active / tp / (peak_w * comp),
                        moe_layers * m_floor + routed * wb / tp / (bw * m_mem))
        shards = min(tp, s.kv_shards) if s.kv_shards else tp
        kv = requests * context * self.kv_bytes_per_token() / shards
        attn_flops = 4.0 * layers * s.attn_width * context * tokens / tp
        t_attn = max(attn_flops / (peak_b * comp_b), layers * k.attn_floor_s + kv / (bw * k.attn_memory))
        elem_bytes = tokens * layers * (8.0 * s.hidden + 3.0 * s.mlp_width / tp) * 2.0
        t_elem = (3 * layers + 1) * floor_b + elem_bytes / (bw * mem_b)  # 2 add-norms + activation per layer
        t_comm = (2 * layers + 1) * k.allreduce_s(tp, tokens * s.hidden * 2.0) if tp > 1 else 0.0
        parts = (("gemm", t_dense + t_lm), ("moe", t_moe), ("attention", t_attn), ("elementwise", t_elem),
                 ("allreduce", t_comm), ("launch", self._launch(tokens)))
        flops = 2.0 * tokens * (dense + lm + moe_layers * s.experts_per_token * s.expert_params) / tp + attn_flops
        bytes_ = (quant * wb + lm * 2.0) / tp + kv + elem_bytes
        compute_bound = 2.0 * tokens * dense / tp / (peak_w * comp) > dense * wb / tp / (bw * mem)
        return StepCost(sum(v for _, v in parts), flops, bytes_, "compute" if compute_bound else "memory", parts)

    def prefill(self, tokens: int, prompt: float, requests: int = 1) -> StepCost:
        """One prefill forward: `tokens` new prompt tokens of `requests` requests whose prompts are `prompt` long."""
        return self.step(tokens, prompt / 2, requests)

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
        """Tokens of KV that fit after the weights, per GPU group of `tp` devices. A token's KV is split over at
        most as many ranks of its attention TP group as there are KV heads (MLA's latent: one); beyond that each
        rank holds a copy. With data-parallel attention each of the `attn_dp` groups holds its own requests' KV
        and a whole copy of the non-expert weights (split over its attention TP); the experts stay split over all
        `tp` GPUs."""
        s, attn_tp = self.shape, max(1, self.tp // max(1, self.attn_dp))
        experts = s.num_moe_layers * s.num_experts * s.expert_params / max(1.0, s.params_total)
        per_gpu = self.weight_bytes() * (min(1.0, experts) / self.tp + (1.0 - min(1.0, experts)) / attn_tp)
        free = (self.hw.memory_bytes * memory_fraction - per_gpu) * self.tp
        shards = min(attn_tp, s.kv_shards) if s.kv_shards else attn_tp
        return max(0.0, free / (self.kv_bytes_per_token() * attn_tp / shards))
