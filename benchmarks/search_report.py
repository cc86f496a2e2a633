"""Markdown for benchmarks/bench_search.py: the result tables and the RESULTS.md section writer."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
SECTION = "## Rule-guided search vs default sampler"
START, END = "<!-- bench_search:start -->", "<!-- bench_search:end -->"

if TYPE_CHECKING:
    from bench_search import CaseResult


def median_trials(hits: list[int | None], cap: int) -> float | None:
    """Median trials-to-target over seeds, a miss counting as beyond the cap; None if the median is a miss."""
    import statistics

    vals = [h if h is not None else cap + 1 for h in hits]
    m = statistics.median(vals)
    return None if m > cap else float(m)


def _fmt_median(m: float | None, cap: int) -> str:
    return f"not reached (>{cap})" if m is None else f"{m:g}"


def _ratio(rule: float | None, default: float | None, default_cap: int) -> tuple[str, float | None]:
    if rule is None:
        return "n/a", None
    if default is None:
        return f">{(default_cap + 1) / rule:.1f}", (default_cap + 1) / rule
    return f"{default / rule:.1f}", default / rule


def _hits(h: list[int | None]) -> str:
    return ", ".join("-" if x is None else str(x) for x in h)


def render(results: list[CaseResult], opts: argparse.Namespace, cmd: str, wall: float, head: str,
           grid: dict, polish: dict) -> str:
    pct = f"{opts.target * 100:g}%"
    lines = [
        f"Command: `{cmd}` (commit {head}; {wall / 60:.1f} min wall, {opts.jobs} processes).",
        "",
        "Score = simulated output tokens/s per GPU (`tuner.objective.SimulateEvaluator`, "
        f"{opts.requests or 'the tuner default of 6 x concurrency'} requests, each score the mean of the tuner's "
        f"two request samples, simulation seed {opts.sim_seed}), "
        "**0 when the configuration is infeasible or misses the "
        "workload's p99 TPOT or TTFT SLO** (single objective; the product's tuner is multi-objective with SLO "
        "constraints). Every method shares one memoised scorer per case.",
        "",
        f"Reference optimum: exhaustive grid {' x '.join(f'{k} {v}' for k, v in grid.items())} "
        "with speculation on, plus the speculation-off branch over the non-speculative axes; every other "
        "parameter at the engine default (dspark_core/config.py) and spec.markov_rank at the released drafters' "
        "256 (a checkpoint property, held there by every method). Then coordinate passes over every parameter the "
        "simulator reads, from the best grid point and again from the best point found inside the rule space, "
        "until a pass improves nothing; the optimum is the better of the two (values: "
        + "; ".join(f"{k} {v}" for k, v in polish.items())
        + "). kernel.*, fusion.*, attention.backend, memory.page_size and the other "
        "parameters of the spaces are not read by the simulator (checked on every evaluation), so they are not "
        "gridded.",
        "",
        f"Rule-guided: what `tune` runs over `space_from_plan(plan)`: the rules' preferred point as trial 0, the "
        f"coordinate screen of the main knobs from the best point so far (`tuner.design.screen`; deterministic, "
        f"so it is the same for every seed), then TPE with the tuner's settings (`tuner.study.make_sampler`: "
        f"multivariate, 8 start-up trials), cap {opts.rule_cap} trials. "
        f"Default: `TPESampler(seed=s)` with Optuna's default settings (the sampler `optuna.create_study()` "
        f"uses) over `unrestricted_space(plan)` plus every other parameter the simulator reads, on its full "
        f"registry domain, no warm start, cap {opts.default_cap} trials. Trials = trials until the best score so "
        f"far reaches {pct} of the optimum; median over seeds {list(opts.seeds)} (a miss counts as beyond the "
        "cap); ratio = default median / rule-guided median.",
        "",
        f"| case | optimum tok/s/GPU (grid only) | dims rules / default | rule-guided trials to {pct}: "
        f"median (per seed) | default sampler: median (per seed) | ratio | {pct} within 30 trials | ratio >= 3 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    met_30 = met_ratio = 0
    for r in results:
        rm = median_trials(r.rule_hits, opts.rule_cap)
        dm = median_trials(r.default_hits, opts.default_cap)
        rtxt, rval = _ratio(rm, dm, opts.default_cap)
        ok30 = rm is not None and rm <= 30
        okr = rval is not None and rval >= 3
        met_30 += ok30
        met_ratio += okr
        lines.append(
            f"| {r.name} | {r.optimum.value:,.0f} ({r.optimum.grid_value:,.0f}) | {r.rule_params} / {r.default_params} "
            f"| {_fmt_median(rm, opts.rule_cap)} ({_hits(r.rule_hits)}) | {_fmt_median(dm, opts.default_cap)} "
            f"({_hits(r.default_hits)}) | {rtxt} | {'yes' if ok30 else 'no'} | {'yes' if okr else 'no'} |")
    lines += ["", f"Targets met: {pct} within 30 trials on {met_30}/{len(results)} cases; ratio >= 3 on "
              f"{met_ratio}/{len(results)} cases (the issue asks for both on at least 6).", ""]
    lines += ["Where the optimum lies and what the rules exclude:", "",
              "| case | optimum configuration | rule-space exclusions | best found inside the rule space "
              "(/ optimum) | best seen by any method / optimum | simulator runs | seconds |",
              "|---|---|---|---|---|---|---|"]
    for r in results:
        p = r.optimum.params
        where = ", ".join(f"{k}={p[k]}" for k in (
            "weights.dtype", "kv.dtype", "parallel.tp", "batch.max_requests", "spec.enabled", "spec.block_size",
            "spec.head", "spec.scheduler", "spec.max_verify_tokens", "spec.draft_layers"))
        frac = r.rule_space_best / r.optimum.value if r.optimum.value else 0.0
        lines.append(f"| {r.name} | {where} | {'; '.join(r.excluded) or 'none'} | {r.rule_space_best:,.0f} "
                     f"({frac:.3f}) | {r.seen_max / r.optimum.value if r.optimum.value else 0:.3f} | {r.evaluations} | "
                     f"{r.seconds:.0f} |")
    return "\n".join(lines) + "\n"


def render_seed(results: list[CaseResult], opts: argparse.Namespace, cmd: str, wall: float, head: str) -> str:
    """The rule-guided search on another simulator landscape: a compact table, one row per case."""
    pct = f"{opts.target * 100:g}%"
    lines = [f"Simulator seed {opts.sim_seed}: `{cmd}` (commit {head}; {wall / 60:.1f} min wall). Same scorer, "
             "grid and polish as the table above, on other request samples, so every case has its own optimum.", "",
             f"| case | optimum tok/s/GPU | optimum configuration | rule-guided trials to {pct} (per seed) "
             "| within 30 trials |", "|---|---|---|---|---|"]
    met = 0
    for r in results:
        rm = median_trials(r.rule_hits, opts.rule_cap)
        ok = rm is not None and rm <= 30
        met += ok
        p = r.optimum.params
        where = ", ".join(f"{k.split('.')[-1]}={p[k]}" for k in (
            "weights.dtype", "parallel.tp", "batch.max_requests", "spec.block_size", "spec.head", "spec.scheduler",
            "spec.max_verify_tokens", "spec.draft_layers"))
        lines.append(f"| {r.name} | {r.optimum.value:,.0f} | {where} | {_fmt_median(rm, opts.rule_cap)} "
                     f"({_hits(r.rule_hits)}) | {'yes' if ok else 'no'} |")
    lines += ["", f"Within 30 trials at simulator seed {opts.sim_seed}: {met}/{len(results)} cases."]
    return "\n".join(lines)


def write_section(body: str, path: Path = RESULTS) -> None:
    """Replace (or append) this benchmark's section of RESULTS.md, leaving other sections untouched."""
    block = f"{SECTION}\n\n{START}\n{body}{END}\n"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        head = head.rstrip()
        if head.endswith(SECTION):
            head = head[: -len(SECTION)].rstrip()
        new = f"{head}\n\n{block}" + (f"\n{tail}" if tail else "")
    else:
        new = text.rstrip("\n") + "\n\n" + block
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(new)
    os.replace(tmp, path)


def excluded_by_rules(case: Any, opt_params: dict[str, Any]) -> list[str]:
    """Optimum values the rule-guided space cannot produce and that cost score, with the rules responsible."""
    from optuna.distributions import CategoricalDistribution

    out = []
    s, plan = case.rule_space, case.plan
    for k, v in opt_params.items():
        if k in s.distributions:
            d = s.distributions[k]
            if isinstance(d, CategoricalDistribution):
                inside, near = v in d.choices, list(d.choices)
            else:
                inside, near = d.low <= v <= d.high, [min(max(v, d.low), d.high)]
            if not inside and max(case.scorer({**opt_params, k: n}) for n in near) < case.scorer(opt_params):
                out.append(f"{k}={v} outside {_dist_text(d)} ({', '.join(plan.space[k].rules)})")
        else:
            have = s.fixed.get(k, s.defaults.get(k))
            if have != v and case.scorer({**opt_params, k: have}) < case.scorer(opt_params):
                src = plan.fixed.get(k) or plan.prefer.get(k)
                by = f"rules {', '.join(src.rules)}" if src is not None else "engine default"
                out.append(f"{k}={v} but {'fixed' if k in s.fixed else 'not searched'} at {have} ({by})")
    return out


def _dist_text(d) -> str:
    from optuna.distributions import CategoricalDistribution

    if isinstance(d, CategoricalDistribution):
        return "{" + ", ".join(map(str, d.choices)) + "}"
    return f"[{d.low}, {d.high}]"


def case_line(r: CaseResult, opts: argparse.Namespace) -> str:
    """One line per finished case, so a long run shows its results as they come."""
    if not r.optimum.value:
        return f"{r.name}: no configuration meets the workload's SLOs (every score is 0): nothing to search for"
    return (f"{r.name}: optimum {r.optimum.value:,.0f}, inside rules {r.rule_space_best / r.optimum.value:.3f}; "
            f"trials to {opts.target:g}: rules {r.rule_hits}, default {r.default_hits} ({r.seconds:.0f} s)")
