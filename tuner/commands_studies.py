"""`studies list`: the tuning studies in the knowledge base, so a user can find the name to resume or export."""

from __future__ import annotations

from typing import Any

import typer

from kb.cli_common import DbOpt, JsonOpt, console, print_json

studies_app = typer.Typer(help="List the tuning studies in the knowledge base.", no_args_is_help=True)


def study_rows(db_url: str) -> list[dict[str, Any]]:
    """One row per study: name, mode, model, GPU, trial counts, best SLO-feasible first objective."""
    import optuna

    from tuner.study import SPEC_ATTR, StudySpec, best_trial, completed, feasible_trials, storage

    st = storage(db_url)
    rows = []
    for summary in optuna.get_all_study_summaries(st):
        study = optuna.load_study(study_name=summary.study_name, storage=st)
        row: dict[str, Any] = {"study": summary.study_name, "trials": len(study.trials),
                               "completed": len(completed(study)), "feasible": len(feasible_trials(study)),
                               "started": summary.datetime_start.isoformat(timespec="seconds")
                               if summary.datetime_start else None}
        raw = study.user_attrs.get(SPEC_ATTR)
        if raw is None:
            rows.append({**row, "mode": None, "model": None, "gpu": None, "objectives": None, "best": None})
            continue
        spec = StudySpec.model_validate(raw)
        profile = spec.profile_model()
        best = best_trial(study, spec)
        rows.append({**row, "mode": spec.mode, "model": profile.model.name, "gpu": profile.hw.name,
                     "objectives": spec.objectives, "best": best.values[0] if best else None,
                     "best_trial": best.number if best else None})
    return rows


@studies_app.command("list")
def list_studies(db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """List the studies: name, mode, model, GPU, trials (all / done = completed / ok = meet the SLOs), the best
    SLO-feasible score and the start date."""
    from rich.table import Table

    from kb.db import open_db, resolve_url

    open_db(db)
    rows = study_rows(resolve_url(db))
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("no studies yet: run `dspark tune`")
        return
    from tuner.objective import METRIC_UNITS, OBJECTIVES

    table = Table("study", "mode", "model", "GPU", "trials", "done", "ok", "best", "started")
    for r in rows:
        unit = METRIC_UNITS.get(OBJECTIVES[r["objectives"][0]][0], "") if r["objectives"] else ""
        best = f"{r['best']:,.4g} {unit}".strip() if r["best"] is not None else "-"
        table.add_row(r["study"], r["mode"] or "?", r["model"] or "?", r["gpu"] or "?", str(r["trials"]),
                      str(r["completed"]), str(r["feasible"]), best, (r["started"] or "")[:10])
    console.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(studies_app, name="studies")
