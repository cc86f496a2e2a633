"""The drafter and verify-scheduler interfaces of the speculative round (the contract part 2 codes against).

One round of the engine (`dspark_core/engine.py`), for the batch of running requests:

1. ``drafter.propose(requests)`` -> :class:`Proposal`: up to ``request.gamma`` draft tokens per request,
   the draft distribution ``q`` each one was sampled from (or ``None`` for a deterministic drafter) and,
   optionally, per-position confidences ``c_k ~ P(token k survives | tokens < k survived)``.
2. ``scheduler.choose(requests, proposal)`` -> how many of the drafted tokens each request verifies
   (``0..proposal.num[b]``). The default :class:`VerifyAll` verifies everything.
3. One target forward over ``[anchor, d_1 .. d_n]`` per request (``n`` = the verified count), greedy or
   rejection-sampling acceptance (lossless), one extra target token (correction or bonus).
4. The target KV cache is rolled back in O(1) (a per-slot length is reset), then
   ``drafter.update(results)`` and ``scheduler.observe(results)`` see what was accepted.

Invariants a drafter can rely on, per request (slot):

* ``request.tokens`` = prompt + generated tokens; ``tokens[-1]`` is the *anchor*: the last committed token,
  sampled from the target but not yet run through it. The target KV cache holds ``len(tokens) - 1``
  positions.
* Target hidden states are delivered exactly once per position, in order: the prompt positions in
  ``reset`` (``[len(prompt), width]``), then for every round the positions that entered the target KV
  (the previous anchor + the accepted draft tokens, ``[accepted + 1, width]``) in ``update``. So a
  drafter that keeps a per-slot context (e.g. DSpark's projected target features as extra keys/values)
  appends ``update``'s rows and never recomputes the past.
* ``width = len(hidden_layers) * hidden_size``: the outputs of the target decoder layers listed in
  ``Drafter.hidden_layers`` (0-based decoder-layer indices, the output of that layer *before* the final
  norm: Hugging Face's ``output_hidden_states[i + 1]`` except for the last layer, where HF applies the final
  norm and we do not), concatenated in that order (DFlash style).
  A drafter with ``hidden_layers = ()`` gets ``hidden = None``.
* Probabilities (``Proposal.probs``) must be computed with :func:`dspark_core.verification.sampling.sampling_probs`
  using the request's :class:`~dspark_core.verification.sampling.SamplingParams`, so temperature / top-k / top-p are
  applied to the draft exactly as to the target (required for lossless rejection sampling). Sample with
  ``request.generator`` so runs are reproducible per request.

Drafters are built by name through ``dspark_core.drafters.build_drafter(name, config, target)``; the
DSpark drafter of part 2 is the entry ``"dspark"`` -> ``dspark_core.drafters.dspark:build_drafter`` with the
signature ``build_drafter(config: EngineConfig, target: LeanModel) -> Drafter``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from dspark_core.verification.sampling import SamplingParams


@dataclass
class DraftRequest:
    """One running request as the drafter and the scheduler see it at the start of a round."""

    slot: int  # cache slot of the request, stable while it runs (index into per-slot drafter state)
    tokens: list[int]  # prompt + generated tokens; tokens[-1] is the anchor (not yet in the target KV)
    gamma: int  # block length for this request this round (0 = plain decoding this round)
    sampling: SamplingParams  # temperature / top-k / top-p of this request (temperature 0 = greedy)
    generator: torch.Generator | None = None  # per-request RNG for sampling drafts (None when greedy)
    prompt_len: int = 0  # number of prompt tokens at the start of `tokens`


@dataclass
class Proposal:
    """What a drafter proposes for a batch of B requests (row b belongs to requests[b])."""

    tokens: torch.Tensor  # [B, G] long: drafted tokens, G = max gamma; row b valid up to num[b]
    num: list[int]  # [B] drafted tokens per request (<= requests[b].gamma)
    probs: torch.Tensor | None = None  # [B, G, V] float: q the tokens were sampled from; None = point mass
    confidence: torch.Tensor | None = None  # [B, G] float in (0, 1): P(token k survives | prefix did)
    entropy: torch.Tensor | None = None  # [B, G] float: entropy (nats) of the draft distribution at position k
    source: list[str] | None = None  # [B] which proposer drafted row b, where a drafter combines several (the hybrid)


@dataclass
class ProposerCount:
    """What one proposer of a drafter that combines several (the hybrid) drafted, and how it fared."""

    drafts: int = 0  # request rounds it drafted
    proposed: int = 0  # draft tokens it proposed
    verified: int = 0  # of them, verified
    accepted: int = 0  # of them, accepted


@dataclass
class RoundResult:
    """The outcome of one round for one request (what `update` and `observe` receive)."""

    slot: int  # cache slot of the request
    proposed: int  # draft tokens proposed (Proposal.num[b])
    verified: int  # draft tokens the target verified (chosen by the scheduler)
    accepted: int  # draft tokens accepted (a prefix of the verified ones)
    new_tokens: list[int]  # accepted draft tokens + the target's own token (accepted + 1; may be cut at EOS)
    hidden: torch.Tensor | None = None  # [accepted + 1, width]: target hidden states of [anchor, d_1..d_acc]
    finished: bool = False  # the request ended this round (EOS / max_new_tokens); release follows


class Drafter(ABC):
    """Proposes draft tokens; keeps its own per-slot state (e.g. a draft KV cache) in step with the target."""

    name: str = "drafter"  # method name in stats and bench rows
    hidden_layers: tuple[int, ...] = ()  # target decoder layers whose hidden states this drafter needs
    stop_below: float = 0.0  # this round's scheduler verifies no draft of lower survival: drafting may stop there

    @abstractmethod
    def reset(self, slot: int, prompt: list[int], hidden: torch.Tensor | None) -> None:
        """Start a new request in `slot`; `hidden` = [len(prompt), width] target states of the prompt."""

    @abstractmethod
    def propose(self, requests: list[DraftRequest]) -> Proposal:
        """Draft up to `request.gamma` tokens after each request's anchor (one batched call per round)."""

    @abstractmethod
    def update(self, results: list[RoundResult]) -> None:
        """Learn what was accepted: roll per-slot state back to the committed tokens and append `hidden`."""

    def release(self, slot: int) -> None:  # noqa: B027 - optional hook, default keeps nothing
        """The request in `slot` finished; free per-slot state (default: nothing to free)."""

    def forget(self) -> None:  # noqa: B027 - optional hook, default keeps nothing across requests
        """Drop what was learned from earlier requests (suffix decoding's global tree): a benchmark pass that
        replays the same prompts must not draft from the outputs of the pass before (default: nothing kept)."""


class VerifyScheduler(Protocol):
    """Chooses how many drafted tokens each request verifies this round (part 2: threshold, prefix, ...)."""

    def gamma(self, slot: int, default: int) -> int:
        """Block length to draft for this request this round (0 = plain decoding; default = config)."""
        ...

    def choose(self, requests: list[DraftRequest], proposal: Proposal) -> list[int]:
        """Per request, the number of draft tokens to verify, 0..proposal.num[b]."""
        ...

    def observe(self, results: list[RoundResult]) -> None:
        """See the outcome of the round (rolling acceptance, fallback decisions)."""
        ...


@dataclass
class VerifyAll:
    """The default scheduler: draft the configured block, verify every drafted token."""

    name: str = "verify_all"  # scheduler name in stats

    def gamma(self, slot: int, default: int) -> int:
        return default

    def choose(self, requests: list[DraftRequest], proposal: Proposal) -> list[int]:
        return list(proposal.num)

    def observe(self, results: list[RoundResult]) -> None:
        return None
