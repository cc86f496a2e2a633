"""Stand-in for `python -m sglang.launch_server` when benchmarks/interop_check.py runs a bundle's sglang.sh.

Runs in the peer venv (sglang 0.5.23). Takes the launch command line exactly as sglang.sh built it, parses it with
SGLang's own parser (`prepare_server_args`), resolves it (`ServerArgs.resolve_once`, with `--device cuda` added
because this machine has no GPU and SGLang refuses DSpark elsewhere), then checks the files the command names:
the draft config through SGLang's DSpark parser and runtime-config resolution, sps.json / sts.json through its
loaders, and, when the drafter folder holds weights, SGLang's own Markov and confidence heads loaded with them
against ours on random inputs. Prints one JSON object on stdout; exit 0 only when everything passed and no
warning says a flag does nothing.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from pathlib import Path

NO_OP = ("no-op", "no effect", "ignoring", "deprecated", "ignored", "disabled: ")  # warnings that say a flag
# does nothing ("speculative_adaptive disabled: <reason>. Falling back to static speculative params.")


class _Grab:
    """Every WARNING-or-worse record any logger handles, whatever its handlers and propagation (SGLang's loggers
    print through their own handlers and do not reach the root logger)."""

    def __init__(self) -> None:
        self.records: list[str] = []
        real = logging.Logger.handle

        def handle(logger: logging.Logger, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                self.records.append(f"{record.name}: {record.getMessage()}")
            real(logger, record)

        logging.Logger.handle = handle  # type: ignore[method-assign]


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _flag_file(argv: list[str], name: str) -> str | None:
    return _flag(argv, name) if name in argv else None


def _heads_agree(draft: Path, out: dict) -> None:
    """SGLang's VanillaMarkov / RNNHead and DSparkConfidenceHead, loaded with the drafter's tensors, against ours."""
    import torch
    from safetensors.torch import load_file
    from sglang.srt.models.dspark import DSparkConfidenceHead, build_markov_head
    from transformers import PretrainedConfig

    from dspark_core.drafters.dspark_layout import read_drafter_config
    from dspark_core.drafters.heads import ConfidenceHead, SequentialHead

    cfg_json = json.loads((draft / "config.json").read_text())
    tensors = {k: v.float() for k, v in load_file(str(draft / "model.safetensors")).items()}
    theirs = build_markov_head(PretrainedConfig(**cfg_json))
    theirs.load_state_dict({k.removeprefix("markov_head."): v for k, v in tensors.items()
                            if k.startswith("markov_head.")})
    conf = DSparkConfidenceHead(hidden_size=cfg_json["hidden_size"], markov_rank=cfg_json["markov_rank"])
    conf.load_state_dict({"proj.weight": tensors["confidence_head.proj.weight"],
                          "proj.bias": tensors["confidence_head.proj.bias"]})
    ours_cfg = read_drafter_config(draft)
    head = SequentialHead(ours_cfg.head, ours_cfg.vocab_size, ours_cfg.hidden_size, ours_cfg.markov_rank)
    sd = {"w1.weight": tensors["markov_head.markov_w1.weight"]}
    if ours_cfg.head != "none":
        sd["w2.weight"] = tensors["markov_head.markov_w2.weight"]
    if ours_cfg.head == "rnn":
        sd |= {"rnn.weight": tensors["markov_head.joint_proj.weight"],
               "rnn.bias": tensors["markov_head.joint_proj.bias"]}
    head.load_state_dict(sd)
    ours_conf = ConfidenceHead(ours_cfg.hidden_size, ours_cfg.markov_rank)
    ours_conf.load_state_dict({"proj.weight": tensors["confidence_head.proj.weight"],
                               "proj.bias": tensors["confidence_head.proj.bias"]})
    g = torch.Generator().manual_seed(0)
    b, steps = 4, ours_cfg.block_size
    prev = torch.randint(0, ours_cfg.vocab_size, (b,), generator=g)
    worst = 0.0
    state_t = theirs.init_state(torch.zeros(b, ours_cfg.hidden_size))
    state_o = head.init_state(b, torch.zeros(b, ours_cfg.hidden_size))
    with torch.no_grad():
        for _ in range(steps):
            h = torch.randn(b, ours_cfg.hidden_size, generator=g)
            bias_t, state_t = theirs.step_bias(prev, hidden_states=h, state=state_t)
            bias_o, state_o, e = head.step(prev, h, state_o)
            bias_o = torch.zeros_like(bias_t) if bias_o is None else bias_o
            worst = max(worst, float((bias_t - bias_o).abs().max()))
            c_t, c_o = conf(h, theirs.get_prev_embeddings(prev)), ours_conf(h, e)
            worst = max(worst, float((c_t - c_o).abs().max()))
            prev = (bias_o + torch.randn(b, ours_cfg.vocab_size, generator=g)).argmax(-1)
    out["heads_max_abs_diff"] = worst
    out["heads_agree"] = worst < 1e-5


def main(argv: list[str]) -> int:
    from sglang.srt.server_args import prepare_server_args  # imported first: its dependencies' import noise is
    # not about the bundle; what SGLang says while parsing and resolving is

    grab = _Grab()
    warnings.simplefilter("always")
    caught: list[str] = []
    warnings.showwarning = lambda m, c, f, n, *a, **k: caught.append(f"{c.__name__}: {m}") if "sglang" in str(f) \
        else None
    if "--device" not in argv:
        argv = [*argv, "--device", "cuda"]
    out: dict = {"argv": argv, "ragged_verify_mode": os.environ.get("SGLANG_RAGGED_VERIFY_MODE", "static"),
                 "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    try:
        sa = prepare_server_args(argv)
    except SystemExit as e:
        out["error"] = f"SGLang's parser refused the command line (exit {e.code})"
        print(json.dumps(out))
        return 3
    try:
        sa.resolve_once()
    except Exception as e:  # noqa: BLE001 - report whatever SGLang raises
        out["error"] = f"resolve_once: {type(e).__name__}: {e}"
        print(json.dumps(out))
        return 4
    d = sa.resolved_dict()
    out["resolved"] = {k: d.get(k) for k in ("speculative_algorithm", "speculative_dspark_block_size",
                                            "speculative_num_draft_tokens", "speculative_num_steps",
                                            "speculative_eagle_topk", "speculative_adaptive",
                                            "speculative_ngram_max_bfs_breadth", "max_running_requests",
                                            "mem_fraction_static", "page_size", "max_prefill_tokens",
                                            "tp_size", "dp_size", "ep_size", "attn_dp_size",
                                            "enable_dp_attention", "quantization",
                                            "speculative_draft_model_quantization", "kv_cache_dtype",
                                            "attention_backend", "cuda_graph_max_bs_decode", "port",
                                            "chunked_prefill_size", "disaggregation_mode",
                                            "disaggregation_transfer_backend")}
    adaptive = _flag_file(argv, "--speculative-adaptive-config")
    if adaptive:  # the schedule: SGLang's own loader, and adaptive still on after its support check
        from sglang.srt.speculative.adaptive_spec_params import (
            _load_adaptive_config,
            resolve_candidate_steps_from_config,
        )

        _, slots = _load_adaptive_config(adaptive)
        out["adaptive"] = {"slots": sorted(slots), "candidate_steps": resolve_candidate_steps_from_config(adaptive)}
        if not d.get("speculative_adaptive"):
            out["error"] = "SGLang turned --speculative-adaptive off (see its warnings)"
    draft = _flag(argv, "--speculative-draft-model-path")
    if draft and d.get("speculative_algorithm") == "DSPARK":
        from sglang.srt.speculative.dspark_components.dspark_config import resolve_runtime_config
        from transformers import AutoConfig

        target_cfg = AutoConfig.from_pretrained(_flag(argv, "--model-path"))
        rt = resolve_runtime_config(draft_hf_config=AutoConfig.from_pretrained(draft),
                                    speculative_num_draft_tokens=d.get("speculative_num_draft_tokens"),
                                    target_vocab_size=int(target_cfg.vocab_size))
        out["draft_runtime"] = {k: getattr(rt, k) for k in ("gamma", "verify_num_draft_tokens", "mask_token_id")
                                if hasattr(rt, k)}
        if (Path(draft) / "model.safetensors").is_file():
            _heads_agree(Path(draft), out)
    sps = _flag(argv, "--speculative-dspark-sps-table-path")
    sts = _flag(argv, "--speculative-dspark-confidence-sts-path")
    if sps:
        from sglang.srt.speculative.dspark_components.dspark_sps import load_sps_table_from_path

        table = load_sps_table_from_path(sps)
        out["sps_probes"] = len(getattr(table, "sample_batch_tokens", []) or [])
    if sts:
        from sglang.srt.speculative.dspark_components.dspark_sts import load_sts_calibration_from_path

        cal = load_sts_calibration_from_path(sts)
        out["sts_temperatures"] = len(cal.temperatures)
        gamma = int(out.get("draft_runtime", {}).get("gamma") or d.get("speculative_dspark_block_size") or 0)
        if gamma and len(cal.temperatures) != gamma:
            out["error"] = f"sts.json has {len(cal.temperatures)} temperatures for gamma {gamma}"
    out["warnings"] = grab.records + caught
    out["no_op_warnings"] = [w for w in out["warnings"] if any(s in w.lower() for s in NO_OP)]
    ok = "error" not in out and not out["no_op_warnings"] and out.get("heads_agree", True)
    out["ok"] = ok
    print(json.dumps(out, default=str))
    return 0 if ok else 5


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
