"""What a DSpark drafter round costs on the real target, part by part, eager against compiled (issue 41: the
drafter's forward through torch.compile), side by side in one process.

The committed SmolLM2-135M drafter (bf16, its reduced draft vocabulary) holds `--rows` requests' contexts: each a
held-out chat prompt run through the target, its hidden states written into the drafter. Then, interleaved, each
`--repeats` times (medians, ms):
  - `propose`, eager backbone against compiled (drafters/dspark_compiled.py);
  - the backbone alone (`block_states`, against `dspark_compiled.states`);
  - the greedy drafting loop: the general one (`DSparkDraftModel._general`, what every round ran before) against
    the all-greedy one (`_greedy`: one W2 matrix over the round's columns);
  - `propose` compiled with drafting stopped at survival `--stop` (the engine's prefix scheduler passes its
    `grid_costs.survival_floor`: a median 0.0155 at 8 requests on chat), and the positions it drafted.

    python benchmarks/drafter_round.py [--rows 8] [--block 8] [--repeats 30] [--threads 2] [--stop 0.0155] [--json]

Needs `python cli.py models fetch smollm2-135m`. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from results_md import check_ranges  # noqa: E402 - after the path it lives on


def run(rows: int, block: int, repeats: int, threads: int, stop: float) -> dict[str, Any]:
    import torch

    from benchmarks.round_trace import real_target
    from dspark_core.drafters.base import DraftRequest
    from dspark_core.drafters.dspark_compiled import states
    from dspark_core.drafters.dspark_runtime import build_runtime
    from dspark_core.modeling.cpu_linear import apply_kernel
    from dspark_core.verification.sampling import SamplingParams

    cfg, target, _, ids = real_target(ROOT / "benchmarks" / "prompts" / "heldout_chat.jsonl", rows)
    torch.set_num_threads(threads)
    kernel = apply_kernel(target, cfg.weights.cpu_kernel)
    cfg.drafter.method = "dspark"  # type: ignore[assignment]
    cfg.spec.block_size = block
    drafter = build_runtime(cfg, target)
    m = drafter.model
    reqs = []
    with torch.inference_mode():
        for slot, prompt in enumerate(ids):
            _, hidden = target.forward_full(torch.tensor([prompt]), hidden_layers=drafter.hidden_layers)
            drafter.reset(slot, prompt[:-1], hidden[0, :-1])
            reqs.append(DraftRequest(slot=slot, tokens=prompt, gamma=block, sampling=SamplingParams()))
    slots, lens = list(range(len(reqs))), [len(p) - 1 for p in ids]
    anchors = torch.tensor([p[-1] for p in ids])
    pos = torch.tensor(lens)
    g = max(block, m.cfg.block_size)
    cols = None if drafter.vocab is None else drafter.vocab.columns([(r.slot, r.tokens) for r in reqs])
    sampling = [r.sampling for r in reqs]

    def propose(compiled: bool, floor: float = 0.0) -> Any:
        drafter.compiled, drafter.stop_below = compiled, floor
        return drafter.propose(reqs)

    def backbone_eager() -> Any:
        lmax = max(lens)
        valid = torch.arange(lmax)[None] < pos[:, None]
        return m.block_states(anchors, pos, drafter._ctx(slots, lmax), valid, g)

    with torch.inference_mode():
        blk = m.block_out(states(m, anchors, pos, slots, lens, drafter.kbuf, drafter.vbuf, g)[:, :block], cols)
        cases = {
            "propose_eager": lambda: propose(False),
            "propose_compiled": lambda: propose(True),
            "propose_compiled_stopped": lambda: propose(True, stop),
            "backbone_eager": backbone_eager,
            "backbone_compiled": lambda: states(m, anchors, pos, slots, lens, drafter.kbuf, drafter.vbuf, g),
            "loop_general": lambda: m._general(blk, anchors, sampling, None, block, False, cols),
            "loop_greedy": lambda: m._greedy(blk, anchors, block, cols),
        }
        for f in cases.values():  # compile and warm every case first
            f()
            f()
        same = torch.equal(cases["loop_general"]().tokens, cases["loop_greedy"]().tokens)
        drafted = max(propose(True, stop).num)
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(repeats):
            for name, f in cases.items():
                t0 = time.perf_counter()
                f()
                times[name].append((time.perf_counter() - t0) * 1e3)
    med = {k: round(statistics.median(v), 3) for k, v in times.items()}
    return {"capability": torch.backends.cpu.get_cpu_capability(), "threads": threads, "rows": len(reqs),
            "block": block, "context": lens, "columns": None if cols is None else int(cols.ids.shape[0]),
            "linear_kernel": kernel, "ms": med, "loops_draft_the_same_tokens": same, "stop": stop,
            "drafted_when_stopped": drafted,
            "ratio": {"propose": round(med["propose_compiled"] / med["propose_eager"], 3),
                      "stopped": round(med["propose_compiled_stopped"] / med["propose_compiled"], 3),
                      "backbone": round(med["backbone_compiled"] / med["backbone_eager"], 3),
                      "loop": round(med["loop_greedy"] / med["loop_general"], 3)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--stop", type=float, default=0.0155)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    check_ranges("drafter_round", (("--stop", a.stop, 0.0, 0.999), ("--rows", a.rows, 1, 64),
                                   ("--block", a.block, 1, 16), ("--repeats", a.repeats, 1, 1000),
                                   ("--threads", a.threads, 1, 256)))
    out = run(a.rows, a.block, a.repeats, a.threads, a.stop)
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"capability {out['capability']}, {out['threads']} threads, {out['rows']} rows x block {out['block']}, "
          f"{out['columns']} columns, linears {out['linear_kernel']}")
    for k, v in out["ms"].items():
        print(f"  {k:20s} {v:8.3f} ms")
    print(f"  compiled / eager: propose {out['ratio']['propose']}, backbone {out['ratio']['backbone']}; "
          f"greedy / general loop {out['ratio']['loop']} (same tokens: {out['loops_draft_the_same_tokens']}); "
          f"stopped at {out['stop']} / whole block {out['ratio']['stopped']} ({out['drafted_when_stopped']} drafted)")


if __name__ == "__main__":
    main()
