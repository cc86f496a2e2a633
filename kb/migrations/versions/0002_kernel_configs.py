"""kernel_configs: tuned Triton kernel configs keyed by (kernel, GPU, shape bucket).

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kernel_configs",
        sa.Column("kernel_config_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kernel", sa.String(60), nullable=False),
        sa.Column("gpu", sa.String(120), nullable=False, index=True),
        sa.Column("shape_bucket", sa.String(120), nullable=False),
        sa.Column("shape", sa.JSON, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("time_ms", sa.Float, nullable=False),
        sa.Column("default_ms", sa.Float, nullable=True),
        sa.Column("torch_ms", sa.Float, nullable=True),
        sa.Column("n_trials", sa.Integer, nullable=False),
        sa.Column("triton_version", sa.String(40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("kernel", "gpu", "shape_bucket", name="uq_kernel_configs_key"),
    )


def downgrade() -> None:
    op.drop_table("kernel_configs")
