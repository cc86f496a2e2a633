"""Do the deployment bundles of `tune --serving` run as shipped? Issue 39's interop check and planning time.

`python benchmarks/interop_cluster.py [--cases qwen3/16xh100/auto,...] [--write] [--json]`

Per case, `python cli.py tune --model M --gpu G --gpus N --serving S` writes a bundle (timed: the issue asks for a
16-GPU plan within 3 minutes on this machine). Then bash runs every launch script of the deployment unmodified,
with `python` and `vllm` handed to the released engines' own parsers (benchmarks/interop_check.py's shims):
SGLang 0.5.23's `prepare_server_args` + `resolve_once()` for each prefill / decode worker and replica,
sglang-router 0.3.2's `parse_router_args` for the router, vLLM 0.33.0's `vllm serve` parser +
`create_engine_config()` for each vLLM worker. A replica script starts several servers and the router in the
background: the stand-ins then stay up for INTEROP_HOLD seconds, as servers would, and every one must pass.
Checked beyond the parse: the disaggregation mode and TP of each worker, the replicas' ports and GPUs, the
router's workers, and the speculative method on the decode side.
`--write` records the rows in benchmarks/results/interop_cluster.json and a table in RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import interop_check as ic  # noqa: E402 - the peer venv, shims and stand-ins

CASES = {  # name -> tune arguments (each case profiles anew)
    "qwen3/16xh100/auto": ["--model", "qwen3", "--gpu", "h100", "--gpus", "16", "--serving", "auto"],
    "qwen3/16xh100/agg": ["--model", "qwen3", "--gpu", "h100", "--gpus", "16", "--serving", "agg"],
    "llama-3.1-70b/16xh200/auto": ["--model", "llama-3.1-70b", "--gpu", "h200", "--gpus", "16", "--serving", "auto"],
    "llama-3.1-70b/16xh200/agg": ["--model", "llama-3.1-70b", "--gpu", "h200", "--gpus", "16", "--serving", "agg"],
    "deepseek-v3/16xh200/auto": ["--model", "deepseek-v3", "--gpu", "h200", "--gpus", "16", "--serving", "auto"],
    # a MoE model's workers with data-parallel attention and expert parallelism: long prompts (LONG) and a 20 ms TPOT
    "qwen3-30b-a3b/8xh200/disagg-long": ["--model", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "8", "--serving",
                                         "disagg", "--workload", "{long}", "--slo-tpot-ms", "20",
                                         "--slo-ttft-ms", "1000"],
}
LONG = (8, 3300, 1000)  # the "{long}" workload: prompts, words a prompt (~3,900 tokens), output tokens


def long_workload(path: Path) -> Path:
    """A JSONL workload of LONG's long prompts (deterministic words; the planner reads only their lengths)."""
    import random

    rng = random.Random(0)
    words = "the of and to in is for on with as by at from that this model server token request cluster".split()
    n, size, out = LONG
    path.write_text("".join(json.dumps({"prompt": " ".join(rng.choice(words) for _ in range(size)),
                                        "output_len": out}) + "\n" for _ in range(n)))
    return path


HOLD_S = 20  # how long a stand-in server stays up in a replica script (the longest parse takes ~10 s)


def _lines(proc: subprocess.CompletedProcess[str]) -> list[dict]:
    return [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]


def _bash(script: Path, env: dict[str, str]) -> tuple[int, list[dict], str]:
    p = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=900)
    return p.returncode, _lines(p), "\n".join(p.stderr.strip().splitlines()[-3:])


def _one(script: Path, env: dict[str, str], want: dict) -> dict:
    """A script that starts one server (or the router): its checker passed and resolved what `want` says."""
    code, got, err = _bash(script, env)
    row: dict = {"script": script.name, "exit": code}
    if not got:
        return {**row, "ok": False, "error": err or "no output"}
    g = got[-1]
    resolved = g.get("resolved", {})
    wrong = {k: (resolved.get(k), v) for k, v in want.items() if resolved.get(k) != v}
    row.update({"ok": bool(g.get("ok")) and not wrong and code == 0, "resolved": {k: resolved.get(k) for k in want}})
    if wrong:
        row["wrong"] = wrong
    if not g.get("ok"):
        row["error"] = g.get("error") or g.get("no_op_warnings")
    return row


def check_bundle(bundle: Path, env: dict[str, str]) -> list[dict]:
    """Every deployment script of `bundle`, each through the engines' parsers; one row per script run."""
    c = json.loads((bundle / "cluster.json").read_text())
    lay, files = c["chosen"], {p.name for p in bundle.iterdir()}
    method = json.loads((bundle / "provenance.json").read_text()).get("speculative_method")
    rows = []
    if lay["mode"] == "disagg":
        urls = {"PREFILL_URLS": " ".join(f"http://10.0.0.{i}:30000" for i in range(lay["prefill_workers"])),
                "DECODE_URLS": " ".join(f"http://10.0.1.{i}:30000" for i in range(lay["decode_workers"]))}
        for role, tp, dp in (("prefill", lay["prefill_tp"], lay.get("prefill_attn_dp", 1)),
                             ("decode", lay["decode_tp"], lay.get("attn_dp", 1))):
            if f"sglang_{role}.sh" in files:
                ep = lay.get("prefill_ep" if role == "prefill" else "ep", 1)
                want = {"disaggregation_mode": role, "tp_size": tp} | ({"attn_dp_size": dp} if dp > 1 else {}) \
                    | ({"ep_size": ep} if ep > 1 else {})
                rows.append(_one(bundle / f"sglang_{role}.sh", env, want))
            if f"vllm_{role}.sh" in files:
                rows.append(_one(bundle / f"vllm_{role}.sh", env, {"gpus": tp}))  # TP x DP (attention DP + EP)
        if "sglang_router.sh" in files:
            rows.append(_one(bundle / "sglang_router.sh", {**env, **urls}, {
                "pd_disaggregation": True, "decode_urls": urls["DECODE_URLS"].split(),
                "prefill_urls": [[u, None] for u in urls["PREFILL_URLS"].split()]}))
    else:
        if "cluster_sglang.sh" in files:
            rows.append(_replicas(bundle / "cluster_sglang.sh", env, c, lay, 30000, router=True))
        if "cluster_vllm.sh" in files and "--data-parallel-size-local" not in (bundle / "cluster_vllm.sh").read_text():
            rows.append(_replicas(bundle / "cluster_vllm.sh", env, c, lay, 8000, router=False))
        elif "cluster_vllm.sh" in files:
            for node in range(c["nodes"]):
                e = {**env, "NODE_RANK": str(node), "DP_ADDRESS": "10.0.0.1"}
                rows.append(_one(bundle / "cluster_vllm.sh", e, {"data_parallel_size": lay["replicas"]}))
                rows[-1]["node"] = node
    rows.append({"script": "(decode side)", "ok": True, "method": method or "none"})
    return rows


def _replicas(script: Path, env: dict[str, str], c: dict, lay: dict, base: int, router: bool) -> dict:
    """A replica script on node 0: its servers (each on its own GPUs and port from `base`) and, with `router`,
    SGLang's router over all nodes' replicas."""
    per_node = c["gpus_per_node"] // lay["tp"]
    hosts = " ".join(f"10.0.0.{n}" for n in range(c["nodes"]))
    outs = Path(tempfile.mkdtemp(prefix="servers-"))  # one JSON file per stand-in server: their prints would mix
    code, _, err = _bash(script, {**env, "NODE_RANK": "0", "WORKER_HOSTS": hosts, "INTEROP_HOLD": str(HOLD_S),
                                  "INTEROP_OUT": str(outs)})
    got = [json.loads(t) for f in sorted(outs.iterdir()) if (t := f.read_text().strip())]
    servers = [g for g in got if g.get("tool") != "sglang_router"]
    routers = [g for g in got if g.get("tool") == "sglang_router"]
    ports = sorted(int(g.get("port") or g.get("resolved", {}).get("port") or 0) for g in servers)
    gpus = sorted(g.get("visible_devices") or "" for g in servers)
    want_gpus = sorted(",".join(str(i * lay["tp"] + j) for j in range(lay["tp"])) for i in range(per_node))
    routed = routers[0].get("resolved", {}).get("worker_urls", []) if routers else []
    ok = (len(servers) == per_node and all(g.get("ok") for g in servers) and ports == list(range(base, base + per_node))
          and gpus == want_gpus and (len(routers) == 1 and routers[0].get("ok") and len(routed) == per_node * c["nodes"]
                                     if router else not routers))
    row = {"script": script.name, "exit": code, "ok": ok, "replicas_here": len(servers), "ports": ports,
           "visible_devices": gpus, "router_workers": len(routed)}
    if not ok:
        row["error"] = next((g.get("error") for g in got if g.get("error")), err)
    return row


def run_case(name: str, py: Path, work: Path) -> dict:
    case = work / name.replace("/", "_")
    case.mkdir(parents=True)
    env = {**os.environ, "DSPARK_DB": f"sqlite:///{case / 'kb.sqlite'}"}
    bundle = case / "bundle"
    t0 = time.time()
    args = [str(long_workload(case / "long.jsonl")) if a == "{long}" else a for a in CASES[name]]
    t = ic._cli(["tune", *args, "--out", str(bundle), "--json"], env)
    row: dict = {"case": name, "tune_exit": t.returncode, "tune_s": round(time.time() - t0, 1)}
    if not (bundle / "cluster.json").is_file():
        return {**row, "error": (t.stderr.strip().splitlines() or ["no bundle"])[-1]}
    from profiler.schema import Profile
    from tuner.study import SPEC_ATTR, StudySpec, open_study

    prov = json.loads((bundle / "provenance.json").read_text())
    spec = StudySpec.model_validate(open_study(env["DSPARK_DB"], prov["study"], None).user_attrs[SPEC_ATTR])
    profile = Profile.model_validate(spec.profile)
    params = prov["params"]
    c = json.loads((bundle / "cluster.json").read_text())
    row.update({"chosen": c["chosen"], "planned": c["planned"], "speculation_speedup": c["speculation_speedup"],
                "method": prov.get("speculative_method") or "none", "weights": params["weights.dtype"]})
    run_env = {**os.environ, "PATH": f"{ic._shims(case / 'bin', py)}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
               "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "VLLM_USE_V2_MODEL_RUNNER": "1",
               "MODEL_PATH": str(ic._stand_in_target(profile, case, str(params["weights.dtype"])))}
    stand_in = {"dspark": ic._stand_in_drafter, "eagle3": ic._stand_in_eagle3,
                "dflash": ic._stand_in_dflash}.get(row["method"])
    if stand_in is not None and not (bundle / "drafter").is_dir():
        run_env["DRAFT_MODEL_PATH"] = str(stand_in(profile, params, case))
    row["scripts"] = check_bundle(bundle, run_env)
    row["meets_slo"] = t.returncode == 0  # 2: the tuned server's p99 misses an SLO its planned mean met (bundle kept)
    row["ok"] = t.returncode in (0, 2) and all(s["ok"] for s in row["scripts"])
    return row


def _layout(lay: dict) -> str:
    from tuner.cluster import worker_name

    if lay["mode"] == "agg":
        return f"agg {lay['replicas']} x {worker_name(lay['tp'], lay.get('attn_dp', 1), lay.get('ep', 1))} " \
               f"({lay['batch']} req)"
    return (f"disagg {lay['prefill_workers']}P x "
            f"{worker_name(lay['prefill_tp'], lay.get('prefill_attn_dp', 1), lay.get('prefill_ep', 1))} + "
            f"{lay['decode_workers']}D x {worker_name(lay['decode_tp'], lay.get('attn_dp', 1), lay.get('ep', 1))} "
            f"({lay['decode_batch']} req)")


def table(rows: list[dict]) -> str:
    lines = ["| case | tune s | planned (speculation off) | tok/s/GPU | tuned server | its p99 meets the SLOs | "
             "as deployed tok/s/GPU | scripts passed |", "|---|---:|---|---:|---|---|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['tune_s']} | no bundle: {r['error']} | | | | | |")
            continue
        scripts = [s for s in r["scripts"] if s["script"] != "(decode side)"]
        passed = f"{sum(s['ok'] for s in scripts)}/{len(scripts)}: " + ", ".join(
            s["script"] + ("" if s["ok"] else " FAIL") for s in scripts)
        lines.append(f"| {r['case']} | {r['tune_s']} | {_layout(r['planned'])} | "
                     f"{r['planned']['tokens_per_s_gpu']:,.0f} | {r['method']}, {r['weights']} weights "
                     f"(speculation {r['speculation_speedup']:.2f}x) | {'yes' if r.get('meets_slo') else 'no'} | "
                     f"{r['chosen']['tokens_per_s_gpu']:,.0f} | "
                     f"{passed} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--write", action="store_true", help="put the table into benchmarks/RESULTS.md")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--from-json", type=Path, help="the rows a --json run printed: render (and --write) them")
    a = ap.parse_args()
    if a.from_json:
        rows = json.loads(a.from_json.read_text())["rows"]
        print(table(rows))
        if a.write:
            _write(rows, f"the run recorded in {a.from_json.name}")
        return 0
    names = [c.strip() for c in a.cases.split(",") if c.strip()]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        print(f"error: unknown case {unknown[0]!r}; choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    py = ic.ensure_venv(ic.venv_dir())
    rows = []
    with tempfile.TemporaryDirectory(prefix="cluster-interop-") as tmp:
        for name in names:
            print(f"case {name} ...", file=sys.stderr, flush=True)
            rows.append(run_case(name, py, Path(tmp)))
            print(f"  {'pass' if rows[-1].get('ok') else 'FAIL'} ({rows[-1]['tune_s']} s to tune)", file=sys.stderr)
    return ic.finish(rows, all(r.get("ok") for r in rows), a.json, a.write, table, _write)


def _write(rows: list[dict], when: str) -> None:
    """benchmarks/results/interop_cluster.json and RESULTS.md's section."""
    from benchmarks.results_md import write_section

    (ROOT / "benchmarks" / "results" / "interop_cluster.json").write_text(json.dumps(rows, indent=2) + "\n")
    write_section("interop_cluster", (
        "## Deployment bundles of `tune --serving` against the released engines (issue 39)\n\n"
        f"`python benchmarks/interop_cluster.py --write` ({when}; peers {', '.join(ic.PEERS)} in a CPU-only venv). "
        "Each bundle comes from `tune --gpus N --serving ...` (the MoE case: long prompts, ~3,900 tokens, and "
        "1,000 output tokens at TTFT 1 s / TPOT 20 ms); bash runs every deployment script unmodified with "
        "`python` / `vllm` handed to SGLang's, sglang-router's and vLLM's own parsers (a replica script's servers "
        "and router all checked). tune s: the whole command on this machine (plan, 40 simulated trials of the "
        "decoding server, export). Planned: AIC-priced in the better of bf16 and FP8, speculation off; as "
        "deployed: the layout with the tuned server's simulated throughput.\n\n" + table(rows)
        + "\n\nDetails per script: benchmarks/results/interop_cluster.json."))


if __name__ == "__main__":
    sys.exit(main())
