"""A job's summary: statistics per device and metric, energy per node and source.

Two queries: the metric ids the scope's devices ever had (`metrics_latest`, milliseconds),
looked up in the metric registry; then one query in ClickHouse (again, with the kinds of the
metrics it found, should one be too new to be known and a power series or a counter):
statistics of each series (device, metric, labels) of the scope, the points of the
node-level power series (registry unit W) integrated, the points of counters turned into
increases (wraps and resets as `as_rate` reads them: the same SQL, api/queries/metrics.py's
counter_increase), then all per device and metric (a node and metric is one energy
source). api/summary.py shapes the rows; api/sharing.py attributes a shared node's energy
(under the `gpus` policy with one more scan: all the node's GPUs, whichever job holds them,
`all_gpus_energy`). The footprint is read beside it
(api/footprint.py): one query holding both took ClickHouse's analyzer longer than both.

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

from dataclasses import replace
from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from api import sharing as attribution
from api import summary as shaping
from api.infra.params import NamePatterns, iso
from api.queries import footprint as fq
from api.queries.metrics import (
    PUSHED,
    Selection,
    counter_increase,
    counter_reset,
    known_metrics,
    scope_rows,
)
from api.registry import registry
from api.schemas import Job

# Per series: statistics, for node-level power series their points integrated, for counters
# their increases; then per device, metric and pushed-or-measured. A node's sum of aliased
# readings is one series per set of devices summed (a reading missing at an instant must
# not start a series of its own). Power series and counters are taken alone; other series
# only add up statistics.
_SUMMARY = """
SELECT device_id, metric_id, pushed, min(mn) AS min, sum(sm) / sum(n) AS avg,
    max(mx) AS max, argMax(last_value, last_ts) AS last, toUInt32(sum(n)) AS count,
    max(is_power) AS power, sumIf(j, is_power) AS joules,
    minIf(cov, is_power) AS covered_s, toUInt32(sumIf(n, is_power)) AS power_readings,
    arraySort(arrayDistinct(arrayFlatten(groupArrayIf(srcs, is_power OR is_counter))))
        AS sources,
    sumIf(inc, is_counter) AS delta,
    sumIf(if(span > 0, inc / span, 0), is_counter) AS rate,
    toUInt32(sumIf(rs, is_counter)) AS resets, minIf(span, is_counter) AS counter_covered_s,
    max(q95) AS p95
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
        if(is_power, arrayReduce('quantileExact(0.95)', v), q_rows) AS q95
    FROM (
        SELECT device_id, metric_id, ({pushed}) AS pushed,
            any(lab['_device_orig']) AS orig, min(value) AS mn, max(value) AS mx,
            sum(value) AS sm, count() AS n, max(ts) AS last_ts,
            argMax(value, ts) AS last_value,
            metric_id IN {counters:Array(String)} AS is_counter,
            metric_id IN {power:Array(String)} AND device_id IN {devices:Array(String)}
                AS power_series,
            power_series OR is_counter AS points,
            arraySort(groupArrayIf(toUnixTimestamp64Micro(ts), points)) AS t,
            arraySort((x, y) -> y, groupArrayIf(value, points),
                groupArrayIf(toUnixTimestamp64Micro(ts), points)) AS v,
            quantileExactIf(0.95)(value, NOT is_counter AND NOT power_series) AS q_rows
        FROM ({rows})
        GROUP BY device_id, metric_id, pushed,
            if(metric_id IN {power:Array(String)} OR metric_id IN {counters:Array(String)},
                series, 0)
    )
)
GROUP BY device_id, metric_id, pushed
ORDER BY device_id, metric_id, pushed
"""

for _name, _sql in (
    ("{increase}", counter_increase("a", "c", "bits")),
    ("{reset}", counter_reset("a", "c", "bits")),
):
    _SUMMARY = _SUMMARY.replace(_name, _sql)


def known_metric_ids(client: Client, selection: Selection) -> list[str]:
    params: dict[str, Any] = {}
    sql = known_metrics(selection, params)
    return [row[0] for row in client.query(sql, parameters=params).result_rows]


def statistics(client: Client, selection: Selection, kinds: shaping.Kinds) -> list[dict[str, Any]]:
    """One row per device, metric and pushed-or-measured (the columns of _SUMMARY)."""
    params: dict[str, Any] = {
        "gap_periods": fq.GAP_PERIODS,
        "power": kinds.power,
        "counters": kinds.counters,
        "counter_bits": [kinds.counter_bits[m] for m in kinds.counters],
    }
    sql = _SUMMARY.replace("{pushed}", PUSHED).replace("{rows}", scope_rows(selection, params))
    rows = []
    # JSON from ClickHouse, parsed by orjson: 10x cheaper than typed rows for 10^4 series.
    for line in client.raw_query(sql, parameters=params, fmt="JSONEachRow").splitlines():
        row = orjson.loads(line)
        row["pushed"] = bool(row["pushed"])
        rows.append(row)
    return rows


def all_gpus_energy(
    client: Client,
    selection: Selection,
    nodes: list[str],
    metrics: list[str],
) -> dict[tuple[str, str], float]:
    """(node, metric) -> joules of every GPU of `nodes` over the selection, whichever job
    holds them: the scan of `statistics` without the allocation condition, for GPU metrics
    only (the `gpus` sharing policy's "node's remaining energy")."""
    reg = registry()
    whole = replace(
        selection, allocated=None, metrics=NamePatterns(tuple(metrics)), only=tuple(nodes)
    )
    found: dict[tuple[str, str], float] = {}
    for row in statistics(client, whole, shaping.kinds(metrics, reg)):
        energy = shaping.energy_row(row, reg.lookup(row["metric_id"]), set(nodes))
        if energy is not None and not energy["pushed"]:
            found[(energy["node"], energy["metric_id"])] = energy["joules"]
    return found


def summarise(
    client: Client,
    job: Job,
    selection: Selection | None,
    known: list[str] | None = None,
    sharing: attribution.Sharing = attribution.EXCLUSIVE,
) -> dict[str, Any]:
    """The summary from raw readings as JSON-ready data (see JobSummary), built from one row
    per device and metric without a model object per row. `known`: the scope's metric ids
    as `known_metric_ids` gives them, when the caller has them already. `sharing`: how a
    shared node's energy is the job's (api/sharing.py)."""
    summary = shaping.empty(job.job_id, job.start, job.end)
    if selection is None:
        return summary
    summary.update(
        start=iso(selection.start),
        end=iso(selection.end),
        duration_s=(selection.end - selection.start).total_seconds(),
    )
    reg = registry()
    known = known_metric_ids(client, selection) if known is None else known
    rows = statistics(client, selection, shaping.kinds(known, reg))
    found = sorted({row["metric_id"] for row in rows})
    new = shaping.kinds(sorted(set(found) - set(known)), reg)
    if new.power or new.counters:
        # A metric too new to be known yet is a power series or a counter: its rows must be
        # taken as such (rare: within a minute of its first reading).
        rows = statistics(client, selection, shaping.kinds(found, reg))
    nodes = list(selection.only or selection.devices)
    shaping.shape(rows, summary, nodes, reg)
    allocations = {n: a.model_dump(exclude_none=True) for n, a in job.allocations.items()}
    shared = [n for n in attribution.shared_nodes(sharing, allocations) if n in nodes]
    gpu_metrics = [m for m in found if reg.lookup(m).energy_role == "gpu"]
    all_gpus = (
        all_gpus_energy(client, selection, shared, gpu_metrics)
        if sharing.policy == "gpus" and shared and gpu_metrics
        else {}
    )
    attribution.attribute(summary, sharing, allocations, all_gpus)
    return summary
