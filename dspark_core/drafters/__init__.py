"""Drafters by name: `build_drafter(name, config, target)`; see `base.py` for the interface."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dspark_core.errors import DSparkError

if TYPE_CHECKING:
    from dspark_core.config import EngineConfig
    from dspark_core.drafters.base import Drafter
    from dspark_core.modeling.model import LeanModel

# name -> "module:function" with signature (config: EngineConfig, target: LeanModel) -> Drafter
DRAFTERS: dict[str, str] = {
    "ar_draft": "dspark_core.drafters.ar_draft:build_drafter",
    "ngram": "dspark_core.drafters.ngram:build_drafter",
    "suffix": "dspark_core.drafters.suffix:build_drafter",
    "dspark": "dspark_core.drafters.dspark_runtime:build_runtime",
    "hybrid": "dspark_core.drafters.hybrid:build_drafter",
}


def build_drafter(name: str, config: EngineConfig, target: LeanModel) -> Drafter:
    """Instantiate the drafter registered under `name` (lazy import, so heavy modules load on use)."""
    if name not in DRAFTERS:
        raise DSparkError(f"unknown drafter {name!r}; choose one of {', '.join(sorted(DRAFTERS))}")
    module, func = DRAFTERS[name].split(":")
    return getattr(importlib.import_module(module), func)(config, target)
