"""Speculative methods as the engines run them: what one round costs, method by method (DESIGN.md section 5).

A round of B requests that each draft K tokens is, in the order the engines run it:
- the drafting:
  - `dspark` / `dflash`: one parallel forward of the block drafter over B x K positions, plus the Markov / RNN
    head's K dependent steps (PerfModel.draft_step);
  - `eagle3`, `mtp`, `draft_model`: sequential. After verification the draft network first re-reads the round's
    verified tokens (the "draft extend": B x (K+1) rows, which also yields the first draft token), then K - 1
    single-position steps (B x topk rows on a tree). The network is the method's own: EAGLE-3's one dense layer
    over the target's width with its reduced-vocabulary LM head, the target's MTP module (one target layer, MoE
    where the target's layers are, plus the shared full-vocabulary LM head), or a small model's whole forward;
  - `ngram` / `suffix`: host-side lookups per request (no GPU forward);
- the verify forward over the real token count: B x (K+1) rows (B x draft_tokens on an EAGLE tree), attention
  over each request's context with K+1 queries, and the MoE experts that many tokens touch (PerfModel.step);
- sampling and verification over those rows' logits (read, softmax / argmax: bytes over the vocabulary);
- the engine's fixed per-round costs (host scheduling that speculation stops hiding, per round and per running
  request, the verify / accept kernels' launches, draft-step synchronisation) and CUDA-graph coverage: past the
  batch an engine captures, every forward runs eagerly and pays its kernels' launches per layer. Those constants
  are fitted to published measurements (tuner/catalog/spec_costs.yaml, beside the rows they came from:
  benchmarks/bench_spec_published.py --fit).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tuner.perf import ModelShape, PerfModel

METHODS = ("none", "dspark", "dflash", "eagle3", "mtp", "draft_model", "ngram", "suffix")
PARALLEL = ("dspark", "dflash")  # one block forward per round
SEQUENTIAL = ("eagle3", "mtp", "draft_model")  # an extend forward + K - 1 steps of the draft network
HOST = ("ngram", "suffix")  # proposals looked up on the host
COSTS_FILE = Path(__file__).parent / "catalog" / "spec_costs.yaml"
LOGIT_BYTES = 4.0 * 3  # fp32 logits written by the LM head, read by softmax / argmax, read again by sampling


@dataclass(frozen=True)
class EngineCosts:
    """One engine's per-round constants for speculative rounds (fitted; see COSTS_FILE) and its defaults."""

    engine: str  # sglang | vllm | trtllm | transformers
    round_s: float  # per speculative round: host work speculation does not overlap, verify / accept launches
    request_s: float  # per request and speculative round: its share of that host work (batch building, accepting)
    draft_step_s: float  # per sequential draft step: launch and synchronisation of the step
    host_lookup_s: float  # per request and round: an n-gram / suffix-tree lookup on the host
    eager_layer_s: float  # per layer of a forward that runs outside a CUDA graph (kernel launches)
    graphs: bool  # the engine captures CUDA graphs at all
    graph_max_bs: int  # largest batch (requests) captured when speculating (0: no request cap)
    graph_max_tokens: int  # largest batch in tokens captured (vLLM sizes graphs in tokens; 0: no token cap)
    max_running: int  # the engine's default cap on running requests when speculating (0: none)

    def eager(self, requests: int, rows: int) -> bool:
        """Whether a speculative forward of `requests` requests and `rows` tokens runs outside a CUDA graph."""
        if not self.graphs:
            return True
        return bool(self.graph_max_bs and requests > self.graph_max_bs) or \
            bool(self.graph_max_tokens and rows > self.graph_max_tokens)


@cache
def _costs_file() -> dict[str, Any]:
    return yaml.safe_load(COSTS_FILE.read_text()) or {}


_OVERRIDES: list[dict[str, Any]] = []  # cost tables a fit tries (costs_table), innermost last


@contextmanager
def costs_table(data: dict[str, Any]) -> Iterator[None]:
    """Price with `data` (COSTS_FILE's layout) instead of the file inside the block: what a fit of the constants
    tries before it writes them."""
    _OVERRIDES.append(data)
    try:
        yield
    finally:
        _OVERRIDES.pop()


def engine_costs(engine: str, arch: str | None = None) -> EngineCosts:
    """The constants of `engine` (sglang when the file does not name it) on a GPU of architecture `arch`."""
    data = _OVERRIDES[-1] if _OVERRIDES else _costs_file()
    rows = data.get("engines") or {}
    name = engine if engine in rows else "sglang"
    row = rows[name]
    fitted = (data.get("fitted") or {}).get(name) or {}

    def us(key: str) -> float:
        return float(fitted.get(key, row.get(key, 0.0))) * 1e-6

    tokens = int(row.get("graph_max_tokens_blackwell", 0) if arch == "blackwell" else 0) or \
        int(row.get("graph_max_tokens", 0))
    return EngineCosts(engine=name, round_s=us("round_us"), request_s=us("request_us"),
                       draft_step_s=us("draft_step_us"),
                       host_lookup_s=us("host_lookup_us"), eager_layer_s=us("eager_layer_us"),
                       graphs=bool(row.get("graphs", True)), graph_max_bs=int(row.get("graph_max_bs", 0)),
                       graph_max_tokens=tokens, max_running=int(row.get("max_running", 0)))


@dataclass(frozen=True)
class Drafting:
    """What a deployment drafts with: the method and its network's facts (from the profile's drafter section)."""

    method: str  # one of METHODS
    topk: int = 1  # EAGLE tree branching per step (1: a chain)
    draft_tokens: int = 0  # EAGLE tree: tokens verified per request incl. the root (0: a chain, K + 1)
    layers: int = 1  # draft layers (DSpark / DFlash backbone; EAGLE-3 and MTP modules: 1)
    head: str = "markov"  # DSpark's sequential head
    markov_rank: int = 256
    draft_vocab: int = 0  # EAGLE-3's reduced LM-head vocabulary (0: the target's)
    draft_intermediate: int = 0  # EAGLE-3 layer's MLP width (0: the target's dense width, or 4 x hidden on MoE)
    model: ModelShape | None = None  # draft_model: the small model's own shape

    def verify_rows(self, k: int) -> int:
        """Tokens each request verifies in a round that drafted `k` (the anchor included)."""
        if k <= 0:
            return 1
        if self.method == "eagle3" and self.topk > 1 and self.draft_tokens:
            return self.draft_tokens
        return k + 1


def draft_net(target: ModelShape, d: Drafting) -> ModelShape:
    """The network a sequential method runs per draft step, as a ModelShape the same kernel model prices."""
    if d.method == "draft_model":
        assert d.model is not None, "draft_model needs the draft model's shape"
        return d.model
    s = target
    kv_layer = s.kv_bytes_per_token_bf16 / max(1, s.num_layers)
    routed = s.num_moe_layers * s.experts_per_token * s.expert_params
    layer = max(1.0, (s.params_active - s.embed_in - s.lm_head - routed) / max(1, s.num_layers))
    if d.method == "mtp":  # the target's own layer (with its routed experts on a MoE target), the shared LM head
        moe = s.num_moe_layers > 0
        proj = 2.0 * s.hidden * s.hidden  # eh_proj: [embedding; hidden] -> hidden
        active = layer + proj + (s.experts_per_token * s.expert_params if moe else 0.0) + s.lm_head
        return replace(s, params_active=active, params_total=active + (s.num_experts * s.expert_params if moe else 0),
                       num_layers=1, kv_bytes_per_token_bf16=kv_layer, embed_in=0.0, num_moe_layers=1 if moe else 0,
                       stored_bytes=())
    # eagle3: one dense decoder layer at the target's width, fc over three target layers' states, reduced LM head
    vocab = d.draft_vocab or s.vocab
    width = d.draft_intermediate or (s.mlp_width if not s.num_experts else 4 * s.hidden)
    attn = 2.0 * s.hidden * s.attn_width + 2.0 * s.hidden * (kv_layer / 4.0 if kv_layer else s.attn_width)
    dense = attn + 3.0 * s.hidden * width + 3.0 * s.hidden * s.hidden  # + fc: 3H -> H
    head = float(vocab * s.hidden)
    return ModelShape(params_active=dense + head, params_total=dense + head, num_layers=1, hidden=s.hidden,
                      attn_width=s.attn_width, kv_bytes_per_token_bf16=kv_layer, vocab=vocab, lm_head=head,
                      kv_shards=s.kv_shards, mlp_width=width)


@dataclass(frozen=True)
class RoundCost:
    """One round's time, split as the engine spends it (seconds)."""

    draft_s: float
    verify_s: float
    sample_s: float
    fixed_s: float  # the engine's per-round constants (host, launches, eager layers)
    rows: int  # tokens the verify forward processed

    @property
    def seconds(self) -> float:
        return self.draft_s + self.verify_s + self.sample_s + self.fixed_s


def round_cost(perf: PerfModel, costs: EngineCosts, d: Drafting, requests: int, k: int, context: float,
               drafting: int | None = None, rows: int | None = None) -> RoundCost:
    """One decode round of `requests` running requests, `drafting` of which (default all) draft `k` tokens;
    `rows`: the verify forward's tokens when a verify scheduler chose them (DSpark's prefix schedulers)."""
    s = perf.shape
    n_draft = requests if drafting is None else drafting
    k = k if n_draft and d.method != "none" else 0
    if rows is None:
        rows = n_draft * d.verify_rows(k) + (requests - n_draft)
    eager = costs.eager(requests, rows) if k else not costs.graphs  # plain decoding: the engine's full ladder
    verify = perf.step(rows, context, requests).seconds
    fixed = costs.eager_layer_s * s.num_layers if eager else 0.0
    draft = 0.0
    if k:
        fixed += costs.round_s + costs.request_s * requests
        if d.method in PARALLEL:
            draft = perf.draft_step(n_draft, k, context, d.layers, d.head if d.method == "dspark" else "none",
                                    d.markov_rank)
            if eager:  # the block drafter's one forward runs outside a graph too
                draft += costs.eager_layer_s * max(1, d.layers)
        elif d.method in HOST:
            draft = costs.host_lookup_s * n_draft
        elif d.method in SEQUENTIAL:
            extend = _draft_forward(perf, d, n_draft * (k + 1), n_draft, context)
            steps = (k - 1) * _draft_forward(perf, d, n_draft * max(1, d.topk), n_draft, context)
            draft = extend + steps + k * costs.draft_step_s
            if eager:
                draft += costs.eager_layer_s * k * max(1, d.layers)
    sample = rows * s.vocab * LOGIT_BYTES / (perf.hw.bandwidth * perf.eff.memory) / perf.tp
    return RoundCost(draft, verify, sample, fixed, rows)


def _draft_forward(target: PerfModel, d: Drafting, rows: int, requests: int, context: float) -> float:
    """One forward of the sequential draft network over `rows` tokens of `requests` requests: from AIC's per-op
    tables where they price the target (EAGLE-3 and MTP reuse its layer ops), else by the kernel model of the
    draft network's own shape (an MTP module in the target's weight format, EAGLE-3 and draft models in bf16)."""
    seq = getattr(target, "seq_draft_step", None)
    if seq is not None and d.method in ("eagle3", "mtp"):
        return seq(d, rows, requests, context)
    return _draft_perf(target, d).step(rows, context, requests).seconds


_DRAFT_NETS: dict[tuple[int, Drafting], tuple[PerfModel, PerfModel]] = {}  # (id(target), d) -> (target, draft's)


def _draft_perf(target: PerfModel, d: Drafting) -> PerfModel:
    """The kernel model of the draft network, built once per target and drafting (not twice per simulated round)."""
    key = (id(target), d)
    got = _DRAFT_NETS.get(key)
    if got is None or got[0] is not target:
        if len(_DRAFT_NETS) >= 64:
            _DRAFT_NETS.clear()
        dtype = target.weights_dtype if d.method == "mtp" else "bf16"
        got = (target, PerfModel(draft_net(target.shape, d), target.hw, target.eff, dtype, target.kv_dtype,
                                 target.tp, target.cuda_graph_max_bs))
        _DRAFT_NETS[key] = got
    return got[1]


def drafting_of(params: dict[str, Any], profile: Any = None, draft_shape: ModelShape | None = None) -> Drafting:
    """The Drafting of tuned `params` (dotted names) and the profile's drafter facts."""
    method = str(params.get("spec.method") or "dspark")
    if not params.get("spec.enabled", True) or int(params.get("spec.block_size") or 0) <= 0:
        method = "none"
    dr = getattr(profile, "drafter", None)
    tree = method == "eagle3"  # only EAGLE drafts a tree (estimate's --topk / --draft-tokens; tune runs chains)
    return Drafting(method=method, topk=int(params.get("spec.topk") or 1) if tree else 1,
                    draft_tokens=int(params.get("spec.draft_tokens") or 0) if tree else 0,
                    layers=_draft_layers(method, params, dr),
                    head=str(params.get("spec.head") or "markov"),
                    markov_rank=int(params.get("spec.markov_rank") or 256),
                    draft_vocab=int(getattr(dr, "draft_vocab", None) or 0),
                    draft_intermediate=int(getattr(dr, "draft_intermediate", None) or 0), model=draft_shape)


def _draft_layers(method: str, params: dict[str, Any], dr: Any) -> int:
    """Layers of one draft forward: the block drafter's tuned depth (`spec.draft_layers`, DSpark / DFlash), else the
    profiled drafter's own when it is of this method (an EAGLE-3 head's layer), else one (an MTP module step)."""
    if method in PARALLEL:
        return int(params.get("spec.draft_layers") or getattr(dr, "layers", None) or 1)
    if dr is not None and getattr(dr, "method", None) == method and getattr(dr, "layers", None):
        return int(dr.layers)
    return 1
