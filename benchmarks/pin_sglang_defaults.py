"""Pin SGLang's own GPU-memory defaults for every catalogue GPU: run in the peer venv (sglang 0.5.23).

SGLang sizes `--mem-fraction-static`, `--chunked-prefill-size` and the decode CUDA-graph batch from the device's
memory and the TP size when they are not given (python/sglang/srt/arg_groups/memory_hook.py
_handle_gpu_memory_settings). This script runs that resolution itself, `prepare_server_args(...).resolve_once()`,
once per catalogue GPU (profiler/catalog/gpus.yaml; the device memory SGLang would read is faked as the catalogue's
GB x 1000 / 1.048576 MiB) and TP 1, 2, 4 and 8, and writes what SGLang resolved to
profiler/catalog/sglang_defaults.yaml. The profiler reads that file into derived.sglang_* so that one rule per
parameter can follow SGLang's defaults on any GPU, instead of one rule per GPU memory class with the constants
re-typed.

    ~/.cache/dspark-tune/interop/venv/bin/python benchmarks/pin_sglang_defaults.py
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "profiler" / "catalog" / "sglang_defaults.yaml"
GPUS = ROOT / "profiler" / "catalog" / "gpus.yaml"
TPS = (1, 2, 4, 8)
MODEL = ROOT / "dspark_core" / "assets" / "tiny" / "target"  # any text model: its config.json is all SGLang reads


def resolve(mem_gb: float, tp: int) -> dict:
    import sglang.srt.arg_groups.memory_hook as memory_hook
    from sglang.srt.server_args import prepare_server_args

    mib = mem_gb * 1e9 / 2**20
    memory_hook.get_device_memory_capacity = lambda device=None: mib
    sa = prepare_server_args(["--model-path", str(MODEL), "--device", "cuda", "--tp-size", str(tp)])
    sa.resolve_once()
    d = sa.resolved_dict()
    graph = d.get("cuda_graph_config") or {}
    decode = graph.get("decode") if isinstance(graph, dict) else getattr(graph, "decode", None)
    max_bs = decode.get("max_bs") if isinstance(decode, dict) else getattr(decode, "max_bs", None)
    return {"mem_fraction_static": float(d["mem_fraction_static"]),
            "chunked_prefill_size": int(d["chunked_prefill_size"]), "cuda_graph_max_bs": int(max_bs)}


def main() -> int:
    logging.disable(logging.WARNING)
    gpus = yaml.safe_load(GPUS.read_text())["gpus"]
    table = {}
    for g in gpus:
        if g.get("arch") == "cpu" or not g.get("memory_gb"):
            continue
        table[g["name"]] = {f"tp{tp}": resolve(float(g["memory_gb"]), tp) for tp in TPS}
        print(g["name"], table[g["name"]]["tp1"], file=sys.stderr)
    data = {"generated_by": "benchmarks/pin_sglang_defaults.py (do not edit by hand; rerun it in the peer venv)",
            "sglang": md.version("sglang"),
            "source": "python/sglang/srt/arg_groups/memory_hook.py _handle_gpu_memory_settings, resolved by "
                      "prepare_server_args(...).resolve_once() with the device memory faked to the catalogue's",
            "gpus": table}
    OUT.write_text("# SGLang's own defaults per catalogue GPU and TP size, read off its resolution (not re-typed).\n"
                   + yaml.safe_dump(data, sort_keys=False, width=120))
    print(f"wrote {OUT} ({len(table)} GPUs, sglang {data['sglang']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
