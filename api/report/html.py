"""A job report as one self-contained HTML file: inline CSS, inline SVG plots, no script and
no reference to anything outside the file (no font, image, style sheet or link to load), so
it opens offline, from a mail or an archive, and reading it tells no one. Every value that
comes from a job, a scheduler or a reading is escaped."""

from __future__ import annotations

from html import escape
from typing import Any

from api.report import svg
from api.report.text import (
    FOOTPRINT_HEAD,
    FOOTPRINT_NUMERIC,
    METRICS_HEAD,
    METRICS_NUMERIC,
    NODES_HEAD,
    NODES_NUMERIC,
    SOURCES_HEAD,
    SOURCES_NUMERIC,
    energy_line,
    footprint_rows,
    job_rows,
    metric_rows,
    node_rows,
    source_rows,
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
    parts = [f'<p class="energy" id="job-energy">{escape(energy_line(report))}</p>']
    nodes = node_rows(report)
    if nodes:
        parts.append(_table(NODES_HEAD, nodes, NODES_NUMERIC))
    sources = source_rows(report)
    if sources:
        parts.append("<h3>per node and source</h3>")
        parts.append(_table(SOURCES_HEAD, sources, SOURCES_NUMERIC))
    return "".join(parts)


def _notes(report: dict[str, Any]) -> str:
    parts = []
    notes = report["summary"].get("notes") or []
    if notes:
        items = "".join(
            f'<li class="{escape(str(n.get("severity", "")))}">'
            f"<b>{escape(str(n.get('severity', '')))}</b>: {escape(str(n.get('text', '')))}"
            f"{_nodes_of(n)}</li>"
            for n in notes
        )
        parts.append(f"<ul>{items}</ul>")
    footprint = footprint_rows(report)
    if footprint:
        parts.append(_table(FOOTPRINT_HEAD, footprint, FOOTPRINT_NUMERIC))
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
        + _notes(report)
        + f"<h2>Plots</h2><p>one point per {step} s (mean of each step)</p>"
        + (plots or "<p>no readings to plot</p>")
        + "<h2>Metrics</h2>"
        + _table(METRICS_HEAD, metric_rows(report), METRICS_NUMERIC)
        + f"<p>generated {escape(report['generated_at'])} by jobscope</p></body></html>"
    )
