"""Suffix decoding: propose the most frequent continuation of the context's longest matched suffix.

The method of Oliaro et al. 2024 (arXiv 2411.04975) as vLLM runs it (`method: suffix`, through Snowflake's Arctic
Inference), written for this engine on `suffix_tree.SuffixTree`:
* a tree per request over its prompt and output, grown as tokens are committed (the last `window` tokens' starts);
* a global tree over the outputs of recently finished requests, bounded by `cache_tokens` (oldest out first), so a
  request can copy what earlier ones wrote;
* each round, each tree matches the longest suffix of the context that occurred with a continuation (at most
  `depth - gamma` tokens, so the tree's depth still holds a full block after it; vLLM allows `depth - 1`, which
  left 1.60x where this gives 1.93x on held-out code, benchmarks/RESULTS.md) and follows its most frequent
  continuation while the estimated probability (a product of frequency ratios) stays >= `min_prob`, for at most
  min(gamma, ceil(spec_factor x match length)) tokens: a longer match speculates further. The tree whose path has
  the larger expected accepted length (the sum of the running products) proposes.
vLLM's defaults: depth 24, spec factor 1.0, min probability 0.1 (vllm/config/speculative.py, 0.32).
Deterministic (a point-mass draft), so verification stays lossless under sampling. `confidence` carries each
token's P(accepted | the ones before were): the frequency ratio mapped to measured acceptance by
`drafter.suffix_calibration` (suffix_calibration.py), else the raw ratio; a scheduler or the hybrid weighs it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import torch

from dspark_core.drafters.base import Drafter, DraftRequest, Proposal, RoundResult
from dspark_core.drafters.suffix_calibration import OWN, SuffixCalibration
from dspark_core.drafters.suffix_corpus import CorpusIndex
from dspark_core.drafters.suffix_tree import SuffixTree, expected_accepted


@dataclass
class _Slot:
    """One running request: its tree and how much of its token list the tree holds."""

    tree: SuffixTree
    tokens: list[int] = field(default_factory=list)  # prompt + committed output, as the tree holds them
    prompt_len: int = 0  # tokens of the prompt at the start of `tokens`
    dropped: int = 0  # start positions taken out of the tree (it indexes the last `window` starts)


@dataclass
class Draft:
    """One tree's proposal for one request."""

    tokens: list[int]  # the drafted continuation
    probs: list[float]  # P(token k accepted | the ones before were): calibrated, else the raw ratios
    ratios: list[float]  # the tree's frequency ratios kid.count / node.cont
    supports: list[int]  # each ratio's node.cont
    match: int  # length of the matched context suffix
    source: int = OWN  # the tree it came from: OWN, GLOBAL or CORPUS


@dataclass
class SuffixStats:
    """Where the proposals came from (tests read them; the drafting time is the engine's `GenStats.draft_s`)."""

    from_request: int = 0  # proposals from the request's own tree
    from_global: int = 0  # proposals from the global tree of finished outputs
    from_corpus: int = 0  # proposals from the frozen corpus of the target's outputs
    taken: list[int] = field(default_factory=lambda: [0, 0, 0])  # drafts verified, by tree (OWN, GLOBAL, CORPUS)
    accepted: list[int] = field(default_factory=lambda: [0, 0, 0])  # their accepted tokens, by tree


class SuffixDrafter(Drafter):
    """Suffix decoding over each request's prompt and output and over recent finished outputs."""

    name = "suffix"

    def __init__(self, depth: int = 24, spec_factor: float = 1.0, min_prob: float = 0.1,
                 cache_tokens: int = 8192, window: int = 4096, calibration: SuffixCalibration | None = None,
                 corpus: CorpusIndex | None = None) -> None:
        self.depth, self.spec_factor, self.min_prob = depth, spec_factor, min_prob
        self.calibration = calibration  # maps the frequency ratios to measured acceptance (None: the raw ratios)
        self.window = max(window, depth)  # substrings starting in the last `window` tokens of a request are indexed
        self.cache_tokens = cache_tokens  # finished-output tokens the global tree keeps (0 = no global tree)
        self.glob = SuffixTree(depth)
        self.corpus = corpus  # the target's outputs for training prompts, frozen (suffix_corpus.py; None: none)
        self._cached: deque[list[int]] = deque()  # outputs in the global tree, oldest first
        self._cached_tokens = 0
        self._slots: dict[int, _Slot] = {}
        self._src: dict[int, int] = {}  # slot -> the tree of this round's draft (credited in `update`)
        self.stats = SuffixStats()

    def reset(self, slot: int, prompt: list[int], hidden: torch.Tensor | None) -> None:
        s = _Slot(SuffixTree(self.depth), [], len(prompt))
        self._slots[slot] = s
        self._extend(s, prompt)

    def _extend(self, s: _Slot, new: list[int]) -> None:
        """Append committed tokens to the slot's tree, then drop the starts that left the window (memory: ~20 nodes
        a token at depth 24, ~5 KB; the window bounds a request's tree whatever its length)."""
        s.tree.append(new)
        s.tokens.extend(new)
        for start in range(s.dropped, len(s.tokens) - self.window):
            s.tree.drop_start(s.tokens, start)
        s.dropped = max(s.dropped, len(s.tokens) - self.window)

    def _sync(self, r: DraftRequest) -> _Slot:
        """The slot's tree extended to the request's committed tokens (the engine resets a slot for each new
        request; a slot first seen here, or one that holds more than the request, starts afresh)."""
        s = self._slots.get(r.slot)
        if s is None or len(r.tokens) < len(s.tokens):
            s = _Slot(SuffixTree(self.depth), [], r.prompt_len)
            self._slots[r.slot] = s
        self._extend(s, r.tokens[len(s.tokens):])
        return s

    def draft(self, context: list[int], gamma: int, tree: SuffixTree | CorpusIndex, source: int) -> Draft | None:
        """The draft of `tree` (which is tree `source`: OWN, GLOBAL or CORPUS) for `context`: the longest matched
        suffix's most frequent continuation (None: no match). The request's own tree was appended `context` itself,
        so its last nodes are the match."""
        longest = max(1, self.depth - gamma)  # leave the tree depth for a full block
        found = tree.match_last(longest) if source == OWN else tree.match(context, longest)
        if found is None:
            return None
        node, k = found
        limit = min(gamma, max(1, math.ceil(self.spec_factor * k)))
        toks, ratios, supports = tree.follow(node, limit, self.min_prob)
        if not toks:
            return None
        probs = self.calibration.probs(ratios, supports, k, source) if self.calibration else ratios
        return Draft(toks, probs, ratios, supports, k, source)

    def drafts(self, r: DraftRequest) -> list[Draft]:
        """The request's tree synced to its tokens, then the draft of every tree that has one for it: its own, the
        global one, the corpus (the calibration's fit scores each; `best_draft` picks one)."""
        s = self._sync(r)
        if r.gamma <= 0:
            return []
        trees = (s.tree, self.glob if self._cached else None, self.corpus)
        return [d for i, t in enumerate(trees) if t is not None
                and (d := self.draft(s.tokens, r.gamma, t, source=i)) is not None]

    def best_draft(self, r: DraftRequest) -> tuple[Draft | None, int]:
        """`best_of(drafts(r))`, and its tree (OWN, GLOBAL, CORPUS; -1: none)."""
        d = best_of(self.drafts(r))
        return d, d.source if d is not None else -1

    def propose(self, requests: list[DraftRequest]) -> Proposal:
        drafts: list[tuple[list[int], list[float]]] = []
        for r in requests:
            d, which = self.best_draft(r)
            if which == 0:
                self.stats.from_request += 1
            elif which == 1:
                self.stats.from_global += 1
            elif which == 2:
                self.stats.from_corpus += 1
            if which >= 0:
                self._src[r.slot] = which
            drafts.append((d.tokens, d.probs) if d is not None else ([], []))
        g = max((len(d) for d, _ in drafts), default=0)
        tokens = torch.zeros(len(requests), g, dtype=torch.long)
        conf = torch.full((len(requests), g), 1e-3)
        for i, (d, p) in enumerate(drafts):
            if d:
                tokens[i, : len(d)] = torch.tensor(d, dtype=torch.long)
                conf[i, : len(p)] = torch.tensor(p).clamp(1e-3, 1 - 1e-3)
        return Proposal(tokens=tokens, num=[len(d) for d, _ in drafts], confidence=conf)

    def not_taken(self, slot: int) -> None:
        """Another proposer's draft was verified for `slot` this round (a hybrid's): credit this one nothing."""
        self._src.pop(slot, None)

    def update(self, results: list[RoundResult]) -> None:
        for res in results:  # committed tokens join the request's tree now; the next propose finds them there
            src = self._src.pop(res.slot, None)
            if src is not None:
                self.stats.taken[src] += 1
                self.stats.accepted[src] += res.accepted
            s = self._slots.get(res.slot)
            if s is not None and res.new_tokens:
                self._extend(s, res.new_tokens)

    def forget(self) -> None:
        """Empty the global tree (the requests' own trees are theirs and stay)."""
        self.glob = SuffixTree(self.depth)
        self._cached.clear()
        self._cached_tokens = 0

    def release(self, slot: int) -> None:
        """The request ended: its output joins the global tree (oldest outputs leave past `cache_tokens`)."""
        self._src.pop(slot, None)
        s = self._slots.pop(slot, None)
        if s is None or self.cache_tokens <= 0:
            return
        out = s.tokens[s.prompt_len:][-self.cache_tokens:]
        if len(out) < 2:
            return
        self.glob.insert(out)
        self._cached.append(out)
        self._cached_tokens += len(out)
        while self._cached_tokens > self.cache_tokens:
            old = self._cached.popleft()
            self.glob.remove(old)
            self._cached_tokens -= len(old)


def best_of(drafts: list[Draft]) -> Draft | None:
    """The draft with the largest expected accepted length (None: none expects any)."""
    best, best_score = None, 0.0
    for d in drafts:
        if (score := expected_accepted(d.probs)) > best_score:
            best, best_score = d, score
    return best


def suffix_stats(drafter: object) -> SuffixStats | None:
    """The counts of a suffix drafter, or of a hybrid's suffix proposer; None for other drafters."""
    st = getattr(getattr(drafter, "suffix", drafter), "stats", None)
    return st if isinstance(st, SuffixStats) else None


def suffix_calibration(config) -> SuffixCalibration | None:  # noqa: ANN001 - EngineConfig
    """`drafter.suffix_calibration`: a file, `none`, or `auto` (the target's committed file when it has one)."""
    from dspark_core.config import committed_file
    from dspark_core.drafters.suffix_calibration import FILE, load_calibration

    path = committed_file(config.drafter.suffix_calibration, config.model.path, FILE)
    return load_calibration(path) if path is not None else None


def suffix_corpus(config, vocab: int) -> CorpusIndex | None:  # noqa: ANN001 - EngineConfig
    """`drafter.suffix_corpus`: a file, `none`, or `auto` (the target's committed file when it has one), indexed."""
    from dspark_core.config import committed_file
    from dspark_core.drafters.suffix_corpus import FILE, load_corpus

    path = committed_file(config.drafter.suffix_corpus, config.model.path, FILE)
    return load_corpus(path, config.drafter.suffix_depth, vocab) if path is not None else None


def from_config(config, calibration: SuffixCalibration | None = None,  # noqa: ANN001 - EngineConfig
                corpus: CorpusIndex | None = None) -> SuffixDrafter:
    """A SuffixDrafter with `config.drafter`'s tree depth, spec factor, probability floor, global cache and window."""
    return SuffixDrafter(config.drafter.suffix_depth, config.drafter.suffix_spec_factor, config.drafter.suffix_min_prob,
                         config.drafter.suffix_cache_tokens, config.drafter.suffix_window, calibration, corpus)


def build_drafter(config, target) -> SuffixDrafter:  # noqa: ANN001 - EngineConfig, LeanModel
    """Registry entry: `config.drafter`'s settings and its calibration (`drafter.suffix_calibration`)."""
    return from_config(config, suffix_calibration(config), suffix_corpus(config, target.arch.vocab_size))
