"""A job report as Markdown (a wiki page, a ticket, a mail body): the job, its energy,
footprint and notes, and the metrics table. Plots do not fit Markdown: each is listed with
its range, the HTML and PDF reports draw them. Cells are escaped so a job's text cannot
break out of its table."""

from __future__ import annotations

from typing import Any

from api.report.svg import bounds, fmt_value
from api.report.text import (
    FOOTPRINT_HEAD,
    FOOTPRINT_SHORT,
    METRICS_HEAD,
    SOURCES_HEAD,
    columns,
    energy_line,
    footprint_rows,
    job_rows,
    metric_rows,
    source_rows,
)


def cell(value: Any) -> str:
    """Text safe in a table cell: no line break, pipes and markup characters escaped."""
    text = " ".join(str(value).split())
    for char in "\\|`*_[]<>#":
        text = text.replace(char, "\\" + char)
    return text


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def render(report: dict[str, Any]) -> str:
    job, summary = report["job"], report["summary"]
    lines = [f"# jobscope report: job {cell(job['job_id'])}", ""]
    lines += _table(["", ""], job_rows(report))
    lines += ["## Energy", "", f"**{cell(energy_line(report))}**", ""]
    sources = source_rows(report)
    if sources:
        lines += _table(SOURCES_HEAD, sources)
    lines += ["## Footprint and notes", ""]
    notes = summary.get("notes") or []
    lines += [f"- **{cell(n.get('severity', ''))}**: {cell(n.get('text', ''))}" for n in notes]
    footprint = footprint_rows(report)
    if footprint:
        lines += ["", *_table(*columns(FOOTPRINT_HEAD, footprint, FOOTPRINT_SHORT))]
    if not notes and not footprint:
        lines.append("none")
    lines += [
        "",
        "## Plots",
        "",
        f"One point per {report['step_s']} s; drawn in the HTML and PDF reports.",
        "",
    ]
    for plot in report["plots"]:
        low, high = bounds(plot)
        lines.append(
            f"- {cell(plot['title'])} [{cell(plot['unit'])}]: {len(plot['series'])} series, "
            f"{fmt_value(low)} .. {fmt_value(high)}"
        )
    lines += ["", "## Metrics", ""]
    lines += _table(METRICS_HEAD, metric_rows(report))
    lines.append(f"generated {report['generated_at']} by jobscope")
    return "\n".join(lines) + "\n"
