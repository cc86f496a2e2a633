"""The simulate objective: the engine's own schedulers and regulator against a modelled clock.

A continuous-batching loop (prefill first, then one speculative round for every running request)
runs `dspark_core`'s scheduler and gamma-regulator objects on confidences and acceptances drawn
from the acceptance model, and advances a clock by the performance model's step times. Requests
come from the workload profile: Poisson arrivals at `request_rate`, or a closed loop of
`concurrency` clients.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from dspark_core.errors import DSparkError
from dspark_core.verification.gamma_policy import TEXT_FEATURES, GammaPolicyFile, choose_blocks
from dspark_core.verification.learned import LearnedScheduler, PolicyFile, RollingAcceptance, RoundContext
from dspark_core.verification.regulator import GammaRegulator, RegulatorConfig
from dspark_core.verification.schedulers import make_scheduler
from dspark_core.verification.sps import SpsTable, default_probes
from profiler.schema import Profile
from profiler.workload import LengthModel, request_lengths
from tuner.acceptance import AcceptanceModel
from tuner.engine_config import learned_policies
from tuner.errors import TunerError
from tuner.perf import PerfModel

STEADY_MIN = 0.25  # a closed loop's steady window must span this share of the run, else tokens / makespan


@dataclass
class Request:
    rid: int
    arrival: float
    prompt: int
    output: int
    generated: int = 0
    first_token: float | None = None
    finish: float | None = None


@dataclass
class SimResult:
    throughput: float  # output tokens per second per GPU
    ttft_p99_ms: float
    tpot_p99_ms: float
    tpot_mean_ms: float
    tau: float  # accepted tokens per speculative round and request, incl. the bonus
    verify_tokens_per_step: float
    requests: int
    feasible: bool = True
    why_infeasible: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def _lognormal(rng: np.random.Generator, n: int, m: LengthModel) -> np.ndarray:
    return np.clip(rng.lognormal(np.log(m.median), m.sigma, n), m.lo, m.hi).astype(int)


def make_requests(profile: Profile, n: int, rng: np.random.Generator) -> tuple[list[Request], int]:
    """`n` requests with lengths from the workload profile; returns them and the closed-loop width."""
    w = profile.workload
    prompt_model, output_model = request_lengths(w, profile.model.max_context)
    prompts, outputs = _lognormal(rng, n, prompt_model), _lognormal(rng, n, output_model)
    arrivals = np.zeros(n)
    if w.request_rate:
        arrivals = np.cumsum(rng.exponential(1.0 / w.request_rate, n))
    return [Request(i, float(arrivals[i]), int(prompts[i]), int(outputs[i])) for i in range(n)], \
        (0 if w.request_rate else max(1, w.concurrency or 8))


def sps_table(perf: PerfModel, max_batch_tokens: int, context: float, requests: int) -> SpsTable:
    """The SPS table the performance model predicts (what `tune` exports for a modelled GPU).

    Batch tokens = running requests x verify tokens per request; the probes keep `requests` requests
    (fewer when the probe has fewer tokens), so extra tokens add compute but not KV reads. Steps per second never
    rise with more tokens: a probe faster than a smaller one (AIC times kernel shapes one by one, and its tables
    are not monotone everywhere: Qwen3-8B on H100 ran 384 tokens faster than 256) takes the smaller one's rate, so
    SGLang's prefix scheduler is never told that verifying more costs less.
    """
    probes, floor = [], float("inf")
    for b in default_probes(max_batch_tokens):
        floor = min(floor, perf.sps(b, context, min(b, requests)))
        probes.append((b, floor))
    return SpsTable.from_probes(probes, max_batch_tokens)


@cache
def _policy(kind: type, path: str):  # -> PolicyFile | GammaPolicyFile, loaded once per study
    try:
        return kind.load(Path(path))
    except DSparkError as e:
        raise TunerError(str(e)) from None


def _p(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else 0.0


def offline_requests(lengths: list[tuple[int, int]]) -> list[Request]:
    """An offline batch: every (prompt tokens, output tokens) request arrives at t = 0."""
    return [Request(i, 0.0, int(p), int(o)) for i, (p, o) in enumerate(lengths)]


def simulate(params: dict[str, Any], profile: Profile, perf: PerfModel, accept: AcceptanceModel,
             n_requests: int = 48, seed: int = 0, requests: list[tuple[int, int]] | None = None,
             bundled: bool = False, engine: str = "sglang", draft_shape: Any = None,
             decode_only: bool = False) -> SimResult:
    """Run the workload through the modelled engine with `params` (dotted names, defaults filled).

    `requests`: an explicit offline list of (prompt, output) token counts, all arriving at t = 0,
    instead of the profile's workload (the fidelity benchmark replays exactly the measured batch).
    `bundled`: model the bundled dspark_core engine rather than SGLang: token-wise work is ragged (prefill
    and verify cost the real tokens) but attention is padded to the longest row's context; each request's
    block is capped at its remaining tokens; and the prefix schedulers count the round's fixed costs
    (host bookkeeping and drafting) as the engine's measured per-round overhead does.
    Otherwise a round is priced as `engine` (sglang, vllm, trtllm) runs `spec.method` (tuner/methods.py): its draft
    forwards in order, the verify forward, sampling, the engine's fitted per-round constants and CUDA-graph
    coverage (`batch.cuda_graph_max_bs`, when tuned, replaces the engine's default capture).
    `decode_only`: a disaggregated decode worker: a prompt's KV arrives from a prefill worker, so admitting it costs
    the host round but no prefill forward (its first token came with the KV).
    """
    from dataclasses import replace

    from tuner.methods import SEQUENTIAL, drafting_of, engine_costs, round_cost

    rng = np.random.default_rng(seed)
    if requests is not None:
        reqs, closed = offline_requests(requests), 0
    else:
        reqs, closed = make_requests(profile, n_requests, rng)
    round_s, round_req_s = perf.eff.round_s, perf.eff.round_request_s
    gamma = int(params["spec.block_size"])
    spec_on = bool(params["spec.enabled"]) and gamma > 0
    method = drafting_of(params, profile, draft_shape)
    costs = engine_costs(engine, profile.hw.arch)
    if int(params.get("batch.cuda_graph_max_bs") or 0) and engine == "sglang":
        costs = replace(costs, graph_max_bs=int(params["batch.cuda_graph_max_bs"]))
    full_blocks = method.method != "dspark"  # only DSpark's verify schedulers choose a prefix of the block
    max_req = int(params["batch.max_requests"])
    max_tokens = int(params["batch.max_tokens"])
    chunk = int(params.get("batch.chunked_prefill") or 0) or max_tokens
    kv_cap = perf.kv_capacity_tokens(float(params["memory.fraction_static"]))
    largest = max(r.prompt + r.output for r in reqs)
    if kv_cap < largest:  # that request could never be admitted, even into an empty pool
        return SimResult(0.0, 1e9, 1e9, 1e9, 0.0, 0.0, 0, False,
                         f"weights leave {kv_cap:,.0f} KV tokens: not enough for a {largest:,}-token request")
    ctx0 = float(np.mean([r.prompt for r in reqs]))
    budget = min(max_tokens, max_req * (gamma + 1))
    sps = sps_table(perf, max(2, budget), ctx0, max_req)
    # the learned policies run as the engine runs them; the simulator has no text, so the block policy sees the text
    # features of its training logs' mean, and neither sees a draft entropy (the verify policy then uses its mean)
    try:
        files = learned_policies(profile, params)
    except TunerError as e:  # a learned choice this drafter has no policy for cannot run: an infeasible point
        return SimResult(0.0, 1e9, 1e9, 1e9, 0.0, 0.0, 0, False, str(e))
    gamma_policy = _policy(GammaPolicyFile, files["gamma_policy_path"]) if "gamma_policy_path" in files else None
    if "policy_path" in files:
        scheduler = LearnedScheduler(policy=_policy(PolicyFile, files["policy_path"]), sps=sps)
    else:
        scheduler = make_scheduler(params["spec.scheduler"], sps=sps,
                                   threshold=float(params["spec.confidence_threshold"]))
    recent = RollingAcceptance()  # per request, what both learned policies read
    adaptive = bool(params.get("spec.adaptive_gamma"))
    regulator = GammaRegulator(RegulatorConfig(gamma_max=max(1, gamma), adaptive=adaptive,
                                               fallback_floor=float(params["spec.fallback_acceptance"])))
    cap_verify = int(params["spec.max_verify_tokens"])
    timeout = float(params.get("batch.timeout_ms") or 0.0) / 1000.0

    pending = deque(reqs[:closed] if closed else reqs)
    backlog = deque(reqs[closed:] if closed else [])
    if closed:
        # clients of a closed loop are desynchronised in steady state: start them over one request's span
        ramp = float(np.mean([r.output for r in reqs])) * perf.step(closed, ctx0, closed).seconds
        for r, start in zip(pending, sorted(rng.uniform(0.0, ramp, len(pending))), strict=True):
            r.arrival = float(start)
    ramp_end = max((r.arrival for r in pending), default=0.0) if closed else 0.0
    running: list[Request] = []
    done: list[Request] = []
    window: list[tuple[float, int]] = []  # closed loop: (t, tokens committed) when all clients are busy, and when
    # the backlog runs out (the steady state lies between: before, clients ramp up; after, the loop drains)
    t, rounds, spec_rounds, gained_spec, verify_total, committed = 0.0, 0, 0, 0, 0, 0
    host_rounds, host_req_rounds = 0, 0  # engine iterations (prefills + rounds) and their request count
    while len(done) < len(reqs):
        arrived = [r for r in pending if r.arrival <= t]
        if not running and not arrived:
            t = pending[0].arrival
            continue
        if not running and timeout > 0 and len(arrived) < max_req and len(pending) > len(arrived):
            fill_at = pending[min(len(pending), max_req) - 1].arrival
            t = max(t, min(t + timeout, fill_at))
            arrived = [r for r in pending if r.arrival <= t]
        used = sum(r.prompt + r.generated + gamma for r in running)
        admitted = []
        for r in arrived:
            if len(running) + len(admitted) >= max_req or used + r.prompt + r.output > kv_cap:
                break
            admitted.append(r)
            used += r.prompt + r.output
        for r in admitted:
            pending.remove(r)
        if admitted:  # prefill first, chunked by the token budget
            total = sum(r.prompt for r in admitted)
            longest = max(r.prompt for r in admitted)
            while total > 0 and not decode_only:
                step = min(total, chunk)
                t += perf.prefill(step, longest if bundled else ctx0, len(admitted)).seconds
                total -= step
            t += round_s + round_req_s * len(admitted)
            host_rounds, host_req_rounds = host_rounds + 1, host_req_rounds + len(admitted)
            for r in admitted:
                r.first_token, r.generated = t, 1
            committed += len(admitted)
            running += admitted
        live = [r for r in running if r.generated < r.output]
        if live:
            contexts = [r.prompt + r.generated for r in live]
            ctx = float(max(contexts) if bundled else sum(contexts) / len(contexts))  # exact: integer sum
            gains = [1] * len(live)
            t += round_s + round_req_s * len(live)
            host_rounds, host_req_rounds = host_rounds + 1, host_req_rounds + len(live)
            if spec_on:
                gammas = [regulator.gamma_for(r.rid) for r in live]
                if bundled:
                    gammas = [max(0, min(g, r.output - r.generated - 1)) for g, r in zip(gammas, live, strict=True)]
                block = gamma
                if gamma_policy is not None:  # the round's block and who drafts, chosen before drafting
                    block = min(gamma, gamma_policy.gamma_max)
                    text = gamma_policy.mean[-len(TEXT_FEATURES):]
                    survival = [gamma_policy.survival(recent.get(r.rid), text, block) for r in live]
                    gammas = choose_blocks(gamma_policy, sps, survival, gammas, block,
                                           float(sum(r.prompt + r.generated for r in live)))
                    block = max(gammas)
                conf, acc = accept.draw(rng, len(live), gamma)
                rows = [list(conf[i, :g]) for i, g in enumerate(gammas)]
                drafting = sum(1 for g in gammas if g > 0)
                draft_s = perf.draft_step(drafting, block, ctx, int(params["spec.draft_layers"]), params["spec.head"],
                                          int(params["spec.markov_rank"])) if drafting and bundled else 0.0
                if bundled and hasattr(scheduler, "overhead_s"):  # the engine times its rounds' fixed costs
                    scheduler.overhead_s = round_s + round_req_s * len(live) + draft_s
                if isinstance(scheduler, LearnedScheduler):
                    scheduler.context = RoundContext(recent_acceptance=[recent.get(r.rid) for r in live])
                if full_blocks:  # EAGLE-3, MTP, draft models, n-gram, DFlash verify what they drafted
                    lengths = list(gammas)
                else:
                    lengths = [min(cap_verify, n, g) for n, g in zip(scheduler.schedule(rows), gammas, strict=True)]
                while sum(lengths) + len(live) > max_tokens and max(lengths) > 0:
                    lengths[lengths.index(max(lengths))] -= 1
                tokens = sum(lengths) + len(live)
                if bundled:
                    t += draft_s + perf.step(tokens, ctx, len(live)).seconds
                else:
                    if method.method in SEQUENTIAL and method.topk > 1 and method.draft_tokens:
                        tokens = drafting * method.draft_tokens + (len(live) - drafting)  # an EAGLE tree's rows
                    t += round_cost(perf, costs, method, len(live), block, ctx, drafting, tokens).seconds
                verify_total += tokens
                for i, (r, n) in enumerate(zip(live, lengths, strict=True)):
                    ok = 0
                    while ok < n and acc[i, ok]:
                        ok += 1
                    gains[i] = ok + 1
                    regulator.observe(r.rid, n, ok)
                    recent.observe(r.rid, n, ok)
                    if gammas[i] > 0:
                        spec_rounds += 1
                        gained_spec += ok + 1
            else:
                t += perf.step(len(live), ctx, len(live)).seconds if bundled else \
                    round_cost(perf, costs, replace(method, method="none"), len(live), 0, ctx).seconds
                verify_total += len(live)
            rounds += 1
            for r, g in zip(live, gains, strict=True):
                committed += min(r.output, r.generated + g) - r.generated
                r.generated = min(r.output, r.generated + g)
        for r in [r for r in running if r.generated >= r.output]:
            r.finish = t
            running.remove(r)
            regulator.drop(r.rid)
            recent.drop(r.rid)
            done.append(r)
            if closed and backlog:
                nxt = backlog.popleft()
                nxt.arrival = t
                pending.append(nxt)
        if closed and len(window) < 2 and (t >= ramp_end if not window else not backlog):
            window.append((t, committed))
    out_tokens = sum(r.output for r in reqs)
    tpots = [(r.finish - r.first_token) / max(1, r.output - 1) * 1e3 for r in reqs]
    ttfts = [(r.first_token - r.arrival) * 1e3 for r in reqs]
    throughput = out_tokens / t
    (t0, c0), (t1, c1) = window if len(window) == 2 else ((0.0, 0), (t, out_tokens))
    if t1 - t0 >= STEADY_MIN * t and c1 > c0:  # too few requests per client leave no steady state to read
        throughput = (c1 - c0) / (t1 - t0)
    else:
        t0, t1 = 0.0, t
    return SimResult(
        throughput=throughput / perf.tp, ttft_p99_ms=_p(ttfts, 99), tpot_p99_ms=_p(tpots, 99),
        tpot_mean_ms=float(np.mean(tpots)), tau=gained_spec / spec_rounds if spec_rounds else 1.0,
        verify_tokens_per_step=verify_total / max(1, rounds), requests=len(reqs),
        extra={"makespan_s": t, "makespan_throughput": out_tokens / t / perf.tp, "steady_window_s": t1 - t0,
               "rounds": rounds, "acceptance_source": accept.source, "host_rounds": host_rounds,
               "host_request_rounds": host_req_rounds, "ttft_mean_ms": float(np.mean(ttfts))})
