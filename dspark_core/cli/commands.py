"""Engine commands: `build-tiny`, `bench`, `generate` (part 2's are in commands_dspark.py).

Heavy libraries (torch, transformers) are imported inside the commands, so `--help` stays fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from dspark_core.errors import DSparkError

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="Engine config (dspark.yaml); default: built-in.")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Target checkpoint: a folder, a fetched model "
                                              "(smollm2-135m: `models fetch`) or a cached model id; default: the "
                                              "config's (the tiny reference target).")]


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _config(path: Path | None, model: str | None = None, dtype: str | None = None):  # noqa: ANN202 - EngineConfig
    """The engine config of --config, with --model / --dtype in place of its target and weight dtype. A model other
    than the tiny target has no default drafter: its speculative methods need drafter.path in --config."""
    from dspark_core.config import EngineConfig, load_config
    from dspark_core.modeling.checkpoint import checkpoint_folder

    cfg = load_config(path) if path else EngineConfig()
    if model:
        cfg.model.path = str(checkpoint_folder(model))
    if dtype:
        cfg.weights.dtype = dtype  # type: ignore[assignment]  # checked by the loader
    if cfg.weights.dtype == "fastest":
        from dspark_core.modeling.dtype_choice import fastest_dtype

        cfg.weights.dtype, line = fastest_dtype(cfg)  # type: ignore[assignment]
        typer.echo(line, err=True)
    return cfg


def build_tiny_cmd(
    out: Annotated[Path, typer.Option(help="Output folder (target/ and draft/ inside).")] = Path(
        "dspark_core/assets/tiny"),
    target_steps: Annotated[int, typer.Option(min=1, help="Optimizer steps for the target.")] = 900,
    draft_steps: Annotated[int, typer.Option(min=1, help="Optimizer steps for the draft model.")] = 500,
    kd_steps: Annotated[int, typer.Option(min=0, help="Distillation steps of the draft towards the target.")] = 400,
    seed: Annotated[int, typer.Option(help="Seed of data order and initialisation.")] = 0,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads (1 is fastest on busy cores).")] = 1,
    json_out: JsonFlag = False,
) -> None:
    """Train the reference tokenizer, tiny Qwen3 target and AR draft model on the standard library's sources."""
    from dataclasses import asdict

    from rich.console import Console

    from dspark_core.training.build_tiny import build_tiny

    rep = build_tiny(out, target_steps=target_steps, draft_steps=draft_steps, kd_steps=kd_steps, seed=seed,
                     threads=threads)
    if json_out:
        _print_json(asdict(rep))
        return
    c = Console()
    c.print(f"[bold]tiny models[/] in {rep.out}  ({rep.seconds:.0f} s, {rep.files} stdlib files, "
            f"{rep.train_tokens:,} train / {rep.heldout_tokens:,} held-out tokens)")
    c.print(f"target: {rep.target_params:,} params, held-out loss {rep.target_heldout_loss:.3f} nats/token")
    c.print(f"draft:  {rep.draft_params:,} params, held-out loss {rep.draft_heldout_loss:.3f} nats/token, "
            f"argmax agreement with the target {rep.draft_agreement:.3f}")


def bench_cmd(
    prompts: Annotated[Path, typer.Option(help="JSONL prompt file ({\"prompt\": ...} per line).")],
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Tokens to generate per prompt.")] = 64,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy (lossless check on).")] = 0.0,
    methods: Annotated[str, typer.Option(help="Comma-separated methods (plain, hf_assisted, hf_prompt_lookup, "
                                              "ar_draft, ngram, dflash, dspark_markov, dspark_rnn, "
                                              "NAME/scheduler; suffix and hybrids: NAME~corpus "
                                              "with the target's frozen corpus, ~nocorpus without).")] = (
        "plain,hf_assisted,ar_draft,ngram"),
    repeats: Annotated[int, typer.Option(min=1, help="Timed interleaved passes per method.")] = 3,
    block_size: Annotated[int | None, typer.Option(min=1, max=16, help="spec.block_size override.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight for engine methods.")] = 1,
    limit: Annotated[int | None, typer.Option(min=1, help="Use only the first N prompts.")] = None,
    max_prompt_tokens: Annotated[int, typer.Option(min=1, help="Keep the last N tokens of each prompt.")] = 256,
    threads: Annotated[int | None, typer.Option(min=1, help="torch CPU threads (default: torch's).")] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed (request i uses seed + i).")] = 0,
    config: ConfigOpt = None,
    model: ModelOpt = None,
    dtype: Annotated[str | None, typer.Option(help="Weight dtype: fp32, bf16, fp16, fp8, ... (default: the "
                                                   "config's; auto = fp32 on a CPU).")] = None,
    record_acceptance: Annotated[bool, typer.Option("--record-acceptance", help="Write the verify_all DSpark rows' "
                                                    "acceptance beside their committed drafters (acceptance.json), "
                                                    "and n-gram's, suffix's and the hybrid's beside the target's "
                                                    "assets (acceptance_methods.json); `profile` reads both.")] = False,
    compile_steps: Annotated[bool | None, typer.Option("--compile/--no-compile", help="Decode / verify steps "
                                                       "through torch.compile (default: the config's).")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Compare generation methods on the same prompts: tokens/s, speedup, tau, acceptance, losslessness."""
    from dspark_core.cli.prompts import load_prompts

    records = load_prompts(prompts, limit)  # a bad file is one line before torch loads
    import torch
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from dspark_core.cli.bench import BenchSpec, build_methods, device_name, report, run_bench
    from dspark_core.modeling.checkpoint import load_model
    from dspark_core.modeling.tokenizer import Tokenizer
    from dspark_core.verification.sampling import SamplingParams

    if threads:
        torch.set_num_threads(threads)
    cfg = _config(config, model, dtype)
    if compile_steps is not None:
        cfg.compile = compile_steps
    # the bench times serving with every shape compiled: the methods share one target and its compiled step, so one
    # compile budget would run the last method's new shapes (and their SPS probes) eager on a cold disk cache
    cfg.compile_budget_s = float("inf")
    names = [m.strip() for m in methods.split(",") if m.strip()]
    if not names:
        raise DSparkError("--methods is empty; name at least one method, e.g. plain,ar_draft")
    target = load_model(cfg.model.path, cfg.device, cfg.weights.dtype)
    tok = Tokenizer.load(cfg.model.tokenizer or cfg.model.path, target.arch.eos_ids)
    ids = [tok.encode(r.prompt)[-max_prompt_tokens:] for r in records]
    bad = [i for i, x in enumerate(ids) if not x]
    if bad:
        raise DSparkError(f"{prompts}: prompt on line {bad[0] + 1} encodes to no tokens; remove it")
    sp = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    spec = BenchSpec(prompts=ids, methods=names, sampling=sp, repeats=repeats, concurrency=concurrency,
                     block_size=block_size)
    built = build_methods(spec, cfg, target, tok)
    err = Console(stderr=True)
    with Progress(console=err, transient=True, disable=json_out) as progress:
        rows = run_bench(spec, built, progress)
    result = report(spec, rows, device_name(target), target)
    if record_acceptance:
        import shlex
        from collections import Counter

        from dspark_core.cli.acceptance_record import record_acceptance as record

        domain = Counter(r.domain or "mixed" for r in records).most_common(1)[0][0]
        command = "python cli.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        result["acceptance_recorded"] = [str(p) for p in record(result, cfg, domain, command)]
    if json_out:
        _print_json(result)
        return
    table = Table(title=f"bench: {len(ids)} prompts x {max_new_tokens} tokens, T={temperature}, "
                        f"{repeats} repeats, {result['device']}")
    for col in ("method", "tokens/s", "speedup", "tau", "position acceptance", "lossless", "identical",
                "first divergence (prompt:pos, top-2 margin)"):
        table.add_column(col)
    for m in result["methods"]:
        acc = " ".join(f"{x:.2f}" for x in m["position_acceptance"])
        div = m.get("first_divergence")
        share = m.get("identical_share")
        table.add_row(m["name"], f"{m['tokens_per_s']:.1f}", f"{m['speedup']:.2f}x" if m["speedup"] else "-",
                      f"{m['tau']:.2f}" if m["tau"] else "-", acc or "-",
                      {True: "yes", False: "NO", None: "-"}[m["lossless"]],
                      f"{share:.0%}" if share is not None else "-",
                      f"{div['prompt']}:{div['position']}, {div['top2_margin']:.3f}" if div else "-")
    Console().print(table)
    for path in result.get("acceptance_recorded", []):
        Console().print(f"acceptance recorded -> {path}")


def generate_cmd(
    prompt: Annotated[list[str] | None, typer.Option("--prompt", help="Prompt text (repeatable).")] = None,
    prompts: Annotated[Path | None, typer.Option(help="JSONL prompt file instead of --prompt.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(min=1, help="Override sampling.max_new_tokens.")] = None,
    temperature: Annotated[float | None, typer.Option(min=0.0, help="Override sampling.temperature.")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch CPU threads (default: torch's).")] = None,
    config: ConfigOpt = None,
    model: ModelOpt = None,
    json_out: JsonFlag = False,
) -> None:
    """Run the engine on prompts with a dspark.yaml and print the outputs and stats."""
    from dspark_core.cli.prompts import load_prompts

    texts = list(prompt or [])
    if prompts:
        texts += [r.prompt for r in load_prompts(prompts)]  # a bad file is one line before torch loads
    if not texts:
        raise DSparkError("no prompts; pass --prompt TEXT or --prompts FILE.jsonl")
    import torch
    from rich.console import Console

    from dspark_core.engine import Engine

    if threads:
        torch.set_num_threads(threads)
    cfg = _config(config, model)
    if model and not config:  # no drafter for another target in the built-in config
        cfg.drafter.method = "plain"
    sp = cfg.sampling.model_copy(update={k: v for k, v in {"max_new_tokens": max_new_tokens,
                                                             "temperature": temperature}.items() if v is not None})
    gen = Engine(cfg).generate(texts, sp)
    if json_out:
        _print_json({"outputs": [{"text": o.text, "token_ids": o.token_ids, "finish_reason": o.finish_reason}
                                 for o in gen.outputs], "stats": gen.stats.summary()})
        return
    c = Console()
    for t, o in zip(texts, gen.outputs, strict=True):
        c.rule()
        c.print(t, end="", markup=False, highlight=False, style="dim")
        c.print(o.text, markup=False, highlight=False)
    c.rule()
    c.print(gen.stats.summary())


def register(app: typer.Typer) -> None:
    """Add the engine commands to the root app (part 2's live in dspark_core.cli.commands_dspark)."""
    app.command("build-tiny")(build_tiny_cmd)
    app.command("bench")(bench_cmd)
    app.command("generate")(generate_cmd)
