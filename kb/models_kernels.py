"""ORM table of tuned kernel configs (migration kb/migrations/versions/0002_kernel_configs.py).

One row per (kernel, GPU, shape bucket): the winning Triton config of `tune-kernels` with the timings
behind it, so a bundle exported for that GPU can carry the configs the engine launches with.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from kb.models import Base, utcnow


class KernelConfigRow(Base):
    """The tuned config of one kernel for one GPU model and one shape bucket."""

    __tablename__ = "kernel_configs"
    __table_args__ = (UniqueConstraint("kernel", "gpu", "shape_bucket", name="uq_kernel_configs_key"),)
    kernel_config_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kernel: Mapped[str] = mapped_column(String(60))  # registry name, e.g. "verify_greedy"
    gpu: Mapped[str] = mapped_column(String(120), index=True)  # normalised device name, e.g. "nvidia-h200"
    shape_bucket: Mapped[str] = mapped_column(String(120))  # the kernel's bucket key, e.g. "B64-g8-V262144"
    shape: Mapped[dict[str, Any]] = mapped_column(JSON)  # the representative shape that was timed
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # knob -> value (a point of the kernel's space)
    time_ms: Mapped[float] = mapped_column(Float)  # best measured time of the Triton kernel
    default_ms: Mapped[float | None] = mapped_column(Float, nullable=True)  # the arch default config's time
    torch_ms: Mapped[float | None] = mapped_column(Float, nullable=True)  # torch eager reference time
    n_trials: Mapped[int] = mapped_column(Integer)  # Optuna trials run
    triton_version: Mapped[str] = mapped_column(String(40))  # configs can go stale across Triton versions
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
