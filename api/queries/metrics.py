"""The readings query: devices x metrics x time range, parameters bound server-side."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

# Kwollect's timestamp: ISO 8601 with microseconds and offset (always UTC here).
_TIMESTAMP = "formatDateTime(timestamp, '%Y-%m-%dT%H:%i:%S.%f+00:00')"


@dataclass(frozen=True)
class ReadingsSelection:
    devices: tuple[str, ...]
    metrics: tuple[str, ...]
    start: datetime
    end: datetime


def readings_query(selection: ReadingsSelection) -> tuple[str, dict[str, Any]]:
    """SQL and parameters selecting the readings, oldest first.

    The output column `timestamp` is the formatted string, so the table's column is
    always named `metrics.timestamp`. Times are naive UTC datetimes.
    """
    where = [
        "device_id IN {devices:Array(String)}",
        "metrics.timestamp >= {start:DateTime64(6, 'UTC')}",
        "metrics.timestamp <= {end:DateTime64(6, 'UTC')}",
    ]
    params: dict[str, Any] = {
        "devices": list(selection.devices),
        "start": selection.start,
        "end": selection.end,
    }
    if selection.metrics:
        where.append("metric_id IN {metrics:Array(String)}")
        params["metrics"] = list(selection.metrics)
    sql = (
        f"SELECT {_TIMESTAMP} AS timestamp, device_id, metric_id, value, labels "
        f"FROM metrics WHERE {' AND '.join(where)} "
        "ORDER BY metrics.timestamp, device_id, metric_id"
    )
    return sql, params
