"""What the bench measured about a committed drafter, written beside it (`<drafter>/acceptance.json`) so the
profiler can hand it to the simulator (profile `accept.*`, profiler/drafter.py) instead of a published prior.

One entry per workload domain: the block length, tau and per-position acceptance of the drafter verified in full
(verify_all, so the figures are the drafter's, not a scheduler's), the calibrated confidence ECE from its
sts.json, the bench command and the date. Only drafters resolved from the committed assets are written (never a
folder the user pointed `drafter.path` at). The methods without a drafter (n-gram, suffix) and the DSpark + suffix
hybrid go to `acceptance_methods.json` beside the target's committed assets, one entry per method and domain, which
`profile` carries as `accept_methods` for the tuner to price each method with its own measured acceptance.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from dspark_core.atomic import atomic_write_text
from dspark_core.config import EngineConfig, apply_params, committed_assets, drafter_path

FILE = "acceptance.json"
METHODS_FILE = "acceptance_methods.json"  # beside a target's committed assets: n-gram, suffix and the hybrid
HOST = {"ngram": "ngram", "suffix": "suffix"}  # bench method -> the method it measures (hybrid_<head>: hybrid)


def record_acceptance(result: dict[str, Any], config: EngineConfig, domain: str, command: str) -> list[Path]:
    """Merge the bench result's verify_all DSpark rows into their committed drafters' acceptance.json."""
    from dspark_core.cli.bench import HEADS, method_params

    if config.drafter.path:
        return []
    # a `%N` row drafts over another vocabulary than the deployed drafter does: not that method's acceptance
    result = result | {"methods": [m for m in result["methods"] if "%" not in m["name"]]}
    written = []
    for m in result["methods"]:
        base, _, sched = m["name"].partition("/")
        if base not in HEADS or (sched or config.spec.scheduler) != "verify_all" or not m["position_acceptance"]:
            continue
        folder = drafter_path(apply_params(config, method_params(m["name"], config)))
        if folder is None:
            continue
        path = Path(folder) / FILE
        data = json.loads(path.read_text()) if path.is_file() else {"domains": {}}
        entry = {"gamma": len(m["position_acceptance"]), "tau": m["tau"],
                 "position_acceptance": m["position_acceptance"], "confidence_ece": _ece(Path(folder)),
                 "prompts": result["prompts"], "max_new_tokens": result["max_new_tokens"],
                 "device": result["device"], "command": command, "measured_at": time.strftime("%Y-%m-%d")}
        data.setdefault("domains", {})[domain] = entry
        atomic_write_text(path, json.dumps(data, indent=2) + "\n")
        written.append(path)
    methods = _method_rows(result, config)
    assets = committed_assets(config.model.path)
    if methods and assets is not None and assets.is_dir():
        path = assets / METHODS_FILE
        data = json.loads(path.read_text()) if path.is_file() else {"methods": {}}
        for method, m in methods.items():
            data.setdefault("methods", {}).setdefault(method, {})[domain] = {
                "gamma": result.get("block_size") or config.spec.block_size, "tau": m["tau"],
                "position_acceptance": m["position_acceptance"], "tokens_per_s": m["tokens_per_s"],
                "speedup": m["speedup"], "prompts": result["prompts"], "max_new_tokens": result["max_new_tokens"],
                "device": result["device"], "command": command, "measured_at": time.strftime("%Y-%m-%d")}
        atomic_write_text(path, json.dumps(data, indent=2) + "\n")
        written.append(path)
    return written


def _method_rows(result: dict[str, Any], config: EngineConfig) -> dict[str, dict[str, Any]]:
    """The verify_all rows of the drafter-less methods and of the hybrid (its best head), by method."""
    out: dict[str, dict[str, Any]] = {}
    for m in result["methods"]:
        base, _, sched = m["name"].partition("/")
        method = HOST.get(base) or ("hybrid" if base.startswith("hybrid_") else None)
        if method is None or (sched or config.spec.scheduler) != "verify_all" or not m["position_acceptance"]:
            continue
        if method not in out or m["tau"] > out[method]["tau"]:
            out[method] = m
    return out


def _ece(folder: Path) -> float | None:
    """Mean per-position ECE after STS from the drafter's sts.json (None without one)."""
    try:
        ece = json.loads((folder / "sts.json").read_text()).get("ece_after") or []
    except (OSError, ValueError):
        return None
    return round(statistics.fmean(ece), 4) if ece else None
