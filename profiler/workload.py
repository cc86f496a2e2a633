"""Workload profile: a preset (chat, code, math, mixed) or a JSONL file of requests; entropy.

JSONL formats (docs/workloads.md), one request per line, either ours:
``{"prompt": "...", "output_len": 128, "domain": "code", "arrival_s": 0.25}`` with all but ``prompt`` optional,
or OpenAI's chat shape: ``{"messages": [{"role": "user", "content": "..."}], "max_tokens": 128}`` (also inside an
OpenAI Batch API line's ``body``; a trailing assistant message is the reference answer: its length, when no
``max_tokens`` is given, is the output length). Token lengths come from the runnable model's tokenizer when one is
given, else from a 4-characters-per-token estimate (the profile notes which).
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from profiler.catalog import workload_presets
from profiler.errors import ProfileError
from profiler.schema import Entropy, Lengths, Slo, WorkloadProfile

CHARS_PER_TOKEN = 4.0  # length estimate when no tokenizer is at hand
TINY_TARGET = Path(__file__).resolve().parent.parent / "dspark_core" / "assets" / "tiny" / "target"


class Request(BaseModel):
    """One JSONL line."""

    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(min_length=1)  # the prompt text
    output_len: int | None = Field(None, ge=1, le=1_048_576)  # tokens to generate
    domain: str | None = None  # chat | code | math | mixed
    arrival_s: float | None = Field(None, ge=0.0, allow_inf_nan=False)  # arrival time in seconds from the start
    _line: int = PrivateAttr(0)  # line of the file it came from


class _Part(BaseModel):
    """One part of a message's content list (text parts count; an image or audio part has no text to time)."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls, ...: not part of the prompt text
    role: str = Field(min_length=1)
    content: str | list[_Part] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "\n".join(p.text for p in self.content if p.type == "text" and p.text)
        return self.content or ""


class _Chat(BaseModel):
    """An OpenAI chat request line (the Batch API's `body`, or the request itself)."""

    model_config = ConfigDict(extra="allow")  # model, temperature, custom_id, ...
    messages: list[_Message] = Field(min_length=1, max_length=100_000)
    max_tokens: int | None = Field(None, ge=1, le=1_048_576)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_048_576)


def _from_chat(obj: dict[str, Any]) -> dict[str, Any]:
    """Our request fields from an OpenAI chat line: the prompt is the messages as `role: text` lines (what a chat
    template adds is a few tokens per message), the output length `max_tokens` / `max_completion_tokens`, else a
    trailing assistant message's estimated length."""
    body = obj.get("body") if isinstance(obj.get("body"), dict) else obj
    chat = _Chat.model_validate(body)
    msgs = list(chat.messages)
    answer = msgs.pop().text() if len(msgs) > 1 and msgs[-1].role == "assistant" else None
    out: dict[str, Any] = {"prompt": "\n".join(f"{m.role}: {m.text()}" for m in msgs)}
    n = chat.max_tokens or chat.max_completion_tokens
    if n is None and answer:
        n = max(1, round(len(answer) / CHARS_PER_TOKEN))
    if n is not None:
        out["output_len"] = n
    for key in ("domain", "arrival_s"):  # ours, allowed beside the OpenAI fields
        if key in obj:
            out[key] = obj[key]
    return out


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    idx = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return float(s[idx])


def _lengths(xs: list[float]) -> Lengths:
    return Lengths(mean=round(statistics.fmean(xs), 1), p50=_pct(xs, 0.5), p99=_pct(xs, 0.99))


def read_requests(path: str | os.PathLike[str]) -> list[Request]:
    """Parse and validate a JSONL workload file; any problem is one ProfileError line (a folder, FIFO or device
    is refused unopened, caps in dspark_core/userfiles.py)."""
    p = Path(path)
    if not p.exists():
        raise ProfileError(f"workload file not found: {p} (give a JSONL file or one of: "
                           f"{', '.join(workload_presets())})")
    from dspark_core.errors import DSparkError
    from dspark_core.jsonl import read_jsonl  # bounded: a regular file, lines <= 4 MiB, nesting <= 64

    out: list[Request] = []
    try:
        for lineno, obj in read_jsonl(p):
            chat = isinstance(obj, dict) and ("messages" in obj or isinstance(obj.get("body"), dict))
            try:
                req = Request.model_validate(_from_chat(obj) if chat else obj)
            except ValidationError as e:
                err = e.errors()[0]
                loc = ".".join(str(x) for x in err["loc"]) or "line"
                shape = ('{"messages": [{"role": str, "content": str}], "max_tokens"?: int >= 1}' if chat else
                         '{"prompt": str, "output_len"?: int >= 1, "domain"?: str, "arrival_s"?: float >= 0}')
                raise ProfileError(f"{p}:{lineno}: {loc}: {err['msg']} (expected {shape}; formats: "
                                   "docs/workloads.md)") from None
            req._line = lineno
            out.append(req)
    except DSparkError as e:
        raise ProfileError(str(e)) from None
    if not out:
        raise ProfileError(f"{p}: no requests (the file is empty)")
    return out


def preset_profile(name: str) -> WorkloadProfile:
    w = workload_presets()[name]
    return WorkloadProfile(
        name=name, domain=w["domain"], prompt_len=Lengths(**w["prompt_len"]),
        output_len=Lengths(**w["output_len"]), concurrency=w["concurrency"], slo=Slo(**w["slo"]),
        temperature=w["temperature"],
    )


def prompts_of(workload: str) -> list[str]:
    """The prompts a workload measures entropy on: the preset's samples or the file's prompts."""
    presets = workload_presets()
    if workload in presets:
        return list(presets[workload]["prompts"])
    return [r.prompt for r in read_requests(workload)]


def file_profile(path: str, tokenize: Any = None, max_context: int | None = None
                 ) -> tuple[WorkloadProfile, list[str]]:
    """Workload profile of a JSONL file, and notes on how lengths were obtained. With `max_context` (the
    model's), a request whose prompt and output do not fit it is one ProfileError line: no deployment of that
    model can serve it."""
    reqs = read_requests(path)
    notes: list[str] = []
    if tokenize is not None:
        plens = [float(len(tokenize(r.prompt))) for r in reqs]
    else:
        plens = [max(1.0, round(len(r.prompt) / CHARS_PER_TOKEN)) for r in reqs]
        notes.append(f"prompt lengths estimated at {CHARS_PER_TOKEN:g} characters per token (no tokenizer)")
    for r, plen in zip(reqs, plens, strict=True):
        if max_context and plen + (r.output_len or 0) > max_context:
            raise ProfileError(f"{path}:{r._line}: prompt ({plen:.0f} tokens) + output_len ({r.output_len or 0}) "
                               f"exceed the model's context of {max_context} tokens; shorten the request or "
                               "pick a model with a longer context")
    domains = {r.domain for r in reqs if r.domain}
    domain = domains.pop() if len(domains) == 1 else "mixed"
    if domain not in ("chat", "code", "math", "mixed"):
        notes.append(f"domain '{domain}' is not one of chat/code/math/mixed; using mixed")
        domain = "mixed"
    base = preset_profile(domain)
    olens = [float(r.output_len) for r in reqs if r.output_len is not None]
    arrivals = sorted(r.arrival_s for r in reqs if r.arrival_s is not None)
    rate = None
    if len(arrivals) >= 2 and arrivals[-1] > arrivals[0]:
        rate = round((len(arrivals) - 1) / (arrivals[-1] - arrivals[0]), 3)
    if not olens:
        notes.append(f"no output_len in the file; output lengths from the '{domain}' preset")
    return WorkloadProfile(
        name=Path(path).name, path=str(Path(path).resolve()), domain=domain, prompt_len=_lengths(plens),
        output_len=_lengths(olens) if olens else base.output_len, concurrency=base.concurrency,
        request_rate=rate, slo=base.slo, temperature=base.temperature,
    ), notes


def tokenizer_of(folder: str | os.PathLike[str] | None) -> Any:
    """``encode(text) -> ids`` from a model folder's tokenizer.json (the fast `tokenizers` library), or None."""
    if folder is None:
        return None
    path = Path(folder)
    path = path if path.is_dir() else path.parent
    if not (path / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    return lambda text: tok.encode(text).ids


def workload_profile(workload: str | None, tokenize: Any = None, max_context: int | None = None
                     ) -> tuple[WorkloadProfile, list[str]]:
    """A preset name or a JSONL path (None: the chat preset); ``tokenize`` counts a file's prompt tokens; a
    preset is scaled down to fit `max_context` (a note says so), a file's request that does not fit is an
    error."""
    name = workload or "chat"
    presets = workload_presets()
    if name.lower() in presets:
        return fit_preset(preset_profile(name.lower()), max_context)
    if not name.endswith(".jsonl") and not Path(name).exists():
        raise ProfileError(f"unknown workload '{name}'; use one of {', '.join(presets)} or a .jsonl file")
    return file_profile(name, tokenize, max_context)


def fit_preset(wl: WorkloadProfile, max_context: int | None) -> tuple[WorkloadProfile, list[str]]:
    """A preset whose p99 prompt + p99 output exceed the model's context, scaled to fit it (a short-context
    model, e.g. the tiny reference target's 2048, never sees the 4k-token chat prompts a preset describes)."""
    if not max_context or not wl.prompt_len or not wl.output_len:
        return wl, []
    need = (wl.prompt_len.p99 or 0) + (wl.output_len.p99 or 0)
    if need <= max_context:
        return wl, []
    f = max_context / need

    def scale(x: Lengths) -> Lengths:
        return Lengths(**{k: (max(1.0, float(int(v * f))) if v else v) for k, v in x.model_dump().items()})

    out = wl.model_copy(update={"prompt_len": scale(wl.prompt_len), "output_len": scale(wl.output_len)})
    return out, [f"the '{wl.name}' preset's p99 prompt + output ({need:.0f} tokens) exceed the model's context of "
                 f"{max_context}: lengths scaled by {f:.2f} to fit"]


@dataclass(frozen=True)
class Traffic:
    """The user's own load and latency targets, replacing those of a preset or a file (`--concurrency`,
    `--slo-ttft-ms`, `--slo-tpot-ms`): presets carry typical figures, a deployment has its own."""

    concurrency: int | None = None  # simultaneous requests in flight (closed-loop clients)
    ttft_ms: float | None = None  # p99 time-to-first-token SLO; 0 drops it
    tpot_ms: float | None = None  # p99 time-per-output-token SLO; 0 drops it

    def given(self) -> bool:
        return any(v is not None for v in (self.concurrency, self.ttft_ms, self.tpot_ms))

    def apply(self, wl: WorkloadProfile) -> WorkloadProfile:
        """`wl` with these figures in place; a bad figure is one ProfileError line naming its flag."""
        if self.concurrency is not None and self.concurrency < 1:
            raise ProfileError(f"--concurrency {self.concurrency}: give the requests in flight, at least 1")
        for flag, v in (("--slo-ttft-ms", self.ttft_ms), ("--slo-tpot-ms", self.tpot_ms)):
            if v is not None and not (v >= 0 and v < float("inf")):
                raise ProfileError(f"{flag} {v:g}: give a p99 latency in milliseconds (0 drops that SLO)")
        if not self.given():
            return wl
        slo = (wl.slo or Slo()).model_copy()
        if self.ttft_ms is not None:
            slo.ttft_ms = self.ttft_ms or None
        if self.tpot_ms is not None:
            slo.tpot_ms = self.tpot_ms or None
        return wl.model_copy(update={
            "concurrency": self.concurrency if self.concurrency is not None else wl.concurrency,
            "slo": slo if (slo.ttft_ms is not None or slo.tpot_ms is not None) else None})


def runnable_model() -> Path | None:
    """The project's tiny reference target when it has been built (dspark_core/assets/tiny/target)."""
    return TINY_TARGET if (TINY_TARGET / "config.json").is_file() else None


def measure_entropy(model_dir: Path, prompts: list[str], max_tokens: int = 256) -> Entropy:
    """Mean and p90 next-token entropy (nats) of the target over the prompts' tokens, teacher-forced. The model runs
    in the bundled engine's lean runner (fp32), which loads in a fraction of the time transformers' import takes."""
    import torch

    from dspark_core.errors import DSparkError
    from dspark_core.modeling.checkpoint import load_model

    encode = tokenizer_of(model_dir)  # a bare tokenizer.json first: no transformers tokenizer class needed
    if encode is None:
        from transformers import AutoTokenizer

        hf_tok = AutoTokenizer.from_pretrained(str(model_dir))
        encode = lambda text: hf_tok(text).input_ids  # noqa: E731
    try:
        model = load_model(model_dir, "cpu", "fp32")
    except DSparkError as e:
        raise ValueError(str(e)) from None
    ents: list[float] = []
    with torch.inference_mode():
        for text in prompts:
            ids = torch.tensor([encode(text)[:max_tokens]], dtype=torch.long)  # [1, T]
            if ids.shape[1] < 2:
                continue
            cache = model.new_cache(1, ids.shape[1])
            logits = model(ids, cache, [0]).logits[0, :-1].float()  # [T-1, V]
            logp = torch.log_softmax(logits, dim=-1)
            ents.extend((-(logp.exp() * logp).sum(-1)).tolist())
    if not ents:
        raise ProfileError("entropy: the workload's prompts are too short to measure (need 2+ tokens)")
    return Entropy(mean=round(statistics.fmean(ents), 4), p90=round(_pct(ents, 0.9), 4))


@dataclass(frozen=True)
class LengthModel:
    """Lognormal request lengths with the workload's median and p99, clipped to [lo, hi]: what the simulator draws
    (tuner/simulate.py) and what the plan's feasibility budgets KV for (kb/feasible.py)."""

    median: float  # tokens
    p99: float  # tokens
    lo: int  # shortest length drawn
    hi: int  # longest length drawn

    @property
    def sigma(self) -> float:
        return max(0.05, math.log(max(self.p99, self.median * 1.01) / self.median) / 2.326)

    def quantile(self, z: float) -> float:
        """The length at standard-normal quantile `z` (2.326 = p99), clipped."""
        return min(max(self.median * math.exp(z * self.sigma), self.lo), self.hi)


def request_lengths(wl: WorkloadProfile, max_context: int | None) -> tuple[LengthModel, LengthModel]:
    """(prompt, output) length models of a workload; absent figures default to a 512-token prompt and a 256-token
    output with p99 three times the median."""
    pm = (wl.prompt_len.p50 or wl.prompt_len.mean) if wl.prompt_len else None
    om = (wl.output_len.p50 or wl.output_len.mean) if wl.output_len else None
    prompt = LengthModel(pm or 512, (wl.prompt_len.p99 if wl.prompt_len else None) or (pm or 512) * 3, 4,
                         max_context or 32768)
    output = LengthModel(om or 256, (wl.output_len.p99 if wl.output_len else None) or (om or 256) * 3, 8, 8192)
    return prompt, output

