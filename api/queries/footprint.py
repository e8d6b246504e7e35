"""A job's footprint in SQL: per node and metric, the mean, p95, time covered, time above
the caution and alert levels, time in each tenth between idle and peak; per node, the
spans without any reading.

From raw readings while the job's are kept; from the 1-minute rollups (`metrics_1m`) once
raw readings have expired (the buckets' means stand for the readings: a minute is the
resolution). Every value is a bound parameter.

Raw: each series' interval between two readings counts with the value at its start, and
is not bridged past `GAP_PERIODS` sampling periods (the series' median interval), as the
summary's energy. A node's time above a level is the most of its series'.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from api.infra.params import NamePatterns
from api.queries.metrics import ALIAS, Selection, node_instants, scope_rows

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

    @classmethod
    def none(cls) -> Scales:
        return cls([], [], [], [], [], [])

    def params(self) -> dict[str, Any]:
        return {
            "fp_metrics": self.metrics,
            "fp_idle": self.idle,
            "fp_peak": self.peak,
            "fp_caution": self.caution,
            "fp_alert": self.alert,
            "fp_higher": [int(h) for h in self.higher_is_worse],
        }


SCALE = """indexOf({fp_metrics:Array(String)}, metric_id) AS k,
    {fp_idle:Array(Nullable(Float64))}[k] AS idle, {fp_peak:Array(Nullable(Float64))}[k] AS peak,
    {fp_caution:Array(Nullable(Float64))}[k] AS caution,
    {fp_alert:Array(Nullable(Float64))}[k] AS alert, {fp_higher:Array(UInt8)}[k] AS higher"""
ABOVE = "ifNull(if(higher = 1, {x} >= {level}, {x} <= {level}), 0)"
TENTH = "least(9, greatest(0, toInt32(floor(({x} - idle) / (peak - idle) * 10))))"
DECILES = (
    "if(idle IS NULL OR peak IS NULL, [], "
    "arrayMap(b -> arraySum(arrayMap((d, ok, x) -> if(ok AND {tenth} = b, d, 0), "
    "dt, bridged, v0)) / 1e6, range(10)))"
).format(tenth=TENTH.format(x="x"))

_RAW = f"""
SELECT node, metric_id, sum(sm) / sum(n) AS mean, quantileTDigestMerge(0.95)(q) AS p95,
    max(cov) AS covered_s, max(caution_s) AS above_caution_s, max(alert_s) AS above_alert_s,
    sumForEach(deciles) AS deciles
FROM (
    SELECT node, metric_id, sm, n, q,
        arrayMap(p -> p.1, pts) AS t, arrayPopBack(arrayMap(p -> p.2, pts)) AS v0,
        arrayPopFront(arrayDifference(t)) AS dt,
        if(empty(dt), 0, arrayReduce('medianExact', dt)) AS period,
        arrayMap(d -> d <= {{gap_periods:UInt8}} * period, dt) AS bridged,
        arraySum(arrayMap((d, ok) -> if(ok, d, 0), dt, bridged)) / 1e6 AS cov,
        arraySum(arrayMap((d, ok, x) -> if(ok AND {ABOVE.format(x="x", level="caution")}, d, 0),
            dt, bridged, v0)) / 1e6 AS caution_s,
        arraySum(arrayMap((d, ok, x) -> if(ok AND {ABOVE.format(x="x", level="alert")}, d, 0),
            dt, bridged, v0)) / 1e6 AS alert_s,
        {DECILES} AS deciles
    FROM (
        SELECT device_id AS node, metric_id, {SCALE},
            arraySort(p -> p.1, groupArray((toUnixTimestamp64Micro(ts), value))) AS pts,
            sum(value) AS sm, count() AS n, quantileTDigestState(0.95)(value) AS q
        FROM ({{rows}}) WHERE device_id IN {{nodes:Array(String)}}
        GROUP BY node, metric_id, series
    )
)
GROUP BY node, metric_id ORDER BY node, metric_id
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

# A node's rows of the rollups: its own, and those of the devices measuring it (summed per
# bucket, as Kwollect sums aliased readings at an instant; own series are averaged).
_ROLLUP_BUCKETS = f"""
SELECT node, metric_id, bucket, if(max(aliased), sum(v), avg(v)) AS v FROM (
    SELECT if(device_id IN {{nodes:Array(String)}}, toString(device_id),
            labels['{ALIAS}']) AS node,
        device_id NOT IN {{nodes:Array(String)}} AS aliased,
        metric_id, bucket, sum / count AS v
    FROM metrics_1m FINAL
    WHERE bucket BETWEEN toStartOfMinute({{start:DateTime64(6, 'UTC')}})
        AND {{end:DateTime64(6, 'UTC')}} AND count > 0
        AND (device_id IN {{nodes:Array(String)}} OR (device_id IN {{aliased:Array(String)}}
            AND labels['{ALIAS}'] IN {{nodes:Array(String)}}))
)
GROUP BY node, metric_id, bucket
"""

_ROLLUP = f"""
SELECT node, metric_id, avg(v) AS mean, quantileExact(0.95)(v) AS p95,
    count() * {ROLLUP_S} AS covered_s,
    countIf({ABOVE.format(x="v", level="caution")}) * {ROLLUP_S} AS above_caution_s,
    countIf({ABOVE.format(x="v", level="alert")}) * {ROLLUP_S} AS above_alert_s,
    if(any(idle) IS NULL OR any(peak) IS NULL, [],
        sumForEach(arrayMap(b -> if({TENTH.format(x="v")} = b, {ROLLUP_S}, 0), range(10))))
        AS deciles
FROM (SELECT *, {SCALE} FROM ({_ROLLUP_BUCKETS}) WHERE metric_id IN {{fp_metrics:Array(String)}})
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

_FIRST = """
SELECT (SELECT toUnixTimestamp(minOrNull(timestamp)) FROM metrics
        WHERE device_id IN {nodes:Array(String)}
        AND timestamp BETWEEN {start:DateTime64(6, 'UTC')} AND {end:DateTime64(6, 'UTC')}),
    (SELECT toUnixTimestamp(minOrNull(bucket)) FROM metrics_1m
        WHERE device_id IN {nodes:Array(String)}
        AND bucket BETWEEN toStartOfMinute({start:DateTime64(6, 'UTC')})
        AND {end:DateTime64(6, 'UTC')})
"""


_ROLLUP_FIRST = """
SELECT toUnixTimestamp(minOrNull(bucket)) FROM metrics_1m
WHERE device_id IN {nodes:Array(String)}
    AND bucket BETWEEN toStartOfMinute({start:DateTime64(6, 'UTC')}) AND {end:DateTime64(6, 'UTC')}
"""


def source(
    client: Client, selection: Selection, raw_first: int | None = None, raw_known: bool = False
) -> str:
    """`raw` while the scope's raw readings are kept; `rollup_1m` when the rollups hold
    readings of a minute before the first raw one (raw readings expired, at least at the
    job's start), or the only ones. `raw_known`: `raw_first` is the nodes' first raw reading
    (Unix s, None: none), read by the summary's scan: only the rollups are asked."""
    if raw_known:
        raw = raw_first
        rollup = client.query(_ROLLUP_FIRST, parameters=_params(selection)).first_row[0]
    else:
        raw, rollup = client.query(_FIRST, parameters=_params(selection)).first_row
    if rollup is not None and (raw is None or rollup < raw - raw % ROLLUP_S):
        return "rollup_1m"
    return "raw"


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
        sql = _ROLLUP
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
        return _rows(client, _SILENT_ROLLUP, params)
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


_METRIC_IDS = {
    False: "SELECT DISTINCT metric_id FROM ({rows}) WHERE device_id IN {nodes:Array(String)}",
    True: f"SELECT DISTINCT metric_id FROM ({_ROLLUP_BUCKETS})",
}


def metric_ids(client: Client, selection: Selection, from_rollups: bool) -> list[str]:
    """The metrics of the scope's nodes (when no summary lists them)."""
    params = _params(selection)
    sql = _METRIC_IDS[from_rollups]
    if not from_rollups:
        sql = sql.replace("{rows}", scope_rows(selection, params))
        params["nodes"] = list(selection.devices)
    return sorted(row[0] for row in client.query(sql, parameters=params).result_rows)
