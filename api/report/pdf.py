"""A job report as PDF (fpdf2): the same sections as the HTML report, text kept as text (it
can be searched and copied: the job's energy included) and plots drawn as vector lines with
the axes of svg.py. The core fonts hold Latin-1 only: other characters print as '?'."""

from __future__ import annotations

import math
from typing import Any

from fpdf import FPDF

from api.report import svg
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

PAGE_W = 190.0  # A4 less 10 mm margins
PLOT_H = 60.0
AXIS_W = 16.0


def _latin1(text: Any) -> str:
    return str(text).encode("latin-1", "replace").decode("latin-1")


class _Pdf(FPDF):
    def footer(self) -> None:
        self.set_y(-12)
        self.set_font("helvetica", size=7)
        self.cell(0, 6, f"jobscope report, page {self.page_no()}", align="C")


def _table(pdf: FPDF, head: list[str], rows: list[list[Any]], widths: list[float]) -> None:
    pdf.set_font("helvetica", size=7)
    with pdf.table(
        col_widths=widths, text_align="LEFT", line_height=4, first_row_as_headings=True
    ) as table:
        for row in [head, *rows]:
            line = table.row()
            for value in row:
                line.cell(_latin1(value))
    pdf.ln(2)


def _heading(pdf: FPDF, text: str) -> None:
    pdf.set_font("helvetica", "B", 12)
    pdf.ln(2)
    pdf.cell(0, 8, _latin1(text), new_x="LMARGIN", new_y="NEXT")


def _plot(pdf: FPDF, plot: dict[str, Any]) -> None:
    """Axes, ticks and a polyline per series, then a legend in lines of text."""
    legend_rows = math.ceil(len(plot["series"]) / 3)
    if pdf.get_y() + PLOT_H + 12 + 4 * legend_rows > pdf.page_break_trigger:
        pdf.add_page()
    pdf.set_font("helvetica", "B", 9)
    pdf.cell(0, 6, _latin1(f"{plot['title']} [{plot['unit']}]"), new_x="LMARGIN", new_y="NEXT")
    left, top = pdf.l_margin + AXIS_W, pdf.get_y()
    width, height = PAGE_W - AXIS_W, PLOT_H
    start, end = plot["start"], max(plot["end"], plot["start"] + 1)
    ticks = svg.value_ticks(*svg.bounds(plot))
    low, high = ticks[0], ticks[-1] if ticks[-1] > ticks[0] else ticks[0] + 1

    def x(t: float) -> float:
        return left + (t - start) / (end - start) * width

    def y(v: float) -> float:
        return top + height - (v - low) / (high - low) * height

    pdf.set_draw_color(150, 150, 150)
    pdf.set_line_width(0.2)
    pdf.rect(left, top, width, height)
    pdf.set_font("helvetica", size=6)
    for v in ticks:
        pdf.set_draw_color(230, 230, 230)
        pdf.line(left, y(v), left + width, y(v))
        pdf.text(pdf.l_margin, y(v) + 1, svg.fmt_value(v))
    for t, label in svg.time_ticks(start, end):
        pdf.set_draw_color(150, 150, 150)
        pdf.line(x(t), top + height, x(t), top + height + 1.5)
        pdf.text(x(t) - pdf.get_string_width(label) / 2, top + height + 4, label)
    pdf.set_line_width(0.3)
    for i, series in enumerate(plot["series"]):
        colour = svg.PALETTE[i % len(svg.PALETTE)]
        rgb = tuple(int(colour[k : k + 2], 16) for k in (1, 3, 5))
        pdf.set_draw_color(*rgb)
        points = [
            (x(t), y(v)) for t, v in zip(series["t"], series["v"], strict=True) if math.isfinite(v)
        ]
        if len(points) > 1:
            pdf.polyline(points)
        lx = left + (i % 3) * width / 3
        ly = top + height + 8 + (i // 3) * 4
        pdf.set_fill_color(*rgb)
        pdf.rect(lx, ly - 1.5, 4, 1, style="F")
        pdf.text(lx + 5, ly, _latin1(series["name"]))
    pdf.set_y(top + height + 10 + 4 * legend_rows)


def render(report: dict[str, Any]) -> bytes:
    job, summary = report["job"], report["summary"]
    pdf = _Pdf(format="A4")
    pdf.set_margins(10, 10, 10)
    pdf.set_auto_page_break(True, margin=15)
    pdf.set_title(_latin1(f"jobscope report: job {job['job_id']}"))
    pdf.set_creator("jobscope")
    pdf.add_page()
    pdf.set_font("helvetica", "B", 15)
    pdf.cell(0, 10, _latin1(f"jobscope report: job {job['job_id']}"), new_x="LMARGIN", new_y="NEXT")
    _table(pdf, ["", ""], job_rows(report), [40, 150])
    _heading(pdf, "Energy")
    pdf.set_font("helvetica", "B", 10)
    pdf.multi_cell(0, 6, _latin1(energy_line(report)), new_x="LMARGIN", new_y="NEXT")
    sources = source_rows(report)
    if sources:
        keep = [name for name in SOURCES_HEAD if name != "pushed"]
        _table(pdf, *columns(SOURCES_HEAD, sources, keep), [30, 45, 15, 30, 20, 50])
    _heading(pdf, "Footprint and notes")
    pdf.set_font("helvetica", size=8)
    notes = summary.get("notes") or []
    for note in notes:
        pdf.multi_cell(
            0,
            5,
            _latin1(f"{note.get('severity', '')}: {note.get('text', '')}"),
            new_x="LMARGIN",
            new_y="NEXT",
        )
    footprint = footprint_rows(report)
    if footprint:
        _table(pdf, *columns(FOOTPRINT_HEAD, footprint, FOOTPRINT_SHORT), [80, 20, 45, 45])
    if not notes and not footprint:
        pdf.cell(0, 5, "none", new_x="LMARGIN", new_y="NEXT")
    _heading(pdf, "Plots")
    pdf.set_font("helvetica", size=8)
    pdf.cell(0, 5, f"one point per {report['step_s']} s", new_x="LMARGIN", new_y="NEXT")
    for plot in report["plots"]:
        _plot(pdf, plot)
    _heading(pdf, "Metrics")
    _table(pdf, METRICS_HEAD, metric_rows(report), [46, 10, 18, 18, 18, 18, 22, 18, 14])
    pdf.set_font("helvetica", size=7)
    pdf.cell(0, 5, _latin1(f"generated {report['generated_at']} by jobscope"))
    return bytes(pdf.output())
