"""OpenAI-compatible request bodies (what the official `openai` client sends) and the sampling they map to.

Fields the engine cannot honour are refused with a clear message rather than silently ignored: n > 1,
logprobs, echo, penalties other than 0, best_of. top_k and ignore_eos are the vLLM / SGLang extensions."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dspark_core.verification.sampling import SamplingParams


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False  # a last chunk with the usage and no choices
    continuous_usage_stats: bool = False  # accepted (vLLM's), usage is sent at the end only


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None  # must name the served model when given
    max_tokens: int | None = Field(None, ge=1)  # new tokens; chat default: what the context leaves
    temperature: float = Field(1.0, ge=0.0, le=2.0)  # 0 = greedy (OpenAI's default is 1)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # vLLM / SGLang extension; 0 or -1 = off
    seed: int | None = None  # the request's sampling seed (default: derived from its id)
    stop: str | list[str] | None = None  # stop strings (not included in the output)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1)  # one choice per request
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0)
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0)
    user: str | None = None

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self, max_new_tokens: int, seed: int) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=max(0, self.top_k),
                              max_new_tokens=max_new_tokens, seed=self.seed if self.seed is not None else seed,
                              ignore_eos=self.ignore_eos, stop_token_ids=self.stop_token_ids)


class CompletionRequest(_Common):
    prompt: str | list[int]  # text or token ids (one prompt per request)
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's completions default
    echo: Literal[False] = False
    logprobs: None = None
    best_of: int | None = Field(None, ge=1, le=1)
    suffix: None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
            return v[0]  # the client wraps a single prompt in a list
        return v


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "developer"]
    content: str
    name: str | None = None


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens
    logprobs: Literal[False] | None = None
    top_logprobs: None = None


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
