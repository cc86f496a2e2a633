"""What the learned scheduler's entropy feature costs the engine: one process, the prefix scheduler, the DSpark
markov drafter on SmolLM2-135M (bf16), passes alternating the drafter's per-position entropies off and on.

Usage: python benchmarks/entropy_cost.py [CONCURRENCY]   (default 8; prints decode tokens/s per pass and the ratio)
Needs `python cli.py models fetch smollm2-135m`.
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

    c = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    torch.set_num_threads(2)
    path = checkpoint_folder("smollm2-135m")
    target = load_model(path, "cpu", "bf16")
    tok = Tokenizer.load(path, target.arch.eos_ids)
    cfg = EngineConfig(device="cpu")
    cfg.model.path, cfg.weights.dtype, cfg.model.max_seq_len = str(path), "bf16", 1024
    cfg.drafter.method, cfg.spec.head, cfg.spec.scheduler, cfg.spec.block_size = "dspark", "markov", "prefix", 8
    cfg.batch.max_requests = c
    eng = Engine(cfg, target=target, tokenizer=tok)
    records = load_prompts(ROOT / "benchmarks" / "prompts" / "heldout_code.jsonl")
    prompts = [tok.encode(r.prompt)[-256:] for r in records][:8]
    sp = SamplingParams(max_new_tokens=64, ignore_eos=True)
    eng.generate(prompts[:2], sp)  # warm-up
    rates: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(4):
        for flag in (False, True) if rep % 2 == 0 else (True, False):
            eng.drafter.want_entropy = flag  # type: ignore[union-attr]
            st = eng.generate(prompts, sp).stats
            rates[flag].append(st.decode_tokens_per_s)
            print(f"pass {rep} entropy {'on ' if flag else 'off'}: {st.decode_tokens_per_s:.1f} decode tok/s, "
                  f"tau {st.tau:.3f}", flush=True)
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"entropy on / off, medians: {on:.1f} / {off:.1f} = {on / off:.3f}")


if __name__ == "__main__":
    main()
