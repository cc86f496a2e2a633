"""A frozen corpus of the target's own outputs for suffix decoding, indexed by a suffix array (issue 42).

A served engine's global tree warms up with its traffic: after an hour it holds thousands of finished outputs, and
suffix decoding copies the phrases the model keeps writing. A benchmark, or a server just started, begins cold. The
corpus starts it warm: greedy continuations the target wrote for training prompts (never the held-out benchmark's;
`build-suffix-corpus`, cli/commands_suffix_corpus.py), a third tree beside the request's own and the global one.

A dict trie costs ~4.7 KB a token at depth 24 (94k tokens: 441 MB), so the corpus is a suffix array instead: the
corpus reversed, its suffixes sorted on their first `depth` tokens, `depth` int32 columns (~110 B a token). It
answers `SuffixTree.match` and `follow` with the same counts, so a draft from it is the one a `SuffixTree.insert` of
each sequence would give (tests/dspark_core/test_suffix_corpus.py):
* match: the longest suffix of the context, read backwards, narrows a range of the sorted reversed suffixes one
  token at a time (a binary search inside the range); its occurrences are the range's positions;
* follow: the occurrences' next tokens, counted; the most frequent one (ties: the smaller id) is taken and the
  occurrences it continued walk on.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from dspark_core.atomic import atomic_write_text
from dspark_core.errors import DSparkError
from dspark_core.userfiles import read_capped

SEP = -1  # between sequences (and at both ends): no match or continuation crosses it
MEMO = 1 << 16  # `follow` answers kept (then all dropped: a few MB at most)
SMALL = 24  # occurrences under which `follow` counts and `match` searches in Python


@dataclass
class Occurrences:
    """A matched string's occurrences in the corpus."""

    ends: np.ndarray  # [C] int64 forward positions of each occurrence's last token
    length: int  # tokens matched
    span: tuple[int, int]  # their range of sorted suffixes (what `follow` memoises on)


class CorpusIndex:
    """Every substring of up to `depth` tokens of `seqs`, counted as `SuffixTree.insert` of each would count them."""

    def __init__(self, seqs: Sequence[Sequence[int]], depth: int) -> None:
        if depth < 2:
            raise ValueError(f"suffix corpus depth must be >= 2 (a match and a continuation), got {depth}")
        self.depth = depth
        parts = [np.array([SEP], dtype=np.int32)]
        for s in seqs:
            parts += [np.asarray(s, dtype=np.int32), np.array([SEP], dtype=np.int32)]
        self.fwd = np.concatenate(parts)  # [N] the sequences, SEP-separated, SEP at both ends
        self.fwd_list = array("i", self.fwd.tobytes())  # the same, for `_follow_few`'s scalar reads
        self.tokens = int((self.fwd != SEP).sum())
        n = len(self.fwd)
        rev = self.fwd[::-1]
        padded = np.concatenate([rev, np.full(depth, SEP, dtype=np.int32)])
        starts = np.flatnonzero(rev != SEP)  # only real tokens start a reversed suffix
        cols = [padded[starts + j] for j in range(depth)]
        order = np.lexsort(cols[::-1])  # sorted on column 0, then 1, ...
        self.sa = starts[order]  # [M] reversed positions, suffixes sorted on their first `depth` tokens
        self.cols = np.stack([c[order] for c in cols])  # [depth, M] column j: each sorted suffix's token j
        self.n = n
        ids, at, counts = np.unique(self.cols[0], return_index=True, return_counts=True)
        self.first = {t: (a, a + c) for t, a, c in zip(ids.tolist(), at.tolist(), counts.tolist(), strict=True)}
        # token -> the range of sorted suffixes that begin with it (match's first step, a dict lookup)
        self._memo: dict[tuple, tuple[list[int], list[float], list[int]]] = {}  # `follow`'s answers: the corpus is
        # frozen, and short matches (thousands of occurrences to count) recur every round

    def match(self, context: Sequence[int], longest: int) -> tuple[Occurrences, int] | None:
        """(every occurrence of the longest suffix of `context`, at most `longest` tokens, that occurred with a next
        token; its length), or None when not even the last token did."""
        n = min(longest, len(context), self.depth - 1)  # the tree counts no continuation past depth
        if n < 1 or (first := self.first.get(context[-1])) is None:
            return None
        lo, hi = first
        ranges = [first]  # the sorted suffixes that begin with the context's last j + 1 tokens
        for j in range(1, n):
            tok = context[-1 - j]
            if hi - lo == 1:  # one occurrence left: compare it token by token
                if int(self.cols[j, lo]) != tok:
                    break
            else:
                if hi - lo <= SMALL:  # a short range: a Python list's bisect beats numpy's call overhead
                    col = self.cols[j, lo:hi].tolist()
                    a, b = bisect_left(col, tok), bisect_right(col, tok)
                else:
                    a, b = np.searchsorted(self.cols[j, lo:hi], (tok, tok + 1)).tolist()  # ids: right(t) = left(t+1)
                if a == b:
                    break
                lo, hi = lo + a, lo + b
            ranges.append((lo, hi))
        for k in range(len(ranges), 0, -1):  # a longer match continued somewhere only if a shorter one did
            lo, hi = ranges[k - 1]
            ends = self.n - 1 - self.sa[lo:hi]  # forward positions of the occurrences' last tokens
            if (self.fwd[ends + 1] != SEP).any():
                return Occurrences(ends, k, (lo, hi)), k
        return None

    def follow(self, at: Occurrences, limit: int, min_prob: float) -> tuple[list[int], list[float], list[int]]:
        """`SuffixTree.follow` from a match's occurrences: up to `limit` tokens of the most frequent continuation
        (no deeper than `depth` tokens with the match, as the tree counts), each with its ratio count / continued
        occurrences and that support, while the running product stays >= min_prob."""
        limit = min(limit, self.depth - at.length)
        key = (at.span, at.length, limit, min_prob)
        if (done := self._memo.get(key)) is None:
            if len(self._memo) >= MEMO:
                self._memo.clear()
            done = self._memo[key] = self._follow(at.ends, limit, min_prob)
        return list(done[0]), list(done[1]), list(done[2])

    def _follow(self, ends: np.ndarray, limit: int, min_prob: float) -> tuple[list[int], list[float], list[int]]:
        """`follow`'s walk, computed."""
        toks: list[int] = []
        probs: list[float] = []
        supports: list[int] = []
        joint = 1.0
        while len(toks) < limit:
            if len(ends) <= SMALL:  # a few occurrences (most steps after the first): Python beats numpy's overheads
                return self._follow_few(ends.tolist(), limit, min_prob, joint, toks, probs, supports)
            nxt = self.fwd[ends + 1]
            nxt = nxt[nxt != SEP]
            cont = len(nxt)
            if cont == 0:
                break
            ids, counts = np.unique(nxt, return_counts=True)  # ids ascending: argmax takes the smaller on a tie
            m = int(counts.argmax())
            p = int(counts[m]) / cont
            if joint * p < min_prob:
                break
            joint *= p
            tok = int(ids[m])
            toks.append(tok)
            probs.append(p)
            supports.append(cont)
            ends = ends[self.fwd[ends + 1] == tok] + 1
        return toks, probs, supports

    def _follow_few(self, ends: list[int], limit: int, min_prob: float, joint: float, toks: list[int],
                    probs: list[float], supports: list[int]) -> tuple[list[int], list[float], list[int]]:
        """`follow`'s loop on a list of occurrences, from where it stood."""
        fwd = self.fwd_list
        while len(toks) < limit:
            counts: dict[int, int] = {}
            for e in ends:
                t = fwd[e + 1]
                if t != SEP:
                    counts[t] = counts.get(t, 0) + 1
            if not counts:
                break
            cont = sum(counts.values())
            tok, c = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))
            p = c / cont
            if joint * p < min_prob:
                break
            joint *= p
            toks.append(tok)
            probs.append(p)
            supports.append(cont)
            ends = [e + 1 for e in ends if fwd[e + 1] == tok]
        return toks, probs, supports

    @property
    def nbytes(self) -> int:
        """Memory the index holds."""
        return self.fwd.nbytes * 2 + self.sa.nbytes + self.cols.nbytes


FILE = "suffix_corpus.json"  # shipped beside a target's committed assets
MAX_BYTES = 8 << 20  # ~1.3M tokens of JSON (the index holds ~110 B a token: ~150 MB at most)
MAX_TOKENS = MAX_BYTES // 7  # what `build-suffix-corpus` may write: 6 digits and a comma a token at most


class CorpusFile(BaseModel):
    """`build-suffix-corpus`'s output: the target's outputs and where they came from."""

    model_config = ConfigDict(extra="forbid")

    target: str  # the checkpoint that wrote them
    dtype: str  # its precision while generating
    prompts: str  # which prompts (a training split, never the held-out benchmark's)
    max_new_tokens: int = Field(ge=1)  # tokens a continuation could reach
    chat_count: int = Field(0, ge=0)  # chat prompts continued: chat_prompts.yaml's training split, drawn by
    chat_seed: int | None = None  # this seed, of at most
    chat_max_len: int | None = Field(None, ge=1)  # this many tokens (calibrate-suffix leaves these prompts out)
    code_count: int = Field(0, ge=0)  # code windows continued, from
    code_source: str | None = None  # this source (dspark_core/training/code_sources.py)
    sequences: list[list[int]] = Field(max_length=1 << 20)  # each output's token ids (the prompt is not kept)


def save_corpus(path: Path, corpus: CorpusFile) -> Path:
    """Write the corpus file atomically."""
    return atomic_write_text(path, corpus.model_dump_json())


def read_corpus(path: Path, vocab: int) -> CorpusFile:
    """Read and check a corpus file; any problem is one DSparkError line naming the file."""
    try:
        raw = read_capped(path, MAX_BYTES, "suffix corpus")
        corpus = CorpusFile.model_validate_json(raw)
    except ValueError as e:  # pydantic's ValidationError
        first = str(e).splitlines()[1:3]
        raise DSparkError(f"{path}: not a suffix corpus ({' '.join(s.strip() for s in first)}); rerun "
                          "`python cli.py build-suffix-corpus` or set drafter.suffix_corpus: none") from None
    bad = next((t for s in corpus.sequences for t in s if not 0 <= t < vocab), None)
    if bad is not None:
        raise DSparkError(f"{path}: token id {bad} is outside the target's vocabulary ({vocab}); was it built for "
                          f"another model? (it names {corpus.target!r})")
    return corpus


def load_corpus(path: Path, depth: int, vocab: int) -> CorpusIndex:
    """Read, check and index a corpus file."""
    return CorpusIndex(read_corpus(path, vocab).sequences, depth)
