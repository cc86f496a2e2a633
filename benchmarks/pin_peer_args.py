"""Pin what the released engines accept into tuner/catalog/releases.yaml (read by tests/tuner/test_export_pins.py).

Run it with the peer venv's python (benchmarks/interop_check.py builds it):
`~/.cache/dspark-tune/interop/venv/bin/python benchmarks/pin_peer_args.py`
It builds SGLang's and vLLM's own argument parsers and records every option string per destination, the choices
of the options the exporter maps values onto, the deprecated options, SGLang's ragged verify modes and vLLM's
`--speculative-config` fields and methods. Facts from the installed packages, never re-typed.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata as md
import os
import sys
import typing
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tuner" / "catalog" / "releases.yaml"


def _sha(module) -> str:
    return hashlib.sha256(Path(module.__file__).read_bytes()).hexdigest()[:16]


def _flags(parser: argparse.ArgumentParser) -> tuple[dict[str, list[str]], list[str]]:
    by_dest: dict[str, list[str]] = {}
    deprecated = []
    for a in parser._actions:
        if not a.option_strings:
            continue
        by_dest.setdefault(a.dest, []).extend(a.option_strings)
        if "Deprecated" in type(a).__name__ or "deprecated" in (a.help or "").lower()[:80]:
            deprecated.extend(a.option_strings)
    return {k: sorted(set(v)) for k, v in sorted(by_dest.items())}, sorted(set(deprecated))


def sglang() -> dict:
    from sglang.srt import server_args
    from sglang.srt.speculative import ragged_verify

    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    flags, deprecated = _flags(parser)
    choices = {a.dest: list(a.choices) for a in parser._actions
               if a.choices and a.dest in ("kv_cache_dtype", "quantization", "attention_backend",
                                           "speculative_draft_model_quantization")}
    modes = [m.value for m in ragged_verify.RaggedVerifyMode]
    return {"flags": flags, "deprecated": deprecated, "choices": choices, "ragged_verify_modes": modes,
            "sha256": {"sglang/srt/server_args.py": _sha(server_args),
                       "sglang/srt/speculative/ragged_verify.py": _sha(ragged_verify)}}


def vllm() -> dict:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.config import compilation, speculative
    from vllm.engine import arg_utils
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    parser = make_arg_parser(FlexibleArgumentParser())
    flags, deprecated = _flags(parser)
    fields = [f.name for f in dataclasses.fields(speculative.SpeculativeConfig) if f.init]
    methods = sorted({a for t in typing.get_args(speculative.SpeculativeMethod)
                      for a in (typing.get_args(t) or (t,))}) if hasattr(speculative, "SpeculativeMethod") else []
    kv = next((list(a.choices) for a in parser._actions if a.dest == "kv_cache_dtype" and a.choices), None)
    if kv is None:
        from vllm.config.cache import CacheDType

        kv = list(typing.get_args(CacheDType))
    passes = [f.name for f in dataclasses.fields(compilation.PassConfig) if f.init]
    return {"flags": flags, "deprecated": deprecated, "speculative_config_fields": fields,
            "pass_config_fields": passes,
            "speculative_methods": methods,
            "choices": {"quantization": sorted(QUANTIZATION_METHODS), "kv_cache_dtype": kv,
                        "attention_backend": sorted(e.name for e in AttentionBackendEnum)},
            "sha256": {"vllm/config/speculative.py": _sha(speculative), "vllm/engine/arg_utils.py": _sha(arg_utils)}}


def main() -> int:
    data = {"generated_by": "benchmarks/pin_peer_args.py (do not edit by hand; rerun it in the peer venv)",
            "packages": {"sglang": {"version": md.version("sglang")}, "vllm": {"version": md.version("vllm")}},
            "sglang": sglang(), "vllm": vllm()}
    from vllm import _version

    data["packages"]["vllm"]["commit"] = getattr(_version, "__commit_id__", None)
    OUT.write_text("# What the released SGLang and vLLM accept, read off their own parsers.\n"
                   + yaml.safe_dump(data, sort_keys=False, width=120))
    print(f"wrote {OUT} (sglang {data['packages']['sglang']['version']}, vllm {data['packages']['vllm']['version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
