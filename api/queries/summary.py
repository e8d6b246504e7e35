"""A job's summary: statistics per device and metric, energy per node and source.

One query returns a row per series (device, metric, labels) of the scope, with the points
of the node-level power series (`_watt`) integrated in ClickHouse; Python only adds up those
few rows.

Energy: the trapezoidal integral of power over time. The sampling period of a series is the
median interval between its readings; an interval longer than 3 periods is a gap, not
bridged. `covered_s` is the time the integral spans without gaps.
"""

from __future__ import annotations

from typing import Any

from clickhouse_connect.driver.client import Client

from api.queries.metrics import Selection, scope_rows
from api.schemas import EnergyTotal, Job, JobSummary, MetricSummary, NodeEnergy

GAP_PERIODS = 3
POWER_SUFFIX = "_watt"

_SERIES = """
SELECT device_id, metric_id, orig, mn, mx, sm, n, last_ts, last_value,
    arrayMap(p -> p.1, pts) AS t, arrayMap(p -> p.2, pts) AS v,
    arrayPopFront(arrayDifference(t)) AS dt,
    if(empty(dt), 0, arrayReduce('medianExact', dt)) AS period,
    arrayMap(d -> d <= {gap_periods:UInt8} * period, dt) AS bridged,
    arraySum(arrayMap((d, b, a, c) -> if(b, (a + c) / 2 * d, 0),
        dt, bridged, arrayPopBack(v), arrayPopFront(v))) / 1e6 AS joules,
    arraySum(arrayMap((d, b) -> if(b, d, 0), dt, bridged)) / 1e6 AS covered_s
FROM (
    SELECT device_id, metric_id, lab['_device_orig'] AS orig,
        min(value) AS mn, max(value) AS mx, sum(value) AS sm, count() AS n,
        max(ts) AS last_ts, argMax(value, ts) AS last_value,
        arraySort(p -> p.1, groupArrayIf((toUnixTimestamp64Micro(ts), value),
            endsWith(metric_id, {power_suffix:String}) AND has({devices:Array(String)}, device_id)))
            AS pts
    FROM ({rows})
    GROUP BY device_id, metric_id, sipHash64(lab), orig
)
"""


def summarise(client: Client, job: Job, selection: Selection | None) -> JobSummary:
    if selection is None:
        return JobSummary(
            job_id=job.job_id,
            start=job.start,
            end=job.end,
            duration_s=0.0,
            metrics=[],
            energy=[],
            energy_total=[],
        )
    params: dict[str, Any] = {"gap_periods": GAP_PERIODS, "power_suffix": POWER_SUFFIX}
    rows = scope_rows(selection, params)
    sql = _SERIES.replace("{rows}", rows)
    stats: dict[tuple[str, str], dict[str, Any]] = {}
    energy: dict[tuple[str, str], dict[str, Any]] = {}
    for r in client.query(sql, parameters=params).named_results():
        key = (r["device_id"], r["metric_id"])
        s = stats.setdefault(
            key,
            {
                "min": r["mn"],
                "max": r["mx"],
                "sum": 0.0,
                "count": 0,
                "last_ts": r["last_ts"],
                "last": r["last_value"],
            },
        )
        s["min"], s["max"] = min(s["min"], r["mn"]), max(s["max"], r["mx"])
        s["sum"] += r["sm"]
        s["count"] += r["n"]
        if r["last_ts"] > s["last_ts"]:
            s["last_ts"], s["last"] = r["last_ts"], r["last_value"]
        if r["t"]:  # a node-level power series
            e = energy.setdefault(
                key, {"joules": 0.0, "covered": r["covered_s"], "readings": 0, "sources": set()}
            )
            e["joules"] += r["joules"]
            e["covered"] = min(e["covered"], r["covered_s"])  # all sources present
            e["readings"] += r["n"]
            e["sources"].update((r["orig"] or r["device_id"]).split(","))
    totals: dict[str, tuple[float, set[str]]] = {}
    for (node, metric), e in energy.items():
        joules, nodes = totals.get(metric, (0.0, set()))
        totals[metric] = (joules + e["joules"], nodes | {node})
    return JobSummary(
        job_id=job.job_id,
        start=selection.start.isoformat(timespec="microseconds") + "+00:00",
        end=selection.end.isoformat(timespec="microseconds") + "+00:00",
        duration_s=(selection.end - selection.start).total_seconds(),
        metrics=[
            MetricSummary(
                device_id=d,
                metric_id=m,
                min=s["min"],
                max=s["max"],
                avg=s["sum"] / s["count"],
                last=s["last"],
                count=s["count"],
            )
            for (d, m), s in sorted(stats.items())
        ],
        energy=[
            NodeEnergy(
                node=n,
                metric_id=m,
                sources=sorted(e["sources"]),
                joules=e["joules"],
                covered_s=e["covered"],
                readings=e["readings"],
            )
            for (n, m), e in sorted(energy.items())
        ],
        energy_total=[
            EnergyTotal(metric_id=m, joules=j, nodes=len(nodes))
            for m, (j, nodes) in sorted(totals.items())
        ],
    )
