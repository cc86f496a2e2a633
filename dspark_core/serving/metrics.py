"""The server's Prometheus metrics (GET /metrics).

Where vLLM 0.33 exports the same quantity, the metric has vLLM's name, labels (`model_name`, `engine`) and meaning
(vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py), so one dashboard and `monitor` read either server:
requests running / waiting, prompt and generation tokens, finished requests by reason, TTFT, inter-token and end-to-
end latency, admission rejections, and the speculative counters (drafts, drafted = verified draft tokens, accepted,
accepted per position). SGLang's DSpark gauges keep its names (tau and the verify window of the last step). DSpark's
own signals are `dspark:*`: drafter against verify time, the SPS table at the current load, the engine-wide block
length, tokens the drafter proposed (the scheduler verifies a prefix of them), the attempts behind each position's
acceptance, target forwards and the tokens they verified, for the hybrid drafter each proposer's drafts and tokens
(`dspark:spec_decode_proposer_*{proposer=suffix|dspark}`), and for suffix decoding (alone or in the hybrid) its
verified drafts and their accepted tokens by tree (`dspark:suffix_tree_*{tree=request|global|corpus}`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dspark_core.drafters.base import ProposerCount
from dspark_core.drafters.suffix_calibration import TREES
from dspark_core.stats import GenStats

if TYPE_CHECKING:
    from dspark_core.drafters.suffix import SuffixStats

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0)  # seconds, vLLM's TTFT buckets
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)  # seconds, vLLM's inter-token buckets
MAX_POSITIONS = 16  # the largest block the engine drafts


@dataclass
class _Seen:
    """The engine's cumulative counters at the previous step (GenStats is cumulative)."""

    steps: int = 0
    verify_tokens: int = 0
    proposed: int = 0
    verified: int = 0
    accepted: int = 0
    drafts: int = 0
    pos: tuple[int, ...] = ()
    tried: tuple[int, ...] = ()
    rounds: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0


class Metrics:
    """One registry per server; the engine thread updates it after each step."""

    def __init__(self, model_name: str, engine_info: dict[str, str] | None = None) -> None:
        self.registry = CollectorRegistry()
        r, names, lv = self.registry, ["model_name", "engine"], (model_name, "0")
        self._lv = lv
        info = engine_info or {}
        self._info_keys = sorted(info)
        self._info = Gauge("dspark:engine_info", "What the engine runs (value 1): method, sequential head, block "
                           "size, verify scheduler.", names + self._info_keys, registry=r)
        self.engine_info(info)
        self.running = Gauge("vllm:num_requests_running", "Requests in model execution batches.", names,
                             registry=r).labels(*lv)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be processed.", names,
                             registry=r).labels(*lv)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.", names, registry=r).labels(*lv)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generation tokens processed.", names,
                                         registry=r).labels(*lv)
        self._success = Counter("vllm:request_success", "Successfully processed requests.",
                                names + ["finished_reason"], registry=r)
        self._rejected = Counter("vllm:admission_rejections", "Admission attempts rejected by a queue limit, by "
                                 "reason.", ["model_name", "reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token in seconds.", names,
                              buckets=LATENCY_BUCKETS, registry=r).labels(*lv)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency in seconds.", names,
                             buckets=ITL_BUCKETS, registry=r).labels(*lv)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.", names,
                             buckets=LATENCY_BUCKETS, registry=r).labels(*lv)
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Speculative drafts (a request's round that drafted).",
                              names, registry=r).labels(*lv)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified.", names,
                                    registry=r).labels(*lv)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Accepted draft tokens.", names,
                                registry=r).labels(*lv)
        per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                          names + ["position"], registry=r)
        self.accepted_pos = [per_pos.labels(*lv, str(p)) for p in range(MAX_POSITIONS)]
        tried = Counter("dspark:spec_decode_num_verified_tokens_per_pos", "Draft tokens verified per position with "
                        "every earlier position accepted (the attempts behind the per-position acceptance).",
                        names + ["position"], registry=r)
        self.verified_pos = [tried.labels(*lv, str(p)) for p in range(MAX_POSITIONS)]
        self.accept_length = Gauge("sglang:spec_accept_length", "Mean acceptance length (accepted drafts + the "
                                   "bonus token) of the last step's verified rounds (SGLang's meaning).", names,
                                   registry=r).labels(*lv)
        self.cap_length = Gauge("sglang:spec_cap_length", "Mean verify window of the last step, incl. the bonus "
                                "slot (SGLang's DSpark gauge).", names, registry=r).labels(*lv)
        self.proposed = Counter("dspark:proposed_draft_tokens", "Draft tokens the drafter proposed (the verify "
                                "scheduler verifies a prefix of them).", names, registry=r).labels(*lv)
        self.steps = Counter("dspark:target_forwards", "Target decode forwards (one verify step of the batch).",
                             names, registry=r).labels(*lv)
        self.verify_tokens = Counter("dspark:verify_tokens", "Tokens the decode forwards processed (anchors + "
                                     "verified drafts).", names, registry=r).labels(*lv)
        self.block = Gauge("dspark:block_length", "The engine-wide block length of the last step (0: the engine-wide "
                           "fallback to plain decoding, verification not free at the current load).", names,
                           registry=r).labels(*lv)
        self.cap = Gauge("dspark:admission_cap", "The most requests the batcher lets run at once (the slots without a "
                         "TPOT SLO).", names, registry=r).labels(*lv)
        self.switches = Gauge("dspark:block_length_switches", "Engine-wide block length changes so far.", names,
                              registry=r).labels(*lv)
        self.draft_s = Counter("dspark:draft_seconds", "Host wall time in the drafter and the verify scheduler.",
                               names, registry=r).labels(*lv)
        self.verify_s = Counter("dspark:verify_seconds", "Host wall time of the target's verify forwards.", names,
                                registry=r).labels(*lv)
        self.sps = Gauge("dspark:sps", "Target steps per second the SPS table gives at the last step's verify tokens.",
                         names, registry=r).labels(*lv)
        self._by = {key: Counter(f"dspark:spec_decode_proposer_{key}", help_, names + ["proposer"], registry=r)
                    for key, help_ in (("drafts", "Request rounds each proposer of a combined drafter (the hybrid: "
                                        "suffix, dspark) drafted."),
                                       ("draft_tokens", "Draft tokens each proposer proposed."),
                                       ("verified_tokens", "Of each proposer's draft tokens, those verified."),
                                       ("accepted_tokens", "Of each proposer's draft tokens, those accepted."))}
        self._seen_by: dict[str, tuple[int, int, int, int]] = {}
        self._trees = {key: Counter(f"dspark:suffix_tree_{key}", help_, names + ["tree"], registry=r)
                       for key, help_ in (("drafts", "Suffix decoding's drafts verified, by the tree they came from "
                                           "(the request's own, the global one of finished outputs, the frozen "
                                           "corpus)."),
                                          ("accepted_tokens", "Their accepted tokens, by tree."))}
        self._seen_trees: list[int] = [0] * 6
        self._seen = _Seen()

    def finished(self, reason: str, ttft_s: float | None, latency_s: float | None, tokens: int) -> None:
        self._success.labels(*self._lv, reason).inc()
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if latency_s is not None:
            self.e2e.observe(latency_s)
            if ttft_s is not None and tokens > 1:
                self.itl.observe((latency_s - ttft_s) / (tokens - 1))

    def rejected(self, reason: str) -> None:
        self._rejected.labels(self._lv[0], reason).inc()

    def engine_info(self, info: dict[str, str]) -> None:
        """What the engine runs now (a reconfigured engine replaces the old labels)."""
        self._info.clear()
        self._info.labels(*self._lv, *(info[k] for k in self._info_keys)).set(1)

    def engine_step(self, stats: GenStats, running: int, waiting: int, block: int = 0, switches: int = 0,
                    sps: float | None = None, cap: int | None = None,
                    proposers: dict[str, ProposerCount] | None = None, trees: SuffixStats | None = None) -> None:
        """Add what the engine counted since the previous call (and a combined drafter's per-proposer counts, and
        suffix decoding's per-tree ones)."""
        if trees is not None:
            now = [*trees.taken, *trees.accepted]
            for i, (n, m) in enumerate(zip(now, self._seen_trees, strict=True)):
                self._trees["drafts" if i < 3 else "accepted_tokens"].labels(*self._lv, TREES[i % 3]).inc(max(0, n - m))
            self._seen_trees = now
        for name, c in (proposers or {}).items():
            now = (c.drafts, c.proposed, c.verified, c.accepted)
            was = self._seen_by.get(name, (0, 0, 0, 0))
            for key, n, m in zip(("drafts", "draft_tokens", "verified_tokens", "accepted_tokens"), now, was,
                                 strict=True):
                self._by[key].labels(*self._lv, name).inc(max(0, n - m))
            self._seen_by[name] = now
        s = self._seen
        self.steps.inc(stats.steps - s.steps)
        self.verify_tokens.inc(stats.verify_tokens - s.verify_tokens)
        self.proposed.inc(stats.proposed - s.proposed)
        self.draft_tokens.inc(stats.verified - s.verified)
        self.accepted.inc(stats.accepted - s.accepted)
        self.drafts.inc(stats.drafts - s.drafts)
        for p, n in enumerate(stats.pos_accepts[:MAX_POSITIONS]):
            self.accepted_pos[p].inc(n - (s.pos[p] if p < len(s.pos) else 0))
        for p, n in enumerate(stats.pos_attempts[:MAX_POSITIONS]):
            self.verified_pos[p].inc(n - (s.tried[p] if p < len(s.tried) else 0))
        drafts, rounds = stats.drafts - s.drafts, stats.rounds - s.rounds
        if drafts:
            self.accept_length.set(1.0 + (stats.accepted - s.accepted) / drafts)
        if rounds:
            self.cap_length.set(1.0 + (stats.verified - s.verified) / rounds)
        self.draft_s.inc(stats.draft_s - s.draft_s)
        self.verify_s.inc(stats.verify_s - s.verify_s)
        if sps is not None:
            self.sps.set(sps)
        if cap is not None:
            self.cap.set(cap)
        self._seen = _Seen(stats.steps, stats.verify_tokens, stats.proposed, stats.verified, stats.accepted,
                           stats.drafts, tuple(stats.pos_accepts), tuple(stats.pos_attempts), stats.rounds,
                           stats.draft_s, stats.verify_s)
        self.running.set(running)
        self.waiting.set(waiting)
        self.block.set(block)
        self.switches.set(switches)
