#!/usr/bin/env python
"""The whole engine on a GPU, eager against compiled + CUDA graphs (issue 41): tokens/s and fp32 greedy identity.

The bundled tiny target (dspark_core/assets, fp32) generates for held-out prompts with plain decoding, n-gram and
the DSpark Markov drafter, at 1 and 4 requests, once with `compile: false` (the eager engine) and once with
`compile: true` (modeling/compiled.py: each decode / verify shape compiled and captured in a CUDA graph). Outputs
must be token-identical (fp32 greedy); the speedup is compiled tok/s over eager tok/s in the same run.

    python benchmarks/gpu_engine.py [--new-tokens 64] [--out F.md] [--json F.json]
    python benchmarks/gpu_engine.py --device cpu --methods plain --concurrency 1   # smoke test (inductor C++)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from dspark_core.cli.bench import method_params  # noqa: E402
from dspark_core.config import EngineConfig, SamplingParams, apply_params  # noqa: E402
from dspark_core.engine import Engine  # noqa: E402

PROMPTS = ROOT / "benchmarks" / "prompts" / "heldout_code.jsonl"


def prompts(n: int) -> list[str]:
    rows = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line.strip()]
    return rows[:n]


def run_one(method: str, compiled: bool, conc: int, texts: list[str], new: int, device: str) -> dict[str, Any]:
    cfg = EngineConfig(device=device)
    cfg.weights.dtype = "fp32"
    cfg.batch.max_requests = conc
    cfg.spec.block_size = 8
    cfg.compile = compiled
    cfg = apply_params(cfg, method_params(method, cfg))
    t0 = time.perf_counter()
    engine = Engine(cfg)
    sp = SamplingParams(max_new_tokens=new, temperature=0.0)
    engine.generate(texts[:conc], sp)  # warm: compiles / captures the shapes a run meets
    warm_s = time.perf_counter() - t0
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    gen = engine.generate(texts, sp)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    wall = time.perf_counter() - t1
    toks = [o.token_ids for o in gen.outputs]
    return {"method": method, "compiled": compiled, "concurrency": conc, "tokens": toks,
            "tok_s": sum(len(t) for t in toks) / wall, "warm_s": warm_s,
            "graphs": len(getattr(engine.target.compiled, "graphs", {}) or {})}


def markdown(rows: list[dict[str, Any]], header: dict[str, Any]) -> str:
    out = [f"### The engine end to end on {header['device_name']}: eager vs compiled + CUDA graphs", "",
           f"torch {header['torch']}; the bundled tiny target in fp32, {header['prompts']} held-out code prompts x "
           f"{header['new_tokens']} new tokens, greedy, block 8. Same run, same prompts.", "",
           "| method | requests | eager tok/s | compiled tok/s | compiled / eager | identical | graphs | warm s |",
           "|---|---:|---:|---:|---:|---|---:|---:|"]
    pairs: dict[tuple[str, int], dict[bool, dict[str, Any]]] = {}
    for r in rows:
        pairs.setdefault((r["method"], r["concurrency"]), {})[r["compiled"]] = r
    for (m, c), p in pairs.items():
        e, k = p.get(False), p.get(True)
        if not (e and k):
            continue
        same = "yes" if e["tokens"] == k["tokens"] else "NO"
        out.append(f"| {m} | {c} | {e['tok_s']:.1f} | {k['tok_s']:.1f} | {k['tok_s'] / e['tok_s']:.2f}x | {same} | "
                   f"{k['graphs']} | {k['warm_s']:.0f} |")
    return "\n".join(out + [""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--methods", default="plain,ngram,dspark_markov")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out")
    ap.add_argument("--json", dest="json_path")
    a = ap.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_engine.py: no CUDA GPU here; pass --device cpu for the smoke test", file=sys.stderr)
        return 2
    texts = prompts(a.prompts)
    header = {"device_name": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "CPU",
              "torch": torch.__version__, "prompts": len(texts), "new_tokens": a.new_tokens}
    rows: list[dict[str, Any]] = []
    for method in a.methods.split(","):
        for conc in (int(c) for c in a.concurrency.split(",")):
            for compiled in (False, True):
                try:
                    rows.append(run_one(method, compiled, conc, texts, a.new_tokens, a.device))
                except Exception as e:  # noqa: BLE001 - one failing way must not end the run
                    print(f"{method} c{conc} {'compiled' if compiled else 'eager'}: {type(e).__name__}: "
                          f"{str(e)[:300]}", file=sys.stderr)
                    continue
                r = rows[-1]
                print(f"{method} c{conc} {'compiled' if compiled else 'eager'}: {r['tok_s']:.1f} tok/s "
                      f"(warm {r['warm_s']:.0f} s)", file=sys.stderr)
                text = markdown(rows, header)
                if a.out:
                    Path(a.out).write_text(text)
                if a.json_path:
                    Path(a.json_path).write_text(json.dumps({"header": header, "rows": rows}))
    text = markdown(rows, header)
    print(text)
    bad = [r for r in rows if r["compiled"] and any(e["tokens"] != r["tokens"] for e in rows if not e["compiled"]
                                                     and (e["method"], e["concurrency"]) ==
                                                     (r["method"], r["concurrency"]))]
    return 1 if bad or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
