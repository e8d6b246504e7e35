"""Devices and their newest readings, from the latest-value table (not a scan of raw data)."""

from __future__ import annotations

from typing import Any

_ISO = "'%Y-%m-%dT%H:%i:%S.%f+00:00'"


def devices_query() -> tuple[str, dict[str, Any]]:
    return (
        "SELECT device_id, toInt64(uniqExact(metric_id)) AS metrics, "
        f"formatDateTime(max(timestamp), {_ISO}) AS last_reading "
        "FROM metrics_latest GROUP BY device_id ORDER BY device_id",
        {},
    )


def latest_query(device_id: str) -> tuple[str, dict[str, Any]]:
    return (
        f"SELECT formatDateTime(timestamp, {_ISO}) AS timestamp, device_id, metric_id, value, "
        "labels FROM metrics_latest WHERE device_id = {device_id:String} "
        "ORDER BY metric_id, labels_hash",
        {"device_id": device_id},
    )
