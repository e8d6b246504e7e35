"""The readings query: a selection of devices, metrics, labels and time, as Kwollect answers
it (aliased devices summed under the node they measure), optionally as rates or aggregated
by step. Every value is a bound parameter; the SQL text depends only on which options are
used, never on their values.

Inner queries produce the columns `ts` (DateTime64), `device_id`, `metric_id`, `value` and
`lab` (labels); `projected` puts them in the columns of the format asked for
(api/formats.py). Readings rows also carry `series`, which tells series apart even where
`lab` does not (two outlets whose labels differ only by the alias, which is never shown).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import IO, Any

from clickhouse_connect.driver.client import Client

from api.infra.params import NamePatterns
from kafka.allocations import Allocated

ALIAS = "_device_alias"
SITE = "_site"
_SPAN = "{start:DateTime64(6, 'UTC')} AND {end:DateTime64(6, 'UTC')}"
_NO_ALIAS = f"mapFilter((k, v) -> k != '{ALIAS}', labels)"


def aliased_devices_query(devices: list[str], start: datetime, end: datetime) -> tuple[str, dict]:
    """The devices whose readings carry `_device_alias` = one of `devices` during the span
    (from `device_aliases`, kept by a view: no scan of readings)."""
    return (
        "SELECT DISTINCT device_id FROM device_aliases WHERE alias IN {devices:Array(String)} "
        "AND last_seen >= {start:DateTime64(6, 'UTC')} "
        "AND first_seen <= {end:DateTime64(6, 'UTC')} ORDER BY device_id",
        {"devices": devices, "start": start, "end": end},
    )


def aliased_devices(
    client: Client, devices: list[str], start: datetime, end: datetime
) -> tuple[str, ...]:
    sql, params = aliased_devices_query(devices, start, end)
    return tuple(row[0] for row in client.query(sql, parameters=params).result_rows)


def _aliased_rows(table: str) -> str:
    """Rows of `table` from devices that measure one of the selected devices. (Qualified:
    a query whose output renames the alias to `device_id` must not see it here.)"""
    return (
        f"({table}.device_id IN {{aliased:Array(String)}} "
        f"AND {table}.labels['{ALIAS}'] IN {{devices:Array(String)}})"
    )


def _summed_by_alias(rows: str) -> str:
    """Kwollect's node view of aliased readings: one row per instant, node and metric, the
    value summed over the devices (and their series: a PDU's two outlets feeding one node's
    two PSUs) measuring the node; labels those the summed readings share, without the
    alias, plus `_device_orig`, the devices summed. `rows`: ts, src (the measuring device),
    metric_id, value, labels."""
    return (
        "SELECT ts, device_id, metric_id, value, mapUpdate("
        "mapFilter((k, v) -> arrayAll(m -> m[k] = v, labs), labs[1]), "
        "map('_device_orig', arrayStringConcat(arraySort(origs), ','))) AS lab, "
        "sipHash64(arraySort(origs)) AS series FROM ("
        f"SELECT ts, labels['{ALIAS}'] AS device_id, metric_id, sum(value) AS value, "
        f"groupArray({_NO_ALIAS}) AS labs, groupUniqArray(src) AS origs FROM ({rows}) "
        "GROUP BY ts, device_id, metric_id)"
    )


@dataclass(frozen=True)
class Selection:
    """Readings of `devices` between `start` and `end` (inclusive, naive UTC).

    Besides a device's own readings, those labelled `_device_alias=<device>` come back under
    the device's id, summed over the devices sharing the alias at each instant, with the
    original devices in the label `_device_orig` (Kwollect's rule). `measured` (a job's scope)
    also returns those aliased readings under their own device id. `only` keeps the output
    rows of these device ids. `aliased`: the devices measuring `devices` during the span
    (`aliased_devices_query`; api/scope.py fills it in): without any, the query has no
    alias branch. `site`: only readings of that site (label `_site`, which a central
    jobscope gives every reading mirrored from a site) and readings without a site.
    `allocated`: a job's GPUs and CPUs per node (kafka/allocations.py): a reading labelled
    with another GPU or CPU of such a node is left out; None: no condition at all.
    """

    devices: tuple[str, ...]
    start: datetime
    end: datetime
    metrics: NamePatterns = field(default_factory=NamePatterns)
    labels: dict[str, str] = field(default_factory=dict)
    measured: bool = False
    only: tuple[str, ...] = ()
    aliased: tuple[str, ...] = ()
    site: str | None = None
    allocated: Allocated | None = None


# The node a row counts for (`{node}` below), its GPU and its CPU id as labelled.
_NODE_OF = f"if(mapContains(labels, '{ALIAS}'), labels['{ALIAS}'], {{device}})"
_GPU_HELD = (
    "(labels['gpu'] = '' AND labels['gpu_uuid'] = '' "
    "OR NOT has({{alloc_gpu_nodes:Array(String)}}, {node}) "
    "OR hasAny({{alloc_gpu_ids:Array(Array(String))}}"
    "[indexOf({{alloc_gpu_nodes:Array(String)}}, {node})], [labels['gpu'], labels['gpu_uuid']]))"
)
_CPU = "if(labels['cpu'] != '', labels['cpu'], labels['core'])"
_CPU_HELD = (
    f"(NOT match({_CPU}, '^[0-9]{{{{1,9}}}}$') "
    "OR NOT has({{alloc_cpu_nodes:Array(String)}}, {node}) "
    "OR has({{alloc_cpu_ids:Array(Array(UInt32))}}"
    f"[indexOf({{{{alloc_cpu_nodes:Array(String)}}}}, {{node}})], toUInt32OrZero({_CPU})))"
)


def allocated(s: Selection, params: dict[str, Any], device: str = "device_id") -> list[str]:
    """A row labelled with a GPU (`gpu`, `gpu_uuid`) or a CPU id (`cpu`, else `core`) of a
    node where the job holds some is kept only if the job holds that one (kafka/allocations.py
    applies the same rule in Python). `device`: SQL of the row's own device id."""
    a = s.allocated
    if a is None:
        return []
    node = _NODE_OF.format(device=device)
    where = []
    if a.gpus:
        params["alloc_gpu_nodes"] = [n for n, _ in a.gpus]
        params["alloc_gpu_ids"] = [list(ids) for _, ids in a.gpus]
        where.append(_GPU_HELD.format(node=node))
    if a.cpus:
        params["alloc_cpu_nodes"] = [n for n, _ in a.cpus]
        params["alloc_cpu_ids"] = [list(ids) for _, ids in a.cpus]
        where.append(_CPU_HELD.format(node=node))
    return where


def _filters(s: Selection, params: dict[str, Any], device: str = "device_id") -> list[str]:
    """Conditions on raw rows common to every branch: metrics, labels, site and allocations
    (`device`: SQL of the row's device id, qualified where an output column shadows it)."""
    where = []
    if s.metrics:
        params["metrics"] = list(s.metrics.exact)
        params["metric_globs"] = list(s.metrics.like)
        where.append(
            "(metric_id IN {metrics:Array(String)} "
            "OR arrayExists(p -> metric_id LIKE p, {metric_globs:Array(String)}))"
        )
    for i, (key, value) in enumerate(sorted(s.labels.items())):
        params[f"label_key_{i}"], params[f"label_value_{i}"] = key, value
        where.append(f"labels[{{label_key_{i}:String}}] = {{label_value_{i}:String}}")
    if s.site is not None:
        params["site"] = s.site
        where.append(f"labels['{SITE}'] IN ('', {{site:String}})")
    return where + allocated(s, params, device)


def _params(s: Selection) -> dict[str, Any]:
    return {"devices": list(s.devices), "aliased": list(s.aliased), "start": s.start, "end": s.end}


def _own_rows_condition(s: Selection, table: str = "metrics") -> str:
    """Rows of `table` returned under their own device id."""
    own = f"{table}.device_id IN {{devices:Array(String)}}"
    return f"({own} OR {_aliased_rows(table)})" if s.measured and s.aliased else own


def _reach(s: Selection, table: str) -> str:
    """Rows of `table` that any output row is made of."""
    own = f"{table}.device_id IN {{devices:Array(String)}}"
    return f"({own} OR {_aliased_rows(table)})" if s.aliased else own


PUSHED = "startsWith(lab['source'], 'user:') OR lab['_metric_origin'] = 'prom_kwollect_custom'"
"""SQL: a row of `scope_rows` users wrote (REST push or kwollect_custom); only jobscope
sets these labels. Such values are never mixed with measured ones."""


def known_metrics(s: Selection, params: dict[str, Any]) -> str:
    """SQL of the metric ids the selection's devices (and their aliased devices) ever had:
    a superset of the metrics its rows hold, from `metrics_latest` (a row per series) in
    milliseconds where the rows take a scan. `metrics_latest` is fed by the 1-minute
    rollups' refresh: a metric newer than the last refresh is not there yet."""
    params.update(_params(s))
    return (
        "SELECT DISTINCT metric_id FROM metrics_latest "
        "WHERE device_id IN {devices:Array(String)} OR device_id IN {aliased:Array(String)}"
    )


def _keep_only(s: Selection, rows: str, params: dict[str, Any]) -> str:
    """The output rows of the devices in `s.only`, if any were asked for."""
    if not s.only:
        return rows
    params["only"] = list(s.only)
    return f"SELECT * FROM ({rows}) WHERE device_id IN {{only:Array(String)}}"


def scope_rows(s: Selection, params: dict[str, Any]) -> str:
    """SQL of the selected readings, unordered: own rows, then alias sums (if any)."""
    params.update(_params(s))
    extra = "".join(f" AND {c}" for c in _filters(s, params))
    own = (
        f"SELECT timestamp AS ts, device_id, metric_id, value, "
        f"if(mapContains(labels, '{ALIAS}'), {_NO_ALIAS}, labels) AS lab, "
        "sipHash64(metrics.labels) AS series "
        f"FROM metrics WHERE metrics.timestamp BETWEEN {_SPAN} AND {_own_rows_condition(s)}{extra}"
    )
    rows = own
    if s.aliased:
        rows += " UNION ALL " + _summed_by_alias(
            "SELECT timestamp AS ts, device_id AS src, metric_id, value, labels FROM metrics "
            f"WHERE metrics.timestamp BETWEEN {_SPAN} AND {_aliased_rows('metrics')}{extra}"
        )
    return _keep_only(s, rows, params)


def _wraps(prev: str, bits: str) -> tuple[str, str]:
    """Conditions under which a decrease from `prev` is a wrap at 2^32, at 2^64."""
    return (
        f"{bits} IN (0, 32) AND {prev} >= 2147483648 AND {prev} < 4294967296",
        f"{bits} IN (0, 64) AND {prev} >= 9223372036854775808",
    )


def counter_increase(prev: str, cur: str, bits: str = "0") -> str:
    """SQL of a counter's increase from `prev` to `cur` (SQL expressions). Counters wrap at
    2^32 (SNMP Counter32) or 2^64; a decrease from the upper half of either range is a wrap,
    any other decrease a reset (the counter restarted from 0: the increase is `cur`).
    `bits`: SQL of the counter's width, 32 or 64 (only that wrap is possible), 0: unknown."""
    wrap32, wrap64 = _wraps(prev, bits)
    return (
        f"multiIf({cur} >= {prev}, {cur} - {prev}, "
        f"{wrap32}, 4294967296 - {prev} + {cur}, "
        f"{wrap64}, 18446744073709551616 - {prev} + {cur}, {cur})"
    )


def counter_reset(prev: str, cur: str, bits: str = "0") -> str:
    """SQL: whether going from `prev` to `cur` is a reset (see counter_increase)."""
    wrap32, wrap64 = _wraps(prev, bits)
    return f"({cur} < {prev} AND NOT ({wrap32}) AND NOT ({wrap64}))"


_RATE = (
    f"if(n = 1 OR ts = prev_ts, NULL, {counter_increase('prev_value', 'value')} "
    "/ (dateDiff('microsecond', prev_ts, ts) / 1e6))"
)


def as_rate(rows: str) -> str:
    """Per-second rate of each series (device, metric, labels) from its previous reading:
    null for the first reading of a series, as in Kwollect; correct across counter wraps
    and resets (see _RATE). The stored counter is untouched."""
    return (
        f"SELECT ts, device_id, metric_id, {_RATE} AS value, lab, series FROM ("
        "SELECT ts, device_id, metric_id, value, lab, series, "
        "lagInFrame(value) OVER w AS prev_value, lagInFrame(ts) OVER w AS prev_ts, "
        f"row_number() OVER w AS n FROM ({rows}) "
        "WINDOW w AS (PARTITION BY device_id, metric_id, series ORDER BY ts "
        "ROWS BETWEEN 1 PRECEDING AND CURRENT ROW))"
    )


# ---- aggregation by step -------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One partial aggregate: its column in a rollup, how raw readings make it, how parts
    of one bucket merge; `state`: an aggregate function state (-State, merged by -Merge)."""

    rollup: str
    raw: str
    merge: str
    state: bool = False

    def finished(self, column: str) -> str:
        """SQL of the value of the part `column` alone, with nothing to merge it with."""
        return f"finalizeAggregation({column})" if self.state else column


_PARTS = {
    "count": Part("count", "count()", "sum"),
    "sum": Part("sum", "sum(value)", "sum"),
    "min": Part("min", "min(value)", "min"),
    "max": Part("max", "max(value)", "max"),
    "first": Part("first", "argMinState(value, timestamp)", "argMinMerge", state=True),
    "last": Part("last", "argMaxState(value, timestamp)", "argMaxMerge", state=True),
    "quantiles": Part(
        "quantiles",
        "quantilesTDigestState(0.5, 0.95)(value)",
        "quantilesTDigestMerge(0.5, 0.95)",
        state=True,
    ),
}
# agg -> (parts it needs, value from the merged parts p_<name>)
AGGS: dict[str, tuple[tuple[str, ...], str]] = {
    "avg": (("sum", "count"), "p_sum / p_count"),
    "sum": (("sum",), "p_sum"),
    "count": (("count",), "toFloat64(p_count)"),
    "min": (("min",), "p_min"),
    "max": (("max",), "p_max"),
    "first": (("first",), "p_first"),
    "last": (("last",), "p_last"),
    "median": (("quantiles",), "p_quantiles[1]"),
    "p95": (("quantiles",), "p_quantiles[2]"),
    # Kwollect's summary: the largest value of a counter (`_total`), the mean of the rest.
    "kwollect": (
        ("sum", "count", "max"),
        "if(endsWith(metric_id, '_total'), p_max, p_sum / p_count)",
    ),
}
ROLLUPS = ((3600, "metrics_1h"), (60, "metrics_1m"))
# Per rollup: the view of the (device_id, bucket) it does not hold whole yet (refreshed after
# their minute or hour: clickhouse/migrations/0022), and the function rounding a time down
# to its bucket. Those buckets are read from raw readings.
_PENDING = {
    "metrics_1h": ("rollup_pending_1h", "toStartOfHour"),
    "metrics_1m": ("rollup_pending_1m", "toStartOfMinute"),
}
_BUCKET = "toStartOfInterval({time}, toIntervalSecond({{step:UInt32}}))"


def rollup_for(step_s: int) -> tuple[int, str] | None:
    """The coarsest rollup whose buckets tile buckets of `step_s` seconds."""
    for width, table in ROLLUPS:
        if step_s % width == 0:
            return width, table
    return None


def _full_buckets(start: datetime, end: datetime, width: int) -> tuple[datetime, datetime]:
    """[from, to): the rollup buckets lying wholly inside [start, end] (empty if from >= to)."""
    epoch, bucket = datetime(1970, 1, 1), timedelta(seconds=width)
    first = epoch - ((epoch - start) // bucket) * bucket  # start rounded up
    last = epoch + ((end + timedelta(microseconds=1) - epoch) // bucket) * bucket
    return first, max(first, last)


def _stepped_states(
    s: Selection,
    step_s: int,
    parts: tuple[str, ...],
    params: dict[str, Any],
    lab: str = "labels",
    pending: bool = True,
) -> str:
    """SQL of the partial aggregates `parts` per series and bucket (`t`, `device_id`,
    `metric_id`, `labels_hash`, `lab`: the SQL `lab` of the series' labels, `p_<part>`),
    several rows per bucket to merge: whole rollup buckets inside the span from the rollup,
    the span's ragged ends, and steps no rollup tiles, from raw readings. Each rollup bucket
    and series comes from one source, in one row (the rollup read FINAL): at a step of the
    rollup's width, one row per bucket and series. `pending`: also the buckets the rollup
    does not hold whole yet from raw readings (False: the caller knows there are none)."""
    params.update(_params(s))
    params["step"] = step_s
    extra = "".join(f" AND {c}" for c in _filters(s, params))
    series = "device_id, metric_id, labels_hash"
    raw_cols = ", ".join(f"{_PARTS[p].raw} AS p_{p}" for p in parts)

    def raw_states(span: str = f"metrics.timestamp BETWEEN {_SPAN}") -> str:
        return (
            f"SELECT {_BUCKET.format(time='metrics.timestamp')} AS t, device_id, metric_id, "
            f"sipHash64(metrics.labels) AS labels_hash, any({lab}) AS lab, {raw_cols} "
            f"FROM metrics WHERE {span} AND {_reach(s, 'metrics')}{extra} GROUP BY t, {series}"
        )

    rollup = rollup_for(step_s)
    if rollup is None:
        return raw_states()
    width, table = rollup
    params["full_from"], params["full_to"] = _full_buckets(s.start, s.end, width)
    rollup_cols = ", ".join(f"{_PARTS[p].rollup} AS p_{p}" for p in parts)
    view, bucket_of = _PENDING[table]
    held = (
        f"(SELECT device_id, bucket FROM {view} WHERE device_id IN {{devices:Array(String)}} "
        "OR device_id IN {aliased:Array(String)})"
    )
    return (
        f"SELECT bucket AS t, {series}, {lab} AS lab, {rollup_cols} FROM {table} FINAL "
        "WHERE bucket >= {full_from:DateTime64(6, 'UTC')} "
        f"AND bucket < {{full_to:DateTime64(6, 'UTC')}} AND {_reach(s, table)}{extra} "
        + (f"AND (device_id, bucket) NOT IN {held} " if pending else "")
        + "UNION ALL "
        # the ragged ends, as two ranges the primary key can find, and the buckets the
        # rollup does not hold whole yet
        + raw_states(
            f"metrics.timestamp BETWEEN {_SPAN} "
            "AND (metrics.timestamp < {full_from:DateTime64(6, 'UTC')} "
            "OR metrics.timestamp >= {full_to:DateTime64(6, 'UTC')}"
            + (f" OR (device_id, {bucket_of}(metrics.timestamp)) IN {held})" if pending else ")")
        )
    )


def _by_time(rows: str) -> str:
    """`rows` sorted by `ts` alone. A GROUP BY of 100,000 keys or more hands on its rows
    in 256 blocks of its hash buckets; sorting those by time, device and metric merges 256
    runs row by row (~0.2 s of CPU for 10^5 rows). Sorted by the single number `ts` first
    (a cheap merge), the final ORDER BY only orders the rows within each `ts` (ClickHouse's
    FinishSorting). The LIMIT (every row) keeps this inner sort from being removed as
    redundant beside the outer one."""
    return f"SELECT * FROM ({rows}) ORDER BY ts LIMIT 18446744073709551615"


def stepped_rows(s: Selection, step_s: int, agg: str, params: dict[str, Any]) -> str:
    """One row per series and bucket of `step_s` seconds (aligned on the Unix epoch), the
    bucket's start as its time, sorted by time (`_by_time`). Whole rollup buckets inside the
    span come from the rollup; the span's ragged ends, and steps no rollup tiles, from raw
    readings. A node's aliased devices are summed bucket by bucket (the sum of their
    aggregates)."""
    parts, final = AGGS[agg]
    states = _stepped_states(s, step_s, parts, params)
    ts = f"toDateTime64({_BUCKET.format(time='t')}, 6, 'UTC') AS ts"
    if (rollup := rollup_for(step_s)) and rollup[0] == step_s:
        # a row per bucket and series already (_stepped_states): no GROUP BY to merge them
        # (for 10^5 rows from the rollup, ~2/3 of the server time left after `_by_time`)
        finished = ", ".join(f"{_PARTS[p].finished(f'st.p_{p}')} AS p_{p}" for p in parts)
        merged = f"SELECT {ts}, device_id, metric_id, lab AS labels, {finished} FROM ({states}) st"
    else:
        merged_cols = ", ".join(f"{_PARTS[p].merge}(p_{p}) AS p_{p}" for p in parts)
        merged = (
            f"SELECT {ts}, device_id, metric_id, labels_hash, any(lab) AS labels, {merged_cols} "
            f"FROM ({states}) GROUP BY ts, device_id, metric_id, labels_hash"
        )
    buckets = f"SELECT ts, device_id, metric_id, labels, {final} AS value FROM ({merged})"
    rows = (
        f"SELECT ts, device_id, metric_id, value, {_NO_ALIAS} AS lab, "
        f"sipHash64(b.labels) AS series FROM ({buckets}) AS b "
        f"WHERE {_own_rows_condition(s, 'b')}"
    )
    if s.aliased:
        rows += " UNION ALL " + _summed_by_alias(
            f"SELECT ts, device_id AS src, metric_id, value, labels FROM ({buckets}) AS b "
            f"WHERE b.labels['{ALIAS}'] IN {{devices:Array(String)}}",
        )
    return _by_time(_keep_only(s, rows, params))


def pending_in_span(s: Selection, step_s: int, params: dict[str, Any]) -> str | None:
    """SQL of whether the rollup serving buckets of `step_s` lacks a whole bucket of the
    selection's devices (or of those measuring them) inside its span: 1 or 0, from the small
    view of pending buckets. None when no rollup serves the step."""
    rollup = rollup_for(step_s)
    if rollup is None:
        return None
    width, table = rollup
    params.update(_params(s))
    params["full_from"], params["full_to"] = _full_buckets(s.start, s.end, width)
    return (
        f"SELECT count() > 0 FROM (SELECT 1 FROM {_PENDING[table][0]} "
        "WHERE (device_id IN {devices:Array(String)} OR device_id IN {aliased:Array(String)}) "
        "AND bucket >= {full_from:DateTime64(6, 'UTC')} "
        "AND bucket < {full_to:DateTime64(6, 'UTC')} LIMIT 1)"
    )


def stepped_node_values(
    s: Selection, step_s: int, aggs: dict[str, str], params: dict[str, Any], pending: bool = True
) -> str:
    """SQL of every series' value per bucket as `stepped_rows` computes it, by the selected
    device it counts for (the node view: `measured` and `only` do not apply): `ts`, `node`
    (the series' own device, or the one its `_device_alias` names), `metric_id`, `aliased`
    (summed under the node, as `stepped_rows` sums them), `value`. `aggs`: the aggregate of
    AGGS by metric id (the selection's metrics), so that one pass over the rollup serves
    metrics aggregated differently. `pending`: as for `_stepped_states` (False only when
    `pending_in_span` found none)."""
    by_agg: dict[str, list[str]] = {}
    for metric, agg in sorted(aggs.items()):
        by_agg.setdefault(agg, []).append(metric)
    needed = {p for agg in by_agg for p in AGGS[agg][0]}
    parts = tuple(p for p in _PARTS if p in needed)
    *chosen, otherwise = sorted(by_agg)
    choices = []
    for i, agg in enumerate(chosen):
        params[f"agg_metrics_{i}"] = by_agg[agg]
        choices += [f"metric_id IN {{agg_metrics_{i}:Array(String)}}", AGGS[agg][1]]
    final = AGGS[otherwise][1]
    if choices:
        final = f"multiIf({', '.join(choices)}, {final})"
    states = _stepped_states(s, step_s, parts, params, lab=f"labels['{ALIAS}']", pending=pending)
    merged_cols = ", ".join(f"{_PARTS[p].merge}(p_{p}) AS p_{p}" for p in parts)
    buckets = (
        f"SELECT toDateTime64({_BUCKET.format(time='t')}, 6, 'UTC') AS ts, "
        f"device_id, metric_id, labels_hash, any(lab) AS alias, {merged_cols} "
        f"FROM ({states}) GROUP BY ts, device_id, metric_id, labels_hash"
    )
    own = "if(device_id IN {devices:Array(String)}, [(toString(device_id), false)], [])"
    summed = "if(alias IN {devices:Array(String)}, [(alias, true)], [])"
    return (
        f"SELECT ts, target.1 AS node, metric_id, target.2 AS aliased, {final} AS value "
        f"FROM ({buckets}) ARRAY JOIN arrayConcat({own}, {summed}) AS target"
    )


def holds_more(client: Client, rows: str, params: dict[str, Any], most: int) -> bool:
    """Whether `rows` holds more than `most` readings (counting stops past it)."""
    counted = client.command(
        f"SELECT count() FROM (SELECT 1 FROM ({rows}) LIMIT {{most_readings:UInt64}})",
        parameters={**params, "most_readings": most + 1},
    )
    return int(counted) > most  # type: ignore[arg-type]


def projected(rows: str, timestamp: str, labels: str) -> str:
    """The final query: the rows' columns as a format carries them (its `timestamp` and
    `labels` expressions, api/formats.py), oldest first."""
    return (
        f"SELECT {timestamp} AS timestamp, device_id, metric_id, value, {labels} AS labels "
        f"FROM ({rows}) ORDER BY ts, device_id, metric_id"
    )


def readings_stream(
    client: Client,
    rows: str,
    params: dict[str, Any],
    timestamp: str,
    labels: str,
    clickhouse_format: str,
) -> IO[bytes]:
    """The readings of `rows`, `projected`, as ClickHouse writes them in `clickhouse_format`,
    read as they come; closing it cancels the query."""
    sql = projected(rows, timestamp, labels)
    return client.raw_stream(sql, parameters=params, fmt=clickhouse_format)  # type: ignore[return-value]


def node_instants(s: Selection, params: dict[str, Any]) -> str:
    """SQL of the instants (`device_id`, `ts`) of the rows `scope_rows` gives the selected
    devices, without summing aliased readings (which keeps their instants): a device's own
    readings, and those of the devices measuring it under its id. Cheaper than the rows when
    only their times matter."""
    params.update(_params(s))
    extra = "".join(f" AND {c}" for c in _filters(s, params, "metrics.device_id"))
    own = "if(metrics.device_id IN {devices:Array(String)}, [toString(metrics.device_id)], [])"
    aliased = f"if({_aliased_rows('metrics')}, [metrics.labels['{ALIAS}']], [])"
    devices = f"arrayConcat({own}, {aliased})" if s.aliased else own
    rows = (
        f"SELECT arrayJoin({devices}) AS device_id, timestamp AS ts FROM metrics "
        f"WHERE metrics.timestamp BETWEEN {_SPAN} AND {_reach(s, 'metrics')}{extra}"
    )
    return _keep_only(s, rows, params)
