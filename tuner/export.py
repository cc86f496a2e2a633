"""TunedConfig -> deployable bundle, written atomically into --out DIR.

Renders the Jinja2 templates in tuner/templates/ (StrictUndefined: a missing value is an error,
never an empty flag) into a temporary folder beside DIR, validates what it can (dspark.yaml
through the engine's own pydantic model, sps.json through the SPS table model), then swaps the
folder into place, so an error or a kill leaves either the old bundle or the new one, never half.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tuner.bundle_dir import check_out, write_bundle
from tuner.errors import TunerError
from tuner.study import SPEC_ATTR, StudySpec, best_trial, completed, feasible_trials, make_evaluator, miss, open_study
from tuner.targets import measured_calibration, sglang_context, sts_payload, vllm_context

TEMPLATES = Path(__file__).parent / "templates"
DSPARK_TEMPLATE = "dspark/v1/dspark.yaml.j2"
SGLANG_TEMPLATE = "sglang/dspark-v1/sglang.sh.j2"
VLLM_TEMPLATES = ("vllm/v0.11/vllm.json.j2", "vllm/v0.11/vllm.sh.j2")
REPORT_TEMPLATE = "report/report.md.j2"


@dataclass
class ExportResult:
    out: Path
    files: list[str]
    trial_number: int
    meets_slo: bool
    metrics: dict[str, float]
    params: dict[str, Any]
    mode: str

    def to_json(self) -> dict[str, Any]:
        return {"out": str(self.out), "files": self.files, "trial": self.trial_number, "meets_slo": self.meets_slo,
                "metrics": self.metrics, "params": self.params, "mode": self.mode}


def _env():  # -> jinja2.Environment
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def _closest(study, spec: StudySpec):  # -> FrozenTrial
    """When nothing meets the SLOs: the completed trial with the smallest total violation."""
    trials = completed(study)
    if not trials:
        raise TunerError(f"study {study.study_name!r} has no completed trial to export; run tune first")
    return min(trials, key=lambda t: (miss(t), t.number))


def export_study(db_url: str, name: str, out: Path) -> ExportResult:
    """Export study `name`'s best SLO-feasible trial (or the closest one, flagged) as a bundle."""
    from dspark_core.config import apply_params, save_config

    check_out(out)  # before the study is even opened
    study = open_study(db_url, name, None)
    spec = StudySpec.model_validate(study.user_attrs[SPEC_ATTR])
    best = best_trial(study, spec)
    trial = best or _closest(study, spec)
    space = spec.space()
    params = space.params_of(dict(trial.params))
    evaluator = make_evaluator(spec)
    profile = spec.profile_model()
    plan = spec.plan_model()
    metrics = dict(trial.user_attrs.get("metrics", {}))

    def build(tmp: Path) -> None:
        config = apply_params(_base_config(spec), params)
        config.spec.sps_path, config.spec.sts_path = "sps.json", "sts.json"
        if _write_kernels(tmp, db_url, profile.hw.name):
            config.kernel_file = "kernels.json"
        cfg_path = tmp / "dspark.yaml"
        save_config(config, cfg_path)
        common = {"study": name, "trial_number": trial.number, "mode": evaluator.mode,
                  "hw_name": profile.hw.name or "device", "model_name": profile.model.name or "model"}
        cfg_text = cfg_path.read_text()
        env = _env()
        cfg_path.write_text(env.get_template(DSPARK_TEMPLATE).render(config_yaml=cfg_text, **common))
        from dspark_core.config import load_config

        load_config(cfg_path)  # the engine's own model accepts what we wrote
        sps = evaluator.sps_table(params)
        sps.save(tmp / "sps.json")
        calibration = measured_calibration(params["spec.head"]) if evaluator.mode == "measure" else None
        (tmp / "sts.json").write_text(json.dumps(sts_payload(profile, params, calibration), indent=2) + "\n")
        sg = sglang_context(profile, params)
        (tmp / "sglang.sh").write_text(env.get_template(SGLANG_TEMPLATE).render(**common, **sg))
        vctx = vllm_context(profile, params)
        (tmp / "vllm.json").write_text(env.get_template(VLLM_TEMPLATES[0]).render(**common, **vctx))
        (tmp / "vllm.sh").write_text(env.get_template(VLLM_TEMPLATES[1]).render(**common, **vctx))
        for f in ("sglang.sh", "vllm.sh"):
            (tmp / f).chmod(0o755)
        from tuner.report import write_report

        write_report(tmp, env.get_template(REPORT_TEMPLATE), study, spec, trial, best is not None, params, space,
                     plan, profile, evaluator, sps, db_url, common)
        (tmp / "provenance.json").write_text(json.dumps({
            "study": name, "trial": trial.number, "mode": evaluator.mode, "meets_slo": best is not None,
            "profile_hash": profile.content_hash(), "profile_id": spec.profile_id, "plan_id": spec.plan_id,
            "rules": plan.rule_refs(), "params": params, "metrics": metrics,
            "sps_table": "modelled" if evaluator.mode == "simulate" else "measured",
            "tool_version": spec.tool_version, "exported_at": datetime.now(timezone.utc).isoformat()},
            indent=2, default=str) + "\n")

    files = write_bundle(out, build)
    return ExportResult(out, files, trial.number, best is not None, metrics, params, evaluator.mode)


def _write_kernels(folder: Path, db_url: str, gpu: str | None) -> bool:
    """kernels.json: the Triton configs `tune-kernels` stored for this GPU (read by the engine)."""
    if not gpu:
        return False
    from kb.db import open_db
    from tuner.kernels import kernels_json, lookup_kernel_configs

    db = open_db(db_url)
    if not lookup_kernel_configs(db, gpu):
        return False
    (folder / "kernels.json").write_text(json.dumps(kernels_json(db, gpu), indent=2) + "\n")
    return True


def _base_config(spec: StudySpec):  # -> EngineConfig
    """The engine config the tuned parameters are applied to (model path when the profile has one)."""
    from dspark_core.config import EngineConfig

    cfg = EngineConfig()
    src = spec.profile_model().model.source or ""
    if src and Path(src).exists():
        cfg.model.path = str(Path(src).resolve().parent if Path(src).is_file() else Path(src).resolve())
    return cfg


def n_feasible(study) -> int:
    return len(feasible_trials(study))
