"""rules/*.yaml -> database, in one transaction: all or nothing, idempotent.

Unchanged rules are untouched, changed rules get a new version, removed rules are disabled
(never deleted: stored plans keep naming them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from kb.db import Database
from kb.loader import LoadedRule
from kb.models import RuleRow, RuleVersionRow, utcnow
from kb.rules import Rule


@dataclass
class SyncReport:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    reenabled: list[str] = field(default_factory=list)
    unchanged: int = 0

    @property
    def touched(self) -> bool:
        return bool(self.added or self.changed or self.disabled or self.reenabled)

    def to_json(self) -> dict[str, Any]:
        return {"added": self.added, "changed": self.changed, "disabled": self.disabled,
                "reenabled": self.reenabled, "unchanged": self.unchanged}


def sync_rules(db: Database, loaded: list[LoadedRule]) -> SyncReport:
    """Mirror the loaded rules into the database in a single transaction."""
    report = SyncReport()
    with db.session() as s:
        existing = {r.rule_id: r for r in s.scalars(select(RuleRow))}
        seen: set[str] = set()
        for lr in loaded:
            rule, digest = lr.rule, lr.rule.content_hash()
            seen.add(rule.id)
            row = existing.get(rule.id)
            if row is None:
                s.add(RuleRow(rule_id=rule.id, version=1, content_hash=digest, category=rule.category,
                              title=rule.title, priority=rule.priority, source_file=lr.file,
                              source_line=lr.line, enabled=True, body=rule.to_json(), updated_at=utcnow()))
                s.flush()
                s.add(RuleVersionRow(rule_id=rule.id, version=1, content_hash=digest, body=rule.to_json(),
                                     created_at=utcnow()))
                report.added.append(rule.id)
                continue
            if row.content_hash != digest:
                row.version += 1
                row.content_hash, row.body = digest, rule.to_json()
                row.category, row.title, row.priority = rule.category, rule.title, rule.priority
                s.add(RuleVersionRow(rule_id=rule.id, version=row.version, content_hash=digest,
                                     body=rule.to_json(), created_at=utcnow()))
                report.changed.append(rule.id)
            elif not row.enabled:
                report.reenabled.append(rule.id)
            else:
                report.unchanged += 1
            if (row.source_file, row.source_line) != (lr.file, lr.line) or not row.enabled:
                row.source_file, row.source_line, row.enabled = lr.file, lr.line, True
                row.updated_at = utcnow()
        for rule_id, row in existing.items():
            if rule_id not in seen and row.enabled:
                row.enabled = False
                row.updated_at = utcnow()
                report.disabled.append(rule_id)
    return report


@dataclass(frozen=True)
class StoredRule:
    rule: Rule
    version: int
    source_file: str
    source_line: int


def enabled_rules(db: Database) -> list[StoredRule]:
    """The enabled rules as stored (the matcher's input), ordered by id."""
    with db.session() as s:
        rows = s.scalars(select(RuleRow).where(RuleRow.enabled.is_(True)).order_by(RuleRow.rule_id))
        return [StoredRule(Rule.model_validate(r.body), r.version, r.source_file, r.source_line) for r in rows]
