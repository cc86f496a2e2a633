"""Which parallel layouts can run: TP, EP and the weight dtype narrowed to the values that fit, after the rules.

The rules say what is worth trying; this says what can run at all, from the profile's own memory and divisibility
facts, so that no point of the plan's space fails to start. A TP size t runs weights in dtype d when
- t x DP <= the devices (hw.count; a profile without one is planned for one 8-GPU node), t is a power of two
  (both engines' all-reduce and expert layouts assume one), the query heads divide over t, and the KV heads divide
  over t or are replicated (t a multiple of them, as vLLM's QKVParallelLinear and SGLang do);
- the weights in d over t GPUs plus the KV cache of the workload's longest request (its longest prompt and
  output, see `longest_request`) fit in the static memory fraction of each GPU (the low end of the plan's
  memory.fraction_static: the simulator admits no request whose KV does not fit).
Weights shrink per GPU as t grows, so every d that fits at t fits at any larger t: the plan keeps the smallest TP
m at which some allowed dtype fits, the dtypes that fit at m, and the TP sizes >= m. Every (TP, dtype) pair of
that product runs. Expert parallelism (MoE) is fixed at the largest admitted size that divides the experts and the
smallest TP (SGLang runs MoE-TP = TP / EP; vLLM's EP is the TP x DP group), so it divides every TP of the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kb.errors import PlanConflict
from kb.match import FixedEntry, Plan, SpaceEntry
from kb.params import param_spec
from profiler.schema import GIB, Profile

NODE = 8  # GPUs assumed when the profile has no device count
TP_SIZES = (1, 2, 4, 8, 16, 32, 64)
Z_LONGEST = 3.09  # the longest request the simulator draws: p99.9 of its lognormal lengths (z = 3.09, p99 at 2.326)
DEFAULT_FRACTION = 0.85  # the engine's memory.fraction_static when no rule plans it
GB = GIB  # hw.memory_gb counts GiB


@dataclass(frozen=True)
class Fit:
    """What one (dtype, TP) costs per GPU against what a GPU holds."""

    weights_gb: float
    kv_gb: float
    usable_gb: float

    @property
    def ok(self) -> bool:
        return self.weights_gb + self.kv_gb <= self.usable_gb


def _values(plan: Plan, param: str) -> list[Any] | None:
    """The values the plan allows for `param` (None: it does not mention it)."""
    if param in plan.fixed:
        return [plan.fixed[param].value]
    e = plan.space.get(param)
    if e is None:
        return None
    if e.choices is not None:
        return [v for v in e.choices if v not in e.exclude]
    return [v for v in TP_SIZES if e.low <= v <= e.high and v not in e.exclude]


def longest_request(profile: Profile) -> float:
    """Tokens of the longest request the workload sends: prompt + output, each at p99.9 of the lengths the simulator
    draws (profiler/workload.py request_lengths)."""
    from profiler.workload import request_lengths

    prompt, output = request_lengths(profile.workload, profile.model.max_context)
    return prompt.quantile(Z_LONGEST) + output.quantile(Z_LONGEST)


def weight_gb(profile: Profile, dtype: str) -> float | None:
    """The model's weights in `dtype` (profile model.weight_bytes; auto = the checkpoint's own dtype)."""
    wb = profile.model.weight_bytes
    if wb is None:
        return None
    if dtype == "auto":
        stored = (profile.model.dtype or "").lower()
        dtype = "fp8" if "fp8" in stored or "float8" in stored else "bf16"
    key = {"fp16": "bf16", "fp32": "bf16", "nvfp4": "int4"}.get(dtype, dtype)
    value = getattr(wb, key, None) or (wb.fp8 if key == "int8" else None)
    if value is None:
        return None
    return value * (2.0 if dtype == "fp32" else 1.0) / GB


def fit(profile: Profile, dtype: str, tp: int, fraction: float) -> Fit | None:
    """Per-GPU memory of `dtype` weights at TP `tp` with the longest request's bf16 KV (None: facts missing)."""
    m, hw = profile.model, profile.hw
    w = weight_gb(profile, dtype)
    kv_tok = m.kv_bytes_per_token.bf16 if m.kv_bytes_per_token else None
    if w is None or kv_tok is None or not hw.memory_gb:
        return None
    kv_heads = m.num_kv_heads or tp
    # MLA's latent KV is whole on every rank; GQA shards over the KV heads and copies them beyond that
    shards = 1 if m.attention == "mla" else min(tp, kv_heads)
    return Fit(w / tp, longest_request(profile) * kv_tok / max(1, shards) / GB, hw.memory_gb * fraction)


def tp_candidates(profile: Profile, dp: int) -> list[int]:
    """TP sizes the devices and the head layout allow."""
    if profile.hw.arch == "cpu":
        return [1]
    count = profile.hw.count or NODE
    m = profile.model
    out = []
    for t in TP_SIZES:
        if t * max(1, dp) > count:
            break
        if m.num_heads and m.num_heads % t:
            continue
        kv = m.num_kv_heads
        if kv and m.attention != "mla" and kv % t and t % kv:
            continue
        out.append(t)
    return out


def fraction_range(plan: Plan) -> tuple[float, float]:
    """The plan's lowest and highest memory.fraction_static."""
    if "memory.fraction_static" in plan.fixed:
        v = float(plan.fixed["memory.fraction_static"].value)
        return v, v
    e = plan.space.get("memory.fraction_static")
    if e is None:
        return DEFAULT_FRACTION, DEFAULT_FRACTION
    if e.low is not None:
        return float(e.low), float(e.high)
    vals = [float(v) for v in e.choices or [DEFAULT_FRACTION]]
    return min(vals), max(vals)


def _fraction(plan: Plan, profile: Profile, dtypes: list[str], tps: list[int]) -> float:
    """The static fraction every plan point runs at: the plan's lowest, raised (and the plan's range narrowed) when
    only a higher fraction inside the range lets something run."""
    lo, hi = fraction_range(plan)
    e = plan.space.get("memory.fraction_static")
    if lo == hi or e is None or e.low is None:
        return lo
    need = []
    for d in dtypes:
        for t in tps:
            f = fit(profile, d, t, 1.0)
            if f is not None:
                need.append((f.weights_gb + f.kv_gb) / f.usable_gb)
    least = min(need, default=lo)
    if lo < least <= hi:
        low = math.ceil(least * 1000) / 1000
        plan.space["memory.fraction_static"] = e.model_copy(update={"low": low, "why": e.why + f"; from {low} so the "
                                                                    "weights and the longest request fit"})
        plan.resolutions.append(f"memory.fraction_static: raised to [{low}, {hi}]: below {low} nothing fits")
        return low
    return lo


def _set(plan: Plan, param: str, values: list[Any], why: str) -> None:
    """Write a narrowed parameter back as fixed (one value) or a choice list."""
    rules = (plan.fixed[param].rules if param in plan.fixed else plan.space[param].rules if param in plan.space
             else [])
    rules = [*rules, "feasibility"]
    plan.space.pop(param, None)
    plan.fixed.pop(param, None)
    if len(values) == 1:
        plan.fixed[param] = FixedEntry(value=values[0], rules=rules, why=why)
        return
    spec = param_spec(param)
    plan.space[param] = SpaceEntry(kind="choices", choices=values, type=spec.type if spec else "int", rules=rules,
                                   why=why)
    if param in plan.prefer and plan.prefer[param].value not in values:
        plan.prefer.pop(param)


def apply_feasibility(plan: Plan, profile: Profile) -> Plan:
    """Narrow parallel.tp, weights.dtype and parallel.ep to what runs; PlanConflict when nothing does."""
    if profile.hw.arch is None and profile.hw.memory_gb is None:
        return plan  # a profile without hardware: nothing to fit against
    dp_vals = _values(plan, "parallel.dp") or [1]
    dp = int(max(dp_vals)) if 0 not in dp_vals else 1
    cands = tp_candidates(profile, dp)
    if not cands:
        raise PlanConflict(f"parallel.tp: no tensor-parallel size divides {profile.model.num_heads} attention heads "
                           f"and {profile.model.num_kv_heads} KV heads within {profile.hw.count or NODE} devices")
    ruled = _values(plan, "parallel.tp")
    tps = [t for t in cands if ruled is None or t in ruled]
    if not tps:
        plan.resolutions.append(f"parallel.tp: the rules' {ruled} leave no size the devices and heads allow "
                                f"({cands}); feasibility keeps {cands}")
        tps = cands
    dtypes = _values(plan, "weights.dtype") or ["auto"]
    frac = _fraction(plan, profile, dtypes, tps)
    fits = {(d, t): fit(profile, d, t, frac) for d in dtypes for t in tps}
    if any(f is None for f in fits.values()):
        if ruled is not None:
            _set(plan, "parallel.tp", tps, f"TP sizes the devices and heads allow: {tps} (no memory facts to fit)")
        return plan
    ok = [(d, t) for (d, t), f in fits.items() if f.ok]  # type: ignore[union-attr]
    if not ok and tps != cands:  # the rules' TP sizes run nothing; a size they left out may (at the static fraction
        # it needs within the rules' range)
        hi = fraction_range(plan)[1]
        wider = {(d, t): fit(profile, d, t, hi) for d in dtypes for t in cands}
        if any(f.ok for f in wider.values()):  # type: ignore[union-attr]
            plan.resolutions.append(f"parallel.tp: nothing runs at the rules' {tps}; feasibility widens to {cands}")
            frac = _fraction(plan, profile, dtypes, cands)
            tps, fits = cands, {(d, t): fit(profile, d, t, frac) for d in dtypes for t in cands}
            ok = [(d, t) for (d, t), f in fits.items() if f.ok]  # type: ignore[union-attr]
    if not ok:
        raise PlanConflict(_nothing_fits(profile, dtypes, tps, frac, fits))
    m = min(t for _, t in ok)
    keep_d = [d for d in dtypes if fits[(d, m)].ok]  # type: ignore[union-attr]
    keep_t = [t for t in tps if t >= m]
    dropped_d = [d for d in dtypes if d not in keep_d]
    if dropped_d:
        plan.resolutions.append(f"weights.dtype: {dropped_d} dropped: they need more than TP {m}, at which "
                                f"{keep_d} already run (the plan keeps the smallest TP that runs)")
    f = fits[(keep_d[0], m)]
    why = (f"runs from TP {m}: {keep_d[0]} weights {f.weights_gb:.1f} GiB + longest request's KV {f.kv_gb:.1f} GiB "  # type: ignore[union-attr]
           f"per GPU <= {profile.hw.memory_gb:g} GiB x {frac:.2f}")
    _set(plan, "parallel.tp", keep_t, why)
    if dropped_d or "weights.dtype" in plan.space or "weights.dtype" in plan.fixed:
        _set(plan, "weights.dtype", keep_d, f"the dtypes that fit at TP {m}")
    _expert_parallel(plan, profile, keep_t, dp)
    _dp_attention(plan, profile, keep_d, keep_t, frac)
    return plan


def dp_attention_fit(profile: Profile, dtype: str, tp: int, fraction: float) -> Fit | None:
    """Per-GPU memory with data-parallel attention over `tp` GPUs: the experts split over them, every GPU a whole copy
    of the other weights, and the longest request's KV whole on its one rank."""
    m = profile.model
    base = fit(profile, dtype, tp, fraction)
    if base is None or not m.num_experts or not m.params_total:
        return None
    experts = min(1.0, (m.num_moe_layers or 0) * m.num_experts * (m.expert_params or 0.0) / m.params_total)
    weights = base.weights_gb * tp * (experts / tp + 1.0 - experts)
    kv = longest_request(profile) * m.kv_bytes_per_token.bf16 / GB if m.kv_bytes_per_token else base.kv_gb
    return Fit(weights, kv, base.usable_gb)


def _dp_attention(plan: Plan, profile: Profile, dtypes: list[str], tps: list[int], frac: float) -> None:
    """Data-parallel attention stays a choice only where every planned TP and dtype holds it: each GPU keeps a whole
    copy of the non-expert weights, which a TP point that fits may not hold."""
    allowed = _values(plan, "parallel.dp_attention")
    if not allowed or True not in allowed:
        return
    fits = ((d, t, dp_attention_fit(profile, d, t, frac)) for d in dtypes for t in tps if t > 1)
    short = next(((d, t, f) for d, t, f in fits if f is not None and not f.ok), None)
    if short is None:
        return
    d, t, f = short
    why = (f"data-parallel attention does not fit {d} at TP {t}: {f.weights_gb:.1f} GiB of weights (the experts "
           f"split, the rest whole) + {f.kv_gb:.1f} GiB of the longest request's KV per GPU > "
           f"{profile.hw.memory_gb:g} GiB x {frac:.2f}")
    plan.resolutions.append(f"parallel.dp_attention: {why}; TP attention only")
    _set(plan, "parallel.dp_attention", [False], why)


def _expert_parallel(plan: Plan, profile: Profile, tps: list[int], dp: int) -> None:
    ruled = _values(plan, "parallel.ep")
    if ruled is None:
        return
    experts = profile.model.num_experts or 0
    smallest = min(tps)
    ok = [e for e in ruled if e >= 1 and smallest % e == 0 and (not experts or experts % e == 0)]
    if not ok:
        need = min(e for e in ruled if e >= 1)
        bigger = [t for t in tps if t % need == 0]
        if not bigger:  # the TP the plan runs at cannot hold the rules' EP: experts stay TP-sharded
            plan.resolutions.append(f"parallel.ep: the rules ask EP >= {need} but the planned TP {tps} cannot hold it "
                                    "(SGLang runs MoE-TP = TP / EP); EP 1")
            _set(plan, "parallel.ep", [1], f"EP 1: no planned TP ({tps}) is a multiple of the rules' EP {need}")
            return
        _set(plan, "parallel.tp", bigger, f"TP sizes that hold EP {need}: {bigger}")
        tps, ok = bigger, [need]
    ok = sorted(ok, reverse=True)  # the largest first: a study that cannot price EP runs that one (tuner/study.py)
    _set(plan, "parallel.ep", ok, f"EP {', '.join(map(str, ok))}: the admitted sizes dividing the experts and TP "
         f"{min(tps)} (EP <= TP x DP = {min(tps) * max(1, dp)})")


def _nothing_fits(profile: Profile, dtypes: list[str], tps: list[int], frac: float, fits: dict) -> str:
    """One line naming the limiting fact."""
    t = max(tps)
    best = min(dtypes, key=lambda d: fits[(d, t)].weights_gb)
    f = fits[(best, t)]
    four_bit = any(d in ("int4", "nvfp4") for d in dtypes)
    fixes = "add devices (--gpus N)" + ("" if four_bit else ", allow 4-bit weights (--quality relaxed)")
    return (f"no parallel layout runs {profile.model.name or 'the model'} on {profile.hw.count or NODE} x "
            f"{profile.hw.name or 'GPU'}: even {best} weights at TP {t} take {f.weights_gb:.1f} GiB + "
            f"{f.kv_gb:.1f} GiB KV for the longest request per GPU, over {profile.hw.memory_gb:g} GiB x {frac:.2f} "
            f"(memory.fraction_static); {fixes} or shorten the workload")
