"""A job report's time series: per node and metric, one value per step, as the stepped
readings path computes them (`stepped_rows`: whole buckets from the 1-minute or 1-hour
rollups, the ragged ends from raw readings), so a long or old job is plotted from its
rollups. Every plotted series of a report comes from one query, which reads the rollup once
for all its metrics, sums a node's aliased devices once, and leaves out the pending buckets'
condition when a cheap look at the pending buckets finds none in the job's span."""

from __future__ import annotations

from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from api.infra.params import NamePatterns
from api.queries.metrics import Selection, pending_in_span, stepped_node_values

# A node's several series of one metric (two PSUs, two outlets summed under it, labels
# telling cores apart) become one node value per bucket: their sum and their mean are both
# returned, the caller picks by the metric's node aggregation. The series summed under the
# node by alias count as one (as Kwollect's node view sums them); a non-finite value is left
# out (an alias sum with one is).
_NODE_SERIES = """
SELECT node AS device_id, metric_id,
    groupArray(toUnixTimestamp64Milli(ts)) AS t, groupArray(total) AS sum,
    groupArray(total / n) AS avg
FROM (
    SELECT ts, node, metric_id,
        sumIf(value, aliased) AS summed,
        isFinite(summed) AND countIf(aliased) > 0 AS with_summed,
        sumIf(value, NOT aliased AND isFinite(value)) + if(with_summed, summed, 0) AS total,
        countIf(NOT aliased AND isFinite(value)) + with_summed AS n
    FROM ({rows})
    GROUP BY ts, node, metric_id HAVING n > 0 ORDER BY node, metric_id, ts
)
GROUP BY node, metric_id ORDER BY node, metric_id
"""


def node_series(
    client: Client, selection: Selection, aggs: dict[str, str], step_s: int
) -> list[dict[str, Any]]:
    """`{device_id, metric_id, t (Unix ms), sum, avg}` per node of the selection and metric
    of `aggs`, one point per bucket of `step_s` seconds aggregated by `aggs[metric]` (avg,
    last...): the node's own rows and those of the devices measuring it, summed under it.
    One query for every metric; the pending buckets' condition only where the rollup lacks
    a bucket of the job's devices in its span (read just before: a bucket becoming pending
    after is answered as the rollup holds it, as if the report had been asked a moment
    earlier)."""
    if not aggs or not selection.devices:
        return []
    narrowed = Selection(
        selection.devices,
        selection.start,
        selection.end,
        NamePatterns(tuple(sorted(aggs))),
        selection.labels,
        aliased=selection.aliased,
        site=selection.site,
        allocated=selection.allocated,
    )
    params: dict[str, Any] = {}
    check = pending_in_span(narrowed, step_s, params)
    pending = check is not None and bool(client.command(check, parameters=params))
    params = {}
    rows = stepped_node_values(narrowed, step_s, aggs, params, pending)
    answer = client.raw_query(
        _NODE_SERIES.replace("{rows}", rows), parameters=params, fmt="JSONEachRow"
    )
    return [orjson.loads(line) for line in answer.splitlines()]
