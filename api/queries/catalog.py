"""What a scope holds: its devices' metrics with counts and first/last times, described by
the metric registry."""

from __future__ import annotations

from typing import Any

from clickhouse_connect.driver.client import Client

from api.queries import iso_sql
from api.queries.metrics import Selection, scope_rows
from api.registry import describe


def catalog_query(selection: Selection) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {}
    rows = scope_rows(selection, params)
    sql = (
        f"SELECT device_id, metric_id, count() AS count, {iso_sql('min(ts)')} AS first, "
        f"{iso_sql('max(ts)')} AS last FROM ({rows}) "
        "GROUP BY device_id, metric_id ORDER BY device_id, metric_id"
    )
    return sql, params


def select_catalog(client: Client, selection: Selection) -> list[dict[str, Any]]:
    """The scope's metrics, each with the registry's unit, kind, scope and description."""
    sql, params = catalog_query(selection)
    rows = client.query(sql, parameters=params).named_results()
    return [{**row, **describe(row["metric_id"])} for row in rows]
