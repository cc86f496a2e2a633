"""TunedConfig -> deployable bundle, written into --out DIR without losing anything the user owns.

Renders the Jinja2 templates in tuner/templates/ (StrictUndefined: a missing value is an error, never an empty
flag; every value in a shell script goes through `q`, shlex.quote) into a staging folder, validates what it can
(dspark.yaml through the engine's own config model, sps.json through the SPS table model, a shipped drafter
through the engine's loader), then moves the files into place (tuner/bundle_dir.py).

dspark.yaml is the configuration that was tuned (tuner/engine_config.py, the function the measure objective runs
too): the profile's model, a KV length that holds the workload, DSpark with the drafter the study ran. A measured
study ships that drafter inside the bundle (`drafter/`, in the layout SGLang and vLLM load); a simulated one names
the profile's drafter checkpoint (a published model id or a folder), or asks for DRAFT_MODEL_PATH when none exists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tuner.bundle_dir import check_out, write_bundle
from tuner.errors import TunerError
from tuner.launch import template_env, write_dspark, write_sglang, write_vllm
from tuner.live.confirm import exported_metrics
from tuner.method_schedule import tuned_schedules
from tuner.study import SPEC_ATTR, StudySpec, best_trial, completed, feasible_trials, make_evaluator, miss, open_study
from tuner.targets import BUNDLED_DRAFTER, measured_calibration, sglang_context, sts_payload, vllm_context

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
    cluster: dict[str, Any] | None = None  # tune --serving: cluster.json's content

    def to_json(self) -> dict[str, Any]:
        return {"out": str(self.out), "files": self.files, "trial": self.trial_number, "meets_slo": self.meets_slo,
                "metrics": self.metrics, "params": self.params, "mode": self.mode,
                **({"cluster": self.cluster} if self.cluster else {})}


def _closest(study, spec: StudySpec):  # -> FrozenTrial
    """When nothing meets the SLOs: the completed trial with the smallest total violation."""
    trials = completed(study)
    if not trials:
        raise TunerError(f"study {study.study_name!r} has no completed trial to export; run tune first")
    return min(trials, key=lambda t: (miss(t), t.number))


def _numbered(study, number: int):  # -> FrozenTrial
    """Completed trial `number` of the study, or one line saying which trials there are."""
    trials = completed(study)
    got = next((t for t in trials if t.number == number), None)
    if got is None:
        numbers = [t.number for t in trials]
        shown = ", ".join(map(str, numbers[:20])) + (" ..." if len(numbers) > 20 else "")
        raise TunerError(f"--trial {number}: study {study.study_name!r} has no completed trial {number} (completed: "
                         f"{shown or 'none'})")
    return got


def _measured_drafter(evaluator, params: dict[str, Any]) -> Path | None:
    """The drafter a measured study ran for `params` (None: speculation off, or a simulated study)."""
    if evaluator.mode not in ("measure", "live") or not params.get("spec.enabled", True):
        return None
    path = evaluator.drafter_path(params)
    return Path(path) if path else None


def _ship_drafter(src: Path, dst: Path, evaluator) -> None:
    """Copy the measured drafter into the bundle in the engines' layout (converted when it is the older one),
    with its STS calibration, and check the copy loads in the bundled engine."""
    import shutil

    from dspark_core.drafters.draft_vocab import VOCAB_FILE
    from dspark_core.drafters.dspark_layout import (
        ENGINE_CONFIG,
        WEIGHTS_FILE,
        engine_layout_config,
        load_drafter,
        save_drafter,
    )
    from dspark_core.errors import DSparkError

    dst.mkdir()
    try:
        if engine_layout_config(src) is not None:
            for name in (ENGINE_CONFIG, WEIGHTS_FILE):
                shutil.copy2(src / name, dst / name)
        else:
            target = evaluator.target
            save_drafter(load_drafter(src, target), dst, target_layers=target.arch.num_hidden_layers,
                         max_positions=target.arch.max_position_embeddings)
        for name in ("sts.json", VOCAB_FILE):  # its calibration, and the reduced draft vocabulary the trials ran
            if (src / name).is_file():
                shutil.copy2(src / name, dst / name)
        load_drafter(dst, evaluator.target)
    except DSparkError as e:
        raise TunerError(f"cannot ship the measured drafter {src} in the engines' layout: {e}") from None


def export_study(db_url: str, name: str, out: Path, number: int | None = None) -> ExportResult:
    """Export study `name`'s best SLO-feasible trial (or the closest one, flagged) as a bundle; `number`: that
    completed trial instead (a Pareto-front point the user prefers), flagged when it misses the SLOs. A study
    `tune --serving` made tuned one server of a planned deployment (StudySpec.cluster): the bundle also holds
    that deployment's plan and launch scripts."""
    from tuner.engine_config import max_seq_len, model_ref, tuned_engine_config

    check_out(out)  # before the study is even opened
    study = open_study(db_url, name, None)
    spec = StudySpec.model_validate(study.user_attrs[SPEC_ATTR])
    if number is None:
        best = best_trial(study, spec)
        trial = best or _closest(study, spec)
    else:
        trial = _numbered(study, number)
        best = trial if any(t.number == number for t in feasible_trials(study)) else None
    space = spec.space()
    params = space.params_of(dict(trial.params))
    evaluator = make_evaluator(spec)
    profile = spec.profile_model()
    plan = spec.plan_model()
    metrics = exported_metrics(study, spec, trial)  # a live finalist: the mean of its measurements
    measured = _measured_drafter(evaluator, params)
    bundled = measured is not None
    schedules = tuned_schedules(evaluator, params)  # the draft length per batch size (simulated studies)
    planned: dict[str, Any] = {}
    cluster = None
    if spec.cluster:  # a study `tune --serving` made: the deployment it tuned a server of
        from tuner.cluster_tune import ClusterChoice

        cluster = ClusterChoice.from_json(spec.cluster)

    def build(tmp: Path) -> None:
        if bundled:
            _ship_drafter(measured, tmp / BUNDLED_DRAFTER, evaluator)
        drafter = BUNDLED_DRAFTER if bundled else profile.drafter.id
        model = str(evaluator.path) if evaluator.mode in ("measure", "live") else None
        common = {"study": name, "trial_number": trial.number, "mode": evaluator.mode,
                  "hw_name": profile.hw.name or "device", "model_name": profile.model.name or "model"}
        sps = evaluator.sps_table(params)
        seq = max_seq_len(profile, int(params["spec.block_size"]))
        if _bundled_engine_runs(params):  # dspark.yaml and its files: only for a method our engine runs
            config = tuned_engine_config(profile, params, drafter, model_path=model)
            config.compile = spec.compile  # as a measured study's trials ran it (False for the other modes)
            if _write_kernels(tmp, db_url, profile.hw.name):
                config.kernel_file = "kernels.json"
            calibration = measured_calibration(tmp / BUNDLED_DRAFTER if bundled else None)
            write_dspark(tmp, config, sps, sts_payload(profile, params, calibration), common)
            seq = config.model.max_seq_len
        from tuner.deploy import engines

        if "sglang" in engines(spec.deploy):
            write_sglang(tmp, sglang_context(profile, params, bundled, seq, schedule=schedules["sglang"]), common)
        if "vllm" in engines(spec.deploy):
            write_vllm(tmp, vllm_context(profile, params, bundled, seq, draft_model=spec.draft,
                                         schedule=schedules["vllm"]), common)
        env = template_env()
        from tuner.report import write_report

        write_report(tmp, env.get_template(REPORT_TEMPLATE), study, spec, trial, best is not None, params, space,
                     plan, profile, evaluator, sps, db_url, common, schedules)
        if cluster is not None:
            from tuner.cluster_tune import write_cluster

            planned.update(write_cluster(tmp, cluster, evaluator, params, metrics, spec.seed, engines(spec.deploy),
                                         common, schedules))
        (tmp / "provenance.json").write_text(json.dumps({
            "study": name, "trial": trial.number, "mode": evaluator.mode, "meets_slo": best is not None,
            "profile_hash": profile.content_hash(), "profile_id": spec.profile_id, "plan_id": spec.plan_id,
            "rules": plan.rule_refs(), "params": params, "metrics": metrics,
            "speculative_method": params.get("spec.method", "dspark") if params.get("spec.enabled", True) else None,
            "deploy": list(engines(spec.deploy)),
            "draft_schedule": schedules,
            "predicted_acceptance": _predicted_acceptance(profile, params),
            "model": model or model_ref(profile), "drafter": {"path": drafter, "source": profile.drafter.source,
                                                   "measured": str(measured) if measured else None},
            "sps_table": "modelled" if evaluator.mode == "simulate" else "measured",
            "cost_source": (evaluator.perf(params).cost_source if evaluator.mode == "simulate" else "measured"),
            "cluster": "cluster.json" if cluster is not None else None,
            "tool_version": spec.tool_version, "exported_at": datetime.now(timezone.utc).isoformat()},
            indent=2, default=str) + "\n")

    files = write_bundle(out, build)
    return ExportResult(out, files, trial.number, best is not None, metrics, params, evaluator.mode, planned or None)


def _bundled_engine_runs(params: dict[str, Any]) -> bool:
    """Whether the bundled engine runs the tuned configuration (plain, DSpark, n-gram, suffix): only then does
    the bundle ship dspark.yaml, dspark.sh and the files they read."""
    from tuner.engine_config import BUNDLED_METHODS

    return not params.get("spec.enabled", True) or str(params.get("spec.method") or "dspark") in BUNDLED_METHODS


def _predicted_acceptance(profile, params: dict) -> dict | None:  # noqa: ANN001 - profiler.schema.Profile
    """The per-position acceptance the tuner assumed for the exported drafter (what `monitor` checks)."""
    if not params.get("spec.enabled", True):
        return None
    from tuner.acceptance import acceptance_of

    head, gamma = str(params["spec.head"]), int(params["spec.block_size"])
    method = str(params.get("spec.method") or "dspark")
    model = acceptance_of(profile, method, head, int(params.get("spec.draft_layers", 0)) or None)
    return {"method": method, "head": head, "gamma": gamma,
            "position_acceptance": [round(a, 4) for a in model.alphas(gamma)],
            "tau": round(model.tau(gamma), 4), "source": model.source}


def _write_kernels(folder: Path, db_url: str, gpu: str | None) -> bool:
    """kernels.json: the Triton configs `tune-kernels` stored for this GPU (read by the engine)."""
    if not gpu:
        return False
    from sqlalchemy import func, select

    from kb.db import open_db
    from kb.models_kernels import KernelConfigRow

    db = open_db(db_url)
    with db.session() as s:
        if not s.scalar(select(func.count()).select_from(KernelConfigRow)):
            return False  # nothing tuned on any GPU: no need to load the kernel registry (it imports torch)
    from tuner.kernels import kernels_json, lookup_kernel_configs

    if not lookup_kernel_configs(db, gpu):
        return False
    (folder / "kernels.json").write_text(json.dumps(kernels_json(db, gpu), indent=2) + "\n")
    return True


def n_feasible(study) -> int:
    return len(feasible_trials(study))
