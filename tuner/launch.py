"""The launch files of a tuned configuration, per engine: what `export` writes into the bundle and what a live
trial (`tune --engine ...`) writes into its trial folder and runs. One function per engine, so the server a live
study measured is started by exactly the script the bundle ships.

- dspark: dspark.yaml (the bundled engine's config, tuner/engine_config.py), sps.json, sts.json, dspark.sh, and the
  learned policies a learned scheduler or block length runs (policy.json, gamma_policy.json);
- vllm: vllm.json (the speculative config) and vllm.sh;
- sglang: sglang.sh (it reads sps.json and sts.json beside it), and sglang_adaptive.json for an adaptive schedule.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tuner.script_values import check_values, finalize, quote, text, token

TEMPLATES = Path(__file__).parent / "templates"
DSPARK_TEMPLATES = ("dspark/v1/dspark.yaml.j2", "dspark/v1/dspark.sh.j2")
SGLANG_TEMPLATE = "sglang/dspark-v2/sglang.sh.j2"
VLLM_TEMPLATES = ("vllm/v0.33/vllm.json.j2", "vllm/v0.33/vllm.sh.j2")
POLICY_FILES = {"policy_path": "policy.json", "gamma_policy_path": "gamma_policy.json"}  # spec field -> bundle file
ENGINE_FILES = {"dspark": ("dspark.yaml", "sps.json", "sts.json", "dspark.sh", *POLICY_FILES.values()),
                "vllm": ("vllm.json", "vllm.sh"),
                "sglang": ("sglang.sh", "sps.json", "sts.json", "sglang_adaptive.json")}
SCRIPTS = {"dspark": "dspark.sh", "vllm": "vllm.sh", "sglang": "sglang.sh"}  # the script that starts each engine


def template_env():  # -> jinja2.Environment
    """The templates' environment: a missing value is an error, and every value a script template renders must be
    marked `q` (a shell word), `token` (inert characters) or `text` (a comment) (tuner/script_values.py)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False, finalize=jinja2.pass_context(finalize))
    env.filters.update(q=quote, token=token, text=text)
    return env


def write_dspark(folder: Path, config, sps, sts: dict[str, Any], common: dict[str, Any]) -> None:
    """dspark.yaml (checked by the engine's own config model), sps.json, sts.json, dspark.sh and the learned policies
    `config` names (copied in, renamed, and named relative to dspark.yaml)."""
    from dspark_core.config import load_config, save_config

    check_values("dspark.sh", common)
    env = template_env()
    # a compiled engine prices its rounds by its own compiled steps, profiled at start-up as the trials' engine did
    # (a CPU's packed verify grids: verification/grid_costs.py); an eager one reads the measured table
    config.spec.sps_path, config.spec.sts_path = None if config.compile else "sps.json", "sts.json"
    for key, name in POLICY_FILES.items():  # the learned policies travel with the bundle, like the SPS table
        src = getattr(config.spec, key)
        if src and Path(src).resolve() != (folder / name).resolve():
            shutil.copy2(src, folder / name)
        setattr(config.spec, key, name if src else None)
    path = folder / "dspark.yaml"
    save_config(config, path)
    path.write_text(env.get_template(DSPARK_TEMPLATES[0]).render(config_yaml=path.read_text(), **common))
    load_config(path)  # the engine's own model accepts what we wrote
    sps.save(folder / "sps.json")
    (folder / "sts.json").write_text(json.dumps(sts, indent=2) + "\n")
    _script(folder, "dspark.sh", env.get_template(DSPARK_TEMPLATES[1]).render(**common))


def write_vllm(folder: Path, context: dict[str, Any], common: dict[str, Any]) -> None:
    check_values("vllm.sh", {**common, **context})
    env = template_env()
    (folder / "vllm.json").write_text(env.get_template(VLLM_TEMPLATES[0]).render(**common, **context))
    _script(folder, "vllm.sh", env.get_template(VLLM_TEMPLATES[1]).render(**common, **context))


def write_sglang(folder: Path, context: dict[str, Any], common: dict[str, Any]) -> None:
    """sglang.sh, and beside it the adaptive config its --speculative-adaptive-config names (the tuned draft steps
    per batch size) when the context carries one."""
    check_values("sglang.sh", {**common, **context})
    if context.get("adaptive_config"):
        (folder / context["adaptive_file"]).write_text(json.dumps(context["adaptive_config"], indent=2) + "\n")
    _script(folder, "sglang.sh", template_env().get_template(SGLANG_TEMPLATE).render(**common, **context))


def _script(folder: Path, name: str, text: str) -> None:
    (folder / name).write_text(text)
    (folder / name).chmod(0o755)
