"""DSpark drafting that stops at the scheduler's survival floor against drafting whole blocks, side by side.

With the prefix (or async_topk) scheduler on a compiled CPU step, a greedy batch's DSpark loop ends once every row's
survival is below `grid_costs.survival_floor`: the packed schedule would verify none of the later drafts
(DSparkDraftModel._greedy's `stop`). This runs plain and each method's engine both ways, the floor on and off (off: the
scheduler's `draft_floor` answers 0), their passes over the same prompts rotated (compiled bf16 target, 128 new
tokens, greedy). Per method and mode: tok/s, x plain, tau, drafting ms a round and draft tokens proposed per
request round:

    python benchmarks/draft_stop.py [--prompts benchmarks/prompts/heldout_chat.jsonl] [--limit 64] \
        [--methods dspark_markov/prefix,hybrid_markov/prefix] [--concurrency 8] [--repeats 3] [--json]

Needs `python cli.py models fetch smollm2-135m`. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from results_md import check_ranges  # noqa: E402 - after the path it lives on
from round_trace import real_target  # noqa: E402


def run(prompts: Path, limit: int, methods: list[str], concurrency: int, repeats: int) -> dict[str, Any]:
    """Plain and `methods`, each one engine run with the floor on and off, `repeats` rotated passes over the
    prompts; per method and mode the summed tokens, seconds, rounds, drafting seconds and proposed drafts."""
    import torch

    from dspark_core.cli.bench import BenchSpec, build_methods
    from dspark_core.engine_parts import warm_steps
    from dspark_core.verification.sampling import SamplingParams

    cfg, target, tok, ids = real_target(prompts, limit)
    sp = SamplingParams(temperature=0.0, max_new_tokens=128, seed=0)
    spec = BenchSpec(prompts=ids, methods=["plain", *methods], repeats=repeats, concurrency=concurrency,
                     block_size=8, sampling=sp)
    engines = {m.name: m.engine for m in build_methods(spec, cfg, target, tok)}
    for eng in engines.values():  # every shape compiled before anything is timed
        eng.generate([ids[0][:32]], sp.model_copy(update={"max_new_tokens": 8}))
        warm_steps(eng, concurrency)
    runs = [("plain", True)] + [(name, stop) for name in methods for stop in (True, False)]
    keys = ("tokens", "seconds", "steps", "draft_s", "rounds", "proposed", "round_tokens")
    rows: dict[tuple[str, bool], dict[str, float]] = {r: dict.fromkeys(keys, 0.0) for r in runs}
    for rep in range(repeats):
        for name, stop in runs[rep % len(runs):] + runs[: rep % len(runs)]:
            eng = engines[name]
            if not stop:
                eng.scheduler.draft_floor = lambda requests: 0.0  # type: ignore[union-attr]
            elif "draft_floor" in vars(eng.scheduler):
                del eng.scheduler.draft_floor  # type: ignore[union-attr]
            if eng.drafter is not None:  # no pass may draft from an earlier pass's outputs
                eng.drafter.forget()
            st = eng.generate(ids, sp).stats
            row = rows[(name, stop)]
            for k, v in (("tokens", st.generated_tokens), ("seconds", st.seconds), ("steps", st.steps),
                         ("draft_s", st.draft_s), ("rounds", st.rounds), ("proposed", st.proposed),
                         ("round_tokens", st.round_tokens)):
                row[k] += v
    base = rows[("plain", True)]["tokens"] / rows[("plain", True)]["seconds"]
    out = []
    for (name, stop), r in rows.items():
        tps = r["tokens"] / r["seconds"]
        out.append({"method": name, "floor": stop if name != "plain" else None, "tokens_per_s": round(tps, 2),
                    "x_plain": round(tps / base, 3), "tau": round(r["round_tokens"] / max(r["rounds"], 1), 3),
                    "draft_ms_per_round": round(r["draft_s"] / max(r["steps"], 1) * 1e3, 3),
                    "proposed_per_request_round": round(r["proposed"] / max(r["rounds"], 1), 2)})
    return {"capability": torch.backends.cpu.get_cpu_capability(), "prompts_file": str(prompts), "prompts": len(ids),
            "concurrency": concurrency, "repeats": repeats, "max_new_tokens": 128, "rows": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=Path, default=ROOT / "benchmarks" / "prompts" / "heldout_chat.jsonl")
    ap.add_argument("--limit", type=int, default=64)
    ap.add_argument("--methods", default="dspark_markov/prefix,hybrid_markov/prefix")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    check_ranges("draft_stop", (("--limit", a.limit, 1, 10_000), ("--concurrency", a.concurrency, 1, 64),
                                ("--repeats", a.repeats, 1, 100)))
    if not a.prompts.is_file():
        print(f"draft_stop: --prompts {a.prompts} is not a file", file=sys.stderr)
        raise SystemExit(2)
    out = run(a.prompts, a.limit, [m for m in a.methods.split(",") if m], a.concurrency, a.repeats)
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"capability {out['capability']}, {out['prompts']} prompts of {a.prompts.name}, {a.concurrency} requests, "
          f"{a.repeats} passes each")
    for r in out["rows"]:
        mode = "" if r["floor"] is None else ("floor on" if r["floor"] else "floor off")
        print(f"{r['method']:<22} {mode:<9} {r['tokens_per_s']:8.2f} tok/s  {r['x_plain']:.3f}x plain  tau "
              f"{r['tau']:.2f}  drafting {r['draft_ms_per_round']:.2f} ms a round  "
              f"{r['proposed_per_request_round']:.1f} drafts a request round")


if __name__ == "__main__":
    main()
