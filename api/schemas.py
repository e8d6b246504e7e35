"""Response shapes, for the OpenAPI documentation and typed clients."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Reading(BaseModel):
    """One reading, as Kwollect's REST API returns it (paper, Fig. 3)."""

    timestamp: str = Field(
        examples=["2026-11-26T11:53:50.164813+00:00"],
        description="ISO 8601, microseconds, UTC offset",
    )
    device_id: str = Field(examples=["node-1"])
    metric_id: str = Field(examples=["bmc_power_watt"])
    value: float = Field(examples=[138])
    labels: dict[str, str] = Field(default_factory=dict)


class ComponentHealth(BaseModel):
    ok: bool
    detail: str


class Health(BaseModel):
    status: str = Field(examples=["ok", "degraded"])
    kafka: ComponentHealth
    clickhouse: ComponentHealth


class ErrorBody(BaseModel):
    error: str
    parameter: str | None = None
