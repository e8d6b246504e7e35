"""Jobs side by side (`GET /api/jobs/compare`): each job's summary flattened into named
figures, and every figure's difference to the first job's (the reference)."""

from __future__ import annotations

from typing import Any

from api import notes

FOOTPRINT_FIGURES = ("mean", "p95", "position", "above_caution_s", "above_alert_s")
METRIC_FIGURES = ("avg", "max", "delta", "rate")


def compared(jobs: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """`jobs`: (job, summary) pairs, the reference first."""
    rows = [_row(job, summary) for job, summary in jobs]
    names = list(dict.fromkeys(name for row in rows for name in row["figures"]))
    reference = rows[0]["figures"] if rows else {}
    for row in rows:
        row["diff"] = {
            name: _diff(value, reference.get(name))
            for name, value in row["figures"].items()
            if row is not rows[0]
        }
    return {"figures": names, "jobs": rows}


def _diff(value: float | None, first: float | None) -> dict[str, float | None]:
    if value is None or first is None:
        return {"delta": None, "relative": None}
    delta = value - first
    return {"delta": delta, "relative": delta / first if first else None}


def _row(job: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    found = summary.get("notes", [])
    return {
        "job": job,
        "notes": found,
        "severity": notes.worst(found),
        "footprint_source": summary.get("footprint_source"),
        "figures": figures(summary),
    }


def figures(summary: dict[str, Any]) -> dict[str, float | None]:
    """The summary's numbers by name: duration, energy and coverage of the job, its
    footprint per metric, its measured metrics over its nodes (mean of the nodes' averages,
    the largest max, sums of deltas and rates)."""
    energy, coverage = job_energy(summary)
    out: dict[str, float | None] = {
        "duration_s": summary.get("duration_s"),
        "energy_j": energy,
        "coverage": coverage,
    }
    for row in summary.get("footprint", []):
        for name in FOOTPRINT_FIGURES:
            out[f"footprint.{row['metric_id']}.{name}"] = row.get(name)
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for row in summary.get("metrics", []):
        if not row.get("pushed"):
            by_metric.setdefault(row["metric_id"], []).append(row)
    for metric, rows in sorted(by_metric.items()):
        out[f"metrics.{metric}.avg"] = _mean([r.get("avg") for r in rows])
        out[f"metrics.{metric}.max"] = _most([r.get("max") for r in rows])
        for name in ("delta", "rate"):
            values = [r.get(name) for r in rows if r.get(name) is not None]
            if values:
                out[f"metrics.{metric}.{name}"] = sum(values)
    return out


def job_energy(summary: dict[str, Any]) -> tuple[float | None, float | None]:
    """The job's energy and coverage: the summary's `energy_job` when it has one, else
    per node the measured source covering most of the job, summed (coverage: the least)."""
    total = summary.get("energy_job")
    if total:
        return total.get("joules"), total.get("coverage")
    duration = summary.get("duration_s") or 0.0
    best: dict[str, dict[str, Any]] = {}
    for row in summary.get("energy", []):
        if not row.get("pushed") and row["covered_s"] > best.get(row["node"], {}).get(
            "covered_s", -1.0
        ):
            best[row["node"]] = row
    if not best:
        return None, None
    joules = sum(r["joules"] for r in best.values())
    coverage = min(r["covered_s"] for r in best.values()) / duration if duration else None
    return joules, coverage


def _mean(values: list[Any]) -> float | None:
    numbers = [v for v in values if v is not None]
    return sum(numbers) / len(numbers) if numbers else None


def _most(values: list[Any]) -> float | None:
    numbers = [v for v in values if v is not None]
    return max(numbers) if numbers else None
