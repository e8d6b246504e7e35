"""A report's plots as inline SVG, drawn here (no library, no script): axes, value ticks, time
labels in UTC, a line per series and a legend. Every text is escaped. The tick helpers are
shared with pdf.py, so both formats show the same axes."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from html import escape
from typing import Any

PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#637939",
)
WIDTH, HEIGHT = 760, 280
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 12, 40
LEGEND_ROW = 16


def value_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round values (1, 2 or 5 x 10^n apart) covering [low, high]."""
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value < high + step * 0.999:
        ticks.append(round(value, 12))
        value += step
    return ticks


def time_ticks(start: float, end: float, count: int = 6) -> list[tuple[float, str]]:
    """Times (Unix seconds) on round minutes or hours over [start, end], with their labels:
    HH:MM, and the date too when the span passes a day."""
    span = max(end - start, 1.0)
    steps = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)
    step = next((s for s in steps if span / s <= count), 86400)
    first = math.ceil(start / step) * step
    long = span >= 86400
    fmt = "%m-%d %H:%M" if long else ("%H:%M:%S" if step < 60 else "%H:%M")
    ticks = []
    t = first
    while t <= end:
        ticks.append((t, datetime.fromtimestamp(t, UTC).strftime(fmt)))
        t += step
    return ticks


def fmt_value(value: float) -> str:
    """A tick or table value: short, without float noise."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e6 or magnitude < 1e-3:
        return f"{value:.3g}"
    return f"{value:.6g}" if magnitude < 1000 else f"{value:,.0f}"


def bounds(plot: dict[str, Any]) -> tuple[float, float]:
    """The value range of a plot's series (0 included for a plot of power)."""
    values = [v for s in plot["series"] for v in s["v"] if math.isfinite(v)]
    if not values:
        return 0.0, 1.0
    low, high = min(values), max(values)
    if plot.get("unit") == "W":
        low = min(low, 0.0)
    return low, high


def render(plot: dict[str, Any]) -> str:
    """One plot as an `<svg>` element sized by its legend."""
    series = plot["series"]
    legend_h = LEGEND_ROW * math.ceil(len(series) / 3)
    height = HEIGHT + legend_h
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    start, end = plot["start"], max(plot["end"], plot["start"] + 1)
    ticks = value_ticks(*bounds(plot))
    low, high = ticks[0], ticks[-1] if ticks[-1] > ticks[0] else ticks[0] + 1

    def x(t: float) -> float:
        return LEFT + (t - start) / (end - start) * inner_w

    def y(v: float) -> float:
        return TOP + inner_h - (v - low) / (high - low) * inner_h

    title = escape(f"{plot['title']} [{plot['unit']}]")
    out = [
        f'<svg class="plot" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{title}">',
        f'<rect x="{LEFT}" y="{TOP}" width="{inner_w}" height="{inner_h}" class="frame"/>',
    ]
    for v in ticks:
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + inner_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
            'class="grid"/>'
            f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" class="tick" text-anchor="end">'
            f"{escape(fmt_value(v))}</text>"
        )
    for t, label in time_ticks(start, end):
        out.append(
            f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{TOP + inner_h}" '
            f'y2="{TOP + inner_h + 4}" class="axis"/>'
            f'<text x="{x(t):.1f}" y="{TOP + inner_h + 16}" class="tick" '
            f'text-anchor="middle">{escape(label)}</text>'
        )
    out.append(
        f'<text x="{LEFT + inner_w / 2:.0f}" y="{HEIGHT - 6}" class="tick" '
        f'text-anchor="middle">time (UTC)</text>'
    )
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        points = [
            f"{x(t):.1f},{y(v):.1f}"
            for t, v in zip(s["t"], s["v"], strict=True)
            if math.isfinite(v)
        ]
        if len(points) == 1:
            points.append(points[0])
        if points:
            out.append(
                f'<path d="M{" L".join(points)}" stroke="{colour}" class="line">'
                f"<title>{escape(s['name'])}</title></path>"
            )
        lx = LEFT + (i % 3) * (inner_w / 3)
        ly = HEIGHT + (i // 3) * LEGEND_ROW + 4
        out.append(
            f'<rect x="{lx:.0f}" y="{ly}" width="12" height="4" fill="{colour}"/>'
            f'<text x="{lx + 16:.0f}" y="{ly + 6}" class="legend">{escape(s["name"])}</text>'
        )
    out.append("</svg>")
    return "".join(out)
