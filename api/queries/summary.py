"""A job's summary: statistics per device and metric, energy per node and source.

One query, in ClickHouse: statistics of each series (device, metric, labels) of the scope,
the points of the node-level power series (`_watt`) integrated, then both per device and
metric (a node and metric is one energy source). Python only shapes the rows.

Values users wrote themselves (pushed: `source=user:<name>`; Kwollect's `kwollect_custom`,
labelled `_metric_origin=prom_kwollect_custom`) are never mixed with measured ones: their
rows, energy and totals come apart, marked `pushed`, so a user cannot add to (or dilute)
the measured energy of a job.

Energy: the trapezoidal integral of power over time. The sampling period of a series is the
median interval between its readings; an interval longer than 3 periods is a gap, not
bridged. `covered_s` is the time the integral spans without gaps.
"""

from __future__ import annotations

from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from api.infra.params import iso
from api.queries.metrics import Selection, scope_rows
from api.schemas import Job

GAP_PERIODS = 3
POWER_SUFFIX = "_watt"

_PUSHED = "startsWith(lab['source'], 'user:') OR lab['_metric_origin'] = 'prom_kwollect_custom'"
"""A reading users wrote (REST push or kwollect_custom); only jobscope sets these labels."""

# Per series: statistics, and for node-level power series their points integrated; then
# per device, metric and pushed-or-measured. A node's sum of aliased readings is one series
# per set of devices summed (a reading missing at an instant must not start a series of
# its own).
_SUMMARY = """
SELECT device_id, metric_id, pushed, min(mn) AS min, sum(sm) / sum(n) AS avg, max(mx) AS max,
    argMax(last_value, last_ts) AS last, toUInt32(sum(n)) AS count, max(is_power) AS power,
    sumIf(j, is_power) AS joules, minIf(cov, is_power) AS covered_s,
    toUInt32(sumIf(n, is_power)) AS power_readings,
    arraySort(arrayDistinct(arrayFlatten(groupArrayIf(srcs, is_power)))) AS sources
FROM (
    SELECT device_id, metric_id, pushed, mn, mx, sm, n, last_ts, last_value,
        notEmpty(pts) AS is_power,
        splitByChar(',', if(orig = '', device_id, orig)) AS srcs,
        arrayMap(p -> p.1, pts) AS t, arrayMap(p -> p.2, pts) AS v,
        arrayPopFront(arrayDifference(t)) AS dt,
        if(empty(dt), 0, arrayReduce('medianExact', dt)) AS period,
        arrayMap(d -> d <= {gap_periods:UInt8} * period, dt) AS bridged,
        arraySum(arrayMap((d, b, a, c) -> if(b, (a + c) / 2 * d, 0),
            dt, bridged, arrayPopBack(v), arrayPopFront(v))) / 1e6 AS j,
        arraySum(arrayMap((d, b) -> if(b, d, 0), dt, bridged)) / 1e6 AS cov
    FROM (
        SELECT device_id, metric_id, ({pushed}) AS pushed, any(lab['_device_orig']) AS orig,
            min(value) AS mn, max(value) AS mx, sum(value) AS sm, count() AS n,
            max(ts) AS last_ts, argMax(value, ts) AS last_value,
            arraySort(p -> p.1, groupArrayIf((toUnixTimestamp64Micro(ts), value),
                endsWith(metric_id, {power_suffix:String})
                AND device_id IN {devices:Array(String)})) AS pts
        FROM ({rows})
        -- a power series is integrated alone; other series only add up their statistics
        GROUP BY device_id, metric_id, pushed,
            if(endsWith(metric_id, {power_suffix:String}), series, 0)
    )
)
GROUP BY device_id, metric_id, pushed
ORDER BY device_id, metric_id, pushed
"""
_STATS = ("device_id", "metric_id", "min", "avg", "max", "last", "count", "pushed")


def summarise(client: Client, job: Job, selection: Selection | None) -> dict[str, Any]:
    """The summary as JSON-ready data (see JobSummary): built from one row per device and
    metric, without a model object per row."""
    summary: dict[str, Any] = {
        "job_id": job.job_id,
        "start": job.start,
        "end": job.end,
        "duration_s": 0.0,
        "metrics": [],
        "energy": [],
        "energy_total": [],
    }
    if selection is None:
        return summary
    params: dict[str, Any] = {"gap_periods": GAP_PERIODS, "power_suffix": POWER_SUFFIX}
    sql = _SUMMARY.replace("{pushed}", _PUSHED).replace("{rows}", scope_rows(selection, params))
    totals: dict[tuple[str, bool], tuple[float, int]] = {}
    # JSON from ClickHouse, parsed by orjson: 10x cheaper than typed rows for 10^4 series.
    for line in client.raw_query(sql, parameters=params, fmt="JSONEachRow").splitlines():
        row = orjson.loads(line)
        row["pushed"] = bool(row["pushed"])
        summary["metrics"].append({k: row[k] for k in _STATS})
        if row["power"]:
            node, metric, pushed = row["device_id"], row["metric_id"], row["pushed"]
            summary["energy"].append(
                {
                    "node": node,
                    "metric_id": metric,
                    "sources": row["sources"],
                    "joules": row["joules"],
                    "covered_s": row["covered_s"],
                    "readings": row["power_readings"],
                    "pushed": pushed,
                }
            )
            joules, nodes = totals.get((metric, pushed), (0.0, 0))
            totals[(metric, pushed)] = (joules + row["joules"], nodes + 1)
    summary.update(
        start=iso(selection.start),
        end=iso(selection.end),
        duration_s=(selection.end - selection.start).total_seconds(),
        energy_total=[
            {"metric_id": m, "joules": j, "nodes": n, "pushed": p}
            for (m, p), (j, n) in sorted(totals.items())
        ],
    )
    return summary
