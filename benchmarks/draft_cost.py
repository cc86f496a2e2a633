"""What a shorter block saves the DSpark drafter: host milliseconds per round spent drafting (propose + scheduler)
at block caps 8, 4 and 2, SmolLM2-135M in bf16 with its markov drafter, concurrency 1 and 8, one process, passes
alternating the caps (the groundwork of a learned gamma policy: what it could save per round).

Usage: python benchmarks/draft_cost.py   (needs `python cli.py models fetch smollm2-135m`)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
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
    for c in (1, 8):
        cfg = EngineConfig(device="cpu")
        cfg.model.path, cfg.weights.dtype, cfg.model.max_seq_len = str(path), "bf16", 1024
        cfg.drafter.method, cfg.spec.head, cfg.spec.block_size, cfg.batch.max_requests = "dspark", "markov", 8, c
        eng = Engine(cfg, target=target, tokenizer=tok)
        batch = (prompts * c)[: max(c, 2)]
        per_round: dict[int, list[float]] = {}
        for _ in range(3):
            for g in (8, 4, 2):
                eng.gamma_cap = g
                st = eng.generate(batch, sp).stats
                per_round.setdefault(g, []).append(st.draft_s / st.steps * 1e3)
        print(f"concurrency {c}: drafting ms per round, median of 3 passes: "
              + ", ".join(f"block {g}: {statistics.median(v):.1f}" for g, v in per_round.items()), flush=True)


if __name__ == "__main__":
    main()
