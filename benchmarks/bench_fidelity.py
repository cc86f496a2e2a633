"""Simulator fidelity on this CPU: predicted vs measured throughput of a target over >= 20 configs.

1. Calibrate (a separate run set, calibration prompts disjoint from the evaluation prompts, and
   configurations not in the evaluation set): every target forward and drafter call of instrumented
   engine runs is timed. Target forwards -> `fit_efficiency` (roofline efficiencies + per-forward
   overhead); drafter calls -> `draft_scale` (measured / modelled draft cost from its size); the rest
   of each run's wall time -> the engine's host overhead per round and per request-round; each
   drafter's per-position acceptance and confidence spread -> its AcceptanceModel.
   Each repeat calibrates afresh, interleaved with its evaluation runs (the load on the shared cores
   drifts by tens of percent within minutes).
2. Evaluate: each configuration runs the real engine (`repeats` times, interleaved; median) on the
   evaluation prompts, and `simulate` replays exactly that offline batch (same prompt lengths,
   max_new_tokens, ignore_eos) with the calibrated model (mean over seeds). Load tracking (`--probe`,
   default on): a calibration probe (plain, 8 slots, calibration prompts) runs before and after each
   evaluation run; the prediction is scaled by the probe's speed there relative to its median over
   the repeat. Figures without the probe are reported too.
3. Report MAPE and Spearman's rho, a per-config table, and write the calibration constants to
   benchmarks/results/fidelity.json (tests/tuner/test_fidelity.py re-checks the ranking with them).

Run: python benchmarks/bench_fidelity.py [--prompts 8] [--max-new 32] [--repeats 5]
     python benchmarks/bench_fidelity.py --model smollm2-135m --dtype bf16 --threads 2 (the real target)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "benchmarks" / "results" / "fidelity.json"
HEADS = ("none", "markov", "rnn")


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rho (average ranks for ties)."""
    def ranks(x: list[float]) -> np.ndarray:
        x_a = np.asarray(x, dtype=float)
        order = x_a.argsort()
        r = np.empty(len(x_a))
        r[order] = np.arange(len(x_a), dtype=float)
        for v in np.unique(x_a):
            m = x_a == v
            r[m] = r[m].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def mape(pred: list[float], meas: list[float]) -> float:
    return float(np.mean([abs(p - m) / m for p, m in zip(pred, meas, strict=True)]))


def available_heads(model: str | None) -> list[str]:
    """Heads with a committed drafter for the target (the tiny one, or a fetched model's)."""
    from dspark_core.config import ASSETS, committed_assets
    from dspark_core.drafters.dspark_layout import is_drafter

    root = committed_assets(model) if model else ASSETS
    return [h for h in HEADS if root is not None and is_drafter(root / "drafters" / h)]


class Bench:
    """The target (the tiny one, or `model`), both prompt sets, the profile and the engine runner."""

    def __init__(self, n_prompts: int, max_new: int, model: str | None = None, dtype: str = "fp32",
                 threads: int = 1, compile: bool = False) -> None:
        import torch

        torch.set_num_threads(threads)
        import dspark_core.config as dc
        from dspark_core.cli.prompts import load_prompts
        from dspark_core.modeling.checkpoint import checkpoint_folder
        from profiler.build import build_profile
        from tuner.measure import MeasureEvaluator, preset_prompts
        from tuner.perf import Hardware, ModelShape

        folder = str(checkpoint_folder(model)) if model else str(dc.ASSETS / "target")
        self.dtype = dtype
        self.profile = build_profile(model=folder, gpu="auto", workload=None, measure=True)
        self.shape, self.hw = ModelShape.from_profile(self.profile), Hardware.from_profile(self.profile)
        self.meas = MeasureEvaluator(self.profile, n_prompts=n_prompts, max_new_tokens=max_new, dtype=dtype,
                                     compile=compile)
        self.max_new = max_new
        rows = load_prompts(preset_prompts("code"), limit=2 * n_prompts)
        self.eval_prompts = [r.prompt for r in rows[:n_prompts]]
        self.calib_prompts = [r.prompt for r in rows[n_prompts:2 * n_prompts]]
        self.heads = available_heads(model)

    def params(self, **kw: Any) -> dict[str, Any]:
        from tuner.space import engine_defaults

        p = {**engine_defaults(), "spec.enabled": False, "weights.dtype": self.dtype}
        p.update({k.replace("__", "."): v for k, v in kw.items()})
        return p

    def engine(self, params: dict[str, Any]):
        from dspark_core.engine import Engine

        cfg = self.meas.config(params)
        if cfg.spec.enabled and not self.heads:
            cfg.drafter.method = "ngram"  # no trained DSpark drafter here yet: prompt lookup drafts
        cfg.sampling.ignore_eos = True
        return Engine(cfg, target=self.meas.target, tokenizer=self.meas.tokenizer), cfg

    def lengths(self, prompts: list[str]) -> list[tuple[int, int]]:
        return [(len(self.meas.tokenizer.encode(p)), self.max_new) for p in prompts]

    def run(self, params: dict[str, Any], prompts: list[str], instrument: bool = False) -> dict[str, Any]:
        from dspark_core.engine_parts import warm_steps
        from tuner.calibrate import instrumented_generate

        eng, cfg = self.engine(params)
        t0 = time.time()
        warm_steps(eng)  # compiled steps: every shape built (or loaded) before the run is timed, as `serve` does
        warm_s = time.time() - t0
        if instrument:
            res = instrumented_generate(eng, prompts, cfg.sampling)
        else:
            res = {"generation": eng.generate(prompts, cfg.sampling)}
        st = res["generation"].stats
        res.update(tps=st.tokens_per_s, seconds=st.seconds, stats=st)
        warm = f" (compiling {warm_s:.0f} s)" if warm_s >= 1 else ""
        print(f"    {label(params)}{' (calibration)' if instrument else ''}: {st.tokens_per_s:.1f} tok/s, "
              f"{time.time() - t0:.0f} s{warm}", flush=True)  # progress: a run is seconds, a cold compile minutes
        return res


def perf_model(b: Bench, eff):
    from tuner.perf import PerfModel

    return PerfModel(b.shape, b.hw, eff, weights_dtype=b.dtype, kv_dtype=b.dtype)


def accept_model(head: str, calib: dict[str, Any]):
    from tuner.acceptance import AcceptanceModel

    a = calib["acceptance"].get(head if calib["heads"] else "ngram")
    if a is None:
        return AcceptanceModel(0.5, 1.0, 3.0, "none measured")
    return AcceptanceModel(a["table"][0] if a["table"] else 0.5, 1.0, a["kappa"], a["source"], tuple(a["table"]))


def predict(b: Bench, params: dict[str, Any], calib: dict[str, Any], lengths: list[tuple[int, int]],
            seeds: int = 3) -> dict[str, float]:
    from tuner.perf import Efficiency
    from tuner.simulate import simulate

    eff = Efficiency(**calib["efficiency"])
    perf = perf_model(b, eff)
    acc = accept_model(params["spec.head"], calib)
    runs = [simulate(params, b.profile, perf, acc, requests=lengths, bundled=True, seed=s) for s in range(seeds)]
    return {"throughput": float(np.mean([r.throughput for r in runs])), "tau": float(np.mean([r.tau for r in runs])),
            "host_rounds": float(np.mean([r.extra["host_rounds"] for r in runs])),
            "host_request_rounds": float(np.mean([r.extra["host_request_rounds"] for r in runs])),
            "makespan_s": float(np.mean([r.extra["makespan_s"] for r in runs]))}


def PROBE(b: Bench) -> dict[str, Any]:  # noqa: N802 - a constant configuration
    """The load-tracking probe: a calibration configuration (plain, 8 slots) on the calibration prompts."""
    return b.params(batch__max_requests=8)


def calibration_configs(b: Bench) -> list[dict[str, Any]]:
    """Disjoint from the evaluation configurations (and run on the calibration prompts)."""
    cfgs = [b.params(batch__max_requests=1), b.params(batch__max_requests=3), b.params(batch__max_requests=8)]
    for head in b.heads or ["markov"]:
        for mr in (1, 5):
            cfgs.append(b.params(spec__enabled=True, spec__head=head, spec__block_size=8,
                                 spec__scheduler="verify_all", batch__max_requests=mr))
    return cfgs


def calibration_runs(b: Bench, cfgs: list[dict[str, Any]] | None = None) -> list[tuple[dict[str, Any], dict]]:
    """One instrumented engine run per calibration configuration on the calibration prompts."""
    return [(p, b.run(p, b.calib_prompts, instrument=True)) for p in (cfgs or calibration_configs(b))]


def calibrate(b: Bench, runs: list[tuple[dict[str, Any], dict]]) -> dict[str, Any]:
    """Calibration constants (efficiency, drafter scale, host overhead, acceptance) from instrumented runs."""
    from tuner.calibrate import beta_concentration, fit_efficiency, fit_round_overhead

    forwards = [s for _, r in runs for s in r["forwards"]]
    eff, err = fit_efficiency(forwards, b.shape, b.hw, b.dtype, b.dtype, unbiased=True)
    perf = perf_model(b, eff)
    # drafter calls: measured seconds ~ draft_scale * (cost from the drafter's size) + draft_request_s * rows
    draft_rows = [(d[3], perf.draft_step(int(d[0]), int(d[1]), d[2], int(p["spec.draft_layers"]), p["spec.head"],
                                         int(p["spec.markov_rank"])), d[0]) for p, r in runs for d in r["drafts"]]
    draft_scale, draft_request_s = fit_round_overhead(draft_rows) if draft_rows else (1.0, 0.0)
    acceptance: dict[str, Any] = {}
    for p, r in runs:
        if not p["spec.enabled"]:
            continue
        key = p["spec.head"] if b.heads else "ngram"
        st = r["stats"]
        acc = acceptance.setdefault(key, {"att": [], "ok": [], "conf": []})
        for j, (n, a) in enumerate(zip(st.pos_attempts, st.pos_accepts, strict=True)):
            while len(acc["att"]) <= j:
                acc["att"].append(0)
                acc["ok"].append(0)
            acc["att"][j] += n
            acc["ok"][j] += a
        acc["conf"] += r["confidences"]
    for key, acc in list(acceptance.items()):
        table = [ok / n if n else 0.0 for ok, n in zip(acc["ok"], acc["att"], strict=True)]
        acceptance[key] = {"table": [round(x, 4) for x in table], "kappa": round(beta_concentration(acc["conf"]), 3),
                           "source": f"measured: {key} drafter on {len(b.calib_prompts)} calibration prompts"}
    calib = {"efficiency": {**asdict(replace(eff, draft_scale=draft_scale, draft_request_s=draft_request_s))},
             "heads": b.heads,
             "acceptance": acceptance, "forward_fit_error": err, "calibration_runs": len(runs),
             "forward_samples": len(forwards)}
    # host overhead: what the modelled forwards and drafts do not explain, per engine iteration / request
    rows = []
    lengths = b.lengths(b.calib_prompts)
    for p, r in runs:
        pred = predict(b, p, calib, lengths, seeds=2)
        rows.append((r["seconds"] - pred["makespan_s"], pred["host_rounds"], pred["host_request_rounds"]))
    rs, rqs = fit_round_overhead(rows)
    calib["efficiency"].update(round_s=rs, round_request_s=rqs)
    calib["efficiency"]["source"] = (f"calibrated on {b.hw.name or 'this CPU'}: {len(forwards)} timed target "
                                     f"forwards (fit error {err:.1%}), drafter and host overhead from "
                                     f"{len(runs)} calibration runs")
    return calib


def label(p: dict[str, Any]) -> str:
    if not p["spec.enabled"]:
        return f"plain mr={p['batch.max_requests']}"
    return (f"{p['spec.head']} g={p['spec.block_size']} {p['spec.scheduler']} mr={p['batch.max_requests']}")


def eval_configs(b: Bench) -> list[dict[str, Any]]:
    cfgs = [b.params(batch__max_requests=m) for m in (1, 2, 4, 6)]
    heads = b.heads or ["markov"]
    grid = [(3, "verify_all", 1), (6, "verify_all", 1), (4, "verify_all", 4), (7, "verify_all", 8),
            (5, "threshold", 2), (6, "prefix", 4), (8, "verify_all", 2)]
    if not b.heads:  # ngram fallback has no confidences: verify_all only, more shapes
        grid = [(g, "verify_all", m) for g in (2, 4, 6) for m in (1, 2, 4, 6)]
    for head in heads:
        for g, sch, mr in grid:
            cfgs.append(b.params(spec__enabled=True, spec__head=head, spec__block_size=g, spec__scheduler=sch,
                                 batch__max_requests=mr))
    return cfgs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="evaluation prompts (and as many calibration prompts)")
    ap.add_argument("--max-new", type=int, default=32, help="max_new_tokens per request (ignore_eos)")
    ap.add_argument("--repeats", type=int, default=5, help="measured repeats per config (interleaved; median)")
    ap.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True,
                    help="scale predictions by a calibration probe run beside each evaluation run (load tracking)")
    ap.add_argument("--out", type=Path, default=None, help="JSON with calibration constants and the table "
                    "(default: results/fidelity.json, or results/fidelity_MODEL.json with --model)")
    ap.add_argument("--model", default=None, help="target: a fetched model (smollm2-135m) or folder; default tiny")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compile", action="store_true", help="the engine's compiled decode / verify steps (its fast "
                    "path, what a tuned bundle runs) instead of eager ones; shapes compiled before any run is timed")
    args = ap.parse_args()
    import torch  # after parsing: --help stays fast

    args.out = args.out or (OUT.with_name(f"fidelity_{Path(args.model).name}.json") if args.model else OUT)
    t_start = time.time()
    b = Bench(args.prompts, args.max_new, args.model, args.dtype, args.threads, args.compile)
    print(f"drafters: {b.heads or 'none trained yet (ngram fallback)'}; load average {os.getloadavg()[0]:.2f}")
    cfgs = eval_configs(b)
    lengths = b.lengths(b.eval_prompts)
    measured: list[list[float]] = [[] for _ in cfgs]
    taus: list[float] = [0.0] * len(cfgs)
    predicted: list[list[float]] = [[] for _ in cfgs]
    raw: list[list[float]] = [[] for _ in cfgs]  # without the load-tracking probe
    tau_pred: list[float] = [0.0] * len(cfgs)
    calibs = []
    for rep in range(args.repeats):
        # each repeat calibrates on its own runs, interleaved with its evaluation runs, so that both see
        # the same load on the shared cores (it drifts by tens of percent over minutes); calibration
        # uses other configurations and other prompts than the evaluation
        calib = calibrate(b, calibration_runs(b))
        calibs.append(calib)
        order = list(range(len(cfgs))) if rep % 2 == 0 else list(reversed(range(len(cfgs))))
        probes = []
        for i in order:
            probes.append(b.run(PROBE(b), b.calib_prompts)["tps"])
            r = b.run(cfgs[i], b.eval_prompts)
            measured[i].append(r["tps"])
            taus[i] = r["stats"].tau
        probes.append(b.run(PROBE(b), b.calib_prompts)["tps"])
        typical = statistics.median(probes)
        for k, i in enumerate(order):
            pr = predict(b, cfgs[i], calib, lengths)
            # load tracking: the probe's speed just before and after this run, relative to its median over
            # the repeat (the repeat's calibration already sets the level; this follows drift within it)
            speed = float(np.sqrt(probes[k] * probes[k + 1])) / typical if args.probe else 1.0
            predicted[i].append(pr["throughput"] * speed)
            raw[i].append(pr["throughput"])
            tau_pred[i] = pr["tau"]
        fitted = {k: round(v, 6) for k, v in calib["efficiency"].items() if isinstance(v, float)}  # kernels: None
        print(f"  repeat {rep + 1}/{args.repeats} done ({time.time() - t_start:.0f} s); "
              f"efficiency {json.dumps(fitted)}")
    calib = calibs[-1]
    rows = []
    for i, p in enumerate(cfgs):
        rows.append({"config": label(p), "measured": statistics.median(measured[i]), "measured_all": measured[i],
                     "predicted": statistics.median(predicted[i]), "predicted_all": predicted[i],
                     "predicted_no_probe": statistics.median(raw[i]),
                     "tau_measured": taus[i], "tau_predicted": tau_pred[i]})
    meas = [r["measured"] for r in rows]
    pred = [r["predicted"] for r in rows]
    raw_pred = [r["predicted_no_probe"] for r in rows]
    summary = {"configs": len(rows), "mape": mape(pred, meas), "spearman": spearman(pred, meas),
               "mape_no_probe": mape(raw_pred, meas), "spearman_no_probe": spearman(raw_pred, meas),
               "seconds": time.time() - t_start, "load_average": os.getloadavg()[0],
               "prompts": args.prompts, "max_new_tokens": args.max_new, "repeats": args.repeats,
               "model": args.model or "tiny", "dtype": args.dtype, "threads": args.threads,
               "compile": args.compile, "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    print("\n| config | measured tok/s | predicted tok/s | error | tau meas | tau pred |\n|---|---|---|---|---|---|")
    for r in rows:
        err = (r["predicted"] - r["measured"]) / r["measured"]
        print(f"| {r['config']} | {r['measured']:.0f} | {r['predicted']:.0f} | {err:+.0%} | "
              f"{r['tau_measured']:.2f} | {r['tau_predicted']:.2f} |")
    print(f"\nMAPE {summary['mape']:.1%}, Spearman {summary['spearman']:.3f} over {len(rows)} configs "
          f"({summary['seconds']:.0f} s, load {summary['load_average']:.2f}); without the load probe: MAPE "
          f"{summary['mape_no_probe']:.1%}, Spearman {summary['spearman_no_probe']:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=args.out.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"calibration": calib, "calibrations": [c["efficiency"] for c in calibs], "summary": summary,
                   "rows": rows, "profile": b.profile.model_dump(mode="json", exclude_none=True),
                   "lengths": lengths, "heads": b.heads}, f, indent=1)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
