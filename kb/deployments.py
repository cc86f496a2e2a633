"""Watched deployments in the knowledge base: the engine-neutral sample `monitor` stores per scrape (tables of
kb/models_live.py), what two samples say about the interval between them, and the acceptance a watch measured
(`profile --from-monitor`).

Counters and histograms are cumulative since the server started, so a window is the difference of two samples.
Acceptance by position: ours exports the attempts at each position (a DSpark verify window can stop short of the
block); vLLM verifies every draft, so its attempts at position k are its acceptances at k - 1; SGLang reports tau
only, as a gauge of its recent batches."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator
from sqlalchemy import select

from kb.db import Database
from kb.errors import KBError
from kb.models import utcnow
from kb.models_live import DeploymentRow, DeploymentSampleRow
from profiler.schema import AcceptProfile

Kind = Literal["dspark", "vllm", "sglang"]
HIST = ("ttft", "itl", "e2e")  # the latency histograms a sample carries


class Sample(BaseModel):
    """One scrape, cumulative since the server started (what the knowledge base stores).

    Non-finite values (a Prometheus page may say NaN or +Inf, e.g. SGLang's acceptance gauge before any
    speculative batch) are not measurements: they are dropped on the way in and counted in `non_finite`. A dropped
    figure reads as absent: None for SGLang's gauges, 0 for a count, and an empty list or histogram when one of its
    values was not finite (a partial list would shift positions, a partial histogram skew quantiles). So no sample
    ever holds NaN or Infinity: PostgreSQL's JSON type refuses them, and windows stay finite."""

    t: float  # unix seconds of the scrape
    kind: Kind
    running: float = 0.0
    waiting: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    finished: float = 0.0  # requests finished (any reason)
    rejected: float = 0.0  # admission rejections (429)
    drafts: float = 0.0  # request rounds that verified drafts
    draft_tokens: float = 0.0  # draft tokens verified
    accepted: float = 0.0  # draft tokens accepted
    accepted_pos: list[float] = Field(default_factory=list)  # accepted at draft position 0, 1, ...
    verified_pos: list[float] = Field(default_factory=list)  # ours: verified at position k with k - 1 accepted
    accept_length: float | None = None  # SGLang's gauge: tau of its recent batches
    accept_rate: float | None = None
    cap_length: float | None = None  # SGLang's DSpark verify window gauge
    engine: dict[str, str] = Field(default_factory=dict)  # ours: dspark:engine_info's labels (method, head, ...)
    ttft: dict[str, float] = Field(default_factory=dict)  # histogram: upper bound -> cumulative count
    itl: dict[str, float] = Field(default_factory=dict)
    e2e: dict[str, float] = Field(default_factory=dict)
    non_finite: int = 0  # values dropped because they were NaN or infinite

    @model_validator(mode="before")
    @classmethod
    def _finite_only(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out, dropped = {}, 0
        for key, value in data.items():
            if _non_finite(value) or isinstance(value, (list, dict)) and any(
                    _non_finite(v) for v in (value.values() if isinstance(value, dict) else value)):
                dropped += 1
                continue
            out[key] = value
        if dropped:
            out["non_finite"] = int(out.get("non_finite") or 0) + dropped
        return out


def _non_finite(v: Any) -> bool:
    return isinstance(v, float) and not math.isfinite(v)


def _bound(le: str) -> float | None:
    """A bucket's upper bound, or None when its label is not a number (NaN included)."""
    try:
        v = math.inf if le == "+Inf" else float(le)
    except ValueError:
        return None
    return None if math.isnan(v) else v


def _quantile(a: dict[str, float], b: dict[str, float], q: float) -> float | None:
    """The q-quantile (seconds) of the observations between two cumulative histograms, linear in a bucket."""
    bounds = sorted((_bound(k), b.get(k, 0.0) - a.get(k, 0.0)) for k in b if _bound(k) is not None)
    total = bounds[-1][1] if bounds else 0.0
    if total <= 0:
        return None
    want, lo, below = q * total, 0.0, 0.0
    for ub, n in bounds:
        if n >= want:
            if math.isinf(ub):
                return lo
            return lo + (ub - lo) * ((want - below) / (n - below) if n > below else 1.0)
        lo, below = ub, n
    return lo


def _diff(a: list[float], b: list[float]) -> list[float]:
    return [y - (a[i] if i < len(a) else 0.0) for i, y in enumerate(b)]


def window(a: Sample, b: Sample) -> dict[str, Any]:
    """What happened between samples a and b (b later): rates, tau, acceptance by position, latency quantiles."""
    dt = max(1e-9, b.t - a.t)
    d = {k: getattr(b, k) - getattr(a, k) for k in ("prompt_tokens", "generation_tokens", "finished", "rejected",
                                                       "drafts", "draft_tokens", "accepted")}
    out: dict[str, Any] = {"seconds": round(dt, 3), "running": b.running, "waiting": b.waiting,
                           "finished": d["finished"], "rejected": d["rejected"],
                           "output_tokens_per_s": d["generation_tokens"] / dt}
    if d["drafts"] > 0:
        out["tau"] = 1.0 + d["accepted"] / d["drafts"]
        out["acceptance_rate"] = d["accepted"] / d["draft_tokens"] if d["draft_tokens"] else None
        acc = _diff(a.accepted_pos, b.accepted_pos)
        if b.verified_pos:  # ours: the attempts at each position are counted (a verify window can stop short)
            tried = _diff(a.verified_pos, b.verified_pos)
        else:  # vLLM verifies every draft: the attempts at k are the acceptances at k - 1
            tried = [d["drafts"]] + acc[:-1]
        cond = []
        for n, m in zip(acc, tried, strict=False):  # P(position k accepted | positions < k accepted)
            if m <= 0:
                break
            cond.append(n / m)
        out["position_acceptance"] = cond
    elif b.accept_length is not None:  # SGLang: its gauge of the recent batches
        out["tau"] = b.accept_length
        out["acceptance_rate"] = b.accept_rate
    for h in HIST:
        for q in (0.5, 0.99):
            v = _quantile(getattr(a, h), getattr(b, h), q)
            out[f"{h}_p{int(q * 100)}_ms"] = None if v is None else v * 1e3
    return out


def measured_acceptance(first: Sample, last: Sample) -> dict[str, Any] | None:
    """Acceptance over a whole watch (first to last scrape): tau, acceptance by position, the engine's head."""
    w = window(first, last)
    if "tau" not in w:
        return None
    return {"tau": w["tau"], "position_acceptance": w.get("position_acceptance") or None,
            "head": last.engine.get("head"), "block_size": last.engine.get("block_size"),
            "drafts": last.drafts - first.drafts, "seconds": w["seconds"]}


def start_deployment(db: Database, url: str, kind: str, bundle: str | None,
                     predictions: dict[str, Any] | None) -> int:
    with db.session() as s:
        row = DeploymentRow(url=url, kind=kind, bundle=bundle, predictions=predictions, started_at=utcnow())
        s.add(row)
        s.flush()
        return row.deployment_id


def add_sample(db: Database, deployment_id: int, sample: Sample) -> None:
    with db.session() as s:
        s.add(DeploymentSampleRow(deployment_id=deployment_id, taken_at=sample.t,
                                  body=sample.model_dump(mode="json")))


def resolve(db: Database, which: str | int | None) -> int:
    """A deployment id from 'latest' / None / a number; one KBError line when there is none."""
    with db.session() as s:
        if which in (None, "latest"):
            row = s.scalar(select(DeploymentRow).order_by(DeploymentRow.deployment_id.desc()))
            if row is None:
                raise KBError("no deployment has been monitored yet; run: python cli.py monitor --url URL")
            return row.deployment_id
        try:
            dep_id = int(which)
        except (TypeError, ValueError):
            raise KBError(f"deployment {which!r}: give a number or 'latest'") from None
        if s.get(DeploymentRow, dep_id) is None:
            raise KBError(f"no monitored deployment {dep_id}; list them with: python cli.py monitor list")
        return dep_id


def deployment(db: Database, deployment_id: int) -> tuple[dict[str, Any], list[Sample]]:
    """(the deployment's row as a dict, its samples in time order)."""
    with db.session() as s:
        row = s.get(DeploymentRow, deployment_id)
        if row is None:
            raise KBError(f"no monitored deployment {deployment_id}")
        info = {"deployment_id": row.deployment_id, "url": row.url, "kind": row.kind, "bundle": row.bundle,
                "predictions": row.predictions or {}, "started_at": row.started_at.isoformat()}
        rows = s.scalars(select(DeploymentSampleRow).where(DeploymentSampleRow.deployment_id == deployment_id)
                         .order_by(DeploymentSampleRow.taken_at, DeploymentSampleRow.deployment_sample_id))
        return info, [Sample.model_validate(r.body) for r in rows]


def list_deployments(db: Database, limit: int = 20) -> list[dict[str, Any]]:
    from sqlalchemy import func

    with db.session() as s:
        counts = dict(s.execute(select(DeploymentSampleRow.deployment_id, func.count())
                                .group_by(DeploymentSampleRow.deployment_id)).all())
        rows = s.scalars(select(DeploymentRow).order_by(DeploymentRow.deployment_id.desc()).limit(limit))
        return [{"deployment_id": r.deployment_id, "url": r.url, "kind": r.kind, "bundle": r.bundle,
                 "started_at": r.started_at.isoformat(), "samples": counts.get(r.deployment_id, 0)} for r in rows]


def monitored_acceptance(db: Database, which: str, domain: str | None) -> AcceptProfile:
    """accept.* from a deployment's whole watch (its first to its last scrape); the head the engine reported
    (ours: dspark:engine_info) or the bundle's gets the exact per-position figures."""
    dep = resolve(db, which)
    info, samples = deployment(db, dep)
    if len(samples) < 2:
        raise KBError(f"deployment {dep} has {len(samples)} sample(s); monitor it for two or more scrapes "
                           "while it serves traffic")
    m = measured_acceptance(samples[0], samples[-1])
    if m is None or not m["drafts"] and info["kind"] != "sglang":
        raise KBError(f"deployment {dep} ({info['url']}) verified no drafts while it was watched; run "
                           "speculative decoding under load (loadgen) while monitor scrapes")
    pos = m["position_acceptance"]
    head = m["head"] or (info["predictions"] or {}).get("head")
    gamma = int(m["block_size"]) if m["block_size"] else (len(pos) if pos else None)
    source = (f"monitor deployment {dep} ({info['url']}, {info['kind']}): {m['drafts']:.0f} drafting rounds over "
              f"{m['seconds']:.0f} s")
    return AcceptProfile(drafter=f"dspark_{head}" if head else None, gamma=gamma, tau=round(m["tau"], 4),
                         position_acceptance=[round(x, 4) for x in pos] if pos else None,
                         per_head={head: [round(x, 4) for x in pos]} if head and pos else None,
                         source=f"measured: {source}", domain=domain)
