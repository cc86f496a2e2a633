"""Profiles and plans in the knowledge base: save, fetch, list."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import select

from kb.db import Database
from kb.errors import KBError
from kb.models import PlanRow, ProfileRow, utcnow
from profiler.schema import Profile


def save_profile(db: Database, profile: Profile, name: str | None = None) -> int:
    """Store a profile (deduplicated by content hash) and return its id; it becomes the latest."""
    digest = profile.content_hash()
    with db.session() as s:
        row = s.scalar(select(ProfileRow).where(ProfileRow.content_hash == digest))
        if row is None:
            row = ProfileRow(content_hash=digest, name=name or _default_name(profile),
                             body=profile.model_dump(mode="json", exclude_none=True), stored_at=utcnow())
            s.add(row)
        else:
            row.stored_at = utcnow()
            if name:
                row.name = name
        s.flush()
        return row.profile_id


def _default_name(p: Profile) -> str:
    parts = [p.model.name, p.hw.name, p.workload.name or p.workload.domain]
    return " / ".join(x for x in parts if x) or "profile"


def _to_profile(row: ProfileRow) -> Profile:
    try:
        return Profile.model_validate(row.body)
    except ValidationError as e:
        raise KBError(f"stored profile {row.profile_id} no longer fits the profile schema "
                      f"({e.errors()[0]['loc']}); profile again") from None


def get_profile(db: Database, profile_id: int) -> Profile:
    with db.session() as s:
        row = s.get(ProfileRow, profile_id)
        if row is None:
            raise KBError(f"no stored profile with id {profile_id}; list them with 'dspark kb stats'")
        return _to_profile(row)


def latest_profile(db: Database) -> tuple[int, Profile] | None:
    """The most recently stored profile, or None when there is none."""
    with db.session() as s:
        row = s.scalar(select(ProfileRow).order_by(ProfileRow.stored_at.desc(), ProfileRow.profile_id.desc()))
        return None if row is None else (row.profile_id, _to_profile(row))


def latest_production(db: Database, model: str, drafter: str | None, domain: str | None,
                      scan: int = 500) -> Profile | None:
    """The newest of the last `scan` stored profiles whose acceptance a live deployment measured (`profile
    --from-monitor`) for this model, drafter and workload domain, or None."""
    with db.session() as s:
        rows = s.scalars(select(ProfileRow).order_by(ProfileRow.stored_at.desc(), ProfileRow.profile_id.desc())
                         .limit(scan))
        for row in rows:
            body = row.body if isinstance(row.body, dict) else {}
            source = str((body.get("accept") or {}).get("source") or "")
            if not source.startswith("measured: monitor "):
                continue
            try:
                p = _to_profile(row)
            except KBError:
                continue
            if p.model.name == model and p.drafter.chosen == drafter and (p.workload.domain or None) == domain:
                return p
    return None


def list_profiles(db: Database, limit: int = 20) -> list[dict[str, Any]]:
    with db.session() as s:
        rows = s.scalars(select(ProfileRow).order_by(ProfileRow.stored_at.desc()).limit(limit))
        return [{"profile_id": r.profile_id, "name": r.name, "hash": r.content_hash,
                 "stored_at": r.stored_at.isoformat()} for r in rows]


def save_plan(db: Database, profile_id: int, plan_json: dict[str, Any], rule_ids: list[dict[str, Any]]) -> int:
    with db.session() as s:
        row = PlanRow(profile_id=profile_id, body=plan_json, rule_ids=rule_ids, created_at=utcnow())
        s.add(row)
        s.flush()
        return row.plan_id


def get_plan(db: Database, plan_id: int) -> dict[str, Any]:
    with db.session() as s:
        row = s.get(PlanRow, plan_id)
        if row is None:
            raise KBError(f"no stored plan with id {plan_id}")
        return {"plan_id": row.plan_id, "profile_id": row.profile_id, "rule_ids": row.rule_ids, **row.body}
