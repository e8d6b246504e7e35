"""The unit of data: one value of one metric of one device at one instant."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Reading:
    timestamp_us: int
    """UTC, microseconds since the Unix epoch."""
    device_id: str
    metric_id: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)
