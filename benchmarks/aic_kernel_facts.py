"""Kernel facts for the roofline priors, read from AIConfigurator's measured tables (needs the `aic` extra).

tuner/catalog/roofline.yaml holds, per GPU architecture, the fractions of datasheet bandwidth and FLOPs that
real kernels reach and their fixed costs. This script derives each figure from the kernel timings AIC ships
(aiconfigurator_core/systems/data/<system>/<op>/sglang/<version>/*.parquet), so the priors come from
measured kernels, not from fitting end-to-end rows:
  - GEMM decode fit: latency = floor + bytes / (fraction x datasheet bandwidth) over every GEMM with M <= 16
    rows, least squares on relative error, per dtype (and the plain fraction of the weights >= 16 M elements);
  - GEMM compute: M >= 4096 rows, N, K >= 4096: FLOPs / latency / datasheet peak;
  - decode attention fit: latency = floor + KV bytes / (fraction x bandwidth), per kernel source;
  - MoE fit: latency = floor + the bytes of the experts uniform routing touches / (fraction x bandwidth), at
    <= 256 tokens, per dtype, routing distribution and kernel;
  - custom all-reduce: its latency curve (message bytes -> us) per GPU count on a log-log grid.

    python benchmarks/aic_kernel_facts.py [--json benchmarks/results/aic_kernel_facts.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from profiler.catalog import resolve_gpu  # noqa: E402
from tuner.aic import catalog  # noqa: E402

BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "int8_wo": 1.0}
PEAK = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8"}


def _table(system: str, op: str, version: str, name: str):
    import aiconfigurator_core
    import pyarrow.parquet as pq

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data" / system / op / "sglang" / version
    f = root / name
    return pq.read_table(f).to_pandas() if f.is_file() else None


def _spread(x: np.ndarray) -> dict[str, float] | None:
    if not len(x):
        return None
    return {"median": float(np.median(x)), "p10": float(np.percentile(x, 10)), "p90": float(np.percentile(x, 90)),
            "n": int(len(x))}


def _fit(latency_s: np.ndarray, work: np.ndarray) -> tuple[float, float]:
    """latency = floor + work / rate, least squares on relative error: (floor s, rate work/s)."""
    a = np.vstack([np.ones(len(work)), work]).T / latency_s[:, None]
    (floor, slope), *_ = np.linalg.lstsq(a, np.ones(len(work)), rcond=None)
    return float(floor), float(1.0 / slope)


def _touched(e: np.ndarray, k: np.ndarray, t: np.ndarray) -> np.ndarray:
    return e * (1.0 - (1.0 - k / e) ** t)


AR_POINTS = [2**13, 2**16, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28]  # message bytes of the all-reduce curve


def facts(gpu: str, system: str, version: str) -> dict[str, Any]:
    g = resolve_gpu(gpu)
    bw = g.bandwidth_gbs * 1e9
    out: dict[str, Any] = {"gpu": gpu, "system": system, "database": version, "bandwidth_gbs": g.bandwidth_gbs}
    gemm = _table(system, "gemm", version, "gemm_perf.parquet")
    if gemm is not None:
        gemm = gemm.assign(t=gemm.latency / 1e3)  # ms -> s
        for dt, grp in gemm.groupby("gemm_dtype"):
            if dt not in BYTES:
                continue
            small = grp[grp.m <= 16]
            moved = small.n * small.k * BYTES[dt] + small.m * (small.k + small.n) * 2.0
            floor, rate = _fit(small.t.to_numpy(), moved.to_numpy())
            big_w = small[small.n * small.k >= 16 * 2**20]
            entry: dict[str, Any] = {
                "decode_fit": {"floor_us": floor * 1e6, "bandwidth_fraction": rate / bw, "n": int(len(small))},
                "bandwidth_fraction_large": _spread(((big_w.n * big_w.k * BYTES[dt]) / big_w.t / bw).to_numpy())}
            peak = (g.peak_tflops.get(PEAK.get(dt, "bf16")) or 0) * 1e12
            big = grp[(grp.m >= 4096) & (grp.n >= 4096) & (grp.k >= 4096)]
            if peak and len(big):
                entry["compute_fraction"] = _spread((2.0 * big.m * big.n * big.k / big.t / peak).to_numpy())
            out[f"gemm_{dt}"] = entry
        out["gemm_floor_us"] = float(gemm.latency.min() * 1e3)
    att = _table(system, "attention", version, "generation_attention_perf.parquet")
    if att is not None:
        a = att[att.kv_cache_dtype == "bfloat16"]
        if "window_size" in a:  # full attention only (not the sliding-window rows)
            a = a[a.window_size.fillna(0) == 0]
        ctx = a.isl + a.step  # the cached context of the measured decode step
        kv = a.batch_size * ctx * a.num_key_value_heads * a.head_dim * 2 * 2.0
        by_src = {}
        for src in sorted(set(a.kernel_source)):
            sel = a.kernel_source == src
            floor, rate = _fit((a.latency[sel] / 1e3).to_numpy(), kv[sel].to_numpy())
            by_src[str(src)] = {"floor_us": floor * 1e6, "bandwidth_fraction": rate / bw, "n": int(sel.sum())}
        out["decode_attention_fit"] = by_src
        big = a.batch_size * ctx >= 65536
        frac = kv[big] / (a.latency[big] / 1e3) / bw
        out["decode_attention_fraction"] = {str(src): _spread(frac[a.kernel_source[big] == src].to_numpy())
                                            for src in sorted(set(a.kernel_source))}
        out["decode_attention_floor_us"] = {str(src): float(a.latency[a.kernel_source == src].min() * 1e3)
                                            for src in sorted(set(a.kernel_source))}
    moe = _table(system, "moe", version, "moe_perf.parquet")
    if moe is not None:
        fits = {}
        for (dt, dist, src), grp in moe.groupby(["moe_dtype", "distribution", "kernel_source"]):
            grp = grp[grp.num_tokens <= 256]
            if dt not in BYTES or len(grp) < 8:
                continue
            experts = grp.num_experts / grp.moe_ep_size
            touched = np.minimum(experts, _touched(grp.num_experts, grp.topk, grp.num_tokens))
            moved = touched * 3.0 * grp.hidden_size * grp.inter_size / grp.moe_tp_size * BYTES[dt]
            floor, rate = _fit((grp.latency / 1e3).to_numpy(), moved.to_numpy())
            fits[f"{dt}/{dist}/{src}"] = {"floor_us": floor * 1e6, "bandwidth_fraction": rate / bw, "n": int(len(grp))}
        out["moe_fit"] = fits  # bytes: the distinct experts uniform routing would touch
        shapes: dict[str, list[list[float]]] = {}
        one = moe[(moe.moe_tp_size == 1) & (moe.moe_ep_size == 1) & (moe.distribution == MOE_ROUTING)
                  & (moe.num_tokens <= 256)]
        for (dt, src, h, i, e, k), grp in one.groupby(["moe_dtype", "kernel_source", "hidden_size", "inter_size",
                                                        "num_experts", "topk"]):
            if dt not in BYTES or len(grp) < 6:
                continue
            touched = np.minimum(e, _touched(np.full(len(grp), float(e)), float(k), grp.num_tokens.to_numpy()))
            floor, rate = _fit((grp.latency / 1e3).to_numpy(), touched * 3.0 * h * i * BYTES[dt])
            shapes.setdefault(f"{dt}/{src}", []).append([int(h), int(i), int(e), int(k), round(floor * 1e6, 1),
                                                         round(rate / bw, 3)])
        out["moe_shapes"] = shapes  # per expert shape at TP 1: [hidden, inter, experts, topk, floor us, fraction]
    ar = _table(system, "comm", version, "custom_allreduce_perf.parquet")
    if ar is not None:
        if "backend" in ar:  # the CUDA-graph custom all-reduce SGLang decodes with, where it was timed
            ar = ar[ar.backend == "sglang_graph"] if (ar.backend == "sglang_graph").any() else ar
        curve = {}
        for n, grp in ar.groupby("num_gpus"):
            grp = grp.sort_values("message_size")
            nbytes = grp.message_size.to_numpy() * 2.0  # message_size counts half-precision elements
            us = grp.latency.to_numpy() * 1e3
            curve[str(int(n))] = [[b, round(float(np.exp(np.interp(np.log(b), np.log(nbytes), np.log(us)))), 2)]
                                  for b in AR_POINTS]
        out["custom_allreduce_us"] = curve  # [message bytes, microseconds] on a log-log grid
    return out


# per architecture: the systems whose tables it takes, SGLang's default decode attention and MoE kernels there,
# and whether the decode GEMM fit is usable (L40S's 96 MB L2 holds many timed weights: the fit reads > 100% of
# DRAM bandwidth, so its large-weight median is taken instead)
ARCHS = {
    "hopper": (["h100_sxm", "h200_sxm"], "fa3", "sglang_fused_moe_triton", True),
    "ampere": (["a100_sxm"], "flash_attention", "sglang_fused_moe_triton", True),
    "blackwell": (["b200_sxm"], "trtllm_mha", "sglang_flashinfer_trtllm_moe", True),
    "ada": (["l40s"], "flashinfer", "sglang_fused_moe_triton", False),
}
MOE_ROUTING = "power_law_1.2"  # the routing skew AIC's MoE model assumes (aiconfigurator_core/sdk/models/moe.py)
HEADER = """# Roofline priors per GPU architecture (tuner/perf.py KernelCosts), GENERATED by
#   python benchmarks/aic_kernel_facts.py --write
# from the kernel timings in NVIDIA AIConfigurator 0.12.0's SGLang database (benchmarks/results/aic_kernel_facts.json
# has every fit with its sample count). They describe kernels, not deployments: nothing here is fitted to an
# end-to-end estimate. Do not edit by hand; rerun the script.
#
#   gemm_memory / gemm_floor_us  decode GEMMs (M <= 16): latency = floor + bytes / (fraction x datasheet bandwidth)
#   gemm_compute                 large GEMMs (M, N, K >= 4096): FLOPs / latency / datasheet peak of the dtype
#   attn                         [floor us, fraction]: decode attention, latency = floor + KV bytes / (fraction x bw)
#   moe                          per dtype, per measured expert shape at TP 1: [hidden, inter, experts, topk, floor us,
#                                fraction]: a MoE layer at <= 256 tokens, latency = floor + the bytes of the experts
#                                uniform routing would touch / (fraction x bw), fitted on AIC's power-law-1.2 routing
#                                rows (a fraction above 1: skewed routing touches fewer experts than uniform); a model
#                                takes the nearest shape (log distance over hidden, inter / TP, experts, topk)
#   allreduce_us                 per TP size, [message bytes, us] of SGLang's custom all-reduce (log-log grid)
# Elementwise kernels (norms, activations, residual adds) are charged the bf16 GEMM floor plus their bytes at
# gemm_memory bf16: AIC has no measured table for them either.
"""


def priors(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """roofline.yaml's architectures from the per-system facts."""
    by = {r["system"]: r for r in rows}
    out: dict[str, Any] = {}
    for arch, (systems, attn_src, moe_src, use_fit) in ARCHS.items():
        have = [by[s] for s in systems if s in by]
        if not have:
            continue

        def mean(xs: list[float], nd: int = 3) -> float:
            return round(sum(xs) / len(xs), nd)

        gm, floors, comp, moe = {}, {}, {}, {}
        for dt, key in (("bf16", "bfloat16"), ("fp8", "fp8_block")):
            g = [r[f"gemm_{key}"] for r in have if f"gemm_{key}" in r]
            if not g:
                continue
            if use_fit:
                gm[dt] = mean([x["decode_fit"]["bandwidth_fraction"] for x in g])
                floors[dt] = mean([x["decode_fit"]["floor_us"] for x in g], 2)
            else:
                gm[dt] = mean([x["bandwidth_fraction_large"]["median"] for x in g])
                floors[dt] = mean([r["gemm_floor_us"] for r in have], 2)
            comp[dt] = mean([x["compute_fraction"]["median"] for x in g])
            if use_fit and f"{key}/{moe_src}" in have[0].get("moe_shapes", {}):
                moe[dt] = have[0]["moe_shapes"][f"{key}/{moe_src}"]
        att = [r["decode_attention_fit"][attn_src] for r in have]
        attn = ([mean([a["floor_us"] for a in att], 1), mean([a["bandwidth_fraction"] for a in att])] if use_fit
                else [mean([r["decode_attention_floor_us"][attn_src] for r in have], 1),
                      mean([r["decode_attention_fraction"][attn_src]["median"] for r in have])])
        out[arch] = {"from": systems, "gemm_memory": gm, "gemm_floor_us": floors, "gemm_compute": comp,
                     "attn": attn, "moe": moe,
                     "allreduce_us": {int(k): v for k, v in have[0]["custom_allreduce_us"].items()}}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "aic_kernel_facts.json")
    ap.add_argument("--write", action="store_true", help="regenerate tuner/catalog/roofline.yaml from the facts")
    args = ap.parse_args()
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        print("aic_kernel_facts: aiconfigurator-core is not installed (pip install -e \".[aic]\")", file=sys.stderr)
        return 2
    rows = [facts(gpu, v["system"], v["database"]) for gpu, v in catalog()["systems"].items()]
    for r in rows:
        print(json.dumps(r, indent=1))
    args.json.write_text(json.dumps(rows, indent=2) + "\n")
    if args.write:
        import yaml

        from tuner.perf import PRIORS

        body = yaml.safe_dump({"architectures": priors(rows)}, default_flow_style=None, sort_keys=False, width=120)
        PRIORS.write_text(HEADER + body)
        print(f"wrote {PRIORS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
