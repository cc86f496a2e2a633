"""A reduced draft vocabulary: the DSpark drafter's logits over the target's most frequent output tokens plus the
tokens of the batch's own context, not over the whole vocabulary.

Why: on SmolLM2-135M (49,152 tokens, width 576) the LM head over a block of 8 and the Markov bias W2 x 8 steps read
the vocabulary's rows 9 times a round; eager bf16 on an AVX512-BF16 CPU a round of drafting took 6.2 ms at one
request and 3.1 ms over 8,192 ranked tokens (`python benchmarks/draft_cost.py`; docs/drafters.md). EAGLE-3 drafts
over a reduced vocabulary for the same reason (SafeAILab/EAGLE eagle/traineagle3/config.json: draft_vocab_size
32000 of Llama-3.1's 128,256, mapped back by `d2t`), and SGLang documents FR-Spec's `--speculative-token-map` as
"lower lm_head overhead for EAGLE-2" (docs.sglang.io, speculative decoding). Ours
adds the context's tokens each round, so a request's rare identifiers stay draftable (code copies them).

* The ranking (`draft_vocab.json` beside the drafter): token ids by how often the target wrote them in the drafter's
  own training continuations, with their counts and the data recipe; `python cli.py draft-vocab` writes it from a
  `train-drafter` state folder, and `train-drafter` writes it with every drafter it exports.
* `drafter.draft_vocab` (N): the N highest-ranked tokens (default DEFAULT_SIZE; 0 = the whole vocabulary). Columns
  per round = those N + the batch's context tokens outside them.
* Lossless either way: verification is unchanged. Under greedy decoding the draft is the argmax over the columns;
  under sampling the proposal q lives on the columns (zero elsewhere), which rejection sampling accepts exactly as
  any other proposal. Only acceptance can move: a target token outside the columns cannot be drafted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import nn

from dspark_core.atomic import atomic_write_text
from dspark_core.errors import DSparkError
from dspark_core.modeling.cpu_linear import PackedLinear, supported
from dspark_core.userfiles import UserFileError, read_capped

VOCAB_FILE = "draft_vocab.json"  # the ranking shipped beside a drafter
FORMAT = "dspark-tune draft vocabulary"  # marks a file this tool wrote (it may replace one of these, nothing else)
DEFAULT_SIZE = 8192  # ranked tokens drafted from when drafter.draft_vocab is unset (benchmarks/draft_cost.py)
FILE_CAP = 8 << 20  # bytes: ~500k ranked ids with their counts (a ranking holds only the tokens its data wrote:
# 12,757 for SmolLM2's 49,152)


class VocabFile(BaseModel):
    """draft_vocab.json: token ids ranked by how often the target wrote them in the drafter's training data."""

    model_config = ConfigDict(extra="forbid")
    format: str = FORMAT  # always FORMAT
    vocab_size: int = Field(ge=1, le=1 << 20)  # the target vocabulary the ids index
    tokens: list[int] = Field(min_length=1)  # ids, most frequent first (only ids the data holds)
    counts: list[int]  # how often each was written, same order
    source: dict[str, str | int | float | None] = {}  # the data recipe (rows, lengths, chat share, seed, ...)


def rank_tokens(tokens: torch.Tensor, prompt_len: int, vocab_size: int) -> tuple[list[int], list[int]]:
    """tokens [S, T] (prompt + the target's continuation) -> (ids, counts) of the continuation tokens, most frequent
    first (ties: lower id first). Only what the target wrote counts, not the prompts."""
    written = tokens[:, prompt_len:].reshape(-1)
    counts = torch.bincount(written, minlength=vocab_size)
    ids = torch.nonzero(counts, as_tuple=True)[0]  # ascending: the tie order
    order = torch.sort(counts[ids], descending=True, stable=True).indices
    ids = ids[order]
    return ids.tolist(), counts[ids].tolist()


def check_writable(folder: Path) -> None:
    """DSparkError unless `folder`/draft_vocab.json is absent or a ranking this tool wrote (it may be replaced)."""
    path = folder / VOCAB_FILE
    if path.exists() or path.is_symlink():
        try:
            ours = not path.is_symlink() and \
                json.loads(read_capped(path, FILE_CAP, "a draft vocabulary")).get("format") == FORMAT
        except (UserFileError, ValueError, AttributeError):
            ours = False
        if not ours:
            raise DSparkError(f"{path} exists and was not written by dspark-tune; move it away to write the draft "
                              "vocabulary there")


def save_vocab(folder: Path, ranking: VocabFile) -> Path:
    """Write `folder`/draft_vocab.json atomically; refuse to replace a file of that name this tool did not write."""
    check_writable(folder)
    return atomic_write_text(folder / VOCAB_FILE, json.dumps(ranking.model_dump()) + "\n")


def load_vocab(path: Path, vocab_size: int) -> VocabFile:
    """Read and check a ranking for a target of `vocab_size` tokens; any problem is one DSparkError line."""
    try:
        raw = json.loads(read_capped(path, FILE_CAP, "a draft vocabulary"))
        f = VocabFile.model_validate(raw)
    except UserFileError as e:
        raise DSparkError(str(e)) from None
    except json.JSONDecodeError as e:
        raise DSparkError(f"draft vocabulary {path} is not JSON ({e.msg}, line {e.lineno}); rerun "
                          "`python cli.py draft-vocab`") from None
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise DSparkError(f"draft vocabulary {path} is invalid: {loc}: {err.get('msg')}; rerun "
                          "`python cli.py draft-vocab`") from None
    why = None
    if f.format != FORMAT:
        why = f"format is {f.format!r}, not {FORMAT!r}"
    elif f.vocab_size != vocab_size:
        why = f"it ranks a vocabulary of {f.vocab_size} tokens; the target has {vocab_size}"
    elif len(f.counts) != len(f.tokens):
        why = f"{len(f.tokens)} tokens but {len(f.counts)} counts"
    elif min(f.tokens) < 0 or max(f.tokens) >= vocab_size or len(set(f.tokens)) != len(f.tokens):
        why = f"its token ids must be distinct and in [0, {vocab_size})"
    if why:
        raise DSparkError(f"draft vocabulary {path}: {why}; rerun `python cli.py draft-vocab` for this drafter")
    return f


@dataclass
class Columns:
    """What one round drafts over: token id of each logit column, and the LM head's / W2's rows in parts (the
    static ranked block, then this round's context tokens), so the static block is never copied."""

    ids: torch.Tensor  # [M] long: token id of each column
    lm: list[torch.Tensor | nn.Module]  # LM-head rows [m_j, H] per part (the static block may be a packed linear)
    w2: list[torch.Tensor] | None  # W2 rows [m_j, r] per part (None: a head without W2)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., H] -> [..., M] LM-head logits over the columns."""
        return _parts(h, self.lm)

    def bias(self, e: torch.Tensor) -> torch.Tensor:
        """e [..., r] (W1 of the previous token) -> [..., M] Markov bias over the columns."""
        assert self.w2 is not None
        return _parts(e, self.w2)


def _parts(x: torch.Tensor, parts: list[torch.Tensor | nn.Module] | list[torch.Tensor]) -> torch.Tensor:
    out = [w(x) if isinstance(w, nn.Module) else F.linear(x, w) for w in parts]
    return out[0] if len(out) == 1 else torch.cat(out, dim=-1)


class DraftVocab:
    """The static ranked block of a drafter's columns, and per slot the context tokens outside it."""

    def __init__(self, ids: list[int], lm_weight: torch.Tensor, w2_weight: torch.Tensor | None) -> None:
        v = lm_weight.shape[0]
        self.full_lm, self.full_w2 = lm_weight, w2_weight  # [V, H], [V, r]: rows of context tokens are read here
        self.static = torch.tensor(ids, dtype=torch.long)  # [N]
        self.lm: torch.Tensor | nn.Module = lm_weight[self.static].contiguous()  # [N, H]
        if self.lm.device.type == "cpu" and supported(self.lm.dtype):  # oneDNN's packed layout: ~2x MKL at 8 rows
            lin = nn.Linear(self.lm.shape[1], self.lm.shape[0], bias=False, dtype=self.lm.dtype)
            lin.weight = nn.Parameter(self.lm, requires_grad=False)
            self.lm = PackedLinear(lin)
        self.w2 = None if w2_weight is None else w2_weight[self.static].contiguous()  # [N, r]
        self._in_static = bytearray(v)  # 1 where a token id is in the static block
        for i in ids:
            self._in_static[i] = 1
        self._seen: dict[int, tuple[int, set[int]]] = {}  # slot -> (tokens read, their ids outside the block)

    @property
    def size(self) -> int:
        return int(self.static.shape[0])

    def forget(self, slot: int) -> None:
        """The slot's request ended or restarts: its context tokens no longer count."""
        self._seen.pop(slot, None)

    def columns(self, contexts: list[tuple[int, list[int]]]) -> Columns:
        """The round's columns for (slot, its tokens so far) per drafted request: the static block plus every
        context token outside it (read incrementally: only the tokens a slot gained since the last round)."""
        extra: set[int] = set()
        for slot, tokens in contexts:
            done, outside = self._seen.get(slot, (0, set()))
            if done > len(tokens):  # a new request in the slot without a forget: start over
                done, outside = 0, set()
            inside = self._in_static
            outside.update(t for t in tokens[done:] if not inside[t])
            self._seen[slot] = (len(tokens), outside)
            extra |= outside
        if not extra:
            return Columns(ids=self.static, lm=[self.lm], w2=None if self.w2 is None else [self.w2])
        more = torch.tensor(sorted(extra), dtype=torch.long)
        w2 = None if self.w2 is None or self.full_w2 is None else [self.w2, self.full_w2[more]]
        return Columns(ids=torch.cat([self.static, more]), lm=[self.lm, self.full_lm[more]], w2=w2)


def build_vocab(folder: Path, size: int | None, vocab_size: int,
                weights: Callable[[], tuple[torch.Tensor, torch.Tensor | None]]) -> DraftVocab | None:
    """The drafter's reduced vocabulary for `drafter.draft_vocab` = `size` (None: DEFAULT_SIZE where the folder has
    a ranking, else the whole vocabulary; 0: the whole vocabulary), or None for the whole vocabulary. `weights()`
    gives the plain LM-head [V, H] and W2 [V, r] rows; it is called only when a reduced vocabulary is built."""
    path = folder / VOCAB_FILE
    if size == 0 or (size is None and not path.is_file()):
        return None
    if not path.is_file():
        raise DSparkError(f"drafter.draft_vocab is {size} but {path} does not exist; write it with `python cli.py "
                          "draft-vocab`, or set drafter.draft_vocab: 0 (the whole vocabulary)")
    ranking = load_vocab(path, vocab_size)
    n = DEFAULT_SIZE if size is None else size
    if n >= vocab_size:
        return None
    lm, w2 = weights()
    return DraftVocab(ranking.tokens[:n], lm, w2)
