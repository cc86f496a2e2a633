"""OpenAI-compatible request bodies (what the official `openai` client sends) and the sampling they map to.

Fields the engine cannot honour are refused with a clear message rather than silently ignored: n > 1,
logprobs, echo, penalties other than 0, best_of. top_k and ignore_eos are the vLLM / SGLang extensions.

Every field is bounded here, at the edge, so no request reaches the engine thread with a value that fails inside
it: the seed is a signed 64-bit integer (vLLM's range; torch's generator overflows past 2**64), a temperature is 0
(greedy) or at least MIN_TEMPERATURE (below it logits / T overflow float32 and the softmax turns into NaN), text is
valid Unicode (a lone surrogate cannot be encoded to UTF-8 for the tokenizer), and lists and strings have caps."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from dspark_core.verification.sampling import MIN_TEMPERATURE, SEED_MAX, SEED_MIN, SamplingParams

MAX_STOPS = 16  # stop strings per request (OpenAI allows 4; vLLM has no cap)
MAX_STOP_CHARS = 1024  # characters of one stop string
MAX_STOP_IDS = 1024  # stop token ids per request
MAX_MESSAGES = 4096  # chat messages per request
MAX_NAME_CHARS = 256  # model / user / message name


def _utf8(text: str) -> str:
    """Refuse text that cannot be encoded as UTF-8 (a lone surrogate such as \\ud800 in the JSON)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"holds a lone surrogate ({text[e.start:e.end].encode('unicode_escape').decode()} at "
                         f"character {e.start}); send valid Unicode text") from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]  # any text the server tokenises, renders or matches
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS), AfterValidator(_utf8)]
StopText = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS), AfterValidator(_utf8)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False  # a last chunk with the usage and no choices
    continuous_usage_stats: bool = False  # accepted (vLLM's), usage is sent at the end only


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Name | None = None  # must name the served model when given
    max_tokens: int | None = Field(None, ge=1)  # new tokens; chat default: what the context leaves
    temperature: float = Field(1.0, ge=0.0, le=2.0)  # 0 = greedy (OpenAI's default is 1)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=2**31 - 1)  # vLLM / SGLang extension; 0 or -1 = off
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)  # the request's sampling seed (default: random)
    stop: StopText | list[StopText] | None = Field(None, max_length=MAX_STOPS)  # stop strings (not in the output)
    stop_token_ids: list[Annotated[int, Field(ge=0, lt=2**31)]] | None = Field(None, max_length=MAX_STOP_IDS)
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1)  # one choice per request
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0)
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0)
    user: Name | None = None

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v: float) -> float:
        if 0.0 < v < MIN_TEMPERATURE:
            raise ValueError(f"must be 0 (greedy) or at least {MIN_TEMPERATURE}; smaller ones overflow the softmax")
        return v

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self, max_new_tokens: int, seed: int) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=max(0, self.top_k),
                              max_new_tokens=max_new_tokens, seed=self.seed if self.seed is not None else seed,
                              ignore_eos=self.ignore_eos, stop_token_ids=self.stop_token_ids)


class CompletionRequest(_Common):
    prompt: Text | list[Annotated[int, Field(ge=0, lt=2**31)]]  # text or token ids (one prompt per request)
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
    content: Text
    name: Name | None = None


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens
    logprobs: Literal[False] | None = None
    top_logprobs: None = None


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
