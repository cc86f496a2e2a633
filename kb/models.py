"""ORM tables of the knowledge base (Optuna style: plural snake_case tables, `<entity>_id` keys).

Alembic owns the schema (kb/migrations); these classes describe it for queries and must match
the latest revision. Later layers add their own tables through new revisions.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class RuleRow(Base):
    """The current version of every rule ever synced; removed rules stay, disabled."""

    __tablename__ = "rules"
    rule_id: Mapped[str] = mapped_column(String(120), primary_key=True)  # the YAML id
    version: Mapped[int] = mapped_column(Integer, default=1)  # bumped when the content hash changes
    content_hash: Mapped[str] = mapped_column(String(32))
    category: Mapped[str] = mapped_column(String(40), index=True)
    title: Mapped[str] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(Integer)
    source_file: Mapped[str] = mapped_column(Text)
    source_line: Mapped[int] = mapped_column(Integer)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True, index=True)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)  # the validated rule as JSON
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RuleVersionRow(Base):
    """Every version of every rule, so a stored plan can name exactly what shaped it."""

    __tablename__ = "rule_versions"
    __table_args__ = (UniqueConstraint("rule_id", "version"),)
    rule_version_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rule_id: Mapped[str] = mapped_column(ForeignKey("rules.rule_id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    content_hash: Mapped[str] = mapped_column(String(32))
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ProfileRow(Base):
    """A stored profile; the same content stored twice is one row (its stored_at moves)."""

    __tablename__ = "profiles"
    profile_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    content_hash: Mapped[str] = mapped_column(String(32), unique=True)
    name: Mapped[str | None] = mapped_column(Text, nullable=True)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    stored_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)


class PlanRow(Base):
    """A plan matched from a profile: the resolved plan and the rule ids + versions behind it."""

    __tablename__ = "plans"
    plan_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    profile_id: Mapped[int] = mapped_column(ForeignKey("profiles.profile_id"), index=True)
    rule_ids: Mapped[list[Any]] = mapped_column(JSON)  # [{"id": ..., "version": ...}] of fired rules
    body: Mapped[dict[str, Any]] = mapped_column(JSON)  # kb.match.Plan as JSON
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

from kb import models_kernels, models_live  # noqa: E402,F401  (register kernel_configs, deployments)
