"""deployments and deployment_samples: what `monitor` scraped from a live server.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("deployment_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("bundle", sa.Text, nullable=True),
        sa.Column("predictions", sa.JSON, nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, index=True),
    )
    op.create_table(
        "deployment_samples",
        sa.Column("deployment_sample_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("deployment_id", sa.Integer, sa.ForeignKey("deployments.deployment_id"), nullable=False,
                  index=True),
        sa.Column("taken_at", sa.Float, nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("deployment_samples")
    op.drop_table("deployments")
