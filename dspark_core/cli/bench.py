"""`bench`: methods run in one process on the same prompts, interleaved and repeated; one row per method.

Methods: `plain` (our runner, no speculation), `hf_assisted` (transformers' assisted generation with the
same target and the small draft model: the peer), `hf_prompt_lookup` (transformers' prompt lookup decoding),
`ar_draft` (our loop, same draft model), `ngram` (prompt lookup), `suffix` (suffix decoding), and part 2's DSpark
drafters by name: `dflash` (head none), `dspark_markov`, `dspark_rnn` (and `hybrid_dflash`, `hybrid_markov`,
`hybrid_rnn`: the same drafter or suffix decoding, per request and round), with an optional `/scheduler` suffix
(`dspark_markov/prefix`) and an optional `@block` suffix: a static block length (`dspark_markov@4`) or the learned
block-length policy (`dspark_markov/prefix@learned`, spec.gamma_policy_path from --config) or its logging mode
(`@explore`: a random block per round), and last an optional `%N` on DSpark and hybrid methods: drafting over the
N most frequent target tokens plus the context's (`drafter.draft_vocab`; `%0` the whole vocabulary, as before the
reduced one). Rows follow DESIGN.md section 3.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from dspark_core.config import EngineConfig, apply_params, drafter_path
from dspark_core.drafters.suffix_calibration import TREES
from dspark_core.errors import DSparkError
from dspark_core.stats import GenStats
from dspark_core.verification.sampling import SamplingParams

if TYPE_CHECKING:
    from dspark_core.modeling.model import LeanModel
    from dspark_core.modeling.tokenizer import Tokenizer

BASE_METHODS = ("plain", "hf_assisted", "ar_draft", "ngram")  # the part-1 methods, default selection
HF_METHODS = ("hf_assisted", "hf_prompt_lookup")  # transformers' generate: assisted with the AR draft / prompt lookup
HF_PROMPT_LOOKUP_TOKENS = 10  # prompt_lookup_num_tokens: the value transformers' documentation suggests
HEADS = {"dflash": "none", "dspark_markov": "markov", "dspark_rnn": "rnn"}  # DSpark method -> spec.head
HYBRIDS = {f"hybrid_{k.removeprefix('dspark_')}": v for k, v in HEADS.items()}  # DSpark + suffix, per round
SCHEDULERS = ("verify_all", "threshold", "prefix", "async_topk", "learned")  # valid `/scheduler` suffixes


def method_params(name: str, config: EngineConfig) -> dict[str, Any]:
    """Engine parameters of an engine-backed method name; DSparkError for an unknown one."""
    full, _, corpus = name.partition("~")
    named, _, vocab = full.partition("%")
    rest, _, gamma = named.partition("@")
    if vocab and not (vocab.isdigit() and int(vocab) <= 1 << 20):
        raise DSparkError(f"method {name!r}: draft-vocabulary suffix {vocab!r} must be a token count (0 = all)")
    base, _, sched = rest.partition("/")
    if gamma and gamma not in ("learned", "explore") and not (gamma.isdigit() and 1 <= int(gamma) <= 16):
        raise DSparkError(f"method {name!r}: block suffix {gamma!r} must be 1..16, 'learned' or 'explore'")
    if gamma and base not in HEADS:
        raise DSparkError(f"method {name!r}: a block suffix applies to DSpark methods ({', '.join(HEADS)})")
    if vocab and base not in (*HEADS, *HYBRIDS):
        raise DSparkError(f"method {name!r}: a %draft-vocabulary suffix applies to DSpark and hybrid methods")
    if corpus and (corpus not in ("corpus", "nocorpus") or base not in ("suffix", *HYBRIDS)):
        raise DSparkError(f"method {name!r}: a ~ suffix is ~corpus or ~nocorpus (suffix decoding with the target's "
                          "committed frozen corpus, or without one), for suffix and hybrid methods")
    if sched and sched not in SCHEDULERS:
        raise DSparkError(f"method {name!r}: unknown scheduler {sched!r}; use one of {', '.join(SCHEDULERS)}")
    if base == "plain":
        params: dict[str, Any] = {"drafter.method": "plain"}
    elif base == "ar_draft":
        params = {"drafter.method": "ar_draft"}
    elif base in ("ngram", "suffix"):
        params = {"drafter.method": base}
    elif base in HEADS:
        params = {"drafter.method": "dspark", "spec.head": HEADS[base], "drafter.path": None}
    elif base in HYBRIDS:
        params = {"drafter.method": "hybrid", "spec.head": HYBRIDS[base], "drafter.path": None}
    else:
        known = ", ".join(dict.fromkeys([*BASE_METHODS, *HF_METHODS, "suffix", *HEADS, *HYBRIDS]))
        raise DSparkError(f"unknown bench method {name!r}; choose from {known} (DSpark ones may add /scheduler)")
    if sched:
        params["spec.scheduler"] = sched
    if vocab:
        params["drafter.draft_vocab"] = int(vocab)
    if corpus:
        params["drafter.suffix_corpus"] = "auto" if corpus == "corpus" else "none"
    if gamma in ("learned", "explore"):
        params["spec.gamma_policy"] = gamma
    elif gamma:
        params["spec.block_size"] = int(gamma)
    return params


def committed_policy_paths(cfg: EngineConfig) -> EngineConfig:
    """A learned choice (`/learned`, `@learned`) with no policy file in the config takes the one committed beside
    the model's drafters for this device, dtype and head (`policy_<hw>_<dtype>_<head>.json`,
    `gamma_<hw>_<dtype>_<head>.json`), as `profile` finds them; with none committed the engine says which to train."""
    from dspark_core.config import committed_assets
    from dspark_core.modeling.checkpoint import resolve_device

    root = committed_assets(cfg.model.path)
    if root is None or resolve_device(cfg.device) != "cpu":  # GPU policies are named by the GPU, which a bench
        return cfg  # here cannot tell: give --config with spec.policy_path there
    dtype = {"auto": "fp32"}.get(cfg.weights.dtype, cfg.weights.dtype)  # auto on a CPU runs fp32
    for flag, key, prefix in (("scheduler", "policy_path", "policy"), ("gamma_policy", "gamma_policy_path", "gamma")):
        path = root / f"{prefix}_cpu_{dtype}_{cfg.spec.head}.json"
        if getattr(cfg.spec, flag) == "learned" and not getattr(cfg.spec, key) and path.is_file():
            setattr(cfg.spec, key, str(path))
    return cfg


class Method(Protocol):
    """A generation method under test."""

    name: str

    def run(self, prompts: list[list[int]], sp: SamplingParams) -> tuple[list[list[int]], GenStats]:
        """Generate for every prompt; (token ids per prompt without EOS, stats with wall seconds)."""
        ...


@dataclass
class EngineMethod:
    """Our engine with one configuration; the target model object is shared between methods."""

    name: str
    config: EngineConfig
    target: LeanModel
    tokenizer: Tokenizer
    engine: Any = None

    def __post_init__(self) -> None:
        from dspark_core.engine import Engine

        self.engine = Engine(self.config, target=self.target, tokenizer=self.tokenizer)

    def run(self, prompts: list[list[int]], sp: SamplingParams) -> tuple[list[list[int]], GenStats]:
        gen = self.engine.generate(prompts, sp)
        gen.stats.method = self.name
        return [o.token_ids for o in gen.outputs], gen.stats


@dataclass
class HFAssistedMethod:
    """transformers `generate` one prompt at a time (its assisted generation takes batch size 1): with
    `assistant_model` (its default assistant schedule) or, when `prompt_lookup` is set, with
    `prompt_lookup_num_tokens` (its n-gram prompt lookup, no draft model)."""

    name: str
    target_path: str
    draft_path: str | None
    eos: set[int]
    dtype: str = "fp32"  # fp32 | bf16: the same precision as our methods in the run
    prompt_lookup: int | None = None  # prompt_lookup_num_tokens (None = assisted generation with the draft)
    model: Any = None
    assistant: Any = None

    def __post_init__(self) -> None:
        import torch
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        dt = torch.bfloat16 if self.dtype == "bf16" else torch.float32
        self.model = transformers.AutoModelForCausalLM.from_pretrained(self.target_path, dtype=dt).eval()
        if self.prompt_lookup is None:
            assert self.draft_path is not None
            self.assistant = transformers.AutoModelForCausalLM.from_pretrained(self.draft_path, dtype=dt).eval()

    def run(self, prompts: list[list[int]], sp: SamplingParams) -> tuple[list[list[int]], GenStats]:
        import torch

        stats = GenStats(method=self.name, requests=len(prompts))
        outs: list[list[int]] = []
        kwargs: dict[str, Any] = {"do_sample": False}
        if not sp.greedy:
            kwargs = {"do_sample": True, "temperature": sp.temperature, "top_k": sp.top_k or None,
                      "top_p": sp.top_p}
        eos = None if sp.ignore_eos else sorted(self.eos)
        t0 = time.perf_counter()
        for i, ids in enumerate(prompts):
            if not sp.greedy:
                torch.manual_seed(sp.seed + i)
            inp = torch.tensor([ids])
            with torch.inference_mode():
                spec = ({"prompt_lookup_num_tokens": self.prompt_lookup} if self.prompt_lookup is not None
                        else {"assistant_model": self.assistant})
                out = self.model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=sp.max_new_tokens,
                                          eos_token_id=eos, pad_token_id=sorted(self.eos)[0] if self.eos else 0,
                                          **spec, **kwargs)
            new = out[0, len(ids) :].tolist()
            if not sp.ignore_eos:
                cut = [j for j, t in enumerate(new) if t in self.eos]
                new = new[: cut[0]] if cut else new
            outs.append(new)
            stats.generated_tokens += len(new)
        stats.seconds = time.perf_counter() - t0
        return outs, stats


@dataclass
class Row:
    """Accumulated measurements of one method."""

    name: str  # method name
    seconds: float = 0.0  # timed wall seconds over all repeats
    tokens: int = 0  # generated tokens over all repeats
    decode_s: float = 0.0  # decode-round seconds over all repeats (engine methods; 0 for the HF ones)
    round_tokens: int = 0  # tokens those rounds committed
    full_s: float = 0.0  # seconds of the decode rounds with every batch slot busy
    full_tokens: int = 0  # tokens those rounds committed
    mixed_s: float = 0.0  # seconds of the decode rounds that also prefilled admitted requests
    stats: GenStats | None = None  # stats of the first repeat (tau, acceptance: deterministic under greedy)
    suffix_sources: list[int] | None = None  # suffix by tree (own, global, corpus) over the timed passes:
    # proposals [0:3], drafts verified [3:6], their accepted tokens [6:9]
    proposers: dict[str, list[int]] = field(default_factory=dict)  # a hybrid's proposer -> [drafts, proposed,
    # verified, accepted] over the timed passes
    outputs: list[list[int]] = field(default_factory=list)  # outputs of the first repeat

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per timed second."""
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens per second of decode rounds, prefill left out (None where the method has no rounds: HF's)."""
        return self.round_tokens / self.decode_s if self.decode_s else None

    @property
    def full_tokens_per_s(self) -> float | None:
        """Tokens per second of the rounds with every slot busy (None where there were none)."""
        return self.full_tokens / self.full_s if self.full_s else None


@dataclass
class BenchSpec:
    """What to run."""

    prompts: list[list[int]]  # token ids per prompt
    methods: list[str]  # method names, in the order rows are printed
    sampling: SamplingParams  # max_new_tokens, temperature, ...
    repeats: int = 3  # timed passes per method, interleaved
    concurrency: int = 1  # requests in flight (engine batch slots); hf_assisted always runs one at a time
    block_size: int | None = None  # spec.block_size override (None = the config's)


def build_methods(spec: BenchSpec, config: EngineConfig, target: LeanModel, tokenizer: Tokenizer) -> list[Method]:
    """Instantiate every method once (loading weights is not timed)."""
    import torch

    from dspark_core.modeling.checkpoint import checkpoint_folder

    base = apply_params(config, {"batch.max_requests": spec.concurrency, "spec.enabled": True})
    if spec.block_size is not None:
        base = apply_params(base, {"spec.block_size": spec.block_size})
    need = max(len(p) for p in spec.prompts) + spec.sampling.max_new_tokens + 64
    if need > base.model.max_seq_len:
        base = apply_params(base, {"model.max_seq_len": need})
    methods: list[Method] = []
    hf_dtype = "bf16" if target.dtype == torch.bfloat16 else "fp32"
    for name in spec.methods:
        if name == "hf_assisted":
            draft = drafter_path(base, "ar_draft")
            if not draft:
                raise DSparkError("hf_assisted needs drafter.path (the small draft model); set it in the config")
            methods.append(HFAssistedMethod(name, str(checkpoint_folder(base.model.path)), draft,
                                            set(target.arch.eos_ids), hf_dtype))
        elif name == "hf_prompt_lookup":
            methods.append(HFAssistedMethod(name, str(checkpoint_folder(base.model.path)), None,
                                            set(target.arch.eos_ids), hf_dtype, prompt_lookup=HF_PROMPT_LOOKUP_TOKENS))
        else:
            cfg = committed_policy_paths(apply_params(base, method_params(name, base)))
            methods.append(EngineMethod(name, cfg, target, tokenizer))
    return methods


def run_bench(spec: BenchSpec, methods: list[Method], progress: Any = None) -> list[Row]:
    """Warm every method up, then `repeats` interleaved timed passes (method order rotates each pass). A compiled
    engine compiles its step shapes and its drafter's round first, as `serve` does at start-up, so the short run
    after it times no compilation: the hybrid prices DSpark's forward by the times it sees."""
    from dspark_core.engine_parts import warm_steps

    rows = {m.name: Row(m.name) for m in methods}
    warm = [spec.prompts[0][:32]]
    for m in methods:
        engine = getattr(m, "engine", None)
        if engine is not None and engine.target.compiled is not None:  # every batch shape compiled before timing
            rows_max = min(spec.concurrency, engine.config.batch.max_requests)
            line = warm_steps(engine, rows_max)
            if progress is not None:
                progress.console.print(f"{m.name}: {line}")
        m.run(warm, spec.sampling.model_copy(update={"max_new_tokens": min(8, spec.sampling.max_new_tokens)}))
    task = progress.add_task("bench", total=spec.repeats * len(methods)) if progress else None
    for rep in range(spec.repeats):
        order = methods[rep % len(methods) :] + methods[: rep % len(methods)]
        for m in order:
            drafter = getattr(getattr(m, "engine", None), "drafter", None)
            if drafter is not None:  # every pass replays the same prompts: none may draft from an earlier pass
                drafter.forget()
            before, src = _proposer_counts(drafter), _suffix_sources(drafter)
            outs, stats = m.run(spec.prompts, spec.sampling)
            row = rows[m.name]
            row.suffix_sources = [a + n - w for a, n, w in zip(row.suffix_sources or [0] * 9,
                                                              _suffix_sources(drafter), src, strict=True)]
            for who, now in _proposer_counts(drafter).items():
                was = before.get(who, [0, 0, 0, 0])
                row.proposers[who] = [a + n - w for a, n, w in zip(row.proposers.get(who, [0] * 4), now, was,
                                                                   strict=True)]
            row.seconds += stats.seconds
            row.tokens += stats.generated_tokens
            row.decode_s += stats.decode_s
            row.round_tokens += stats.round_tokens
            row.full_s += stats.full_s
            row.full_tokens += stats.full_tokens
            row.mixed_s += stats.mixed_s
            if row.stats is None:
                row.stats, row.outputs = stats, outs
            if progress:
                progress.update(task, advance=1)
    return [rows[m.name] for m in methods]


def _suffix_sources(drafter: Any) -> list[int]:
    """Suffix decoding's counts so far by tree (the request's own, the global one, the frozen corpus), for a suffix
    drafter or a hybrid's: proposals, drafts verified, their accepted tokens; zeros for others."""
    from dspark_core.drafters.suffix import suffix_stats

    st = suffix_stats(drafter)
    if st is None:
        return [0] * 9
    return [st.from_request, st.from_global, st.from_corpus, *st.taken, *st.accepted]


def _proposer_counts(drafter: Any) -> dict[str, list[int]]:
    """A combining drafter's running counts per proposer (drafts, proposed, verified, accepted); {} for others."""
    from dataclasses import astuple

    return {who: list(astuple(c)) for who, c in (getattr(drafter, "proposers", None) or {}).items()}


def report(spec: BenchSpec, rows: list[Row], device: str, target: LeanModel | None = None) -> dict[str, Any]:
    """The bench JSON (DESIGN.md section 3). `lossless` is true only for token-identical greedy outputs; with
    `target`, every method also gets `identical_share` and its `first_divergence` (dspark_core/cli/identity.py)."""
    from dataclasses import asdict

    from dspark_core.cli.identity import identity

    plain = next((r for r in rows if r.name == "plain"), None)
    out_methods = []
    for r in rows:
        st = r.stats
        lossless: bool | None = None
        extra: dict[str, Any] = {}
        if spec.sampling.greedy and plain is not None:
            lossless = r.outputs == plain.outputs
            if target is not None and r is not plain:
                share, div = identity(target, spec.prompts, plain.outputs, r.outputs)
                extra = {"identical_share": round(share, 4), "first_divergence": asdict(div) if div else None}
        speculative = st is not None and st.rounds > 0 and r.name not in ("plain", *HF_METHODS)
        out_methods.append({
            "name": r.name,
            "tokens_per_s": round(r.tokens_per_s, 2),
            "speedup": round(r.tokens_per_s / plain.tokens_per_s, 3) if plain and plain.tokens_per_s else None,
            "decode_tokens_per_s": round(r.decode_tokens_per_s, 2) if r.decode_tokens_per_s else None,
            "decode_speedup": round(r.decode_tokens_per_s / plain.decode_tokens_per_s, 3)
            if plain and r.decode_tokens_per_s and plain.decode_tokens_per_s else None,
            # rounds with all `concurrency` slots busy: the speed under sustained load, without the closed batch's
            # tail of a few requests finishing alone
            "full_batch_tokens_per_s": round(r.full_tokens_per_s, 2) if r.full_tokens_per_s else None,
            "full_batch_speedup": round(r.full_tokens_per_s / plain.full_tokens_per_s, 3)
            if plain and r.full_tokens_per_s and plain.full_tokens_per_s else None,
            "tau": round(st.tau, 4) if speculative and st else (1.0 if r.name == "plain" else None),
            "position_acceptance": [round(x, 4) for x in st.position_acceptance] if speculative and st else [],
            "lossless": lossless,
            "verify_tokens_per_step": round(st.verify_tokens_per_step, 3) if st and st.steps else None,
            # requests a decode step ran on average, and the ms of its verify forward (with the verdicts): what a
            # verified token costs at this load, and how full a speculative method kept the batch (first pass)
            "requests_per_step": round(st.rounds / st.steps, 3) if st and st.steps else None,
            "verify_ms_per_step": round(1e3 * st.verify_s / st.steps, 3) if st and st.steps else None,
            # the drafter's host time (propose + scheduler) per decode step and its share of the decode time
            "draft_ms_per_step": round(1e3 * st.draft_s / st.steps, 3) if speculative and st and st.steps else None,
            "draft_share": round(st.draft_s / st.decode_s, 4) if speculative and st and st.decode_s else None,
            "generated_tokens": r.tokens,
            "seconds": round(r.seconds, 3),
            **({"time_split": time_split(r)} if r.decode_s else {}),
            # a hybrid's rounds per proposer over the timed passes: request rounds it drafted, and its tokens'
            # acceptance (accepted / proposed) and accepted tokens per drafted round
            **({"proposers": {who: {"drafts": d, "proposed": p, "verified": v, "accepted": a,
                                    "acceptance": round(a / p, 4) if p else None,
                                    "accepted_per_draft": round(a / d, 3) if d else None}
                              for who, (d, p, v, a) in r.proposers.items()}} if r.proposers else {}),
            # suffix decoding by tree: its proposals, and the drafts verified (a hybrid's: those it took) with their
            # accepted tokens
            **({"suffix_sources": dict(zip(TREES, r.suffix_sources[:3], strict=True)),
                "suffix_taken": {t: {"drafts": d, "accepted": a, "accepted_per_draft": round(a / d, 3) if d else None}
                                 for t, d, a in zip(TREES, r.suffix_sources[3:6], r.suffix_sources[6:], strict=True)}}
               if r.suffix_sources and any(r.suffix_sources) else {}),
            **extra,
        })
    return {"device": device, "prompts": len(spec.prompts), "max_new_tokens": spec.sampling.max_new_tokens,
            "temperature": spec.sampling.temperature, "repeats": spec.repeats, "concurrency": spec.concurrency,
            "block_size": spec.block_size, "methods": out_methods}


def time_split(r: Row) -> dict[str, float]:
    """Where an engine method's timed seconds went: prefills run apart from a round, rounds that also prefilled
    admitted requests (the compiled mixed step), rounds with every slot busy, and the other rounds (a closed batch's
    tail, slots emptied by finished requests). Plain decoding admits a wave of equal-length requests in one prefill
    where a speculative method's requests finish apart and are replaced one at a time inside rounds, so this shows
    what a whole-run ratio is made of."""
    other = r.decode_s - r.mixed_s - r.full_s
    return {"prefill_s": round(r.seconds - r.decode_s, 3), "mixed_rounds_s": round(r.mixed_s, 3),
            "full_rounds_s": round(r.full_s, 3), "other_rounds_s": round(max(0.0, other), 3)}


def device_name(target: LeanModel) -> str:
    """Human-readable device of the run."""
    import torch

    if target.device.type == "cuda":
        return torch.cuda.get_device_name(target.device)
    return f"cpu ({torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)"
