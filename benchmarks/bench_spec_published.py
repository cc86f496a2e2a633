"""How well does the simulator predict published, measured speculative-decoding speedups on GPUs?

Every row of benchmarks/spec_published/rows.yaml (each with its source and the quoted line) that names a model,
GPU and method the catalogues know is replayed through `estimate` (tuner/estimate.py) on the row's engine, TP,
weight dtype, concurrency, lengths, depth and, where the source measured it, acceptance length; the predicted
speedup over no speculation is compared with the measured one. Rows without a measured acceptance use the
method's prior (marked). Reported: the share of rows within +-15%, the worst ratio, and inside each published
sweep (a depth or a concurrency series) the Spearman rank correlation and whether the best depth agrees.

`--fit` refits the engines' per-round constants (tuner/catalog/spec_costs.yaml `fitted`) on the `use: fit` rows
whose acceptance length was measured (the only rows where the constants are identifiable apart from the
acceptance), writes them with the row ids they came from, and reports the error on every other row.

    python benchmarks/bench_spec_published.py [--fit] [--write] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from benchmarks.results_md import shown_command, write_section  # noqa: E402

ROWS = ROOT / "benchmarks" / "spec_published" / "rows.yaml"
METHOD = {"eagle": "eagle3", "eagle3": "eagle3", "mtp": "mtp", "ngram": "ngram", "dspark": "dspark",
          "dflash": "dflash", "draft_model": "draft_model", "suffix": "suffix"}  # EAGLE-1/2 priced as EAGLE-3's net
ENGINES = ("sglang", "vllm", "trtllm", "transformers")


def engine_of(row: dict[str, Any]) -> str:
    """The engine a row ran on (its first word: "vllm + arctic-inference plugin" is vLLM)."""
    word = str(row.get("engine") or "").split(" ")[0].lower()
    return word if word in ENGINES else "sglang"
GPU = {"b200": "b200", "h200": "h200", "h100": "h100", "gb200": "gb200", "b300": "b300", "h20": "h20",
       "rtx_pro_6000": "rtx-pro-6000", "mi300x": "mi300x"}
FIT_WORKERS = 2  # processes a fit prices rows in
FIT_GRID = {"round_us": [0, 50, 100, 200, 300, 500, 800, 1200, 1800, 2500],
            "request_us": [0, 5, 10, 20, 40, 80, 160],
            "draft_step_us": [0, 25, 50, 100, 150, 250, 400, 600]}


def model_name(hf_id: str | None) -> str | None:
    """A catalogue name for a published model id: the org and quantisation / instruct suffixes dropped."""
    if not hf_id:
        return None
    name = hf_id.split("/")[-1].split(" ")[0]
    name = re.sub(r"-(FP4|NVFP4|FP8|Instruct|Base|0324|chat-hf|DSpark|0731)$", "", name, flags=re.I)
    name = re.sub(r"-(FP4|NVFP4|FP8|Instruct|0324)$", "", name, flags=re.I)
    return name.replace("Meta-Llama", "Llama")


def dtype_of(row: dict[str, Any]) -> str:
    text = (row.get("dtype") or "").lower() + " " + str(row.get("model") or "").lower()
    if "fp4" in text:
        return "nvfp4"
    if "fp8" in text:
        return "fp8"
    return "auto"


def case_of(row: dict[str, Any]):  # -> tuple[Case | None, str]
    """The estimate Case of a row, or None and why it cannot be replayed."""
    from tuner.estimate import Case

    method = METHOD.get(str(row.get("method")))
    if method is None or row.get("method") == "none":
        return None, f"method {row.get('method')!r}"
    conc = row.get("concurrency")
    if not isinstance(conc, int):
        return None, f"concurrency {conc!r} not stated"
    gpu = GPU.get(str(row.get("gpu")))
    if gpu is None:
        return None, f"GPU {row.get('gpu')!r}"
    m = row.get("measured") or {}
    if not m.get("speedup"):
        return None, "no measured speedup"
    tau = m.get("acceptance_length")
    steps = row.get("steps")
    topk = int(row.get("topk") or 1)
    dt = int(row.get("draft_tokens") or 0) if topk > 1 else 0
    if tau is not None and steps and not 1 <= tau <= steps + 1:
        tau = None
    return Case(model=model_name(row["model"]) or "", gpu=gpu, gpus=row.get("gpus") or row.get("tp") or 1,
                tp=row.get("tp") or row.get("gpus") or 1, dtype=dtype_of(row), concurrency=conc,
                isl=int(row.get("isl") or 1024), osl=int(row.get("osl") or 1024), method=method,
                steps=int(steps) if steps else None, topk=topk, draft_tokens=dt, tau=tau,
                engine=engine_of(row)), ""


_BASES: dict[tuple, dict[str, Any]] = {}  # the no-speculation run per deployment: no fitted constant prices it


def _estimate(case) -> dict[str, Any]:  # noqa: ANN001 - tuner.estimate.Case
    from dataclasses import astuple, replace

    from tuner.estimate import estimate

    key = astuple(replace(case, method="none", steps=None, topk=1, draft_tokens=0, tau=None))
    r = estimate(case, _BASES.get(key))
    _BASES[key] = r["none"]
    return r


def _anchor_tau(row: dict[str, Any], by_id: dict[str, dict[str, Any]], cache: dict[str, float]) -> float | None:
    """The acceptance of a series whose timed run published none (`tau_anchor`): the tau at which the anchor row's
    predicted speedup meets its measured one (bisection; the speedup grows with tau)."""
    from dataclasses import replace

    aid = row["tau_anchor"]
    if aid in cache:
        return cache[aid]
    anchor = by_id[aid]
    case, _ = case_of(anchor)
    if case is None:
        return None
    want = anchor["measured"]["speedup"]
    lo, hi = 1.0, float(case.steps or 1) + 1.0
    for _ in range(14):
        mid = (lo + hi) / 2
        if _estimate(replace(case, tau=mid))["speedup"] < want:
            lo = mid
        else:
            hi = mid
    cache[aid] = round((lo + hi) / 2, 3)
    return cache[aid]


def predict(rows: list[dict[str, Any]], every: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Each row with its prediction (or why none). `every`: all rows, where `relative_to` / `tau_anchor` look up
    the rows they name (default: `rows`)."""
    from dataclasses import replace

    from tuner.errors import TunerError

    by_id = {r["id"]: r for r in (every or rows)}
    anchors: dict[str, float] = {}
    out = []
    for row in rows:
        case, why = case_of(row)
        rec = {"id": row["id"], "use": row["use"], "measured": (row.get("measured") or {}).get("speedup"),
               "tau_measured": (row.get("measured") or {}).get("acceptance_length") is not None,
               "series": "|".join(str(row.get(k)) for k in ("dataset", "temperature", "isl", "osl", "topk")) +
               (f"|{row.get('draft_tokens')}" if int(row.get("topk") or 1) > 1 else ""),
               **({"sweep": row["sweep"]} if row.get("sweep") else {})}
        if case is None:
            out.append(rec | {"skipped": why})
            continue
        try:
            if row.get("tau_anchor"):
                tau = _anchor_tau(row, by_id, anchors)
                if tau is None:
                    out.append(rec | {"skipped": f"anchor {row['tau_anchor']} cannot be replayed"})
                    continue
                case = replace(case, tau=tau)
                rec["tau_source"] = f"fitted on {row['tau_anchor']}"
            r = _estimate(case)
            for k in row.get("steps_tuned") or []:  # the source tuned the depth per batch: our best of its choices
                other = _estimate(replace(case, steps=int(k), tau=None))
                if other["speedup"] > r["speedup"]:
                    r = other
            speedup = r["speedup"]
            if row.get("relative_to"):  # the published speedup is over another published configuration
                base_case, why = case_of(by_id[row["relative_to"]])
                if base_case is None:
                    out.append(rec | {"skipped": f"relative_to {row['relative_to']}: {why}"})
                    continue
                speedup = speedup / _estimate(base_case)["speedup"]
                rec["relative_to"] = row["relative_to"]
        except (TunerError, Exception) as e:  # noqa: BLE001 - a catalogue gap is a skipped row, reported
            out.append(rec | {"skipped": " ".join(str(e).split())[:160]})
            continue
        rec |= {"predicted": speedup, "ratio": speedup / rec["measured"], "engine": case.engine,
                "model": case.model, "gpu": case.gpu, "method": case.method, "steps": r["steps"],
                "concurrency": case.concurrency, "tau": r["tau"], "cost": r["cost_source"]}
        out.append(rec)
    return out


def sweeps(preds: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows of one published series: same source, model, GPU, method, engine, dataset and lengths, differing only
    in depth or only in concurrency (at least three of them); or the rows a source published as one series with
    the configuration it chose per point (`sweep: NAME`, varying concurrency)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in preds:
        if "predicted" not in p:
            continue
        if p.get("sweep"):
            groups.setdefault(f"{p['sweep']}|by concurrency", []).append(p)
            continue
        prefix = "_".join(p["id"].split("_")[:2])
        for vary, fixed in (("steps", "concurrency"), ("concurrency", "steps")):
            key = f"{prefix}|{p['model']}|{p['gpu']}|{p['method']}|{p['engine']}|{p['series']}|{fixed}={p[fixed]}"
            groups.setdefault(f"{key}|by {vary}", []).append(p)
    out = {}
    for k, rows in groups.items():
        vary = k.rsplit("by ", 1)[1]
        if len({r[vary] for r in rows}) >= 3:
            out[k] = rows
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for pos, i in enumerate(order):
            r[i] = pos
        return r

    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    d = sum((a - b) ** 2 for a, b in zip(rx, ry, strict=True))
    return 1 - 6 * d / (n * (n * n - 1))


def summary(preds: list[dict[str, Any]], use: str | None = None) -> dict[str, Any]:
    done = [p for p in preds if "predicted" in p and (use is None or p["use"] == use)]
    if not done:
        return {"rows": 0}
    within = sum(abs(p["ratio"] - 1) <= 0.15 for p in done)
    worst = max(done, key=lambda p: abs(math.log(p["ratio"])))
    out = {"rows": len(done), "within_15pct": within, "share_within_15pct": round(within / len(done), 3),
           "worst": {"id": worst["id"], "ratio": round(worst["ratio"], 3)},
           "mean_abs_log_ratio": round(sum(abs(math.log(p["ratio"])) for p in done) / len(done), 4),
           "all_within_1p3x": all(1 / 1.3 <= p["ratio"] <= 1.3 for p in done)}
    series = {}
    for name, rows in sweeps(done).items():
        key = name.rsplit("by ", 1)[1]
        by_depth = key == "steps"
        rows = sorted(rows, key=lambda r: r[key])
        rho = spearman([r["measured"] for r in rows], [r["predicted"] for r in rows])
        entry: dict[str, Any] = {"by": key, "spearman": round(rho, 3)}
        if by_depth:
            entry["best_measured"] = max(rows, key=lambda r: r["measured"])["steps"]
            entry["best_predicted"] = max(rows, key=lambda r: r["predicted"])["steps"]
        series[name] = entry
    out["sweeps"] = series
    return out


def fit_rows(rows: list[dict[str, Any]], engine: str) -> list[dict[str, Any]]:
    """An engine's `use: fit` rows that can be replayed. Where the engine has rows with a measured acceptance
    length only those (the constants are identifiable apart from the acceptance); else all of them, their
    acceptance the method's published prior (SGLang's calibration rows publish none)."""
    mine = [r for r in rows if r["use"] == "fit" and engine_of(r) == engine and case_of(r)[0] is not None]
    measured = [r for r in mine if (r.get("measured") or {}).get("acceptance_length") is not None
                or r.get("tau_anchor")]
    return measured if len(measured) >= 3 else mine


def free_constants(rows: list[dict[str, Any]]) -> list[str]:
    """The constants these rows can tell apart: a per-request cost only across concurrencies, a per-step one only
    with a sequential method, the per-round one always."""
    names = ["round_us"]
    if len({r.get("concurrency") for r in rows}) > 1:
        names.append("request_us")
    if any(METHOD.get(str(r.get("method"))) in ("eagle3", "mtp", "draft_model") for r in rows):
        names.append("draft_step_us")
    return names


_POOL: Any = None  # worker processes of a fit (forked: each keeps its own no-speculation cache)


def _fit_chunk(data: dict[str, Any], engine: str, point: dict[str, int], chunk: list[dict[str, Any]],
               rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import tuner.methods as methods

    with methods.costs_table({**data, "fitted": {engine: dict(point)}}):
        return [p for p in predict(chunk, rows) if "predicted" in p]


def _fit_error(data: dict[str, Any], engine: str, point: dict[str, int], mine: list[dict[str, Any]],
               rows: list[dict[str, Any]]) -> tuple[float, list[str]]:
    """Mean squared log ratio of `mine` priced with `point` as the engine's fitted constants, and the rows used;
    the rows split over the fit's worker processes (a row's anchor goes with it)."""
    n = FIT_WORKERS if _POOL is not None else 1
    chunks = [mine[i::n] for i in range(n)]
    if _POOL is None:
        preds = _fit_chunk(data, engine, point, mine, rows)
    else:
        futures = [_POOL.submit(_fit_chunk, data, engine, point, c, rows) for c in chunks if c]
        preds = [p for f in futures for p in f.result()]
    return sum(math.log(p["ratio"]) ** 2 for p in preds) / max(1, len(preds)), [p["id"] for p in preds]


def fit(rows: list[dict[str, Any]], engines: set[str] | None = None) -> dict[str, Any]:
    """Per engine (`engines`, default all), the per-round constants minimising the squared log ratio on its fit
    rows: coordinate search over FIT_GRID (two passes), the constants a row set cannot identify left at zero. An
    engine not refitted keeps its constants from the file."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import tuner.methods as methods

    global _POOL
    _POOL = ProcessPoolExecutor(FIT_WORKERS, mp_context=multiprocessing.get_context("fork"))
    fitted: dict[str, Any] = {}
    data = yaml.safe_load(methods.COSTS_FILE.read_text())
    kept = {e: v for e, v in (data.get("fitted") or {}).items() if engines is not None and e not in engines}
    fitted.update(kept)
    data["fitted"] = dict(kept)
    for engine in sorted({engine_of(r) for r in rows if r["use"] == "fit"} - set(kept)):
        mine = fit_rows(rows, engine)
        if len(mine) < 3:
            continue
        names = free_constants(mine)
        point = {n: 0 for n in names}

        best = _fit_error(data, engine, point, mine, rows)
        print(f"fit {engine}: {len(mine)} rows, constants {names}", file=sys.stderr, flush=True)
        for _ in range(2):
            for name in names:
                for value in FIT_GRID[name]:
                    if value == point[name]:
                        continue
                    got = _fit_error(data, engine, point | {name: value}, mine, rows)
                    if got[0] < best[0]:
                        best, point = got, point | {name: value}
                print(f"  {engine} {point} rms log {math.sqrt(best[0]):.4f}", file=sys.stderr, flush=True)
        fitted[engine] = {**point, "rms_log_error": round(math.sqrt(best[0]), 4),
                          "acceptance": "measured" if any((r.get("measured") or {}).get("acceptance_length")
                                                          for r in mine) else "method prior", "rows": best[1]}
    _POOL.shutdown()
    return fitted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", action="store_true", help="refit the engines' per-round constants and write them")
    ap.add_argument("--engines", help="with --fit: refit only these engines (comma-separated), keep the others'")
    ap.add_argument("--write", action="store_true", help="write the section into benchmarks/RESULTS.md")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = yaml.safe_load(ROWS.read_text())
    t0 = time.perf_counter()
    if a.fit:
        wanted = set(a.engines.split(",")) if a.engines else None
        if wanted and not wanted <= set(ENGINES):
            ap.error(f"--engines: choose from {', '.join(sorted(ENGINES))}")
        fitted = fit(rows, wanted)
        _write_fit(fitted)
    preds = predict(rows)
    result = {"fit_rows": summary(preds, "fit"), "check_rows": summary(preds, "check"), "all": summary(preds),
              "rows": preds, "seconds": round(time.perf_counter() - t0, 1)}
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        _print(result)
    if a.write:
        write_section("spec_published", _markdown(result))


def _write_fit(fitted: dict[str, Any]) -> None:
    import tuner.methods as methods
    from dspark_core.atomic import atomic_write_text

    text = methods.COSTS_FILE.read_text()
    head = text[: text.index("fitted:")] if "fitted:" in text else text
    body = yaml.safe_dump({"fitted": fitted}, sort_keys=False, width=118)
    atomic_write_text(methods.COSTS_FILE, head + body)
    methods._costs_file.cache_clear()


def _print(result: dict[str, Any]) -> None:
    for p in result["rows"]:
        if "predicted" in p:
            print(f"{p['id'][:60]:60s} {p['use']:5s} measured {p['measured']:.2f} predicted {p['predicted']:.2f} "
                  f"x{p['ratio']:.2f} tau {p['tau']:.2f}{'' if p['tau_measured'] else ' (prior)'}")
        else:
            print(f"{p['id'][:60]:60s} {p['use']:5s} skipped: {p['skipped']}")
    for key in ("fit_rows", "check_rows", "all"):
        print(key, json.dumps({k: v for k, v in result[key].items()}, indent=None)[:1500])


def _markdown(result: dict[str, Any]) -> str:
    day = time.strftime("%Y-%m-%d")
    lines = [f"## Speculation on GPUs: `estimate` against published measurements (issue 37, {day})", "",
             f"`{shown_command('benchmarks/bench_spec_published.py')}`; rows and quotes: "
             "`benchmarks/spec_published/rows.yaml`; fitted constants: `tuner/catalog/spec_costs.yaml`.", "",
             "| row | use | engine | model / GPU | method, K, concurrency | tau | measured | predicted | ratio |",
             "|---|---|---|---|---|---:|---:|---:|---:|"]
    for p in result["rows"]:
        if "predicted" not in p:
            continue
        tau = f"{p['tau']:.2f}" + ("" if p["tau_measured"] else " (prior)")
        lines.append(f"| {p['id']} | {p['use']} | {p['engine']} | {p['model']} / {p['gpu']} | {p['method']}, "
                     f"{p['steps']}, {p['concurrency']} | {tau} | {p['measured']:.2f}x | {p['predicted']:.2f}x | "
                     f"{p['ratio']:.2f} |")
    skipped = [p for p in result["rows"] if "predicted" not in p]
    lines += ["", "Summary (within 15% / rows, worst ratio, all within 1.3x):"]
    for key in ("fit_rows", "check_rows", "all"):
        s = result[key]
        if s.get("rows"):
            lines.append(f"- {key}: {s['within_15pct']}/{s['rows']} within 15% ({s['share_within_15pct']:.0%}); "
                         f"worst {s['worst']['id']} x{s['worst']['ratio']}; all within 1.3x: {s['all_within_1p3x']}")
            for name, sw in s.get("sweeps", {}).items():
                best = (f", best depth measured {sw['best_measured']} / predicted {sw['best_predicted']}"
                        if "best_measured" in sw else "")
                lines.append(f"  - sweep {name} (by {sw['by']}): Spearman {sw['spearman']}{best}")
    lines += ["", f"Rows not replayed ({len(skipped)}): " +
              "; ".join(f"`{p['id']}` ({p['skipped']})" for p in skipped[:40])]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
