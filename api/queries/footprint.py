"""A job's footprint in SQL: per node and metric, the mean, p95, time covered, time above
the caution and alert levels, time in each tenth between idle and peak; per node, the
spans without any reading.

From raw readings while the job's are kept; from the 1-minute rollups (`metrics_1m`) once
raw readings have expired (the buckets' means stand for the readings: a minute is the
resolution). Every value is a bound parameter.

A node's several series of a metric (two PSUs, sixteen cores) are one: at each instant
(raw) or minute (rollups) their values combine by the metric's node aggregation in the
registry (sum, mean, max, min; without one, the worst of them). Raw: each interval between
two instants counts with the value at its start, and is not bridged past `GAP_PERIODS`
sampling periods (the median interval), as the summary's energy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from api.infra.params import NamePatterns
from api.queries.metrics import ALIAS, PUSHED, Selection, allocated, node_instants, scope_rows

GAP_PERIODS = 3
SILENT_PERIODS = 5
"""A node is silent when no reading came for more than this many of its sampling periods
(the median interval between its readings, counted in whole seconds)."""
ROLLUP_S = 60


@dataclass(frozen=True)
class Scales:
    """Per metric (same order): the registry's idle, peak, caution, alert, higher_is_worse."""

    metrics: list[str]
    idle: list[float | None]
    peak: list[float | None]
    caution: list[float | None]
    alert: list[float | None]
    higher_is_worse: list[bool]
    aggregation: list[str]
    """How a node's series of the metric combine at an instant (the registry's
    node_aggregation: sum, mean, max, min; "": the worst of them)."""

    def params(self) -> dict[str, Any]:
        return {
            "fp_metrics": self.metrics,
            "fp_idle": self.idle,
            "fp_peak": self.peak,
            "fp_caution": self.caution,
            "fp_alert": self.alert,
            "fp_higher": [int(h) for h in self.higher_is_worse],
            "fp_agg": self.aggregation,
        }


SCALE = """indexOf({fp_metrics:Array(String)}, metric_id) AS k,
    {fp_idle:Array(Nullable(Float64))}[k] AS idle, {fp_peak:Array(Nullable(Float64))}[k] AS peak,
    {fp_caution:Array(Nullable(Float64))}[k] AS caution,
    {fp_alert:Array(Nullable(Float64))}[k] AS alert, {fp_higher:Array(UInt8)}[k] AS higher,
    {fp_agg:Array(String)}[k] AS agg"""
COMBINE = (
    "multiIf(agg = 'sum', arraySum({xs}), agg = 'mean', arrayAvg({xs}), "
    "agg = 'min' OR (agg = '' AND higher = 0), arrayMin({xs}), arrayMax({xs}))"
)
"""SQL: the node's value at an instant of its series' values there (`xs`, an array)."""
ABOVE = "ifNull(if(higher = 1, {x} >= {level}, {x} <= {level}), 0)"
TENTH = "least(9, greatest(0, toInt32(floor(ifNotFinite(({x} - idle) / (peak - idle) * 10, -1)))))"
"""SQL: the tenth of the scale `{x}` is in (0 below idle, 9 above peak; not finite: 0)."""

# The footprint of a node and metric from `fp_pts`: its series' points (Unix us, value)
# sorted, combined at each instant by the metric's aggregation (one poll stamps all of a
# device's readings: a node's series share their instants), then each interval between two
# instants weighs its length (0 past `GAP_PERIODS` periods, the median interval: not
# bridged) and counts with the value at its start. One subquery per step, every array made
# once: ClickHouse's analyzer expands an alias where it is used, and lambdas nested over
# repeated formulas took it 0.7 s to analyse.
_POINT_STEPS = (
    f"""{SCALE}, arraySplit((p, s) -> p.1 != s, fp_pts,
        arraySlice(arrayPushFront(fp_pts.1, -1), 1, length(fp_pts))) AS fp_groups""",
    f"""arrayMap(g -> g[1].1, fp_groups) AS fp_t,
        arrayMap(g -> {COMBINE.format(xs="g.2")}, fp_groups) AS fp_v""",
    """arrayPopFront(arrayDifference(fp_t)) AS fp_dt, arrayPopBack(fp_v) AS fp_v0,
        if(empty(fp_v), 0, arrayAvg(fp_v)) AS fp_mean,
        if(empty(fp_v), 0, arrayReduce('quantileExact(0.95)', fp_v)) AS fp_p95""",
    "if(empty(fp_dt), 0, arrayReduce('medianExact', fp_dt)) AS fp_period",
    f"""arrayMap(d -> if(d <= {{gap_periods:UInt8}} * fp_period, d, 0), fp_dt) AS fp_w,
        arrayMap(x -> {TENTH.format(x="x")}, fp_v0) AS fp_tenth""",
    f"""arraySum(fp_w) / 1e6 AS fp_cov,
        arraySum(arrayMap((w, x) -> if({ABOVE.format(x="x", level="caution")}, w, 0),
            fp_w, fp_v0)) / 1e6 AS fp_caution,
        arraySum(arrayMap((w, x) -> if({ABOVE.format(x="x", level="alert")}, w, 0),
            fp_w, fp_v0)) / 1e6 AS fp_alert,
        if(idle IS NULL OR peak IS NULL, [], arrayMap(b -> arraySum(arrayMap((w, k) ->
            if(k = b, w, 0), fp_w, fp_tenth)) / 1e6, range(10))) AS fp_deciles""",
)


def with_points(source: str) -> str:
    """SQL: the rows of `source` (with `metric_id` and `fp_pts`) and their footprint's
    columns fp_mean, fp_p95 (of the combined values), fp_cov, fp_caution, fp_alert and
    fp_deciles (and SCALE's)."""
    for step in _POINT_STEPS:
        source = f"SELECT *, {step} FROM ({source})"
    return source


_POINTS_RAW = """
SELECT device_id AS node, metric_id,
    arraySort(groupArray((toUnixTimestamp64Micro(ts), value))) AS fp_pts
FROM ({rows}) WHERE device_id IN {nodes:Array(String)} AND NOT ({pushed})
GROUP BY node, metric_id
"""
_RAW = f"""
SELECT node, metric_id, fp_mean AS mean, fp_p95 AS p95, fp_cov AS covered_s,
    fp_caution AS above_caution_s, fp_alert AS above_alert_s, fp_deciles AS deciles
FROM ({with_points(_POINTS_RAW.replace("{pushed}", PUSHED))})
ORDER BY node, metric_id
"""

_SILENT_RAW = """
SELECT node, period, t[1] AS first, t[-1] AS last,
    arrayFilter(p -> p.2 - p.1 > {silent_periods:UInt8} * period,
        arrayZip(arrayPopBack(t), arrayPopFront(t))) AS gaps
FROM (
    SELECT device_id AS node, arraySort(groupUniqArray(toUnixTimestamp(ts))) AS t,
        greatest(1, if(length(t) < 2, 1, arrayReduce('medianExact',
            arrayPopFront(arrayDifference(t))))) AS period
    FROM ({rows}) WHERE device_id IN {nodes:Array(String)}
    GROUP BY node
)
ORDER BY node
"""

_ROLLUP_ROWS = f"""
SELECT if(device_id IN {{nodes:Array(String)}}, toString(device_id), labels['{ALIAS}']) AS node,
    device_id NOT IN {{nodes:Array(String)}} AS aliased, metric_id, bucket, sum / count AS v,
    labels AS lab
FROM metrics_1m FINAL
WHERE bucket BETWEEN toStartOfMinute({{start:DateTime64(6, 'UTC')}})
    AND {{end:DateTime64(6, 'UTC')}} AND count > 0
    AND (device_id IN {{nodes:Array(String)}} OR (device_id IN {{aliased:Array(String)}}
        AND labels['{ALIAS}'] IN {{nodes:Array(String)}})){{allocated}}
"""
"""A node's rows of the rollups: its own, and those of the devices measuring it; `{allocated}`:
the job's allocations' conditions (`_rollup`)."""
_ROLLUP_BUCKETS = f"SELECT DISTINCT node, metric_id, bucket FROM ({_ROLLUP_ROWS})"

# Per node, metric and bucket: the devices measuring the node summed (as Kwollect sums
# aliased readings at an instant), the node's own series combined as COMBINE says.
_ROLLUP = f"""
SELECT node, metric_id, avg(v) AS mean, quantileExact(0.95)(v) AS p95,
    count() * {ROLLUP_S} AS covered_s,
    countIf({ABOVE.format(x="v", level="caution")}) * {ROLLUP_S} AS above_caution_s,
    countIf({ABOVE.format(x="v", level="alert")}) * {ROLLUP_S} AS above_alert_s,
    if(any(idle) IS NULL OR any(peak) IS NULL, [],
        sumForEach(arrayMap(b -> if({TENTH.format(x="v")} = b, {ROLLUP_S}, 0), range(10))))
        AS deciles
FROM (
    SELECT node, metric_id, bucket, k, idle, peak, caution, alert, higher, agg,
        if(max(aliased), sum(v), {COMBINE.format(xs="groupArray(v)")}) AS v
    FROM (
        SELECT *, {SCALE} FROM ({_ROLLUP_ROWS})
        WHERE metric_id IN {{fp_metrics:Array(String)}} AND NOT ({PUSHED})
    )
    GROUP BY node, metric_id, bucket, k, idle, peak, caution, alert, higher, agg
)
GROUP BY node, metric_id ORDER BY node, metric_id
"""

_SILENT_ROLLUP = f"""
SELECT node, {ROLLUP_S} AS period, t[1] AS first, t[-1] + {ROLLUP_S} AS last,
    arrayMap(p -> (p.1 + {ROLLUP_S}, p.2), arrayFilter(p -> p.2 - p.1 > {ROLLUP_S},
        arrayZip(arrayPopBack(t), arrayPopFront(t)))) AS gaps
FROM (
    SELECT node, arraySort(groupUniqArray(toUnixTimestamp(bucket))) AS t
    FROM ({_ROLLUP_BUCKETS}) GROUP BY node
)
ORDER BY node
"""

_ROLLUP_FIRST = """
SELECT toUnixTimestamp(minOrNull(bucket)) FROM metrics_1m
WHERE device_id IN {nodes:Array(String)}
    AND bucket BETWEEN toStartOfMinute({start:DateTime64(6, 'UTC')}) AND {end:DateTime64(6, 'UTC')}
"""
_RAW_BEFORE = """
SELECT count() FROM (
    SELECT 1 FROM metrics
    WHERE device_id IN {nodes:Array(String)}
        AND timestamp BETWEEN {start:DateTime64(6, 'UTC')} AND {before:DateTime64(6, 'UTC')}
    LIMIT 1
)
"""


def _rollup(sql: str, selection: Selection, params: dict[str, Any]) -> str:
    """`sql` reading `_ROLLUP_ROWS` with the rows of GPUs and CPUs the job does not hold left
    out (the rollups keep a series' labels, so the raw rows' rule applies as is)."""
    held = "".join(f" AND {c}" for c in allocated(selection, params))
    return sql.replace("{allocated}", held)


def source(client: Client, selection: Selection) -> str:
    """`raw` while the scope's raw readings are kept; `rollup_1m` when the rollups hold a
    minute of the nodes' without raw readings up to its end (raw readings expired, at least
    at the job's start), or the only ones. Two lookups by the primary keys."""
    params = _params(selection)
    first = client.query(_ROLLUP_FIRST, parameters=params).first_row[0]
    if first is None:
        return "raw"
    end_of_first = datetime.fromtimestamp(first + ROLLUP_S, UTC).replace(tzinfo=None)
    before = min(selection.end, end_of_first - timedelta(microseconds=1))
    raw = client.query(_RAW_BEFORE, parameters={**params, "before": before}).first_row[0]
    return "raw" if raw else "rollup_1m"


def footprint_rows(
    client: Client, selection: Selection, scales: Scales, from_rollups: bool
) -> list[dict[str, Any]]:
    """Per node and metric of `scales`: mean, p95, covered_s, above_caution_s,
    above_alert_s, deciles (seconds in each tenth between idle and peak; [] without a
    scale)."""
    if not scales.metrics:
        return []
    params = {**_params(selection), **scales.params(), "gap_periods": GAP_PERIODS}
    if from_rollups:
        sql = _rollup(_ROLLUP, selection, params)
    else:
        narrowed = replace(selection, metrics=NamePatterns(exact=tuple(scales.metrics)))
        sql = _RAW.replace("{rows}", scope_rows(narrowed, params))
        params["nodes"] = list(selection.devices)
    return _rows(client, sql, params)


def silent_rows(client: Client, selection: Selection, from_rollups: bool) -> list[dict[str, Any]]:
    """Per node with readings: its period (s), first and last reading (Unix s) and the
    gaps `[from, to]` longer than SILENT_PERIODS periods between them."""
    params = {**_params(selection), "silent_periods": SILENT_PERIODS}
    if from_rollups:
        return _rows(client, _rollup(_SILENT_ROLLUP, selection, params), params)
    every = replace(selection, metrics=NamePatterns(), labels={})
    sql = _SILENT_RAW.replace("{rows}", node_instants(every, params))
    params["nodes"] = list(selection.devices)
    return _rows(client, sql, params)


def _params(selection: Selection) -> dict[str, Any]:
    return {
        "nodes": list(selection.devices),
        "aliased": list(selection.aliased),
        "start": selection.start,
        "end": selection.end,
    }


def _rows(client: Client, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        orjson.loads(line)
        for line in client.raw_query(sql, parameters=params, fmt="JSONEachRow").splitlines()
    ]
