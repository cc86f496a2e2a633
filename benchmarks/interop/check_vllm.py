"""Stand-in for `vllm serve` when benchmarks/interop_check.py runs a bundle's vllm.sh.

Runs in the peer venv (vllm 0.33.0, CPU platform: VLLM_TARGET_DEVICE=cpu VLLM_USE_V2_MODEL_RUNNER=1, set by the
caller). Parses the command line with vLLM's own `vllm serve` parser, builds EngineArgs from it and runs
`create_engine_config()`, which validates the speculative config and reads the target and draft configs. The
stand-in target folders have no tokenizer, so tokenizer loading is skipped. When the drafter folder holds weights,
vLLM's own Qwen3DSparkForCausalLM is built on the CPU and loads them, and the loaded parameters are compared with
the shipped tensors. Prints one JSON object; exit 0 only when everything passed.

Adaptive verification needs full CUDA graphs, which a CPU platform never has: when that is create_engine_config's
only objection, the config is validated again with it off and the result says so.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

CUDA_GRAPHS = "Adaptive verification requires full CUDA graphs"
CPU_OPS = "'_C' object has no attribute"  # a custom op the CPU build does not compile


def _engine_args(argv: list[str]):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(description="vllm serve"))
    args = parser.parse_args(argv)
    if getattr(args, "model_tag", None):
        args.model = args.model_tag  # what `vllm serve` does with its positional argument
    args.skip_tokenizer_init = True
    return AsyncEngineArgs.from_cli_args(args), args


def _load_draft(cfg, draft: Path, out: dict) -> None:
    """vLLM's own draft class loads the shipped tensors; q/k/v and gate/up land stacked where vLLM expects them."""
    import torch
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM

    with set_current_vllm_config(cfg):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method="tcp://127.0.0.1:29541", backend="gloo")
        initialize_model_parallel(1, 1)
        with torch.device("cpu"):
            model = Qwen3DSparkForCausalLM(vllm_config=cfg, prefix="")
    tensors = load_file(str(draft / "model.safetensors"))
    model.load_weights(list(tensors.items()))
    params = dict(model.named_parameters())
    hf = cfg.speculative_config.draft_model_config.hf_config
    checks = {"model.fc.weight": tensors["fc.weight"],
              "model.markov_head.markov_w1.weight": tensors["markov_head.markov_w1.weight"],
              "model.markov_head.markov_w2.weight": tensors["markov_head.markov_w2.weight"],
              "model.layers.0.self_attn.qkv_proj.weight": torch.cat(
                  [tensors[f"layers.0.self_attn.{x}_proj.weight"] for x in "qkv"]),
              "model.layers.0.mlp.gate_up_proj.weight": torch.cat(
                  [tensors["layers.0.mlp.gate_proj.weight"], tensors["layers.0.mlp.up_proj.weight"]])}
    if getattr(model.model, "confidence_head", None) is not None:
        checks["model.confidence_head.proj.weight"] = tensors["confidence_head.proj.weight"]
    # vLLM holds each parameter in its own dtype (fc in the target's, the layers in the draft's): compare there
    bad = [n for n, want in checks.items()
           if n not in params or not torch.equal(params[n].detach(), want.to(params[n].dtype))]
    out["draft_weights"] = {"loaded": len(tensors), "checked": len(checks), "mismatched": bad,
                            "confidence_head": getattr(model.model, "confidence_head", None) is not None,
                            "mask_token_id": getattr(model.model, "mask_token_id", None),
                            "layers": hf.num_hidden_layers}


def _create(argv: list[str], out: dict, spec: dict | None = None):  # -> VllmConfig
    """create_engine_config() of `argv` (with `spec` as the speculative config when given); when the CPU build's
    missing custom ops (`torch.ops._C.<op>`, e.g. rotary_embedding, which a TP all-reduce fusion pass looks up on
    the CPU platform) are its only objection, validated again without --compilation-config, and the result says
    so. Each attempt parses the command line anew: create_engine_config() writes into the arguments it reads (a
    data-parallel start rank becomes a rank), so a second call on the same object sees another command line."""
    def fresh():  # noqa: ANN202 - vLLM's AsyncEngineArgs
        ea, _ = _engine_args(argv)
        if spec is not None:
            ea.speculative_config = spec
        return ea

    ea = fresh()
    try:
        return ea.create_engine_config()
    except AttributeError as e:
        if CPU_OPS not in str(e) or not getattr(ea, "compilation_config", None):
            raise
        out["platform_note"] = (f"the CPU build lacks a custom op a compilation pass needs ({e}); the rest of the "
                                "config was validated without --compilation-config")
        ea = fresh()
        ea.compilation_config = type(ea.compilation_config)() if not isinstance(ea.compilation_config, dict) else {}
        return ea.create_engine_config()


def main(argv: list[str]) -> int:
    logging.disable(logging.WARNING)  # vLLM's CPU-platform notices are not about the bundle
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    out: dict = {"argv": argv, "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        ea, args = _engine_args(argv)
        out["port"] = getattr(args, "port", None)
    except SystemExit as e:
        out["error"] = f"vLLM's serve parser refused the command line (exit {e.code})"
        print(json.dumps(out))
        return 3
    spec = dict(ea.speculative_config or {})
    out["speculative_config"] = spec
    try:
        cfg = _create(argv, out)
    except Exception as e:  # noqa: BLE001 - report whatever vLLM raises
        if CUDA_GRAPHS not in str(e):
            out["error"] = f"create_engine_config: {type(e).__name__}: {e}"
            print(json.dumps(out, default=str))
            return 4
        out["platform_note"] = ("enable_adaptive_verification needs full CUDA graphs, which the CPU platform does not "
                                "have; the rest of the config was validated with it off")
        try:
            cfg = _create(argv, out, {**spec, "enable_adaptive_verification": False})
        except Exception as e2:  # noqa: BLE001
            out["error"] = f"create_engine_config: {type(e2).__name__}: {e2}"
            print(json.dumps(out, default=str))
            return 4
    sc = cfg.speculative_config
    hf = sc.draft_model_config.hf_config if sc is not None else None
    out["resolved"] = {"method": getattr(sc, "method", None),
                       "num_speculative_tokens": getattr(sc, "num_speculative_tokens", None),
                       "draft_architectures": getattr(hf, "architectures", None),
                       "draft_model_type": getattr(hf, "model_type", None),
                       "max_num_seqs": cfg.scheduler_config.max_num_seqs,
                       "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
                       "block_size": cfg.cache_config.block_size,
                       "gpu_memory_utilization": cfg.cache_config.gpu_memory_utilization,
                       "max_model_len": cfg.model_config.max_model_len,
                       "tensor_parallel_size": cfg.parallel_config.tensor_parallel_size,
                       "data_parallel_size": cfg.parallel_config.data_parallel_size,
                       "gpus": cfg.parallel_config.tensor_parallel_size * cfg.parallel_config.data_parallel_size
                       * cfg.parallel_config.pipeline_parallel_size,
                       "kv_connector": getattr(cfg.kv_transfer_config, "kv_connector", None)}
    method = getattr(sc, "method", None)
    ok = method == spec.get("method")  # the method the bundle names is the one vLLM runs
    if method == "dspark":
        ok = ok and "Qwen3DSparkModel" in (getattr(hf, "architectures", None) or [])
    schedule = spec.get("num_speculative_tokens_per_batch_size")
    if schedule is not None:  # kept (not dropped for MRV1 or DP) and expanded by vLLM's own lookup builder
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        kept = getattr(sc, "num_speculative_tokens_per_batch_size", None)
        dense = build_dynamic_sd_schedule_lookup(kept, cfg.scheduler_config.max_num_seqs, sc.num_speculative_tokens) \
            if kept is not None else None
        out["schedule"] = {"kept": kept is not None, "k_by_batch": sorted(set(dense[1:])) if dense else None}
        ok = ok and kept is not None
    draft = Path(spec.get("model") or "")
    if ok and (draft / "model.safetensors").is_file():
        _load_draft(cfg, draft, out)
        ok = not out["draft_weights"]["mismatched"]
    out["ok"] = ok
    print(json.dumps(out, default=str))
    return 0 if ok else 5


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
