"""AIConfigurator's measured kernel database as the simulator's cost source (the optional `aic` extra).

When aiconfigurator-core (the pinned version of tuner/catalog/aic.yaml) is installed and it has measured the
GPU, the model's architecture and the dtypes, every forward the simulator prices is a sum of AIC's per-op
latencies: the GEMMs, MoE and all-reduces at M = the forward's tokens, attention at the real batch of
requests and context. A DSpark verify step is the target's decode op list at M = B x (gamma + 1) tokens with
attention over B requests (the verify kernel reads each request's KV once for all its query rows); the
drafter is the same per-layer ops at M = B x gamma scaled to its depth, the LM head at B x gamma rows, and the
sequential head as gamma dependent GEMMs of B rows. Anything AIC cannot price falls back to the roofline with
the reason, so `cost_source` always says which one produced a figure.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from profiler.schema import Profile
from tuner.perf import PerfModel, StepCost

CATALOG = Path(__file__).parent / "catalog" / "aic.yaml"
PREFILL_ROWS = 64  # a forward with more new tokens per request than this is a prefill (context ops)
CTX_STRIDE = 16  # contexts are priced on this grid (AIC interpolates between measured points anyway)


@cache
def catalog() -> dict[str, Any]:
    return yaml.safe_load(CATALOG.read_text())


def installed_version() -> str | None:
    """The installed aiconfigurator-core version, or None when the extra is absent."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(catalog()["package"])
    except PackageNotFoundError:
        return None


@dataclass(frozen=True)
class AicTarget:
    """What AIC needs to compile the model for one deployment."""

    model_path: str  # a Hugging Face id AIC bundles, or a folder holding config.json
    system: str  # AIC system name, e.g. h100_sxm
    database: str  # the system's SGLang database version
    backend: str = "sglang"

    def source(self) -> str:
        return f"aic:{self.system}/{self.backend}/{self.database}"


def _hf_id(source: str | None) -> str | None:
    if source and source.startswith("https://huggingface.co/"):
        parts = source.removeprefix("https://huggingface.co/").split("/")
        if len(parts) >= 2:
            return f"{parts[0]}/{parts[1]}"
    return None


def _model_path(profile: Profile) -> str | None:
    """A model path AIC reads without the network: its bundled config, the profiled folder, or the catalogue row
    written to our cache folder."""
    from aiconfigurator_core.sdk.common import DefaultHFModels

    src = profile.model.source
    hf = _hf_id(src)
    if hf and hf in DefaultHFModels:
        return hf
    if src and Path(src).is_dir() and (Path(src) / "config.json").is_file():
        return src
    from profiler.catalog import models

    entry = next((m for m in models() if m.name == profile.model.name), None)
    if entry is None:
        return None
    folder = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dspark-tune" / "aic" / entry.name
    folder.mkdir(parents=True, exist_ok=True)
    cfg = folder / "config.json"
    text = json.dumps(entry.config, indent=2, sort_keys=True) + "\n"
    if not cfg.is_file() or cfg.read_text() != text:
        tmp = cfg.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(cfg)
    return str(folder)


def resolve(profile: Profile, engine: str = "sglang") -> tuple[AicTarget | None, str]:
    """The AIC target for this profile as `engine` runs it (its own kernel tables where AIC timed that engine, else
    SGLang's), or None and why AIC cannot price it."""
    cat = catalog()
    have = installed_version()
    if have is None:
        return None, f"{cat['package']} is not installed (pip install -e \".[aic]\")"
    if have != cat["version"]:
        return None, f"{cat['package']} {have} is installed; this tool reads the {cat['version']} API"
    row = cat["systems"].get(profile.hw.name or "")
    if row is None:
        return None, f"AIC has no measured system for {profile.hw.name or 'this hardware'}"
    path = _model_path(profile)
    if path is None:
        return None, f"AIC cannot read the architecture of {profile.model.name or 'this model'}"
    backend = cat["backends"].get(engine, cat["backend"])
    database = row["database"] if backend == cat["backend"] else row.get(backend)
    if database is None:
        return None, f"aic.yaml names no {backend} database for {profile.hw.name}"
    return AicTarget(path, row["system"], database, backend), ""


COVER_DTYPES = ("bf16", "fp8", "nvfp4")  # the dtypes `covers` probes, in order


def covers(profile: Profile, engine: str = "sglang") -> tuple[AicTarget | None, str]:
    """`resolve`, and AIC's tables hold the model's own kernels: one decode step at TP 1 prices in one of
    COVER_DTYPES. A model whose attention or GEMM shapes AIC never timed (SmolLM2's 64-wide heads, 3 KV heads) would
    fail at every point of a study, so the study is priced by the roofline from the start instead (one cost source
    either way). Several dtypes, since a table may time a model's MoE only quantised (TRT-LLM's B200 tables hold
    DeepSeek-R1's experts in fp8 and nvfp4, not bf16); a dtype AIC lacks is priced from a timed one."""
    target, why = resolve(profile, engine)
    if target is None:
        return None, why
    said = ""
    for dtype in COVER_DTYPES:
        try:
            handle(target, 1, dtype, "auto", bool(profile.model.num_experts)).decode_ms(1, 1, 512)
            return target, ""
        except Exception as exc:  # noqa: BLE001 - any refusal of AIC's means it cannot price this dtype
            said = said or _said(exc)
    return None, f"AIC has no measured kernels for {profile.model.name}'s shapes ({said})"


def _said(exc: BaseException) -> str:
    """An AIC refusal's first line, without the local file path its Rust core appends, bounded for one line."""
    return re.sub(r" at /\S+.*$", "", (str(exc).splitlines() or [""])[0])[:160]


class _Handle:
    """One compiled AIC engine (model x system x parallelism x dtypes) and its cached per-op queries."""

    def __init__(self, target: AicTarget, tp: int, weights: str, kv: str, moe: bool, moe_ep: int = 1,
                 attn_dp: int = 1) -> None:
        from aiconfigurator_core.sdk.engine import EngineHandle

        cat = catalog()
        # `tp` GPUs: attention TP x attention DP (AIC's tp_size x attention_dp_size), MoE TP x EP
        kwargs: dict[str, Any] = {"tp_size": tp // attn_dp, "attention_dp_size": attn_dp,
                                  "backend_version": target.database}
        if weights != "checkpoint":  # "checkpoint": the quant modes AIC infers from the model's own config
            kwargs |= {"gemm_quant_mode": cat["gemm_quant"][weights], "kvcache_quant_mode": cat["kv_quant"][kv],
                       "fmha_quant_mode": cat["fmha_quant"][kv]}
        if moe:  # SGLang's default MoE layout: experts tensor-parallel over the TP group (moe_ep = 1)
            kwargs |= {"moe_tp_size": tp // moe_ep, "moe_ep_size": moe_ep}
            if weights != "checkpoint":
                kwargs["moe_quant_mode"] = cat["moe_quant"][weights]
        with _quiet():
            self.engine = EngineHandle.compile(target.model_path, target.system, target.backend, **kwargs)
        names = [op[0] for op in self.engine.decode_step_per_op(1, 16, 2)]
        self.gen_all = list(range(len(names)))
        self.gen_names = names
        self.ctx_all = list(range(len(self.engine.run_static_per_op(batch_size=1, isl=16, osl=2)[0])))
        self._memo: dict[tuple, float] = {}

    def decode_ms(self, rows: int, requests: int, context: int) -> float:
        """A decode / verify forward: `rows` tokens through every op, attention over `requests` at `context`."""
        key = ("d", rows, requests, context)
        if key not in self._memo:
            ops = self.engine.evaluate_generation_ops(self.gen_all, batch_size=requests, s=context,
                                                      x=rows if rows != requests else None)
            self._memo[key] = sum(op[1] for op in ops)
        return self._memo[key]

    def decode_ops(self, rows: int, requests: int, context: int) -> list[tuple[str, float]]:
        ops = self.engine.evaluate_generation_ops(self.gen_all, batch_size=requests, s=context,
                                                  x=rows if rows != requests else None)
        return [(op[0], op[1]) for op in ops]

    def prefill_ms(self, requests: int, prompt: int) -> float:
        key = ("p", requests, prompt)
        if key not in self._memo:
            ops = self.engine.evaluate_context_ops(self.ctx_all, batch_size=requests, s=prompt)
            self._memo[key] = sum(op[1] for op in ops)
        return self._memo[key]

    def gemm_ms(self, rows: int, n: int, k: int) -> float:
        """One bf16 GEMM of `rows` x k by k x n (the drafter's sequential head)."""
        key = ("g", rows, n, k)
        if key not in self._memo:
            from aiconfigurator_core.sdk import common
            from aiconfigurator_core.sdk import operations as ops
            from aiconfigurator_core.sdk.engine import build_ops_json

            spec = build_ops_json([ops.GEMM("head", 1, n, k, common.GEMMQuantMode.bfloat16)])
            self._memo[key] = sum(v[1] for v in self.engine.evaluate_ops_json(spec, is_context=False,
                                                                              batch_size=rows, s=1))
        return self._memo[key]


@contextmanager
def _quiet():
    """AIC logs its database loading (fallback rows, lane defaults) at WARNING; the cost source says what it is."""
    log = logging.getLogger("aiconfigurator_core")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


_HANDLES: dict[tuple, _Handle] = {}


def handle(target: AicTarget, tp: int, weights: str, kv: str, moe: bool, moe_ep: int = 1,
           attn_dp: int = 1) -> _Handle:
    """The compiled engine for this choice, compiled once per process (a compile costs ~1 s, a query ~20 us).
    With `attn_dp` > 1 its forwards are one attention-DP rank's: AIC scales the MoE's tokens by the ranks."""
    key = (target, tp, weights, kv, moe, moe_ep, attn_dp)
    if key not in _HANDLES:
        _HANDLES[key] = _Handle(target, tp, weights, kv, moe, moe_ep, attn_dp)
    return _HANDLES[key]


def unsupported(target: AicTarget, weights: str, kv: str) -> str:
    """Why AIC's database cannot price these dtypes on this system ("" when it can)."""
    cat = catalog()
    if weights not in cat["gemm_quant"]:
        return f"aic.yaml maps no {weights} GEMMs to an AIC quant mode"
    if kv not in cat["kv_quant"]:
        return f"aic.yaml maps no {kv} KV cache to an AIC quant mode"
    have = _measured_dtypes(target.system, target.backend, target.database)
    if cat["gemm_quant"][weights] not in have:
        return f"AIC has not measured {weights} GEMMs on {target.system} under {target.backend}"
    return ""


@cache
def _measured_dtypes(system: str, backend: str, database: str) -> frozenset[str]:
    import aiconfigurator_core
    import pyarrow.parquet as pq

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data" / system / "gemm" / backend / database
    files = list(root.glob("*.parquet"))
    return frozenset(str(v) for f in files for v in pq.read_table(f, columns=["gemm_dtype"]).column(0).unique()
                     .to_pylist())


@dataclass
class AicPerfModel(PerfModel):
    """PerfModel whose forwards are priced from AIC's database; roofline terms stay for what AIC lacks."""

    aic: _Handle | None = None
    target: AicTarget | None = None
    _ctx_round: int = field(default=CTX_STRIDE, repr=False)

    @property
    def cost_source(self) -> str:
        assert self.target is not None
        return self.target.source()

    def _ctx(self, context: float) -> int:
        return max(1, int(round(context / self._ctx_round)) * self._ctx_round)

    def _rank(self, tokens: int, requests: int) -> tuple[int, int]:
        """(tokens, requests) of one attention-DP rank when the server's `requests` spread evenly over its ranks
        (the busiest rank's share: the ranks step together)."""
        requests = max(1, min(requests, tokens))
        if self.attn_dp <= 1:
            return tokens, requests
        per = math.ceil(requests / self.attn_dp)
        return max(per, math.ceil(per * tokens / requests)), per

    def step(self, tokens: int, context: float, requests: int = 1) -> StepCost:
        assert self.aic is not None
        if tokens / max(1, min(requests, tokens)) > PREFILL_ROWS:
            return self.prefill(tokens, 2.0 * context, requests)
        tokens, requests = self._rank(tokens, requests)
        ms = self.aic.decode_ms(tokens, requests, self._ctx(context))
        return StepCost(ms / 1e3 + self.eff.overhead_s, 0.0, 0.0, "aic")

    def prefill(self, tokens: int, prompt: float, requests: int = 1) -> StepCost:
        assert self.aic is not None
        per_request = max(1, math.ceil(tokens / max(1, min(requests, tokens))))
        _, requests = self._rank(tokens, requests)
        ms = self.aic.prefill_ms(requests, per_request)
        return StepCost(ms / 1e3 + self.eff.overhead_s, 0.0, 0.0, "aic")

    def draft_step(self, requests: int, gamma: int, context: float, draft_layers: int, head: str,
                   markov_rank: int = 256) -> float:
        """The drafter: `draft_layers` of the target's layer ops at B x gamma rows (attention over the B requests'
        context; a MoE target's drafter is dense, its FFN the active experts' width as GEMMs), the LM head at
        B x gamma rows, then gamma sequential head GEMMs of B rows."""
        assert self.aic is not None
        s, dense_tp = self.shape, max(1, self.tp // self.attn_dp)
        requests = math.ceil(requests / self.attn_dp)  # one attention-DP rank's share
        rows = requests * gamma
        ops = self.aic.decode_ops(rows, requests, self._ctx(context))
        head_ms = sum(ms for name, ms in ops if "logits" in name)
        layer_ms = sum(ms for name, ms in ops if "logits" not in name and "embedding" not in name
                       and not (s.num_experts and ("moe" in name or "router" in name)))
        if s.num_experts:  # a dense drafter layer of the target's active width: gate/up and down GEMMs of k experts
            width = max(1, s.experts_per_token * s.expert_width // dense_tp)
            layer_ms += (self.aic.gemm_ms(rows, 2 * width, s.hidden) + self.aic.gemm_ms(rows, s.hidden, width)) \
                * s.num_layers
        t = (layer_ms * draft_layers / s.num_layers + head_ms) / 1e3 + self.eff.overhead_s
        if head != "none":
            width = markov_rank * (2 if head == "rnn" else 1)
            t += gamma * self.aic.gemm_ms(requests, s.vocab, width) / 1e3
        return t * self.eff.draft_scale + self.eff.draft_request_s * requests

    def seq_draft_step(self, d, rows: int, requests: int, context: float) -> float:  # noqa: ANN001 - methods.Drafting
        """One step of a sequential drafter from the target's own op tables at `rows` rows: an MTP module is one
        target layer (its MoE at the rows' routing) plus the shared LM head and the eh_proj GEMM; an EAGLE-3 layer
        is the attention of one layer, a dense MLP of the draft's width, the fc over three target layers' states
        and the LM head scaled to the draft vocabulary."""
        assert self.aic is not None
        s, dense_tp = self.shape, max(1, self.tp // self.attn_dp)
        rows, requests = self._rank(rows, requests)
        ops = self.aic.decode_ops(rows, requests, self._ctx(context))
        head_ms = sum(ms for name, ms in ops if "logits" in name)
        body = [(name, ms) for name, ms in ops if "logits" not in name and "embedding" not in name]
        if d.method == "mtp":
            layer_ms = sum(ms for _, ms in body) / s.num_layers + self.aic.gemm_ms(rows, s.hidden, 2 * s.hidden)
        else:
            ffn = ("moe", "router", "ffn", "mlp", "gate", "up", "down", "shared")
            layer_ms = sum(ms for name, ms in body if not any(w in name.lower() for w in ffn)) / s.num_layers
            width = max(1, (d.draft_intermediate or (s.mlp_width if not s.num_experts else 4 * s.hidden))
                        // dense_tp)
            layer_ms += self.aic.gemm_ms(rows, 2 * width, s.hidden) + self.aic.gemm_ms(rows, s.hidden, width)
            layer_ms += self.aic.gemm_ms(rows, s.hidden, 3 * s.hidden)
            head_ms *= (d.draft_vocab or s.vocab) / s.vocab
        return (layer_ms * max(1, d.layers) + head_ms) / 1e3 + self.eff.overhead_s


@dataclass
class ScaledAicPerfModel(PerfModel):
    """A weight or KV dtype AIC has not measured: AIC's price of the same forward in the nearest measured format (FP8
    for int8 / int4 / nvfp4 where AIC timed FP8, else bf16; a bf16 KV cache where AIC lacks the FP8-KV attention
    table), times the roofline's ratio between the two. The roofline knows what the dtype changes (bytes read,
    compute peak), AIC the absolute level, so configurations of one case stay ranked on one scale instead of mixing
    two cost models."""

    ref: AicPerfModel | None = None  # the same deployment in the nearest measured dtypes, priced by AIC
    ref_roofline: PerfModel | None = None  # the same, priced by the roofline

    @property
    def cost_source(self) -> str:
        assert self.ref is not None
        parts = [f"{self.weights_dtype} as {self.ref.weights_dtype}"] if self.weights_dtype != self.ref.weights_dtype \
            else []
        if self.kv_dtype != self.ref.kv_dtype:
            parts.append(f"{self.kv_dtype} KV as {self.ref.kv_dtype} KV")
        return f"{self.ref.cost_source} ({', '.join(parts)} x roofline ratio)"

    def _scale(self, ours: StepCost, ref: StepCost, ref_roof: StepCost) -> StepCost:
        s = ref.seconds / ref_roof.seconds if ref_roof.seconds > 0 else 1.0
        return StepCost(ours.seconds * s, ours.flops, ours.bytes, ours.bound, ours.parts)

    def step(self, tokens: int, context: float, requests: int = 1) -> StepCost:
        assert self.ref is not None and self.ref_roofline is not None
        return self._scale(super().step(tokens, context, requests), self.ref.step(tokens, context, requests),
                           self.ref_roofline.step(tokens, context, requests))

    def prefill(self, tokens: int, prompt: float, requests: int = 1) -> StepCost:
        assert self.ref is not None and self.ref_roofline is not None
        # the roofline's own prefill (PerfModel.prefill is a step at half the prompt): calling it through `self`
        # would dispatch to this class's step and scale twice
        return self._scale(super().step(tokens, prompt / 2, requests), self.ref.prefill(tokens, prompt, requests),
                           self.ref_roofline.prefill(tokens, prompt, requests))

    def draft_step(self, requests: int, gamma: int, context: float, draft_layers: int, head: str,
                   markov_rank: int = 256) -> float:
        assert self.ref is not None
        return self.ref.draft_step(requests, gamma, context, draft_layers, head, markov_rank)  # the drafter is bf16

    def seq_draft_step(self, d, rows: int, requests: int, context: float) -> float:  # noqa: ANN001
        assert self.ref is not None
        return self.ref.seq_draft_step(d, rows, requests, context)


def _variants(target: AicTarget, weights: str, kv: str) -> list[tuple[str, str]]:
    """The (weights, KV) dtypes to try AIC at, nearest first: the point's own; the measured weight format nearest
    in bytes per element (FP8 for 8-bit and narrower formats where AIC timed FP8 GEMMs, int8 W8A8 and FP8 streaming
    the same bytes; else bf16); then each with a bf16 KV cache (AIC lacks some FP8-KV attention tables: MLA's FP8
    context kernels, FP8 prefill on L40S)."""
    from tuner.perf import DTYPE_BYTES

    near = ("fp8", "bf16") if DTYPE_BYTES.get(weights, 2.0) <= 1.0 else ("bf16",)
    out: list[tuple[str, str]] = []
    for k in (kv, "auto"):
        for w in (weights, *near):
            if (w, k) not in out and (w == weights or unsupported(target, weights, k)):
                out.append((w, k))
    return out


def aic_perf(base: PerfModel, profile: Profile, engine: str = "sglang") -> tuple[PerfModel, str]:
    """`base` re-priced from AIC's database (the tables of `engine` where AIC timed it) when it covers the profile.
    A point AIC cannot price at its own dtypes (a weight format it has not timed, an FP8-KV attention table it
    lacks) is AIC's price of the nearest variant it can, times the roofline's ratio between the two: one cost model
    per study, the roofline only saying what the dtype changes. `base` and why, when no variant compiles (the
    model, GPU or layout is beyond AIC)."""
    from dataclasses import replace

    target, why = resolve(profile, engine)
    if target is None:
        return base, why
    moe = bool(profile.model.num_experts)
    dp, ep = (base.attn_dp, base.ep) if moe else (1, 1)  # a dense model's server is TP whatever it was asked
    first = ""
    for weights, kv in _variants(target, base.weights_dtype, base.kv_dtype):
        why = unsupported(target, weights, kv)
        if not why:
            try:
                h = handle(target, base.tp, weights, kv, moe, ep, dp)
            except Exception as exc:  # noqa: BLE001 - AIC refuses a layout or lacks a table: try the next variant
                layout = f"tp {base.tp}" + (f" (attention DP {dp}, EP {ep})" if max(dp, ep) > 1 else "")
                why = f"AIC cannot compile {profile.model.name} at {layout} ({weights} weights, {kv} KV): {_said(exc)}"
        if why:
            first = first or why
            continue
        ref_base = replace(base, weights_dtype=weights, kv_dtype=kv, attn_dp=dp, ep=ep)
        ref = AicPerfModel(ref_base.shape, ref_base.hw, ref_base.eff, weights, kv, base.tp, base.cuda_graph_max_bs,
                           dp, ep, aic=h, target=target)
        if (weights, kv) == (base.weights_dtype, base.kv_dtype):
            return ref, ""
        return ScaledAicPerfModel(base.shape, base.hw, base.eff, base.weights_dtype, base.kv_dtype, base.tp,
                                  base.cuda_graph_max_bs, dp, ep, ref=ref, ref_roofline=ref_base), ""
    return base, first
