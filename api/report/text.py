"""Words and numbers every report format prints alike: the job's facts, its energy line."""

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
