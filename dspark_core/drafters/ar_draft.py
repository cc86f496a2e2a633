"""The small autoregressive draft model as a drafter: gamma cheap forwards per round, own KV cache.

Per slot the draft cache holds a prefix of the request's committed tokens (`dlen`). `propose` first feeds
the tokens the draft has not seen yet (the anchor, plus the last accepted draft token after a fully
accepted block), then drafts token by token; `update` rolls the draft cache back to the accepted prefix
in O(1).
"""

from __future__ import annotations

import torch

from dspark_core.drafters.base import Drafter, DraftRequest, Proposal, RoundResult
from dspark_core.modeling.argmax import top1
from dspark_core.modeling.model import KVCache, LeanModel
from dspark_core.verification.sampling import sampling_probs


class ARDrafter(Drafter):
    """Draft with a small causal LM that shares the target's tokenizer."""

    name = "ar_draft"

    def __init__(self, model: LeanModel, slots: int, max_len: int) -> None:
        self.model = model
        self.cache: KVCache = model.new_cache(slots, max_len)
        self.base: dict[int, int] = {}  # slot -> len(request.tokens) at the last propose

    def reset(self, slot: int, prompt: list[int], hidden: torch.Tensor | None) -> None:
        self.cache.truncate(slot, 0)
        self.base[slot] = 0

    def _next(self, logits: torch.Tensor, req: DraftRequest) -> tuple[int, torch.Tensor | None]:
        """logits [V] -> (token, q [V] or None when greedy)."""
        if req.sampling.greedy:
            return int(top1(logits)), None
        q = sampling_probs(logits, req.sampling)
        return int(torch.multinomial(q.cpu(), 1, generator=req.generator)), q

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> Proposal:
        b = len(requests)
        g = max((r.gamma for r in requests), default=0)
        tokens = torch.zeros(b, max(g, 1), dtype=torch.long)
        probs: list[list[torch.Tensor | None]] = [[] for _ in range(b)]
        rows = [i for i, r in enumerate(requests) if r.gamma > 0]
        if not rows:
            return Proposal(tokens=tokens[:, :0], num=[0] * b)
        # step 0: feed what the draft has not seen (>= the anchor), take the last logits
        feeds = [requests[i].tokens[self.cache.length(requests[i].slot):] for i in rows]
        t = max(len(f) for f in feeds)
        inp = torch.zeros(len(rows), t, dtype=torch.long)
        for j, f in enumerate(feeds):
            inp[j, : len(f)] = torch.tensor(f)
        slots = [requests[i].slot for i in rows]
        logits = self.model(inp, self.cache, slots, [len(f) for f in feeds], last_only=True).logits[:, 0]
        for step in range(g):
            for j, i in enumerate(rows):
                tok, q = self._next(logits[j], requests[i])
                tokens[i, step] = tok
                probs[i].append(q)
            rows = [i for i in rows if requests[i].gamma > step + 1]
            if not rows or step == g - 1:
                break
            slots = [requests[i].slot for i in rows]
            logits = self.model(tokens[rows, step : step + 1], self.cache, slots).logits[:, 0]
        for r in requests:
            self.base[r.slot] = len(r.tokens)
        q_all = None
        if any(p and p[0] is not None for p in probs):
            v = self.model.arch.vocab_size
            q_all = torch.zeros(b, g, v)
            for i, plist in enumerate(probs):
                for k, q in enumerate(plist):
                    if q is not None:
                        q_all[i, k] = q
        return Proposal(tokens=tokens[:, :g], num=[r.gamma for r in requests], probs=q_all)

    def update(self, results: list[RoundResult]) -> None:
        for res in results:
            keep = min(self.cache.length(res.slot), self.base.get(res.slot, 0) + res.accepted)
            self.cache.truncate(res.slot, keep)


def build_drafter(config, target: LeanModel) -> ARDrafter:  # noqa: ANN001 - EngineConfig (import cycle-free)
    """Registry entry: load `config.drafter.path` as a draft LM on the target's device and dtype."""
    from dspark_core.config import drafter_path
    from dspark_core.errors import DSparkError
    from dspark_core.modeling.checkpoint import load_model

    path = drafter_path(config)
    if not path:
        raise DSparkError("drafter.method ar_draft needs drafter.path (a small HF causal LM with the same tokenizer)")
    draft = load_model(path, str(target.device), config.weights.dtype)
    if draft.arch.vocab_size != target.arch.vocab_size:
        raise DSparkError(f"draft vocab {draft.arch.vocab_size} != target vocab {target.arch.vocab_size}; "
                          "the draft model must share the target's tokenizer")
    from dspark_core.modeling.cpu_linear import apply_kernel

    apply_kernel(draft, config.weights.cpu_kernel)  # the target's kernel (same dtype, already checked here)
    return ARDrafter(draft, config.batch.max_requests, config.model.max_seq_len + 32)
