"""calibrations: the simulator against live measurements of one model on one machine (`tune --engine`).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "calibrations",
        sa.Column("calibration_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("hw_name", sa.Text, nullable=False, index=True),
        sa.Column("model_name", sa.Text, nullable=False),
        sa.Column("engine", sa.String(40), nullable=False),
        sa.Column("scale", sa.Float, nullable=False),
        sa.Column("spread", sa.Float, nullable=False),
        sa.Column("trials", sa.Integer, nullable=False),
        sa.Column("efficiency", sa.JSON, nullable=True),
        sa.Column("study", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, index=True),
    )


def downgrade() -> None:
    op.drop_table("calibrations")
