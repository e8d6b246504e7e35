"""A job's footprint and notes, added to its summary (`annotated`): for every gauge the
registry gives a scale (idle and peak) or levels (caution, alert), where the job sat
between idle and peak and how long it spent above the levels, per node and over the job;
the spans in which a node of the job sent no reading at all; then the notes the site's
rules (api/notes.py) draw from them.

Over the job, a metric's mean is the mean of its nodes' means, its p95 and times above a
level the worst node's, its tenths the nodes' time in each tenth summed, as fractions."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from datetime import UTC, datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from api import notes
from api.infra.params import iso
from api.live.scope import glob_regex
from api.queries import footprint as q
from api.queries import summary as summaries
from api.queries.metrics import Selection
from api.registry import Kind, MetricInfo, registry
from api.schemas import Job
from api.sharing import EXCLUSIVE, Sharing


def annotated(
    client: Client, job: Job, selection: Selection | None, sharing: Sharing = EXCLUSIVE
) -> dict[str, Any]:
    """The summary from raw readings with its footprint and notes, a shared node's energy
    attributed by `sharing`. The footprint and the silences are read in threads beside the
    summary's scan: queries at once answer sooner than one holding them all (ClickHouse
    analysed that one for longer than it ran)."""
    if selection is None or not selection.devices:
        summary = summaries.summarise(client, job, selection, sharing=sharing)
        summary.update(footprint=[], silent=[], footprint_source=None)
    else:
        known = summaries.known_metric_ids(client, selection)
        from_rollups = q.source(client, selection) == "rollup_1m"
        asked = glob_regex(selection.metrics)
        scales = scales_of([m for m in known if asked is None or asked.match(m)])
        alone = client.get_client_setting("session_id") is not None  # one query at a time
        with ThreadPoolExecutor(1 if alone else 2, thread_name_prefix="footprint") as pool:
            rows = pool.submit(q.footprint_rows, client, selection, scales, from_rollups)
            silent = pool.submit(q.silent_rows, client, selection, from_rollups)
            if alone:
                wait([rows, silent])
            summary = summaries.summarise(client, job, selection, known, sharing)
        found = scales_of(sorted({m["metric_id"] for m in summary["metrics"]}))
        fp_rows = rows.result()
        if not from_rollups and set(found.metrics) - set(scales.metrics):
            # A footprint gauge too new to be known (within a minute of its first reading).
            scales, fp_rows = found, q.footprint_rows(client, selection, found, False)
        summary.update(
            footprint=_per_metric(fp_rows, scales),
            silent=_silences(silent.result(), job, selection),
            footprint_source="rollup_1m" if from_rollups else "raw",
        )
    summary["notes"] = notes.evaluate(notes.rules(), job.model_dump(), summary)
    return summary


def _placed(info: MetricInfo) -> bool:
    """A gauge with a scale or a level: it has a footprint."""
    levels = info.thresholds is not None and (
        info.thresholds.caution is not None or info.thresholds.alert is not None
    )
    scale = info.idle is not None and info.peak is not None
    return info.kind == Kind.GAUGE and (scale or levels)


def scales_of(metrics: list[str]) -> q.Scales:
    chosen = [m for m in metrics if _placed(registry().lookup(m))]
    infos = [registry().lookup(m) for m in chosen]
    return q.Scales(
        metrics=chosen,
        idle=[i.idle for i in infos],
        peak=[i.peak for i in infos],
        caution=[i.thresholds.caution if i.thresholds else None for i in infos],
        alert=[i.thresholds.alert if i.thresholds else None for i in infos],
        higher_is_worse=[i.thresholds.higher_is_worse if i.thresholds else True for i in infos],
        aggregation=[i.node_aggregation or "" for i in infos],
    )


def _position(value: float | None, idle: float | None, peak: float | None) -> float | None:
    """Where `value` sits between idle (0) and peak (1), clamped."""
    if value is None or idle is None or peak is None:
        return None
    return min(1.0, max(0.0, (value - idle) / (peak - idle)))


def _fractions(seconds: list[float]) -> list[float]:
    total = sum(seconds)
    return [s / total for s in seconds] if total > 0 else []


def _per_metric(rows: list[dict[str, Any]], scales: q.Scales) -> list[dict[str, Any]]:
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_metric.setdefault(row["metric_id"], []).append(row)
    out = []
    for k, metric in enumerate(scales.metrics):
        node_rows = by_metric.get(metric)
        if not node_rows:
            continue
        idle, peak = scales.idle[k], scales.peak[k]
        nodes = [_node(r, idle, peak) for r in node_rows]
        mean = sum(n["mean"] for n in nodes) / len(nodes)
        tenths = [sum(r["deciles"][b] for r in node_rows if r["deciles"]) for b in range(10)]
        out.append(
            {
                "metric_id": metric,
                "unit": registry().lookup(metric).unit,
                "idle": idle,
                "peak": peak,
                "caution": scales.caution[k],
                "alert": scales.alert[k],
                "higher_is_worse": scales.higher_is_worse[k],
                "mean": mean,
                "p95": max(n["p95"] for n in nodes),
                "position": _position(mean, idle, peak),
                "above_caution_s": max(n["above_caution_s"] for n in nodes),
                "above_alert_s": max(n["above_alert_s"] for n in nodes),
                "covered_s": max(n["covered_s"] for n in nodes),
                "deciles": _fractions(tenths) if idle is not None else [],
                "nodes": nodes,
            }
        )
    return out


def _node(row: dict[str, Any], idle: float | None, peak: float | None) -> dict[str, Any]:
    return {
        "node": row["node"],
        "mean": row["mean"],
        "p95": row["p95"],
        "position": _position(row["mean"], idle, peak),
        "above_caution_s": float(row["above_caution_s"]),
        "above_alert_s": float(row["above_alert_s"]),
        "covered_s": float(row["covered_s"]),
        "deciles": _fractions(row["deciles"]),
    }


def _silences(rows: list[dict[str, Any]], job: Job, selection: Selection) -> list[dict[str, Any]]:
    """Per node silent for some of the scope: its silent seconds, their fraction of the
    scope's span and the spans. The span after a running job's last reading is not yet
    silence; a node without any reading is silent throughout."""
    start = selection.start.replace(tzinfo=UTC).timestamp()
    end = selection.end.replace(tzinfo=UTC).timestamp()
    duration = end - start
    found = {row["node"]: row for row in rows}
    out = []
    for node in selection.only or selection.devices:
        row = found.get(node)
        spans = [(start, end)] if row is None else _spans(row, start, end, job.end is not None)
        silent_s = sum(b - a for a, b in spans)
        if silent_s > 0 and duration > 0:
            out.append(
                {
                    "node": node,
                    "silent_s": silent_s,
                    "fraction": min(1.0, silent_s / duration),
                    "spans": [{"start": _iso(a), "end": _iso(b)} for a, b in spans],
                }
            )
    return out


def _spans(row: dict[str, Any], start: float, end: float, ended: bool) -> list[tuple[float, float]]:
    limit = q.SILENT_PERIODS * row["period"]
    spans = [(float(a), float(b)) for a, b in row["gaps"]]
    if row["first"] - start > limit:
        spans = [(start, float(row["first"])), *spans]
    if ended and end - row["last"] > limit:
        spans.append((float(row["last"]), end))
    return [(max(a, start), min(b, end)) for a, b in spans if min(b, end) > max(a, start)]


def _iso(seconds: float) -> str:
    return iso(datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None))
