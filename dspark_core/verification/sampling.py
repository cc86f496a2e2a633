"""Sampling parameters and the one sampling transform shared by target and drafters.

Lossless rejection sampling needs the draft distribution q and the target distribution p to be built by
the same transform (temperature, then top-k, then top-p), so every component calls `sampling_probs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:
    import torch

MIN_TEMPERATURE = 0.01  # the smallest sampling temperature (vLLM's _MAX_TEMP): below it logits / T overflow float32
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # a signed 64-bit seed (vLLM's range; torch's generator takes no wider)


class SamplingParams(BaseModel):
    """How one request samples; temperature 0 is greedy (argmax, no randomness)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False)  # 0 = greedy; > 0 divides the logits
    top_k: int = Field(0, ge=0)  # keep the k most likely tokens (0 = off)
    top_p: float = Field(1.0, gt=0.0, le=1.0)  # keep the smallest set with cumulative probability >= p
    max_new_tokens: int = Field(64, ge=1)  # generation budget per request
    seed: int = Field(0, ge=SEED_MIN, le=SEED_MAX)  # per-request generator seed (request i uses seed + i)
    ignore_eos: bool = False  # keep generating past EOS (benchmarks with a fixed length)
    stop_token_ids: list[int] | None = None  # extra stop tokens; None = only the tokenizer's EOS

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v: float) -> float:
        if 0.0 < v < MIN_TEMPERATURE:
            raise ValueError(f"temperature {v} is below {MIN_TEMPERATURE}: logits / T overflow and sampling fails; "
                             "use 0 for greedy decoding")
        return v

    @property
    def greedy(self) -> bool:
        """True when decoding is deterministic argmax."""
        return self.temperature == 0.0


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] (float32) after temperature, top-k and top-p.

    Greedy (temperature 0) returns the one-hot distribution of the argmax, so greedy verification is the
    special case of rejection sampling with point masses.
    """
    import torch

    from dspark_core.modeling.argmax import top1

    logits = logits.float()
    if params.greedy:
        out = torch.zeros_like(logits)
        return out.scatter_(-1, top1(logits)[..., None], 1.0)
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [..., V]
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass strictly before each token
        drop_sorted = before >= params.top_p  # the top token always has before = 0 and stays
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """probs [..., V] -> sampled token ids [...] (long); argmax when the distribution is a point mass."""
    import torch

    flat = probs.reshape(-1, probs.shape[-1])
    ids = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return ids.reshape(probs.shape[:-1])
