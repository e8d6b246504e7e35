"""Words and numbers every report format prints alike: the job's facts, its energy line,
the rows of its tables (each format only renders them: HTML cells, Markdown pipes, PDF
cells; a narrow one keeps some `columns`)."""

from __future__ import annotations

from typing import Any

JOB_FIELDS = ("job_id", "user", "project", "queue", "site", "state", "start", "end")


def number(value: Any) -> str:
    """A value for a table: short, '' when there is none."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int) or (float(value).is_integer() and abs(value) < 1e15):
        return f"{int(value):,}"
    return f"{value:,.2f}" if abs(value) >= 100 else f"{value:.4g}"


def percent(share: float | None) -> str:
    return "" if share is None else f"{share * 100:.1f} %"


def kwh(joules: float | None) -> str:
    return "" if joules is None else f"{joules / 3.6e6:.4f}"


def energy_text(joules: float) -> str:
    """The job's energy as every format writes it (the PDF test looks for this text)."""
    return f"{number(round(joules))} J ({kwh(joules)} kWh)"


def energy_line(report: dict[str, Any]) -> str:
    energy = report.get("energy")
    if not energy:
        return "job energy: no power readings measured for this job"
    source = energy.get("metric_id") or energy.get("role") or ""
    parts = [f"job energy: {energy_text(energy['joules'])}"]
    if source:
        parts.append(f"from {source}")
    if energy.get("coverage") is not None:
        parts.append(f"coverage {percent(energy['coverage'])}")
    return ", ".join(parts)


def job_rows(report: dict[str, Any]) -> list[list[str]]:
    """The job's facts as (name, value) rows: fields, nodes, duration, labels."""
    job, summary = report["job"], report["summary"]
    rows = [[name, str(job.get(name) or "")] for name in JOB_FIELDS]
    nodes = job.get("nodes") or []
    rows.append(
        ["nodes", f"{len(nodes)}: {', '.join(nodes[:20])}{' ...' if len(nodes) > 20 else ''}"]
    )
    rows.append(["duration", f"{number(summary.get('duration_s') or 0)} s"])
    rows += [[f"label {k}", str(v)] for k, v in sorted((job.get("labels") or {}).items())]
    return rows


METRICS_HEAD = ["metric", "unit", "kind", "min", "mean", "max", "increase", "rate /s", "devices"]
"""The metrics table of every format: a gauge's min, mean and max; a counter's increase over
the job and its mean rate, summed over the job's devices (its raw values mean nothing)."""
METRICS_NUMERIC = set(range(3, len(METRICS_HEAD)))


def metric_rows(report: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for m in report["metrics"]:
        counted = m.get("delta") is not None
        stats = ["", "", ""] if counted else [number(m["min"]), number(m["avg"]), number(m["max"])]
        rows.append(
            [
                m["metric_id"],
                m["unit"],
                m["kind"],
                *stats,
                number(m.get("delta")),
                number(m.get("rate")),
                m["devices"],
            ]
        )
    return rows


NODES_HEAD = ["node", "J", "kWh", "metric", "role", "coverage", "sources", "spread"]
"""The energy of each node: its best source, how much of the job it covers, how far the
node's sources disagree."""
NODES_NUMERIC = {1, 2, 5, 6, 7}


def node_rows(report: dict[str, Any]) -> list[list[Any]]:
    return [
        [
            n["node"],
            number(n["joules"]),
            kwh(n["joules"]),
            n.get("metric_id") or "",
            n.get("role") or "",
            percent(n.get("coverage")),
            n.get("sources_count", ""),
            percent((n.get("spread") or {}).get("relative")),
        ]
        for n in report["summary"].get("energy_nodes") or []
    ]


SOURCES_HEAD = ["node", "metric", "role", "J", "coverage", "sources", "pushed"]
"""The energy of each node and source (metric), coverage the share of the job it covers."""
SOURCES_NUMERIC = {3, 4}


def source_rows(report: dict[str, Any]) -> list[list[Any]]:
    summary = report["summary"]
    duration = summary.get("duration_s") or 0.0
    return [
        [
            e["node"],
            e["metric_id"],
            e.get("role") or "",
            number(e["joules"]),
            percent(e["covered_s"] / duration if duration else None),
            ", ".join(e.get("sources") or []),
            "yes" if e.get("pushed") else "",
        ]
        for e in summary.get("energy", [])
    ]


FOOTPRINT_HEAD = ["metric", "unit", "mean", "p95", "idle..peak", "above caution s", "alert s"]
"""Where each key metric sat over the job: idle..peak its mean's position between the
registry's idle and peak."""
FOOTPRINT_NUMERIC = {2, 3, 4, 5, 6}
FOOTPRINT_SHORT = ["metric", "unit", "mean", "idle..peak"]
"""The footprint columns the Markdown and PDF reports keep."""


def footprint_rows(report: dict[str, Any]) -> list[list[Any]]:
    return [
        [
            f.get("metric_id", ""),
            f.get("unit", ""),
            number(f.get("mean")),
            number(f.get("p95")),
            percent(f.get("position")),
            number(f.get("above_caution_s")),
            number(f.get("above_alert_s")),
        ]
        for f in report["summary"].get("footprint") or []
    ]


def columns(
    head: list[str], rows: list[list[Any]], keep: list[str]
) -> tuple[list[str], list[list[Any]]]:
    """Only the columns `keep` of a table, in its order (a narrower format's choice)."""
    picked = [i for i, name in enumerate(head) if name in keep]
    return [head[i] for i in picked], [[row[i] for i in picked] for row in rows]
