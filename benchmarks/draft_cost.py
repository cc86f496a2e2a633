"""What the DSpark drafter costs a round: host milliseconds spent drafting (propose + scheduler) at block caps 8, 4
and 2, over the whole vocabulary and over reduced draft vocabularies (`drafter.draft_vocab`: the N most frequent
target tokens plus the context's, drafters/draft_vocab.py), SmolLM2-135M in bf16 with its markov drafter,
concurrency 1 and 8, one process, passes alternating the settings.

Usage: python benchmarks/draft_cost.py [--vocab 0,4096,8192,16384] [--json]
       (needs `python cli.py models fetch smollm2-135m`; 0 = the whole vocabulary)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", default="0,8192", help="draft vocabularies to compare (0 = whole vocabulary)")
    ap.add_argument("--json", action="store_true", help="print the medians as JSON")
    args = ap.parse_args()
    try:
        sizes = [int(v) for v in args.vocab.split(",")]
    except ValueError:
        ap.error(f"--vocab {args.vocab!r}: give token counts separated by commas")
    import torch

    from dspark_core.cli.prompts import load_prompts
    from dspark_core.config import EngineConfig
    from dspark_core.engine import Engine
    from dspark_core.modeling.checkpoint import checkpoint_folder, load_model
    from dspark_core.modeling.tokenizer import Tokenizer
    from dspark_core.verification.sampling import SamplingParams

    torch.set_num_threads(2)
    path = checkpoint_folder("smollm2-135m")
    target = load_model(path, "cpu", "bf16")
    tok = Tokenizer.load(path, target.arch.eos_ids)
    records = load_prompts(ROOT / "benchmarks" / "prompts" / "heldout_code.jsonl")
    prompts = [tok.encode(r.prompt)[-256:] for r in records][:4]
    sp = SamplingParams(max_new_tokens=48, ignore_eos=True)
    out: dict[str, dict[str, float]] = {}
    print(f"capability {torch.backends.cpu.get_cpu_capability()}, 2 threads, bf16", flush=True)
    for c in (1, 8):
        engines = {}
        for v in sizes:
            cfg = EngineConfig(device="cpu")
            cfg.model.path, cfg.weights.dtype, cfg.model.max_seq_len = str(path), "bf16", 1024
            cfg.drafter.method, cfg.spec.head, cfg.spec.block_size, cfg.batch.max_requests = "dspark", "markov", 8, c
            cfg.drafter.draft_vocab = v
            engines[v] = Engine(cfg, target=target, tokenizer=tok)
        batch = (prompts * c)[: max(c, 2)]
        per_round: dict[str, list[float]] = {}
        for _ in range(3):
            for g in (8, 4, 2):
                for v, eng in engines.items():
                    eng.gamma_cap = g
                    st = eng.generate(batch, sp).stats
                    per_round.setdefault(f"block {g}, vocab {v or 'all'}", []).append(st.draft_s / st.steps * 1e3)
        out[f"concurrency {c}"] = {k: round(statistics.median(x), 2) for k, x in per_round.items()}
        if not args.json:
            print(f"concurrency {c}: drafting ms per round, median of 3 passes: "
                  + ", ".join(f"{k}: {m:.1f}" for k, m in out[f"concurrency {c}"].items()), flush=True)
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
