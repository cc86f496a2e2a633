"""`tune --engine`'s options, checked before anything is measured, and the live study's settings they give:
the engine found here, the simulated optimum it starts from, and the devices its servers share (`--devices`)."""

from __future__ import annotations

from pathlib import Path

from kb.cli_common import err_console
from tuner.errors import TunerError


def live_spec(spec, engine: str, python: Path | None, draft: str | None, requests: int | None,  # noqa: ANN001
               max_tokens: int | None, startup_s: float, quiet: bool):  # -> StudySpec
    """A live study's settings: the engine found here (one line when it is missing or not the pinned version) and
    the simulated optimum it starts from."""
    from tuner.live.engines import engine_class
    from tuner.measure import _checkpoint
    from tuner.prior import simulated_optimum

    check_live_options(engine, python, draft)
    draft_path = str(Path(draft).absolute()) if draft else None  # absolute, not resolved: a link is kept as given
    profile = spec.profile_model()
    live = engine_class(engine)(profile, _checkpoint(profile), str(python) if python else None, draft_path).locate()
    if live.warning and not quiet:
        err_console.print(f"[yellow]warning:[/] {live.warning}", highlight=False, soft_wrap=True)
    spec = spec.model_copy(update={"engine": engine, "engine_python": live.python, "draft": draft_path,
                                   "engine_version": f"{live.package} {live.version}", "live_requests": requests,
                                   "live_max_tokens": max_tokens, "startup_seconds": startup_s})
    return spec.model_copy(update={"prior": simulated_optimum(spec)})


def check_live_options(engine: str, python: Path | None, draft: str | None) -> None:
    """One line for a live option that cannot work: a missing interpreter or draft folder, or a draft path vLLM
    would read as another method."""
    if draft is not None and not (Path(draft) / "config.json").is_file():
        raise TunerError(f"--draft {draft}: not a checkpoint folder (no config.json); give a small autoregressive "
                         "model of the target's tokenizer, e.g. dspark_core/assets/tiny/draft")
    if python is not None and not python.exists():
        raise TunerError(f"--engine-python {python}: no such interpreter")
    if engine == "vllm" and draft is not None:
        from tuner.live.engines import check_vllm_draft

        check_vllm_draft(str(Path(draft).absolute()))


def live_workers(devices: str | None, workers: int | None, engine: str | None) -> tuple[int, list[int] | None]:
    """Worker processes (`--workers`, None when not given) and the parsed --devices of a tune: one server per device
    group, side by side, needs --devices (they must not share a device); without it a live study runs one server at
    a time."""
    from tuner.live.devices import parse_devices

    if devices is None:
        if engine is not None and (workers or 1) > 1:
            raise TunerError("--engine runs one server at a time unless --devices names the devices they may share "
                             "(e.g. --devices 0-7: one server per group of TP x DP devices); add --devices or drop "
                             "--workers")
        return workers or 1, None
    if engine is None:
        raise TunerError("--devices places the servers of a live study: add --engine dspark|vllm|sglang")
    ids = parse_devices(devices)
    if workers is not None and workers > len(ids):
        raise TunerError(f"--workers {workers}: more servers than the {len(ids)} devices of --devices {devices} hold")
    return workers or len(ids), ids


def live_deploy(engine: str | None, deploy: str | None = None) -> str | None:
    """The bundle a live SGLang or vLLM study exports: for the engine it measured (so its search holds only what
    that engine runs, and the script it ships is the one the trials ran). One line for a --deploy without it."""
    if engine not in ("sglang", "vllm"):
        return None
    if deploy is not None and deploy not in (engine, "both"):
        raise TunerError(f"--deploy {deploy}: this study measures {engine}, so its bundle must hold {engine}'s script; "
                         f"give --deploy {engine} or both")
    return engine
