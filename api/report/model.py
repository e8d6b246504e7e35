"""What a job report shows, gathered once and rendered by html.py, markdown.py and pdf.py (and
served as it is for `format=json`): the job, its summary (the summary route's own), the job's
energy figure, and plots of power per node and source and of the registry's key metrics.

Plots come from the stepped readings path with a step giving at most `MAX_POINTS` points per
series (a 24 h job: 5-minute steps, read from the 1-minute rollups). A job of more than
`MAX_NODE_LINES` nodes is drawn as min, mean and max over its nodes, not a line per node.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from api import records
from api.infra.config import ApiSettings
from api.infra.params import to_time
from api.queries.metrics import Selection
from api.queries.report import node_series
from api.registry import Kind, Registry, registry
from api.schemas import Job
from api.scope import EVERYTHING, job_selection, with_aliases

MAX_POINTS = 400
STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)
MAX_NODE_LINES = 12
"""Up to this many nodes a plot has a line per node; above, min/mean/max over the nodes."""
VERSION = 1


def step_for(duration_s: float) -> int:
    """The finest step of STEPS_S giving at most MAX_POINTS buckets over the job."""
    for step in STEPS_S:
        if duration_s / step <= MAX_POINTS:
            return step
    return 86400


def build(client: Client, settings: ApiSettings, job: Job) -> dict[str, Any]:
    """The report of `job` (visible to the caller: the route checked) as JSON-ready data; its
    summary is the summary route's whole one (an ended job's record, also past raw retention)."""
    reg = registry()
    selection = with_aliases(client, job_selection(job, EVERYTHING))
    summary = records.served(client, settings, job, EVERYTHING, selection)
    step = step_for(summary.get("duration_s") or 0.0)
    report: dict[str, Any] = {
        "version": VERSION,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "job": job.model_dump(),
        "summary": summary,
        "energy": job_energy(summary, reg),
        "metrics": metric_table(summary, reg),
        "step_s": step,
        "plots": [],
    }
    if selection is not None:
        report["plots"] = _plots(client, selection, summary, reg, step)
    return report


def job_energy(summary: dict[str, Any], reg: Registry) -> dict[str, Any] | None:
    """The job's energy: the summary's `energy_job` when it has one, else the measured total
    of the source the site's priority prefers (`energy_total`)."""
    chosen = summary.get("energy_job")
    if chosen and chosen.get("joules") is not None:
        return {
            "joules": chosen["joules"],
            "role": chosen.get("role"),
            "coverage": chosen.get("coverage"),
            "metric_id": None,
            "nodes": chosen.get("nodes"),
        }
    totals = [t for t in summary.get("energy_total", []) if not t.get("pushed")]
    if not totals:
        return None
    priority = {role: i for i, role in enumerate(reg.energy_priority)}

    def rank(total: dict[str, Any]) -> tuple[int, str]:
        role = reg.lookup(total["metric_id"]).energy_role
        return priority.get(role, len(priority)) if role else len(priority), total["metric_id"]

    best = min(totals, key=rank)
    return {
        "joules": best["joules"],
        "role": reg.lookup(best["metric_id"]).energy_role,
        "coverage": _coverage(summary, best["metric_id"]),
        "metric_id": best["metric_id"],
        "nodes": best.get("nodes"),
    }


def _coverage(summary: dict[str, Any], metric_id: str) -> float | None:
    """The least share of the job a node's integral of `metric_id` covers."""
    duration = summary.get("duration_s") or 0.0
    covered = [
        e["covered_s"]
        for e in summary.get("energy", [])
        if e["metric_id"] == metric_id and not e.get("pushed")
    ]
    return min(covered) / duration if covered and duration > 0 else None


def metric_table(summary: dict[str, Any], reg: Registry) -> list[dict[str, Any]]:
    """Per metric, over the job's devices: min, mean, max, devices, readings and unit, and a
    counter's increase and mean rate summed over them (a job of 100 nodes x 100 metrics: 100
    rows, not 10,000)."""
    rows: dict[tuple[str, bool], dict[str, Any]] = {}
    for m in summary.get("metrics", []):
        key = (m["metric_id"], bool(m.get("pushed")))
        row = rows.get(key)
        if row is None:
            info = reg.lookup(m["metric_id"])
            row = rows[key] = {
                "metric_id": m["metric_id"],
                "unit": m.get("unit") or info.unit,
                "kind": str(m.get("kind") or info.kind),
                "min": m["min"],
                "avg_sum": 0.0,
                "max": m["max"],
                "devices": 0,
                "count": 0,
                "delta": None,
                "rate": None,
                "pushed": key[1],
            }
        row["min"] = min(row["min"], m["min"])
        row["max"] = max(row["max"], m["max"])
        row["avg_sum"] += m["avg"] * m["count"]
        row["devices"] += 1
        row["count"] += m["count"]
        for counted in ("delta", "rate"):
            if m.get(counted) is not None:
                row[counted] = (row[counted] or 0.0) + m[counted]
    out = []
    for row in sorted(rows.values(), key=lambda r: (r["pushed"], r["metric_id"])):
        row["avg"] = row.pop("avg_sum") / row["count"] if row["count"] else None
        out.append(row)
    return out


def _plots(
    client: Client, selection: Selection, summary: dict[str, Any], reg: Registry, step: int
) -> list[dict[str, Any]]:
    power = sorted(
        {
            e["metric_id"]
            for e in summary.get("energy", [])
            if not e.get("pushed") and reg.lookup(e["metric_id"]).unit == "W"
        }
    )
    present = {m["metric_id"] for m in summary.get("metrics", []) if not m.get("pushed")}
    key = sorted(m for m in present - set(power) if reg.lookup(m).key)
    counters = [m for m in key if reg.lookup(m).kind != Kind.GAUGE]
    gauges = [m for m in key if m not in counters]
    aggs = {m: "avg" for m in power + gauges} | {m: "last" for m in counters}
    rows = [
        _as_rate(r, step) if r["metric_id"] in counters else r
        for r in node_series(client, selection, aggs, step)
    ]
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        info = reg.lookup(row["metric_id"])
        values = row["sum"] if info.node_aggregation == "sum" else row["avg"]
        by_metric.setdefault(row["metric_id"], []).append(
            {"node": row["device_id"], "t": [t / 1000 for t in row["t"]], "v": values}
        )
    start = to_time(summary["start"]).replace(tzinfo=UTC).timestamp()
    end = to_time(summary["end"]).replace(tzinfo=UTC).timestamp()
    plots = []
    if len(power) > 1 or (power and len(by_metric.get(power[0], [])) > 1):
        plots.append(_job_power(power, by_metric, start, end, step))
    for metric in power + key:
        nodes = by_metric.get(metric, [])
        if not nodes:
            continue
        info = reg.lookup(metric)
        rate = metric in counters
        plots.append(
            {
                "id": f"{'power' if metric in power else 'key'}-{metric}",
                "title": f"{metric}{' (rate)' if rate else ''}",
                "metric_id": metric,
                "unit": f"{info.unit}/s" if rate else info.unit,
                "kind": "power" if metric in power else "key",
                "start": start,
                "end": end,
                "step_s": step,
                "series": _lines(nodes),
            }
        )
    return plots


def _job_power(
    power: list[str],
    by_metric: dict[str, list[dict[str, Any]]],
    start: float,
    end: float,
    step: int,
) -> dict[str, Any]:
    """The job's power per source: the sum over its nodes at each step."""
    series = []
    for metric in power:
        total: dict[float, float] = {}
        for node in by_metric.get(metric, []):
            for t, v in zip(node["t"], node["v"], strict=True):
                total[t] = total.get(t, 0.0) + v
        times = sorted(total)
        series.append({"name": metric, "t": times, "v": [total[t] for t in times]})
    return {
        "id": "job-power",
        "title": "job power per source (sum over its nodes)",
        "metric_id": None,
        "unit": "W",
        "kind": "job_power",
        "start": start,
        "end": end,
        "step_s": step,
        "series": series,
    }


def _lines(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A line per node, or min/mean/max over the nodes at each step when there are many."""
    if len(nodes) <= MAX_NODE_LINES:
        return [{"name": n["node"], "t": n["t"], "v": n["v"]} for n in nodes]
    at: dict[float, list[float]] = {}
    for node in nodes:
        for t, v in zip(node["t"], node["v"], strict=True):
            at.setdefault(t, []).append(v)
    times = sorted(at)
    count = len(nodes)
    return [
        {"name": f"max over {count} nodes", "t": times, "v": [max(at[t]) for t in times]},
        {
            "name": f"mean over {count} nodes",
            "t": times,
            "v": [sum(at[t]) / len(at[t]) for t in times],
        },
        {"name": f"min over {count} nodes", "t": times, "v": [min(at[t]) for t in times]},
    ]


def _as_rate(row: dict[str, Any], step: int) -> dict[str, Any]:
    """A counter's last value per bucket as a per-second rate between buckets; a decrease is
    a reset (the new value counted from 0). The first bucket has no rate."""
    t = row["t"]

    def rates(values: list[float]) -> list[float]:
        return [
            ((b - a) if b >= a else b) / (((t1 - t0) / 1000) or step)
            for t0, t1, a, b in zip(t, t[1:], values, values[1:], strict=False)
        ]

    return {**row, "t": t[1:], "sum": rates(row["sum"]), "avg": rates(row["avg"])}
