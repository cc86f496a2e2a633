"""The engine: `Engine(config).generate(prompts, sampling) -> Generation(outputs, stats)`, built on the online
API `add_request` / `step` / `abort` that `serve` drives.

Continuous batching over `batch.max_requests` KV slots: a request joins the running batch whenever a slot
frees. Each step is one speculative round for every running request (see `drafters/base.py` for the
contract): draft, let the scheduler pick the verify length, verify with one target forward, accept
losslessly, roll the KV caches back in O(1). Plain decoding is the same loop with no drafter (block length 0).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from dspark_core.config import HOT_SPEC, EngineConfig, SpecSection, apply_params, learned_gamma
from dspark_core.drafters.base import Drafter, DraftRequest, Proposal, RoundResult, VerifyScheduler
from dspark_core.engine_parts import build_scheduler, install_kernel_configs, kv_dtype, step_sizes
from dspark_core.errors import DSparkError, EngineBusy
from dspark_core.modeling.argmax import top1
from dspark_core.modeling.dtype_choice import fastest_dtype
from dspark_core.pystack import on_deep_stack
from dspark_core.stats import GenStats
from dspark_core.verification.sampling import SamplingParams, sampling_probs
from dspark_core.verification.verify import round_verdicts

if TYPE_CHECKING:
    from dspark_core.modeling.model import ForwardOut, LeanModel
    from dspark_core.modeling.tokenizer import Tokenizer


@dataclass
class Output:
    """One request's result."""

    prompt_tokens: int  # prompt length in tokens
    token_ids: list[int]  # generated tokens (EOS excluded)
    text: str  # decoded generated text ("" when no tokenizer)
    finish_reason: str  # "stop" (EOS / stop token), "length" (max_new_tokens), "abort", "time_limit"
    ttft_s: float | None = None  # seconds from the request's arrival (add_request) to its first token
    latency_s: float | None = None  # seconds from its arrival to its last token
    request_id: str = ""  # the id add_request returned


@dataclass
class Generation:
    """What `generate` returns."""

    outputs: list[Output]  # one per prompt, in prompt order
    stats: GenStats  # throughput, tau, per-position acceptance


@dataclass
class Update:
    """What one `step` did to one request: the tokens it committed, and the output once it finished."""

    request_id: str
    new_tokens: list[int]  # tokens committed this step (EOS excluded)
    output: Output | None = None  # set on the step the request finished (or was aborted)


@dataclass
class _Request:
    """A request from add_request to its output: waiting (slot -1), then holding a KV slot."""

    rid: str  # request id
    ids: list[int]  # prompt token ids
    sp: SamplingParams  # its sampling (seed = its generator's seed)
    stop: set[int]  # token ids that end it
    arrival: float  # perf_counter() at add_request
    slot: int = -1  # KV slot once admitted
    tokens: list[int] = field(default_factory=list)  # prompt + generated; tokens[-1] is the anchor
    generator: torch.Generator | None = None  # per-request RNG (None when greedy)
    out: list[int] = field(default_factory=list)  # generated tokens
    finish: str = ""  # finish reason once done
    first_token_s: float | None = None  # seconds from arrival to the first token


class Engine:
    """Loads the target (and drafter) once and runs requests through one round loop.

    Online: `add_request` queues a request at any time, `step` admits what fits and runs one speculative round
    for every running request, `abort` frees a request's slot. `generate` is that loop over a list of prompts."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        target: LeanModel | None = None,
        tokenizer: Tokenizer | None = None,
        drafter: Drafter | None = None,
        scheduler: VerifyScheduler | None = None,
    ) -> None:
        from dspark_core.modeling.checkpoint import load_model
        from dspark_core.modeling.tokenizer import Tokenizer

        self.config = config or EngineConfig()
        c = self.config
        if c.weights.dtype == "fastest":  # measured here unless the CLI resolved it first
            c.weights.dtype = fastest_dtype(c)[0]  # type: ignore[assignment]
        from dspark_core.preflight import preflight  # weights + KV cache + drafter against free memory, first

        preflight(c, target.arch if target is not None else None, with_drafter=drafter is None)
        self.target = target if target is not None else load_model(c.model.path, c.device, c.weights.dtype)
        from dspark_core.modeling.cpu_linear import apply_kernel

        self.linear_kernel = apply_kernel(self.target, c.weights.cpu_kernel)  # before drafters share the head
        if c.compile:
            from dspark_core.modeling.compiled import attach

            attach(self.target, step_sizes(c), c.compile_budget_s)
        if tokenizer is None and target is None:
            tokenizer = Tokenizer.load(c.model.tokenizer or c.model.path, self.target.arch.eos_ids)
        self.tokenizer = tokenizer
        self.eos = set(self.target.arch.eos_ids or (tokenizer.eos_ids if tokenizer else []))
        if drafter is None and c.spec.enabled and c.drafter.method != "plain":
            from dspark_core.drafters import build_drafter

            drafter = build_drafter(c.drafter.method, c, self.target)
        self.drafter = drafter
        self.cache = self.target.new_cache(c.batch.max_requests, c.model.max_seq_len, dtype=kv_dtype(c, self.target))
        self._install(scheduler if scheduler is not None else build_scheduler(c, self.target, self.cache,
                                                                              self.hidden_layers))
        install_kernel_configs(c, self.target.device)
        self.stats = GenStats(method=self.drafter.name if self.drafter else "plain")  # since the last reset_stats
        self._free = list(range(c.batch.max_requests - 1, -1, -1))  # free KV slots (pop from the end)
        self._waiting: deque[_Request] = deque()  # arrived, not admitted, FIFO
        self._running: list[_Request] = []  # holding a slot, in slot order
        self._ids: dict[str, _Request] = {}  # every unfinished request by id
        self._next_id = 0
        self.gamma_cap: int | None = None  # serve's engine-wide block length under load (0: plain decoding)
        self.admit_cap: int | None = None  # serve's cap on running requests (None: every free slot)

    def _install(self, scheduler: VerifyScheduler) -> None:
        """Make `scheduler` the engine's, with the features its policies read from the drafter and tokenizer."""
        c = self.config
        self.scheduler = scheduler
        if hasattr(self.drafter, "want_entropy"):  # a feature of the learned scheduler and of the round log
            self.drafter.want_entropy = bool(getattr(scheduler, "reads_entropy", False))  # type: ignore[union-attr]
        if hasattr(scheduler, "classes") and (learned_gamma(c) or c.spec.round_log):
            from dspark_core.verification.gamma_policy import TokenClasses

            if self.tokenizer is not None:  # the gamma policy's token-class features (none without a tokenizer)
                scheduler.classes = TokenClasses.from_tokenizer(self.tokenizer)  # type: ignore[union-attr]

    def reconfigure(self, spec: dict[str, Any]) -> SpecSection:
        """Change the verify-length settings (config.HOT_SPEC fields of `spec`) between requests, without reloading
        the weights: a live study varies them within one server life. Refused while requests are in flight (their
        rounds hold the old scheduler's per-request state) and for any other field; all or nothing."""
        cold = sorted(set(spec) - set(HOT_SPEC))
        if cold:
            raise DSparkError(f"spec fields {', '.join(cold)} need a restart; only {', '.join(HOT_SPEC)} change on a "
                              "running engine")
        if self.has_work():
            raise EngineBusy(f"{self.num_running + self.num_waiting} requests are in flight; reconfigure between "
                              "requests")
        config = apply_params(self.config, {f"spec.{k}": v for k, v in spec.items()})
        self.cache.lens.zero_()  # every slot is free (nothing in flight): an idle cache the SPS probes may use
        scheduler = build_scheduler(config, self.target, self.cache, self.hidden_layers)  # raises before any change
        self.config = config
        self._install(scheduler)
        return config.spec

    # -- online API -------------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], sampling: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue one request (text or token ids); returns its id. Raises DSparkError on a bad prompt or id."""
        rid = request_id if request_id is not None else f"req-{self._next_id}"
        self._next_id += 1
        return self._queue(prompt, sampling or self.config.sampling, rid, f"request {rid}")

    def abort(self, request_id: str) -> Output | None:
        """Stop a request wherever it is (waiting or running) and free its slot; None when it is not live."""
        req = self._ids.get(request_id)
        if req is None:
            return None
        req.finish = "abort"
        if req.slot < 0:
            self._waiting.remove(req)
        else:
            self._running.remove(req)
        return self._finish(req)

    def fail_in_flight(self) -> list[Output]:
        """After `step` raised: end every request the failed step held (running, or taken from the queue for its
        prefill) with finish_reason "error" and free their slots, so the loop can go on with the waiting ones. A
        step's state is not rolled back, so no request of it can continue; the queue is untouched."""
        held = [r for r in self._ids.values() if r.slot >= 0 or r in self._running]
        self._running = [r for r in self._running if r not in held]
        failed = []
        for req in held:
            req.finish = "error"
            if req.slot >= 0:
                self.cache.truncate(req.slot, 0)
            failed.append(self._finish(req))
        return failed

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """The target layers whose hidden states every step returns (the drafter's; none without one)."""
        return self.drafter.hidden_layers if self.drafter else ()

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def live_ids(self) -> set[str]:
        """Ids of the requests not yet finished (waiting or running)."""
        return set(self._ids)

    def step(self) -> list[Update]:
        """Admit waiting requests into free slots, then one speculative round for every running request; one update
        per request that committed tokens or finished. Admitted prompts prefill in a ragged forward of their own, or
        inside this round's verify forward where the compiled step mixes short ones in (`batch.mixed_prefill_tokens`;
        they join the running batch from the next round): modeling/compiled_mixed.py says what that saves."""
        updates: dict[str, Update] = {}
        batch = self._take_batch() if self._waiting and self._free else []
        mixing = bool(batch) and bool(self._running) and self._mixes(batch)
        if batch and not mixing:
            self._started(self._admit(batch), updates)
        if self._running:
            for req, kept in zip(self._running, self._round(self._running, batch if mixing else []), strict=True):
                u = updates.setdefault(req.rid, Update(req.rid, []))
                u.new_tokens.extend(kept)
            for req in [r for r in self._running if r.finish]:
                self._running.remove(req)
                updates[req.rid].output = self._finish(req)
        if mixing:
            self._started(batch, updates)
        return list(updates.values())

    def _started(self, batch: list[_Request], updates: dict[str, Update]) -> None:
        """Record the prefilled requests' first tokens; those not finished by them join the running batch."""
        for req in batch:
            updates[req.rid] = Update(req.rid, list(req.out))
            if req.finish:
                updates[req.rid].output = self._finish(req)
            else:
                self._running.append(req)
        self._running.sort(key=lambda r: r.slot)  # rows in slot order: the target reads consecutive slots

    def _mixes(self, batch: list[_Request]) -> bool:
        """Whether the next round's verify forward can prefill `batch` too."""
        if self.target.compiled is None or sum(len(r.ids) for r in batch) > self.config.batch.mixed_prefill_tokens:
            return False  # a long prompt's own prefill is compute-bound: mixed in, it saves nothing
        rows = [r.slot for r in self._running], [r.slot for r in batch], [len(r.ids) for r in batch]
        return self.target.compiled.takes_mixed(self.cache, *rows, self.hidden_layers)

    def reset_stats(self) -> GenStats:
        """Start a new stats window; returns the one that ends."""
        old, self.stats = self.stats, GenStats(method=self.stats.method)
        return old

    # -- offline API ------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[str | list[int]], sampling: SamplingParams | None = None,
                 time_limit_s: float | None = None) -> Generation:
        """Generate for every prompt (text or token ids); outputs in prompt order, with stats. Request i samples
        with seed `sampling.seed + i`.

        `time_limit_s`: stop after this many seconds (between rounds); requests still running end with
        finish_reason "time_limit", those never admitted are left out, and `stats.cut` counts both, so a
        measurement of a very slow configuration costs a bounded time and says it was cut."""
        if self.has_work():
            raise DSparkError("generate() needs an idle engine; drain or abort the online requests first")
        sp = sampling or self.config.sampling
        self.reset_stats()
        self._sync()
        t0 = time.perf_counter()
        try:
            rids = [self._queue(p, sp.model_copy(update={"seed": sp.seed + i}), str(i), f"prompt {i}")
                    for i, p in enumerate(prompts)]
        except DSparkError:
            for rid in list(self._ids):
                self.abort(rid)
            raise
        done: dict[str, Output] = on_deep_stack(self._drain, t0, time_limit_s)
        self._sync()
        stats = self.reset_stats()
        stats.requests = len(rids)
        stats.seconds = time.perf_counter() - t0
        return Generation(outputs=[done[r] for r in rids if r in done], stats=stats)

    def _drain(self, t0: float, time_limit_s: float | None) -> dict[str, Output]:
        """Step until no request is left (or the time limit); the finished outputs by request id. Runs on a
        data-stack chunk of its own (dspark_core/pystack.py), so no step maps or unmaps one."""
        done: dict[str, Output] = {}
        while self.has_work():
            if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
                self.stats.cut = len(self._running) + len(self._waiting)
                for req in list(self._running):
                    req.finish = "time_limit"
                    self._running.remove(req)
                    done[req.rid] = self._finish(req)
                for req in list(self._waiting):
                    self.abort(req.rid)
                break
            for u in self.step():
                if u.output is not None:
                    done[u.request_id] = u.output
        return done

    # -- internals --------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.target.device.type == "cuda":
            torch.cuda.synchronize()

    def _queue(self, prompt: str | list[int], sp: SamplingParams, rid: str, label: str) -> str:
        if rid in self._ids:
            raise DSparkError(f"request id {rid!r} is already live; ids must be unique among live requests")
        ids = self._encode(prompt, label)
        limit = self.config.model.max_seq_len
        if len(ids) + sp.max_new_tokens + 1 > limit:
            raise DSparkError(f"{label}: {len(ids)} tokens + max_new_tokens {sp.max_new_tokens} exceed "
                              f"model.max_seq_len {limit}; shorten the prompt or raise max_seq_len")
        stop = set(sp.stop_token_ids or []) | (set() if sp.ignore_eos else self.eos)
        req = _Request(rid=rid, ids=ids, sp=sp, stop=stop, arrival=time.perf_counter())
        self._waiting.append(req)
        self._ids[rid] = req
        self.stats.requests += 1
        return rid

    def _encode(self, prompt: str | list[int], label: str) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise DSparkError("text prompts need a tokenizer; pass token ids or load a checkpoint with one")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
        if not ids:
            raise DSparkError(f"{label} is empty; every request needs at least one prompt token")
        vocab = self.target.arch.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise DSparkError(f"{label} has token ids outside the vocabulary [0, {vocab}); check the tokenizer")
        return ids

    def _take_batch(self) -> list[_Request]:
        """The waiting requests the next prefill admits: FIFO, one per free slot (up to `admit_cap` running), within
        batch.max_tokens of padded prompt rows."""
        batch: list[_Request] = []
        budget = self.config.batch.max_tokens
        cap = self.admit_cap if self.admit_cap is not None else len(self._free) + len(self._running)
        while self._waiting and self._free and len(self._running) + len(batch) < cap:
            longest = max([len(self._waiting[0].ids)] + [len(r.ids) for r in batch])
            if batch and longest * (len(batch) + 1) > budget:
                break
            req = self._waiting.popleft()
            req.slot = self._free.pop()
            self.cache.truncate(req.slot, 0)  # a taken slot starts empty
            batch.append(req)
        return batch

    def _admit(self, batch: list[_Request]) -> list[_Request]:
        """Prefill the batch's prompts in one forward (ragged: only real tokens are computed), then start them."""
        inp, lens = self._prompts(batch)
        out = self.target(inp, self.cache, [r.slot for r in batch], lens, hidden_layers=self.hidden_layers,
                          last_only=True)
        self._start(batch, out)
        return batch

    def _prompts(self, batch: list[_Request]) -> tuple[torch.Tensor, list[int]]:
        """The batch's prompts as [B, longest] (zeros past each) and their lengths."""
        lens = [len(r.ids) for r in batch]
        inp = torch.zeros(len(batch), max(lens), dtype=torch.long)
        for j, r in enumerate(batch):
            inp[j, : lens[j]] = torch.tensor(r.ids)
        return inp, lens

    def _start(self, batch: list[_Request], out: ForwardOut) -> None:
        """From the prefill's last-token logits: sample each request's first token, reset the drafter on its prompt."""
        first = top1(out.logits[:, 0]).tolist() if all(r.sp.greedy for r in batch) else None
        for j, r in enumerate(batch):
            r.tokens = list(r.ids)
            r.generator = None if r.sp.greedy else torch.Generator().manual_seed(r.sp.seed)
            if first is not None or r.sp.greedy:
                tok = first[j] if first is not None else int(top1(out.row_logits(j)[0]))
            else:
                tok = int(torch.multinomial(sampling_probs(out.row_logits(j)[0], r.sp).cpu(), 1,
                                            generator=r.generator))
            if self.drafter:
                hid = out.row_hidden(j)[: len(r.ids)] if out.flat_hidden is not None else None
                self.drafter.reset(r.slot, list(r.ids), hid)
            self._commit(r, [tok])
            r.first_token_s = time.perf_counter() - r.arrival

    def _commit(self, req: _Request, new: list[int]) -> list[int]:
        """Append tokens up to a stop token / max_new_tokens; returns what was kept."""
        kept: list[int] = []
        for tok in new:
            if tok in req.stop:
                req.finish = "stop"
                break
            kept.append(tok)
            if len(req.out) + len(kept) >= req.sp.max_new_tokens:
                req.finish = "length"
                break
        req.out.extend(kept)
        req.tokens.extend(kept)
        return kept

    def _finish(self, req: _Request) -> Output:
        """Free its slot (if it holds one) and build its output."""
        if req.slot >= 0:
            if self.drafter:
                self.drafter.release(req.slot)
            self._free.append(req.slot)
            req.slot = -1
        del self._ids[req.rid]
        self.stats.generated_tokens += len(req.out)
        text = self.tokenizer.decode(req.out) if self.tokenizer else ""
        return Output(prompt_tokens=len(req.ids), token_ids=req.out, text=text, finish_reason=req.finish,
                      ttft_s=req.first_token_s, latency_s=time.perf_counter() - req.arrival, request_id=req.rid)

    def _round(self, running: list[_Request], admit: list[_Request]) -> list[list[int]]:
        """One speculative round for every running request; returns the tokens each committed. Its verify forward
        also prefills `admit` (the compiled mixed step), which are started after the round."""
        t_round = time.perf_counter()
        block = self.config.spec.block_size if self.drafter else 0
        if self.gamma_cap is not None:
            block = min(block, self.gamma_cap)
        if block and getattr(self.scheduler, "plans_blocks", False):  # the learned / explore gamma policy picks it
            block = self.scheduler.round_block([(r.slot, r.tokens, r.sp.max_new_tokens - len(r.out) - 1)
                                                for r in running], block)
        reqs = []
        for r in running:
            remaining = r.sp.max_new_tokens - len(r.out)
            gamma = min(self.scheduler.gamma(r.slot, block), remaining - 1) if block else 0
            reqs.append(DraftRequest(slot=r.slot, tokens=r.tokens, gamma=max(gamma, 0), sampling=r.sp,
                                     generator=r.generator, prompt_len=len(r.ids)))
        b = len(reqs)
        t0 = time.perf_counter()
        if hasattr(self.scheduler, "waiting"):  # the round log records the queue behind the batch
            self.scheduler.waiting = len(self._waiting)
        if self.drafter and any(q.gamma for q in reqs):
            self.drafter.stop_below = getattr(self.scheduler, "draft_floor", lambda _: 0.0)(reqs)  # where to stop
            prop = self.drafter.propose(reqs)
            chosen = self.scheduler.choose(reqs, prop)
        else:
            prop, chosen = Proposal(tokens=torch.zeros(b, 0, dtype=torch.long), num=[0] * b), [0] * b
            if hasattr(self.scheduler, "plain_round"):  # the round log prices plain steps too
                self.scheduler.plain_round(reqs)
        cap = self.config.spec.max_verify_tokens
        nv = [max(0, min(int(c), n, cap)) for c, n in zip(chosen, prop.num, strict=True)]
        t = max(nv) + 1
        inp = torch.zeros(b, t, dtype=torch.long)  # [B, T]: anchor, then the verified drafts
        drafts = prop.tokens.cpu()
        for i, r in enumerate(running):
            inp[i, 0] = r.tokens[-1]
            if nv[i]:
                inp[i, 1 : nv[i] + 1] = drafts[i, : nv[i]]
        bases = [len(r.tokens) - 1 for r in running]
        t1 = time.perf_counter()
        slots, n_new = [r.slot for r in running], [n + 1 for n in nv]
        if admit:
            prompts, plens = self._prompts(admit)
            out, fill = self.target.compiled.mixed(inp, self.cache, slots, n_new, prompts, [r.slot for r in admit],
                                                   plens, self.hidden_layers)
        else:
            out = self.target(inp, self.cache, slots, n_new, hidden_layers=self.hidden_layers)
        verdicts = round_verdicts(out, inp, nv, [r.sp for r in running], [r.generator for r in running], prop.probs)
        stats = self.stats
        took = time.perf_counter() - t1
        stats.draft_s, stats.verify_s = stats.draft_s + t1 - t0, stats.verify_s + took
        if hasattr(self.scheduler, "step_took") and not admit:  # a compiled target's scheduler prices its shapes by
            self.scheduler.step_took(b, t, took, sum(nv) + b)
        stats.steps += 1
        stats.verify_tokens += sum(nv) + b
        results, committed = [], []
        for i, r in enumerate(running):
            k, tok = verdicts[i]
            kept = self._commit(r, inp[i, 1 : k + 1].tolist() + [tok])
            self.cache.truncate(r.slot, bases[i] + k + 1)
            stats.record(verified=nv[i], accepted=k, committed=len(kept), proposed=prop.num[i])
            hidden = out.row_hidden(i)[: k + 1] if out.flat_hidden is not None else None
            results.append(RoundResult(slot=r.slot, proposed=prop.num[i], verified=nv[i], accepted=k,
                                       new_tokens=kept, hidden=hidden, finished=bool(r.finish)))
            committed.append(kept)
        if self.drafter:
            self.drafter.update(results)
        self.scheduler.observe(results)
        if admit:
            self._start(admit, fill)
            stats.admit_rounds += 1
        took = time.perf_counter() - t_round
        stats.decode_s, stats.mixed_s = stats.decode_s + took, stats.mixed_s + (took if admit else 0.0)
        if len(running) == self.config.batch.max_requests:
            stats.full_s += took
            stats.full_tokens += sum(len(k) for k in committed)
        return committed
