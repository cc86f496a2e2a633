"""Initial schema: rules, rule_versions, profiles, plans.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "rules",
        sa.Column("rule_id", sa.String(120), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("content_hash", sa.String(32), nullable=False),
        sa.Column("category", sa.String(40), nullable=False, index=True),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("source_file", sa.Text, nullable=False),
        sa.Column("source_line", sa.Integer, nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False, index=True),
        sa.Column("body", sa.JSON, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "rule_versions",
        sa.Column("rule_version_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("rule_id", sa.String(120), sa.ForeignKey("rules.rule_id"), nullable=False, index=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("content_hash", sa.String(32), nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("rule_id", "version"),
    )
    op.create_table(
        "profiles",
        sa.Column("profile_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("content_hash", sa.String(32), nullable=False, unique=True),
        sa.Column("name", sa.Text, nullable=True),
        sa.Column("body", sa.JSON, nullable=False),
        sa.Column("stored_at", TS, nullable=False, index=True),
    )
    op.create_table(
        "plans",
        sa.Column("plan_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("profile_id", sa.Integer, sa.ForeignKey("profiles.profile_id"), nullable=False, index=True),
        sa.Column("rule_ids", sa.JSON, nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )


def downgrade() -> None:
    for table in ("plans", "profiles", "rule_versions", "rules"):
        op.drop_table(table)
