"""A job report's time series: per node and metric, one value per step, through the stepped
readings path (`stepped_rows`: whole buckets from the 1-minute or 1-hour rollups, the ragged
ends from raw readings), so a long or old job is plotted from its rollups."""

from __future__ import annotations

from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from api.infra.params import NamePatterns
from api.queries.metrics import Selection, stepped_rows

# A node's several series of one metric (two PSUs, two outlets summed under it, labels
# telling cores apart) become one node value per bucket: their sum and their mean are both
# returned, the caller picks by the metric's node aggregation.
_NODE_SERIES = """
SELECT device_id, metric_id,
    groupArray(toUnixTimestamp64Milli(ts)) AS t, groupArray(total) AS sum, groupArray(mean) AS avg
FROM (
    SELECT ts, device_id, metric_id, sum(value) AS total, avg(value) AS mean
    FROM ({rows}) WHERE isFinite(value)
    GROUP BY ts, device_id, metric_id ORDER BY device_id, metric_id, ts
)
GROUP BY device_id, metric_id ORDER BY device_id, metric_id
"""


def node_series(
    client: Client, selection: Selection, metrics: list[str], step_s: int, agg: str
) -> list[dict[str, Any]]:
    """`{device_id, metric_id, t (Unix ms), sum, avg}` per node of the selection and metric
    of `metrics`, one point per bucket of `step_s` seconds aggregated by `agg` (avg, last...):
    the node's own rows and those of the devices measuring it, summed under it."""
    if not metrics or not selection.devices:
        return []
    params: dict[str, Any] = {}
    narrowed = Selection(
        selection.devices,
        selection.start,
        selection.end,
        NamePatterns(tuple(metrics)),
        selection.labels,
        measured=False,
        only=selection.devices,
        aliased=selection.aliased,
        site=selection.site,
    )
    sql = _NODE_SERIES.replace("{rows}", stepped_rows(narrowed, step_s, agg, params))
    answer = client.raw_query(sql, parameters=params, fmt="JSONEachRow")
    return [orjson.loads(line) for line in answer.splitlines()]
