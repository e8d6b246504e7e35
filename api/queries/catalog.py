"""What a scope holds: its devices' metrics with counts and first/last times."""

from __future__ import annotations

from typing import Any

from api.queries.metrics import Selection, scope_rows

_ISO = "'%Y-%m-%dT%H:%i:%S.%f+00:00'"


def catalog_query(selection: Selection) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {}
    rows = scope_rows(selection, params)
    sql = (
        f"SELECT device_id, metric_id, count() AS count, formatDateTime(min(ts), {_ISO}) AS first, "
        f"formatDateTime(max(ts), {_ISO}) AS last FROM ({rows}) "
        "GROUP BY device_id, metric_id ORDER BY device_id, metric_id"
    )
    return sql, params
