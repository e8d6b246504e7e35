"""A job's summary: statistics per device and metric, energy per node and source.

Two queries: the metric ids the scope's devices ever had (`metrics_latest`, milliseconds),
looked up in the metric registry; then one query in ClickHouse (again, with the kinds of the
metrics it found, should one be too new to be known and more than a gauge): statistics of
each series (device, metric, labels) of the scope, the points of the node-level power series
(registry unit W) integrated, the points of counters turned into increases (wraps and resets
as `as_rate` reads them: the same SQL, api/queries/metrics.py's counter_increase), then all
per device and metric (a node and metric is one energy source). api/summary.py shapes the
rows. The same scan gives the footprint's columns and the nodes' first raw reading (`scan`,
used by api/footprint.py's `annotated`): each scan of a scope's rows costs a FINAL read of
its readings, so there is one.

Values users wrote themselves (pushed: `source=user:<name>`; Kwollect's `kwollect_custom`,
labelled `_metric_origin=prom_kwollect_custom`) are never mixed with measured ones: their
rows, energy and totals come apart, marked `pushed`, so a user cannot add to (or dilute)
the measured energy of a job.

Energy: the trapezoidal integral of power over time. The sampling period of a series is the
median interval between its readings; an interval longer than 3 periods is a gap, not
bridged. `covered_s` is the time the integral spans without gaps. An energy counter's
energy is its increase; its `covered_s` the time from its first to its last reading.
Counters: `delta` the increase over the job summed over the row's series, `rate` the sum of
each series' increase over the seconds from its first to its last reading.
Gauges: `p95` exact (of all the row's readings; for a power metric of several series,
the largest of theirs: each is integrated apart).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from api import summary as shaping
from api.infra.params import iso
from api.queries import footprint as fq
from api.queries.metrics import (
    Selection,
    counter_increase,
    counter_reset,
    known_metrics,
    scope_rows,
)
from api.registry import Registry, registry
from api.schemas import Job

GAP_PERIODS = 3

_PUSHED = "startsWith(lab['source'], 'user:') OR lab['_metric_origin'] = 'prom_kwollect_custom'"
"""A reading users wrote (REST push or kwollect_custom); only jobscope sets these labels."""

# Per series: statistics, for node-level power series their points integrated, for counters
# their increases; then per device, metric and pushed-or-measured, with the points of the
# footprint's gauges on the nodes (`fp_metrics`) combined at each instant by the metric's
# node aggregation and placed on its scale (api/queries/footprint.py's POINTS). A node's
# sum of aliased readings is one series per set of devices summed (a reading missing at an
# instant must not start a series of its own). One scan of the scope's rows answers the
# summary and the footprint.
_SUMMARY = """
SELECT device_id, metric_id, pushed, min, avg, max, last, count, power, joules, covered_s,
    power_readings, sources, delta, rate, resets, counter_covered_s, p95, own, first, fp,
    fp_mean, fp_p95, fp_cov AS fp_covered_s, fp_caution AS fp_caution_s,
    fp_alert AS fp_alert_s, fp_deciles
FROM (
    SELECT *, {scale}, {points}
    FROM (
        SELECT device_id, metric_id, pushed, min(mn) AS min, sum(sm) / sum(n) AS avg,
            max(mx) AS max, argMax(last_value, last_ts) AS last, toUInt32(sum(n)) AS count,
            max(is_power) AS power, sumIf(j, is_power) AS joules,
            minIf(cov, is_power) AS covered_s, toUInt32(sumIf(n, is_power)) AS power_readings,
            arraySort(arrayDistinct(arrayFlatten(groupArrayIf(srcs, is_power OR is_counter))))
                AS sources,
            sumIf(inc, is_counter) AS delta,
            sumIf(if(span > 0, inc / span, 0), is_counter) AS rate,
            toUInt32(sumIf(rs, is_counter)) AS resets, minIf(span, is_counter) AS counter_covered_s,
            max(q95) AS p95, toUInt32(sum(own_n)) AS own,
            toUnixTimestamp(minIf(first_own, own_n > 0)) AS first,
            max(fp_series) AS fp,
            arraySort(arrayFlatten(groupArrayIf(arrayZip(t, v), fp_series))) AS fp_pts
        FROM (
            SELECT *, notEmpty(t) AND power_series AS is_power,
                splitByChar(',', if(orig = '', device_id, orig)) AS srcs,
                arrayPopFront(arrayDifference(t)) AS dt,
                if(empty(dt) OR NOT is_power, 0, arrayReduce('medianExact', dt)) AS period,
                arrayMap(d -> d <= {gap_periods:UInt8} * period, dt) AS bridged,
                if(is_power, arraySum(arrayMap((d, b, a, c) -> if(b, (a + c) / 2 * d, 0),
                    dt, bridged, arrayPopBack(v), arrayPopFront(v))) / 1e6, 0) AS j,
                arraySum(arrayMap((d, b) -> if(b, d, 0), dt, bridged)) / 1e6 AS cov,
                {counter_bits:Array(UInt8)}[indexOf({counters:Array(String)}, metric_id)] AS bits,
                if(is_counter,
                    arraySum(arrayMap((a, c) -> {increase}, arrayPopBack(v), arrayPopFront(v))),
                    0) AS inc,
                if(is_counter, arrayCount((a, c) -> {reset}, arrayPopBack(v), arrayPopFront(v)),
                    0) AS rs,
                if(length(t) > 1, (t[-1] - t[1]) / 1e6, 0) AS span,
                if(fp_series, arrayReduce('quantileExact(0.95)', v), q_rows) AS q95
            FROM (
                SELECT device_id, metric_id, ({pushed}) AS pushed,
                    any(lab['_device_orig']) AS orig, min(value) AS mn, max(value) AS mx,
                    sum(value) AS sm, count() AS n, max(ts) AS last_ts,
                    argMax(value, ts) AS last_value,
                    metric_id IN {counters:Array(String)} AS is_counter,
                    metric_id IN {power:Array(String)} AND device_id IN {devices:Array(String)}
                        AS power_series,
                    metric_id IN {fp_metrics:Array(String)} AND device_id IN {devices:Array(String)}
                        AS fp_series,
                    power_series OR is_counter OR fp_series AS points,
                    arraySort(groupArrayIf(toUnixTimestamp64Micro(ts), points)) AS t,
                    arraySort((x, y) -> y, groupArrayIf(value, points),
                        groupArrayIf(toUnixTimestamp64Micro(ts), points)) AS v,
                    quantileExactIf(0.95)(value, NOT is_counter AND NOT fp_series) AS q_rows,
                    countIf({own}) AS own_n, minIf(ts, {own}) AS first_own
                FROM ({rows})
                -- power series, counters and the footprint's gauges are taken alone; other
                -- series only add up statistics
                GROUP BY device_id, metric_id, pushed,
                    if(metric_id IN {power:Array(String)} OR metric_id IN {counters:Array(String)}
                        OR (metric_id IN {fp_metrics:Array(String)}
                            AND device_id IN {devices:Array(String)}), series, 0)
            )
        )
        GROUP BY device_id, metric_id, pushed
    )
)
ORDER BY device_id, metric_id, pushed
"""
for _name, _sql in (
    ("{increase}", counter_increase("a", "c", "bits")),
    ("{reset}", counter_reset("a", "c", "bits")),
    ("{scale}", fq.SCALE),
    ("{points}", fq.POINTS),
    # a node's own reading (not a sum of the devices measuring it)
    ("{own}", "device_id IN {devices:Array(String)} AND NOT mapContains(lab, '_device_orig')"),
):
    _SUMMARY = _SUMMARY.replace(_name, _sql)


def known_metric_ids(client: Client, selection: Selection) -> list[str]:
    params: dict[str, Any] = {}
    sql = known_metrics(selection, params)
    return [row[0] for row in client.query(sql, parameters=params).result_rows]


@dataclass(frozen=True)
class Scan:
    """A summary, the statistics rows it was shaped from (with the footprint's columns
    `fp_*` for the gauges of `scales`), and the first own raw reading of the scope's nodes
    (Unix s; None: none) when the scan read all of their metrics and labels (`unfiltered`):
    what api/footprint.py needs, without a second scan."""

    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    first_raw: int | None
    unfiltered: bool


def statistics(
    client: Client, selection: Selection, kinds: shaping.Kinds, scales: fq.Scales | None = None
) -> list[dict[str, Any]]:
    """One row per device, metric and pushed-or-measured (the columns of _SUMMARY)."""
    params: dict[str, Any] = {
        "gap_periods": GAP_PERIODS,
        "power": kinds.power,
        "counters": kinds.counters,
        "counter_bits": [kinds.counter_bits[m] for m in kinds.counters],
        **(scales or fq.Scales.none()).params(),
    }
    sql = _SUMMARY.replace("{pushed}", _PUSHED).replace("{rows}", scope_rows(selection, params))
    rows = []
    # JSON from ClickHouse, parsed by orjson: 10x cheaper than typed rows for 10^4 series.
    for line in client.raw_query(sql, parameters=params, fmt="JSONEachRow").splitlines():
        row = orjson.loads(line)
        row["pushed"] = bool(row["pushed"])
        rows.append(row)
    return rows


def scan(
    client: Client,
    job: Job,
    selection: Selection | None,
    scales: Callable[[list[str]], fq.Scales] | None = None,
) -> Scan:
    """The summary from raw readings as JSON-ready data (see JobSummary), built from one row
    per device and metric without a model object per row; with `scales` (the footprint's
    gauges among the scope's metrics), the footprint's columns from the same scan."""
    summary = shaping.empty(job.job_id, job.start, job.end)
    if selection is None:
        return Scan(summary, [], None, False)
    summary.update(
        start=iso(selection.start),
        end=iso(selection.end),
        duration_s=(selection.end - selection.start).total_seconds(),
    )
    reg = registry()
    known = known_metric_ids(client, selection)
    rows = statistics(
        client, selection, shaping.kinds(known, reg), scales(known) if scales else None
    )
    found = sorted({row["metric_id"] for row in rows})
    if _treated_apart(sorted(set(found) - set(known)), reg, scales):
        # A metric too new to be known yet is a power series, counter or footprint gauge:
        # its rows must be taken as such (rare: within a minute of its first reading).
        rows = statistics(
            client, selection, shaping.kinds(found, reg), scales(found) if scales else None
        )
    nodes = list(selection.only or selection.devices)
    shaping.shape(rows, summary, nodes, reg)
    first = [row["first"] for row in rows if row["own"]]
    unfiltered = (
        not selection.metrics
        and not selection.labels
        and selection.site is None
        and set(selection.only or selection.devices) >= set(selection.devices)
    )
    return Scan(summary, rows, min(first) if first else None, unfiltered)


def _treated_apart(
    metric_ids: list[str], reg: Registry, scales: Callable[[list[str]], fq.Scales] | None
) -> bool:
    """Whether any of `metric_ids` is read as more than statistics (see _SUMMARY)."""
    kinds = shaping.kinds(metric_ids, reg)
    placed = scales(metric_ids).metrics if scales and metric_ids else []
    return bool(kinds.power or kinds.counters or placed)


def summarise(client: Client, job: Job, selection: Selection | None) -> dict[str, Any]:
    """The summary from raw readings (see `scan`)."""
    return scan(client, job, selection).summary
