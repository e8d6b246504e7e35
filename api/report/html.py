"""A job report as one self-contained HTML file: inline CSS, inline SVG plots, no script and
no reference to anything outside the file (no font, image, style sheet or link to load), so
it opens offline, from a mail or an archive, and reading it tells no one. Every value that
comes from a job, a scheduler or a reading is escaped."""

from __future__ import annotations

from html import escape
from typing import Any

from api.report import svg
from api.report.text import (
    METRICS_HEAD,
    METRICS_NUMERIC,
    energy_line,
    job_rows,
    kwh,
    metric_rows,
    number,
    percent,
)

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'"
"""The Content-Security-Policy the API serves the report with: nothing may be loaded."""

_STYLE = """
body{font-family:sans-serif;margin:1.5em auto;max-width:800px;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;border-bottom:1px solid #ccc;margin-top:1.6em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}td.n{text-align:right}
.energy{font-size:1.2em;font-weight:bold}
svg.plot{display:block;margin:.5em 0}
svg .frame{fill:none;stroke:#999}svg .grid{stroke:#eee}svg .axis{stroke:#999}
svg .tick,svg .legend{font-size:11px;fill:#444}svg .line{fill:none;stroke-width:1.4}
.alert{color:#b00}.warning{color:#a60}.info{color:#246}
"""


def _table(head: list[str], rows: list[list[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    cells = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td{' class=n' if i in numeric else ''}>{escape(str(c))}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{cells}</tr>{body}</table>"


def _energy(report: dict[str, Any]) -> str:
    summary = report["summary"]
    parts = [f'<p class="energy" id="job-energy">{escape(energy_line(report))}</p>']
    nodes = summary.get("energy_nodes") or []
    if nodes:
        rows = [
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
            for n in nodes
        ]
        head = ["node", "J", "kWh", "metric", "role", "coverage", "sources", "spread"]
        parts.append(_table(head, rows, {1, 2, 5, 6, 7}))
    duration = summary.get("duration_s") or 0.0
    rows = [
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
    if rows:
        parts.append("<h3>per node and source</h3>")
        head = ["node", "metric", "role", "J", "coverage", "sources", "pushed"]
        parts.append(_table(head, rows, {3, 4}))
    return "".join(parts)


def _notes(summary: dict[str, Any]) -> str:
    parts = []
    notes = summary.get("notes") or []
    if notes:
        items = "".join(
            f'<li class="{escape(str(n.get("severity", "")))}">'
            f"<b>{escape(str(n.get('severity', '')))}</b>: {escape(str(n.get('text', '')))}"
            f"{_nodes_of(n)}</li>"
            for n in notes
        )
        parts.append(f"<ul>{items}</ul>")
    footprint = summary.get("footprint") or []
    if footprint:
        rows = [
            [
                f.get("metric_id", ""),
                f.get("unit", ""),
                number(f.get("mean")),
                number(f.get("p95")),
                percent(f.get("position")),
                number(f.get("above_caution_s")),
                number(f.get("above_alert_s")),
            ]
            for f in footprint
        ]
        head = ["metric", "unit", "mean", "p95", "idle..peak", "above caution s", "alert s"]
        parts.append(_table(head, rows, {2, 3, 4, 5, 6}))
    return "".join(parts) or "<p>none</p>"


def _nodes_of(note: dict[str, Any]) -> str:
    nodes = note.get("nodes") or []
    return f" ({escape(', '.join(map(str, nodes)))})" if nodes else ""


def render(report: dict[str, Any]) -> str:
    """The whole HTML document."""
    job = report["job"]
    title = escape(f"jobscope report: job {job['job_id']}")
    plots = "".join(
        f'<figure id="{escape(p["id"])}"><figcaption>{escape(p["title"])} '
        f"[{escape(p['unit'])}]</figcaption>{svg.render(p)}</figure>"
        for p in report["plots"]
    )
    step = report["step_s"]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="referrer" content="no-referrer">'
        f"<title>{title}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{title}</h1>"
        + _table(["", ""], job_rows(report))
        + "<h2>Energy</h2>"
        + _energy(report)
        + "<h2>Footprint and notes</h2>"
        + _notes(report["summary"])
        + f"<h2>Plots</h2><p>one point per {step} s (mean of each step)</p>"
        + (plots or "<p>no readings to plot</p>")
        + "<h2>Metrics</h2>"
        + _table(METRICS_HEAD, metric_rows(report), METRICS_NUMERIC)
        + f"<p>generated {escape(report['generated_at'])} by jobscope</p></body></html>"
    )
