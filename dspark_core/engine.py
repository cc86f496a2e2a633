"""The engine: `Engine(config).generate(prompts, sampling) -> Generation(outputs, stats)`.

Continuous batching over `batch.max_requests` KV slots. Each decode step is one speculative round for
every running request (see `drafters/base.py` for the contract): draft, let the scheduler pick the verify
length, verify with one target forward, accept losslessly, roll the KV caches back in O(1).
Plain decoding is the same loop with no drafter (block length 0).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from dspark_core.config import EngineConfig
from dspark_core.drafters.base import Drafter, DraftRequest, Proposal, RoundResult, VerifyAll, VerifyScheduler
from dspark_core.errors import DSparkError
from dspark_core.kernels.spec import use_triton
from dspark_core.sampling import SamplingParams, sampling_probs
from dspark_core.stats import GenStats
from dspark_core.verify import greedy_verdicts, verify_greedy_batch, verify_sampling

if TYPE_CHECKING:
    from dspark_core.model import LeanModel
    from dspark_core.tokenizer import Tokenizer


@dataclass
class Output:
    """One request's result."""

    prompt_tokens: int  # prompt length in tokens
    token_ids: list[int]  # generated tokens (EOS excluded)
    text: str  # decoded generated text ("" when no tokenizer)
    finish_reason: str  # "stop" (EOS / stop token) or "length" (max_new_tokens)
    ttft_s: float | None = None  # seconds from generate() start to this request's first token
    latency_s: float | None = None  # seconds from generate() start to its last token


@dataclass
class Generation:
    """What `generate` returns."""

    outputs: list[Output]  # one per prompt, in prompt order
    stats: GenStats  # throughput, tau, per-position acceptance


@dataclass
class _Running:
    """A request holding a slot."""

    index: int  # position in the prompt list
    slot: int  # KV slot
    tokens: list[int]  # prompt + generated; tokens[-1] is the anchor
    prompt_len: int  # prompt tokens
    generator: torch.Generator | None  # per-request RNG
    out: list[int] = field(default_factory=list)  # generated tokens
    finish: str = ""  # finish reason once done
    first_token_s: float | None = None  # seconds from generate() start to the first token


class Engine:
    """Loads the target (and drafter) once; `generate` runs batches of prompts through the round loop."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        target: LeanModel | None = None,
        tokenizer: Tokenizer | None = None,
        drafter: Drafter | None = None,
        scheduler: VerifyScheduler | None = None,
    ) -> None:
        from dspark_core.checkpoint import load_model
        from dspark_core.tokenizer import Tokenizer

        self.config = config or EngineConfig()
        c = self.config
        self.target = target if target is not None else load_model(c.model.path, c.device, c.weights.dtype)
        if tokenizer is None and target is None:
            tokenizer = Tokenizer.load(c.model.tokenizer or c.model.path, self.target.arch.eos_ids)
        self.tokenizer = tokenizer
        self.eos = set(self.target.arch.eos_ids or (tokenizer.eos_ids if tokenizer else []))
        if drafter is None and c.spec.enabled and c.drafter.method != "plain":
            from dspark_core.drafters import build_drafter

            drafter = build_drafter(c.drafter.method, c, self.target)
        self.drafter = drafter
        self.scheduler = scheduler if scheduler is not None else build_scheduler(c, self.target)
        _install_kernel_configs(c, self.target.device)
        self.cache = self.target.new_cache(c.batch.max_requests, c.model.max_seq_len, dtype=kv_dtype(c, self.target))
        self._t0 = 0.0  # perf_counter() at the start of the current generate() call

    # -- public API -------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[str | list[int]], sampling: SamplingParams | None = None,
                 time_limit_s: float | None = None) -> Generation:
        """Generate for every prompt (text or token ids); outputs in prompt order, with stats.

        `time_limit_s`: stop after this many seconds (between rounds); requests still running end with
        finish_reason "time_limit", those never admitted are left out, and `stats.cut` counts both, so a
        measurement of a very slow configuration costs a bounded time and says it was cut."""
        sp = sampling or self.config.sampling
        encoded = [self._encode(p, i) for i, p in enumerate(prompts)]
        limit = self.config.model.max_seq_len
        for i, ids in enumerate(encoded):
            if len(ids) + sp.max_new_tokens + 1 > limit:
                raise DSparkError(f"prompt {i}: {len(ids)} tokens + max_new_tokens {sp.max_new_tokens} exceed "
                                  f"model.max_seq_len {limit}; shorten the prompt or raise max_seq_len")
        stats = GenStats(method=self.drafter.name if self.drafter else "plain", requests=len(encoded))
        outputs: list[Output | None] = [None] * len(encoded)
        stop = self.eos | set(sp.stop_token_ids or [])
        if sp.ignore_eos:
            stop = set(sp.stop_token_ids or [])
        free = list(range(self.config.batch.max_requests - 1, -1, -1))
        queue = list(range(len(encoded) - 1, -1, -1))
        running: list[_Running] = []
        self._sync()
        t0 = self._t0 = time.perf_counter()
        while queue or running:
            if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
                for req in running:
                    req.finish = "time_limit"
                    outputs[req.index] = self._finish(req, free, stats)
                stats.cut = len(running) + len(queue)
                running, queue = [], []
                break
            if queue and free:
                batch: list[tuple[int, list[int], int]] = []
                budget = self.config.batch.max_tokens
                while queue and free:
                    longest = max([len(encoded[queue[-1]])] + [len(x[1]) for x in batch])
                    if batch and longest * (len(batch) + 1) > budget:
                        break
                    i = queue.pop()
                    batch.append((i, encoded[i], free.pop()))
                for req in self._admit(batch, sp, stop):
                    if req.finish:
                        outputs[req.index] = self._finish(req, free, stats)
                    else:
                        running.append(req)
                running.sort(key=lambda r: r.slot)  # rows in slot order: the target reads consecutive slots as a view
            if not running:
                continue
            self._round(running, sp, stop, stats)
            for req in [r for r in running if r.finish]:
                running.remove(req)
                outputs[req.index] = self._finish(req, free, stats)
        self._sync()
        stats.seconds = time.perf_counter() - t0
        return Generation(outputs=[o for o in outputs if o is not None], stats=stats)

    # -- internals --------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.target.device.type == "cuda":
            torch.cuda.synchronize()

    def _encode(self, prompt: str | list[int], i: int) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise DSparkError("text prompts need a tokenizer; pass token ids or load a checkpoint with one")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
        if not ids:
            raise DSparkError(f"prompt {i} is empty; every request needs at least one prompt token")
        vocab = self.target.arch.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise DSparkError(f"prompt {i} has token ids outside the vocabulary [0, {vocab}); check the tokenizer")
        return ids

    def _admit(self, batch: list[tuple[int, list[int], int]], sp: SamplingParams, stop: set[int]) -> list[_Running]:
        """Prefill (index, prompt ids, slot) rows in one forward (ragged: only real tokens are computed), sample
        each first token, reset the drafter."""
        lens = [len(ids) for _, ids, _ in batch]
        inp = torch.zeros(len(batch), max(lens), dtype=torch.long)
        for j, (_, ids, slot) in enumerate(batch):
            inp[j, : len(ids)] = torch.tensor(ids)
            self.cache.truncate(slot, 0)
        layers = self.drafter.hidden_layers if self.drafter else ()
        out = self.target(inp, self.cache, [s for _, _, s in batch], lens, hidden_layers=layers, last_only=True)
        first = out.logits[:, 0].argmax(-1).tolist() if sp.greedy else None
        reqs = []
        for j, (index, ids, slot) in enumerate(batch):
            gen = None if sp.greedy else torch.Generator().manual_seed(sp.seed + index)
            req = _Running(index=index, slot=slot, tokens=list(ids), prompt_len=len(ids), generator=gen)
            if first is not None:
                tok = first[j]
            else:
                tok = int(torch.multinomial(sampling_probs(out.row_logits(j)[0], sp).cpu(), 1, generator=gen))
            if self.drafter:
                hid = out.row_hidden(j)[: len(ids)] if out.flat_hidden is not None else None
                self.drafter.reset(slot, list(ids), hid)
            self._commit(req, [tok], sp, stop)
            req.first_token_s = time.perf_counter() - self._t0
            reqs.append(req)
        return reqs

    def _commit(self, req: _Running, new: list[int], sp: SamplingParams, stop: set[int]) -> list[int]:
        """Append tokens up to EOS / max_new_tokens; returns what was kept."""
        kept: list[int] = []
        for tok in new:
            if tok in stop:
                req.finish = "stop"
                break
            kept.append(tok)
            if len(req.out) + len(kept) >= sp.max_new_tokens:
                req.finish = "length"
                break
        req.out.extend(kept)
        req.tokens.extend(kept)
        return kept

    def _finish(self, req: _Running, free: list[int], stats: GenStats) -> Output:
        if self.drafter:
            self.drafter.release(req.slot)
        free.append(req.slot)
        stats.generated_tokens += len(req.out)
        text = self.tokenizer.decode(req.out) if self.tokenizer else ""
        return Output(prompt_tokens=req.prompt_len, token_ids=req.out, text=text, finish_reason=req.finish,
                      ttft_s=req.first_token_s, latency_s=time.perf_counter() - self._t0)

    def _round(self, running: list[_Running], sp: SamplingParams, stop: set[int], stats: GenStats) -> None:
        """One speculative round for every running request."""
        block = self.config.spec.block_size if self.drafter else 0
        reqs = []
        for r in running:
            remaining = sp.max_new_tokens - len(r.out)
            gamma = min(self.scheduler.gamma(r.slot, block), remaining - 1) if block else 0
            reqs.append(DraftRequest(slot=r.slot, tokens=r.tokens, gamma=max(gamma, 0), sampling=sp,
                                     generator=r.generator, prompt_len=r.prompt_len))
        b = len(reqs)
        if self.drafter and any(q.gamma for q in reqs):
            prop = self.drafter.propose(reqs)
            chosen = self.scheduler.choose(reqs, prop)
        else:
            prop = Proposal(tokens=torch.zeros(b, 0, dtype=torch.long), num=[0] * b)
            chosen = [0] * b
        cap = self.config.spec.max_verify_tokens
        nv = [max(0, min(int(c), n, cap)) for c, n in zip(chosen, prop.num, strict=True)]
        t = max(nv) + 1
        inp = torch.zeros(b, t, dtype=torch.long)
        drafts = prop.tokens.cpu()
        for i, r in enumerate(running):
            inp[i, 0] = r.tokens[-1]
            if nv[i]:
                inp[i, 1 : nv[i] + 1] = drafts[i, : nv[i]]
        bases = [len(r.tokens) - 1 for r in running]
        layers = self.drafter.hidden_layers if self.drafter else ()
        out = self.target(inp, self.cache, [r.slot for r in running], [n + 1 for n in nv], hidden_layers=layers)
        if sp.greedy and out.pack is not None and not use_triton(out.flat_logits):  # ragged: argmax real tokens
            verdicts = greedy_verdicts(out.argmax(), inp[:, 1:], nv)
        elif sp.greedy:
            verdicts = verify_greedy_batch(out.logits, inp[:, 1:], nv)
        else:
            verdicts = []
            for i in range(b):
                p = sampling_probs(out.row_logits(i)[: nv[i] + 1], sp)
                q = prop.probs[i, : nv[i]].to(p.device) if prop.probs is not None else None
                verdicts.append(verify_sampling(p, q, inp[i, 1 : nv[i] + 1].to(p.device), running[i].generator))
        stats.steps += 1
        stats.verify_tokens += sum(nv) + b
        results = []
        for i, r in enumerate(running):
            k, tok = verdicts[i]
            kept = self._commit(r, inp[i, 1 : k + 1].tolist() + [tok], sp, stop)
            self.cache.truncate(r.slot, bases[i] + k + 1)
            stats.record(verified=nv[i], accepted=k, committed=len(kept), proposed=prop.num[i])
            hidden = out.row_hidden(i)[: k + 1] if out.flat_hidden is not None else None
            results.append(RoundResult(slot=r.slot, proposed=prop.num[i], verified=nv[i], accepted=k,
                                       new_tokens=kept, hidden=hidden, finished=bool(r.finish)))
        if self.drafter:
            self.drafter.update(results)
        self.scheduler.observe(results)


def kv_dtype(config: EngineConfig, target: LeanModel) -> torch.dtype:
    """The KV cache's dtype for `kv.dtype`: auto = the activations'; fp8 variants store keys and values in FP8
    with no scale (as vLLM's and SGLang's `--kv-cache-dtype fp8_*` without calibrated scales) and attend in the
    activation dtype."""
    return {"auto": target.dtype, "bf16": torch.bfloat16, "fp16": torch.float16,
            "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[config.kv.dtype]


def _install_kernel_configs(config: EngineConfig, device: torch.device) -> None:
    """Triton configs: the config's `kernel.<name>.<knob>`, then a bundle's kernels.json for this GPU."""
    from dspark_core.kernels import spec as kspec

    if config.kernel:
        kspec.load_engine_params(config.kernel)
    if config.kernel_file:
        try:
            kspec.load_tuned_file(config.kernel_file, device)
        except ValueError as e:
            raise DSparkError(str(e)) from None


def build_scheduler(config: EngineConfig, target: LeanModel) -> VerifyScheduler:
    """Plain `verify_all` here; schedulers with confidence ranking, adaptive gamma or the plain-decoding fallback
    come from part 2's `dspark_core.schedulers.build_verify_scheduler`."""
    name, spec = config.spec.scheduler, config.spec
    if name == "verify_all" and not spec.adaptive_gamma and spec.fallback_acceptance == 0.0:
        return VerifyAll()  # nothing to regulate: every request drafts and verifies the full block
    try:
        from dspark_core.schedulers import build_verify_scheduler  # type: ignore[attr-defined]
    except ImportError:
        raise DSparkError(f"spec.scheduler {name!r} is not available in this build; use verify_all") from None
    return build_verify_scheduler(config, target)
