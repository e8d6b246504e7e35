"""Devices and their newest readings, from `metrics_newest` (the latest-value table, and raw
readings of the minutes it does not hold yet: clickhouse/migrations/0022), not a scan."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from api.queries import iso_sql
from api.queries.jobs import Condition


def devices_query(nodes_of: Condition | None = None) -> tuple[str, dict[str, Any]]:
    """Every device, or with `nodes_of` only the nodes of the jobs it keeps."""
    where, params = "", {}
    if nodes_of is not None:
        where = f"WHERE device_id IN (SELECT arrayJoin(nodes) FROM jobs WHERE {nodes_of[0]}) "
        params = nodes_of[1]
    return (
        "SELECT device_id, toInt64(uniqExact(metric_id)) AS metrics, "
        f"{iso_sql('max(timestamp)')} AS last_reading "
        f"FROM metrics_newest {where}GROUP BY device_id ORDER BY device_id",
        params,
    )


def latest_query(device_id: str) -> tuple[str, dict[str, Any]]:
    return (
        f"SELECT {iso_sql('timestamp')} AS timestamp, device_id, metric_id, value, "
        "labels FROM metrics_newest WHERE device_id = {device_id:String} "
        "ORDER BY metric_id, labels_hash",
        {"device_id": device_id},
    )


def recent_metrics_query(since: datetime, until: datetime) -> tuple[str, dict[str, Any]]:
    """Every device and metric whose newest reading lies in (since, until]: what reported
    lately, when `until` is now."""
    return (
        "SELECT DISTINCT device_id, metric_id FROM metrics_newest "
        "WHERE timestamp > {since:DateTime64(6, 'UTC')} "
        "AND timestamp <= {until:DateTime64(6, 'UTC')} ORDER BY device_id, metric_id",
        {"since": since, "until": until},
    )


def select_devices(client: Client, nodes_of: Condition | None = None) -> list[dict[str, Any]]:
    sql, params = devices_query(nodes_of)
    return list(client.query(sql, parameters=params).named_results())


def select_latest(client: Client, device_id: str) -> list[dict[str, Any]]:
    sql, params = latest_query(device_id)
    return list(client.query(sql, parameters=params).named_results())


def select_recent_metrics(client: Client, since: datetime, until: datetime) -> list[dict[str, Any]]:
    sql, params = recent_metrics_query(since, until)
    return list(client.query(sql, parameters=params).named_results())
