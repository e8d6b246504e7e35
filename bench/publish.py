"""`python -m bench.publish`: the docs' published figures, generated from result files.

Every published figure lives in a generated block of a Markdown page, which names what it
renders and the result file (bench/results.py) it comes from:

    <!-- bench: sizing bench/results/2026-11-27-58f0a70-quick.json -->
    ...text generated from that file...
    <!-- /bench -->

The blocks: `figures` (every published figure of one run), `sizing` (below) and `runs`, which
cites several files, comma-separated without spaces, and sets their figures side by side with
each figure's median and spread (max/min) over the runs that hold it:

    <!-- bench: runs bench/results/a.json,bench/results/b.json,bench/results/c.json -->

`python -m bench.publish` renders every block again from the files it cites (after a change
of this module); `python -m bench.publish FILE...` makes every block (or those named by
`--block`) cite the given files: a `runs` block all of them (at least two, each once, runs of
one profile: its spread is run to run), the others the last (several files where no runs
block is rendered are refused); `--check` writes nothing and exits 1 when a page differs from
what its files give, or cites a file that is not in bench/results/ (or cannot cite what it
does; tests/bench/test_published_figures.py runs the same check). The producer, ClickHouse
and API sizing of docs/kubernetes.md is computed here, from the cited file's figures:
`sizing`.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.results import REPO_ROOT, RESULTS_DIR

WIDTH = 95  # generated paragraphs are wrapped at this width
BLOCK = re.compile(
    r"<!-- bench: (?P<name>[\w-]+) (?P<file>\S+) -->\n(?P<body>.*?)<!-- /bench -->", re.S
)


@dataclass(frozen=True)
class Result:
    """A result file, `path` relative to the repository root."""

    path: str
    data: dict[str, Any]

    @classmethod
    def load(cls, path: str) -> Result:
        data = json.loads((REPO_ROOT / path).read_text())
        if "run" not in data:
            raise ValueError(f"{path}: not a result file of bench/results.py (no `run`)")
        return cls(path, data)

    def get(self, key: str) -> Any:
        """A figure by its key, dotted for a nested one; None when the run has none."""
        value: Any = self.data
        for part in key.split("."):
            if not isinstance(value, dict):
                return None
            value = value.get(part)
        return value


# Figure: (what, key, format). A figure the cited run does not hold is left out of a table.
Figure = tuple[str, str, str]

FIGURES: list[tuple[str, list[Figure]]] = [
    (
        "Storage and ingest (jobscope beside its peers)",
        [
            ("jobscope ingest, readings/s until queryable", "ingest_e2e_readings_per_s", ",.0f"),
            (
                "VictoriaMetrics ingest, readings/s",
                "peer_victoriametrics_ingest_readings_per_s",
                ",.0f",
            ),
            ("PostgreSQL ingest, readings/s", "peer_postgres_ingest_readings_per_s", ",.0f"),
            ("jobscope ingest CPU per reading, µs", "ingest_cpu_us_per_reading", ".2f"),
            (
                "VictoriaMetrics CPU per reading, µs",
                "peer_victoriametrics_ingest_cpu_us_per_reading",
                ".2f",
            ),
            ("PostgreSQL CPU per reading, µs", "peer_postgres_ingest_cpu_us_per_reading", ".2f"),
            ("jobscope rollup CPU per reading, µs", "rollup_cpu_us_per_reading", ".2f"),
            (
                "jobscope drain, readings/s after the consumers' start",
                "ingest_drain_readings_per_s",
                ",.0f",
            ),
            ("jobscope bytes per reading", "bytes_per_reading", ".2f"),
            ("VictoriaMetrics bytes per reading", "peer_victoriametrics_bytes_per_reading", ".2f"),
            ("PostgreSQL bytes per reading", "peer_postgres_bytes_per_reading", ".2f"),
            ("jobscope query, 100 devices x 10 min, s", "query_100dev_10min_s", ".3f"),
            (
                "VictoriaMetrics query, 100 devices x 10 min, s",
                "peer_victoriametrics_query_100dev_10min_s",
                ".3f",
            ),
            (
                "PostgreSQL query, 100 devices x 10 min, s",
                "peer_postgres_query_100dev_10min_s",
                ".3f",
            ),
            ("freshness p50, s", "freshness_p50_s", ".3f"),
            ("freshness p99, s", "freshness_p99_s", ".3f"),
        ],
    ),
    (
        "Job API",
        [
            ("1 M readings of a job, best format, s", "api_1m_readings_s", ".3f"),
            ("1 M readings as Parquet, s", "api_1m_parquet_s", ".3f"),
            ("API over direct ClickHouse, same format", "api_1m_overhead_ratio", ".2f"),
            ("summary of 1 M readings, s", "api_summary_1m_readings_s", ".3f"),
            ("`step=1m` over the whole data, s", "api_step_1m_s", ".3f"),
            (
                "`step=1m`, server time (nothing encoded), s",
                "systems.jobscope.api_step_server_s",
                ".3f",
            ),
            ("export peak RSS, MB", "api_export_peak_rss_mb", ",.0f"),
            ("report, 100 nodes x 24 h, HTML, s", "report_100_nodes_24h_s", ".3f"),
            ("small queries answered per second", "api_small_queries_per_s", ",.1f"),
            ("small query p99 without abuse, s", "api_p99_no_abuse_s", ".3f"),
            ("small query p99 under SQL abuse, s", "api_p99_under_sql_abuse_s", ".3f"),
            (
                "small queries answered right under SQL abuse",
                "api_success_ratio_under_sql_abuse",
                ".3f",
            ),
            ("freshness p99 under SQL abuse, s", "freshness_p99_under_sql_abuse_s", ".3f"),
            ("probes seen under SQL abuse", "freshness_seen_ratio_under_sql_abuse", ".3f"),
        ],
    ),
    (
        "Scale: a day, then a week, of the fleet held (bench/scale.py; d = days held)",
        [
            (f"{label} {what}, {days} d{unit}", f"scale_{system}_{key}_{days}d{suffix}", fmt)
            for system, label in (
                ("jobscope", "jobscope"),
                ("victoriametrics", "VictoriaMetrics"),
                ("postgres", "PostgreSQL"),
            )
            for what, key, suffix, unit, fmt in (
                ("query, 10 devices x 1 h", "10dev_60min", "_s", ", s", ".3f"),
                ("query, 1 device x the day", "1dev_day", "_s", ", s", ".3f"),
                ("summary of the day", "summary", "_s", ", s", ".3f"),
                ("`step=1m` over the day", "step_1m", "_s", ", s", ".3f"),
                ("bytes per reading", "bytes_per_reading", "", "", ".2f"),
            )
            for days in (1, 7)
        ]
        + [
            (
                "jobscope query time, most growth, first level held to last",
                "scale_jobscope_growth_max",
                ".2f",
            ),
            (
                "VictoriaMetrics query time, most growth",
                "scale_victoriametrics_growth_max",
                ".2f",
            ),
            ("PostgreSQL query time, most growth", "scale_postgres_growth_max", ".2f"),
        ],
    ),
    (
        "Polling (per CPU-second of the collector process)",
        [
            ("jobscope SNMP OIDs", "snmp_oids_per_core_s", ",.0f"),
            ("snmp_exporter OIDs", "snmp_exporter_oids_per_core_s", ",.0f"),
            ("kwollector OIDs", "kwollector_oids_per_core_s", ",.0f"),
            ("jobscope IPMI sensors", "ipmi_sensors_per_core_s", ",.0f"),
            ("jobscope Prometheus samples", "prometheus_samples_per_core_s", ",.0f"),
            ("Prometheus server samples", "prometheus_server_samples_per_core_s", ",.0f"),
            ("jobscope wattmeter readings", "wattmeter_readings_per_core_s", ",.0f"),
            ("kwollector-wattmetre readings", "kwollector_wattmetre_readings_per_core_s", ",.0f"),
            ("jobscope remote_write samples", "remote_write_samples_per_core_s", ",.0f"),
            (
                "VictoriaMetrics remote_write samples",
                "remote_write_victoriametrics_samples_per_core_s",
                ",.0f",
            ),
            ("on-demand activation, median s", "on_demand_activation_s", ".2f"),
            ("live stream latency p99, s", "live_latency_p99_s", ".3f"),
        ],
    ),
]


def _format(value: Any, fmt: str) -> str | None:
    return None if value is None else format(value, fmt)


def _value(result: Result, key: str, fmt: str) -> str | None:
    return _format(result.get(key), fmt)


def _commit(run: dict[str, Any]) -> str:
    """The commit a run started on, and where the tree was when it ended if it moved on."""
    sha = f"`{run['commit']['short']}`" + (
        " (uncommitted changes)" if run["commit"]["dirty"] else ""
    )
    if at_end := run.get("commit_at_end"):
        changes = " with uncommitted changes" if at_end["dirty"] else ""
        sha += f" (the tree was at `{at_end['short']}`{changes} when it ended)"
    return sha


def _run(result: Result, page: Path) -> tuple[str, str]:
    """A run's file as a link from `page`, and what it was: profile, commit (and the tree's
    at its end, if it moved on), date, command, machine and what else that machine did."""
    run = result.data["run"]
    machine = result.data.get("machine") or {}
    link = os.path.relpath(REPO_ROOT / result.path, (REPO_ROOT / page).parent)
    sha = _commit(run)
    memory = (machine.get("memory_total_bytes") or 0) / 2**30
    busy = machine.get("cpu_busy_fraction_during")
    load = machine.get("loadavg_before") or [None]
    return f"[`{Path(result.path).name}`]({link})", (
        f"profile `{run['profile']}`, commit {sha}, {run['date']}, "
        f"`{run['command']}`; {machine.get('cpu_count')} CPUs ({machine.get('cpu_model')}), "
        f"{memory:.0f} GiB, {machine.get('os')}; 1-minute load {load[0]} before the run, "
        f"machine {100 * (busy or 0):.0f}% busy during it."
    )


def cite(result: Result, page: Path) -> str:
    """The line every one-file block opens with: which file, which run, which machine."""
    link, run = _run(result, page)
    return f"Generated by `python -m bench.publish` from {link} (do not edit by hand): {run}"


# A figure some of the runs hold: (what, key, format, each run's value, None where it has none).
Row = tuple[str, str, str, list[Any]]


def _parts(results: list[Result]) -> list[tuple[str, list[Row]]]:
    """The parts of FIGURES with the figures at least one of the runs holds; a part whose
    figures none holds is left out."""
    parts = []
    for title, figures in FIGURES:
        rows = [(what, key, fmt, [r.get(key) for r in results]) for what, key, fmt in figures]
        rows = [row for row in rows if any(v is not None for v in row[3])]
        if rows:
            parts.append((title, rows))
    return parts


def _table(title: str, columns: list[str], rows: list[tuple[str, str, list[str]]]) -> list[str]:
    """A part's table: a figure per row, its key, then `columns`."""
    return [
        "",
        f"{title}:",
        "",
        f"| figure | key | {' | '.join(columns)} |",
        "|---" * (len(columns) + 2) + "|",
        *(f"| {what} | `{key}` | {' | '.join(cells)} |" for what, key, cells in rows),
    ]


def render_figures(result: Result, page: Path) -> str:
    """Every published figure the cited run holds, by part."""
    lines = [_wrap(cite(result, page))]
    for title, rows in _parts([result]):
        cells = [(what, key, [format(v, fmt)]) for what, key, fmt, (v,) in rows]
        lines += _table(title, ["value"], cells)
    if len(lines) == 1:
        lines += ["", "This run holds no published figure."]
    return "\n".join(lines)


def _median_spread(values: list[Any], fmt: str) -> list[str]:
    """The median of the values the runs hold, and their max/min (n/a: one value, or a 0)."""
    held = [v for v in values if v is not None]
    spread = f"{max(held) / min(held):.2f}x" if len(held) > 1 and min(held) > 0 else "n/a"
    return [format(statistics.median(held), fmt), spread]


def render_runs(results: list[Result], page: Path) -> str:
    """Every published figure of several runs side by side, by part, with the median and the
    spread (max/min) of the runs that hold it: how much a figure moves from run to run."""
    lines = [
        _wrap(
            f"Generated by `python -m bench.publish` from {len(results)} runs (do not edit by "
            "hand):"
        ),
        "",
        *(_wrap(f"- run {i}: {': '.join(_run(r, page))}") for i, r in enumerate(results, 1)),
    ]
    columns = [f"run {i}" for i in range(1, len(results) + 1)] + ["median", "max/min"]
    for title, rows in _parts(results):
        cells = [
            (what, key, [_format(v, fmt) or "n/a" for v in values] + _median_spread(values, fmt))
            for what, key, fmt, values in rows
        ]
        lines += _table(title, columns, cells)
    if len(lines) == len(results) + 2:
        lines += ["", "These runs hold no published figure."]
    return "\n".join(lines)


@dataclass(frozen=True)
class Site:
    """The worked example of docs/kubernetes.md (the shape of helm/jobscope/ci/large-site.yaml)."""

    nodes: int = 5000
    node_exporter_metrics: int = 100  # per node, every second
    bmc_sensors: int = 13  # per node, every bmc_period_s
    bmc_period_s: int = 5
    switches: int = 100
    switch_ports: int = 48  # each polled for port_oids OIDs every second
    port_oids: int = 4
    users: int = 200  # dashboards refreshing every refresh_s
    refresh_s: int = 10
    exports_at_once: int = 24


CORE_SHARE = 0.8  # of a core a producer process is sized to use
SERVER_CORES = 2  # cores of one ClickHouse server, as measured
HEADROOM = 0.5  # of a server's capacity left for merges and queries
GROWTH = 2  # ClickHouse shards leave room for this many times today's load
KAFKA_CONSUMERS = 6  # clickhouse.kafkaConsumers: each needs a partition of its own
EXPORTS_PER_REPLICA = 8  # JOBSCOPE_MAX_EXPORTS
MAX_REPLICAS_FACTOR = 4  # api.autoscaling's maximum over its minimum

PRODUCER_FIGURES = {  # rate of the example site, figure per core-second
    "prometheus": ("prometheus_samples_per_core_s", "node_exporter samples/s"),
    "ipmi": ("ipmi_sensors_per_core_s", "BMC sensors/s"),
    "snmp": ("snmp_oids_per_core_s", "switch OIDs/s"),
}
QPS = "api_small_queries_per_s"
CLICKHOUSE_CPU = "systems.jobscope.ingest_detail.cpu_us_per_reading_by_process.clickhouse"


def clickhouse_us_per_reading(result: Result) -> float | None:
    """ClickHouse's CPU per reading stored: its share of the timed ingest (the broker's left
    out), plus the rollups' refreshes where the run measured them apart."""
    ingest = result.get(CLICKHOUSE_CPU)
    if ingest is None:
        return None
    return ingest + (result.get("rollup_cpu_us_per_reading") or 0)


def sizing(result: Result, site: Site = Site()) -> dict[str, Any]:
    """The example site's producer shards, ClickHouse shards, partitions and API replicas
    from the run's figures; a part whose figure the run lacks is None."""
    rates = {
        "prometheus": site.nodes * site.node_exporter_metrics,
        "ipmi": site.nodes * site.bmc_sensors / site.bmc_period_s,
        "snmp": site.switches * site.switch_ports * site.port_oids,
    }
    cores = {
        name: rates[name] / per_core if (per_core := result.get(key)) else None
        for name, (key, _) in PRODUCER_FIGURES.items()
    }
    out: dict[str, Any] = {"rates": rates, "cores": cores, "readings_per_s": sum(rates.values())}
    known = None not in cores.values()
    out["producer_cores"] = sum(cores.values()) if known else None  # type: ignore[arg-type]
    out["producer_shards"] = math.ceil(out["producer_cores"] / CORE_SHARE) if known else None
    us = clickhouse_us_per_reading(result)
    out["clickhouse_us_per_reading"] = us
    out["server_readings_per_s"] = SERVER_CORES * 1e6 / us if us else None
    if out["server_readings_per_s"]:
        needed = out["readings_per_s"] / (out["server_readings_per_s"] * HEADROOM)
        out["clickhouse_needed"] = needed
        out["clickhouse_shards"] = math.ceil(GROWTH * needed)
        out["partitions"] = out["clickhouse_shards"] * KAFKA_CONSUMERS
    qps = result.get(QPS)
    queries = site.users / site.refresh_s
    for_exports = math.ceil(site.exports_at_once / EXPORTS_PER_REPLICA)
    out["api_queries_per_s"] = queries
    out["api_replicas_for_queries"] = queries / qps if qps else None
    out["api_replicas_for_exports"] = for_exports
    out["api_min_replicas"] = max(math.ceil(queries / qps), for_exports) if qps else None
    return out


def _n(value: float, fmt: str = ",.0f") -> str:
    return format(value, fmt)


def _missing(result: Result, *keys: str) -> str:
    absent = [f"`{k}`" for k in keys if result.get(k) is None]
    return f"needs {', '.join(absent)}, which this run does not hold"


SIZING_FIGURES: list[Figure] = [
    ("SNMP OIDs per core-second", "snmp_oids_per_core_s", ",.0f"),
    ("IPMI sensors per core-second", "ipmi_sensors_per_core_s", ",.0f"),
    ("Prometheus samples per core-second", "prometheus_samples_per_core_s", ",.0f"),
    ("ClickHouse CPU per reading stored, µs (ingest + rollups)", CLICKHOUSE_CPU, ".2f"),
    ("readings stored per second, Kafka to ClickHouse", "ingest_e2e_readings_per_s", ",.0f"),
    ("small API queries answered per second, one API", "api_small_queries_per_s", ",.1f"),
    ("1 M readings exported as Parquet, one API, s", "api_1m_parquet_s", ".2f"),
]


def _sizing_table(result: Result) -> list[str]:
    us = clickhouse_us_per_reading(result)
    values = {CLICKHOUSE_CPU: None if us is None else f"{us:.2f}"}
    keys = {CLICKHOUSE_CPU: "`...by_process.clickhouse` + `rollup_cpu_us_per_reading`"}
    return ["| figure | key | this run |", "|---|---|---|"] + [
        f"| {what} | {keys.get(key, f'`{key}`')} | "
        f"{values.get(key) or _value(result, key, fmt) or 'not in this run'} |"
        for what, key, fmt in SIZING_FIGURES
    ]


def _wrap(text: str) -> str:
    """A paragraph or list item, wrapped as the pages are (their diffs stay readable)."""
    indent = "  " if text.startswith("- ") else ""
    return textwrap.fill(
        text, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def _producers(result: Result, site: Site, s: dict[str, Any]) -> str:
    parts = []
    for name, (key, what) in PRODUCER_FIGURES.items():
        cores, rate = s["cores"][name], _n(s["rates"][name])
        if cores is None:
            parts.append(f"{what} {rate}: {_missing(result, key)}")
        else:
            parts.append(f"{what} {rate} / {_n(result.get(key))} = {cores:.2f} cores")
    shards = (
        f"Total {s['producer_cores']:.2f} cores; at {CORE_SHARE:.0%} of a core per process, "
        f"**`producers.shards: {s['producer_shards']}`**"
        if s["producer_shards"] is not None
        else "The shard count needs every figure above"
    )
    return (
        f"- **Producer shards.** node_exporter, {site.node_exporter_metrics} metrics per node "
        f"every second; BMCs, {site.bmc_sensors} sensors every {site.bmc_period_s} s; "
        f"{site.switches} switches, {site.switch_ports} ports x {site.port_oids} OIDs every "
        "second. " + "; ".join(parts) + f". {shards} (each shard polls the devices "
        "`producers/sharding.py` gives it; adding one moves only about 1/N of them)."
    )


def _clickhouse(result: Result, s: dict[str, Any]) -> list[str]:
    total = _n(s["readings_per_s"])
    if s.get("clickhouse_shards") is None:
        return [
            f"- **ClickHouse shards and partitions.** {total} readings/s; their count "
            f"{_missing(result, CLICKHOUSE_CPU)}."
        ]
    server = s["server_readings_per_s"]
    return [
        f"- **ClickHouse shards.** {total} readings/s. ClickHouse spent "
        f"{s['clickhouse_us_per_reading']:.2f} µs of CPU per reading (its share of the timed "
        f"ingest, rollups included), so one {SERVER_CORES}-core server holds ~{_n(server)} "
        f"readings/s; at {HEADROOM:.0%} of that (headroom for merges and queries), {total} / "
        f"{_n(server * HEADROOM)} = {s['clickhouse_needed']:.2f} servers carry the load, and "
        f"room to grow {GROWTH}x gives **{s['clickhouse_shards']} shards** "
        "(`clickhouse.cluster`). The bench ingests a backlog in large blocks; at a fleet's "
        "steady rate blocks are small and each reading costs more: keep the headroom. All "
        "shards' Kafka tables share one consumer group, so they split the partitions.",
        "- **Partitions.** Every Kafka-engine consumer needs a partition of its own, and each "
        f"shard should get the same number: {s['clickhouse_shards']} shards x {KAFKA_CONSUMERS} "
        f"consumers (`clickhouse.kafkaConsumers`) = **{s['partitions']} partitions** "
        f"(`kafka.readingsPartitions`; {_n(s['readings_per_s'] / s['partitions'])} readings/s "
        "each). Partitions can be added later, never removed.",
    ]


def _api(result: Result, site: Site, s: dict[str, Any]) -> str:
    exports = (
        f"exports stream {EXPORTS_PER_REPLICA} at a time per replica (`JOBSCOPE_MAX_EXPORTS`), "
        f"so {site.exports_at_once} at once need {s['api_replicas_for_exports']} replicas"
    )
    if s["api_min_replicas"] is None:
        return f"- **API replicas.** {exports}; the query load {_missing(result, QPS)}."
    return (
        f"- **API replicas.** {site.users} dashboard users refreshing every {site.refresh_s} "
        f"s: {_n(s['api_queries_per_s'])} queries/s, / {_value(result, QPS, ',.1f')} = "
        f"{s['api_replicas_for_queries']:.2f} replicas; {exports}. **`api.autoscaling`: "
        f"{s['api_min_replicas']} to {MAX_REPLICAS_FACTOR * s['api_min_replicas']} "
        "replicas** on CPU (the PodDisruptionBudget keeps at least one through node drains)."
    )


def render_sizing(result: Result, page: Path) -> str:
    """docs/kubernetes.md's sizing: its figures, and the worked example computed from them."""
    site, s = Site(), sizing(result)
    return "\n".join(
        [
            _wrap(cite(result, page)),
            "",
            *_sizing_table(result),
            "",
            f"A worked example, {_n(site.nodes)} nodes (the shape of "
            "`helm/jobscope/ci/large-site.yaml`):",
            "",
            _wrap(_producers(result, site, s)),
            *(_wrap(line) for line in _clickhouse(result, s)),
            _wrap(_api(result, site, s)),
        ]
    )


# -- goals: issue 32's targets, each judged on the cited run --------------------------------

_SCALE_SHAPE = re.compile(r"\Ascale_(?P<system>[a-z]+)_(?P<shape>\d+dev_\w+?)_(?P<level>\d+d)_s\Z")


def shape_times(result: Result) -> dict[str, dict[str, float]]:
    """system -> {shape: seconds} of the job query shapes the run holds: QUICK's and full's
    `queries_s` (peers as `peer_<name>`), or the scale profile's `scale_<system>_<shape>_
    <level>_s` (a shape per level: `10dev_60min@7d`)."""
    out: dict[str, dict[str, float]] = {}
    for system, shapes in (result.get("queries_s") or {}).items():
        out[system.removeprefix("peer_")] = dict(shapes)
    for key, value in result.data.items():
        if (m := _SCALE_SHAPE.match(key)) and value is not None:
            out.setdefault(m["system"], {})[f"{m['shape']}@{m['level']}"] = value
    return out


def worst_speedup(result: Result, peer: str) -> tuple[float, str] | None:
    """The smallest of the peer's time over jobscope's, over the shapes both hold, and its
    shape; None when they share none."""
    times = shape_times(result)
    ours, theirs = times.get("jobscope", {}), times.get(peer, {})
    ratios = [(theirs[s] / ours[s], s) for s in ours if s in theirs and ours[s] > 0]
    return min(ratios) if ratios else None


def _ratio(result: Result, key: str, over: str) -> float | None:
    a, b = result.get(key), result.get(over)
    return a / b if a is not None and b else None


@dataclass(frozen=True)
class Goal:
    """One of issue 32's goals: the figure, the bound it must meet (`at_least` or at most)."""

    what: str
    figure: Callable[[Result], tuple[float, str] | None]
    bound: float
    at_least: bool

    def verdict(self, value: float) -> str:
        met = value >= self.bound if self.at_least else value <= self.bound
        return "met" if met else "not met"


def _plain(
    figure: Callable[[Result], float | None],
) -> Callable[[Result], tuple[float, str] | None]:
    def value(result: Result) -> tuple[float, str] | None:
        v = figure(result)
        return None if v is None else (v, "")

    return value


GOALS: list[Goal] = [
    Goal(
        "ingest readings/s end to end, jobscope over VictoriaMetrics",
        _plain(
            lambda r: _ratio(
                r, "ingest_e2e_readings_per_s", "peer_victoriametrics_ingest_readings_per_s"
            )
        ),
        1.5,
        True,
    ),
    Goal(
        "ingest CPU per reading as deployed (rollups in), jobscope over VictoriaMetrics",
        _plain(
            lambda r: _ratio(
                r, "ingest_cpu_us_per_reading", "peer_victoriametrics_ingest_cpu_us_per_reading"
            )
        ),
        1.0,
        False,
    ),
    *(
        Goal(
            f"job queries through the API, time of {label} over jobscope's, worst shape",
            lambda r, peer=peer: worst_speedup(r, peer),
            bound,
            True,
        )
        for peer, label, bound in (
            ("postgres", "PostgreSQL", 5.0),
            ("victoriametrics", "VictoriaMetrics", 1.5),
        )
    ),
    Goal(
        "`step=1m` of 10^5 rows from the rollups, server time (nothing encoded), s",
        _plain(lambda r: r.get("systems.jobscope.api_step_server_s")),
        0.05,
        False,
    ),
    Goal(
        "Prometheus scraping per CPU-second, jobscope's producer over the Prometheus server",
        _plain(lambda r: r.get("prometheus_vs_server")),
        1.0,
        True,
    ),
]


def render_goals(result: Result, page: Path) -> str:
    """Each goal the cited run holds a figure for: the figure, the bound, met or not."""
    rows = []
    for goal in GOALS:
        if (found := goal.figure(result)) is None:
            continue
        value, where = found
        bound = f"{'>=' if goal.at_least else '<='} {goal.bound:g}"
        shape = f" (`{where}`)" if where else ""
        rows.append(f"| {goal.what} | {value:.3g}{shape} | {bound} | {goal.verdict(value)} |")
    lines = [_wrap(cite(result, page)), ""]
    if not rows:
        return "\n".join([*lines, "This run holds no figure of a goal."])
    return "\n".join([*lines, "| goal | this run | bound | verdict |", "|---|---|---|---|", *rows])


RENDERERS: dict[str, Callable[[Result, Path], str]] = {
    "figures": render_figures,
    "goals": render_goals,
    "sizing": render_sizing,
}
"""Blocks citing one result file."""
RUNS_RENDERERS: dict[str, Callable[[list[Result], Path], str]] = {"runs": render_runs}
"""Blocks citing several result files, comma-separated (no space) in their marker."""
MIN_RUNS = 2  # files a runs block cites at least: one run has no spread
BLOCKS = sorted(RENDERERS | RUNS_RENDERERS)


def files(field: str) -> list[str]:
    """The files a block's marker cites: one, or several separated by commas."""
    return field.split(",")


def _count_problem(name: str, paths: list[str]) -> str | None:
    """Why a block cannot cite these files (an unknown block, a wrong count, or a runs block
    citing a file more than once); None if it can."""
    if name in RUNS_RENDERERS:
        if len(paths) < MIN_RUNS:
            cites = f"{len(paths)} file{'s' if len(paths) != 1 else ''}"
            return f"block {name} cites {cites}: it needs at least {MIN_RUNS}"
        if twice := sorted({path for path in paths if paths.count(path) > 1}):
            return f"block {name} cites {', '.join(twice)} more than once: each run once"
        return None
    if name in RENDERERS:
        return None if len(paths) == 1 else f"block {name} cites {len(paths)} files: it takes one"
    return f"unknown block {name!r} (known: {', '.join(BLOCKS)})"


def _profile_problem(name: str, results: list[Result]) -> str | None:
    """Why a runs block cannot cite these runs (they ran different profiles: its spread is
    run-to-run of one profile); None if it can, or for another block."""
    profiles = sorted({r.data["run"].get("profile") or "?" for r in results})
    if name not in RUNS_RENDERERS or len(profiles) < 2:
        return None
    return (
        f"block {name} cites runs of profiles {', '.join(profiles)}: its spread is run to run "
        "of one profile"
    )


def render_block(name: str, paths: list[str], page: Path) -> str:
    """A block's text (its marker apart) from the files it cites."""
    if problem := _count_problem(name, paths):
        raise ValueError(f"{page}: {problem}")
    results = [Result.load(path) for path in paths]
    if problem := _profile_problem(name, results):
        raise ValueError(f"{page}: {problem}")
    if name in RUNS_RENDERERS:
        return RUNS_RENDERERS[name](results, page)
    return RENDERERS[name](results[0], page)


HELM_EXAMPLE = Path("helm/jobscope/ci/large-site.yaml")
"""The chart's large-site values: the sizing's worked example, whose producer shards and
readings partitions are written there from the result file the sizing block cites."""
SIZING_PAGE = Path("docs/kubernetes.md")
_HELM_FIGURES = {
    ("producers", "shards"): "producer_shards",
    ("kafka", "readingsPartitions"): "partitions",
}


def render_helm_example(text: str, result: Result) -> str:
    """The large-site values with the sizing's figures (a figure the run lacks: unchanged)."""
    s = sizing(result)
    for (section, key), figure in _HELM_FIGURES.items():
        if s.get(figure) is None:
            continue
        line = re.compile(rf"^({section}:\n(?:(?:  .*|\s*#.*)\n)*?  {key}: )\d+$", re.M)
        text, found = line.subn(rf"\g<1>{s[figure]}", text)
        if found != 1:
            raise ValueError(f"{HELM_EXAMPLE}: no `{section}.{key}` line")
    return text


def helm_example_rendered() -> tuple[str, str]:
    """The large-site values as they are, and as the sizing block's cited file gives them."""
    text = (REPO_ROOT / HELM_EXAMPLE).read_text()
    page = (REPO_ROOT / SIZING_PAGE).read_text()
    cited_file = next((path for name, path in cited(page) if name == "sizing"), None)
    if cited_file is None:
        raise ValueError(f"{SIZING_PAGE} has no sizing block: {HELM_EXAMPLE} follows it")
    return text, render_helm_example(text, Result.load(cited_file))


def check_helm_example() -> list[str]:
    """What differs between the large-site values and the sizing, as a unified diff."""
    text, rendered = helm_example_rendered()
    diff = difflib.unified_diff(
        text.splitlines(), rendered.splitlines(), str(HELM_EXAMPLE), "regenerated", lineterm=""
    )
    return list(diff)


def pages() -> list[Path]:
    """The Markdown pages of the repository (tracked, or new and not ignored), relative."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted({Path(p) for p in listed.splitlines() if (REPO_ROOT / p).exists()})


def render(
    text: str, page: Path, cite_files: list[str] | None = None, only: set[str] | None = None
) -> str:
    """`text` with every block rendered again, from the files it cites, or from `cite_files`
    (the blocks named in `only`, or all): a runs block cites them all, another the last."""

    def block(m: re.Match[str]) -> str:
        name, paths = m["name"], files(m["file"])
        if cite_files and (only is None or name in only):
            paths = cite_files if name in RUNS_RENDERERS else cite_files[-1:]
        body = render_block(name, paths, page)
        return f"<!-- bench: {name} {','.join(paths)} -->\n{body}\n<!-- /bench -->"

    return BLOCK.sub(block, text)


def cited(text: str) -> list[tuple[str, str]]:
    """(block, file) of every block of a page; a runs block's files comma-separated (`files`)."""
    return [(m["name"], m["file"]) for m in BLOCK.finditer(text)]


def check(page: Path, text: str | None = None) -> list[str]:
    """What differs between a page (or `text` as that page) and its blocks rendered again, as
    a unified diff; or every cited file that is not in bench/results/, and every block that
    cannot cite what it does."""
    text = (REPO_ROOT / page).read_text() if text is None else text
    problems = [
        f"{page}: block {name} cites {path}, not a file in bench/results/"
        for name, field in cited(text)
        for path in files(field)
        if (REPO_ROOT / path).parent != RESULTS_DIR or not (REPO_ROOT / path).is_file()
    ] + [
        f"{page}: {problem}"
        for name, field in cited(text)
        if (problem := _count_problem(name, files(field)))
    ]
    if problems:
        return problems
    problems = [
        f"{page}: {problem}"
        for name, field in cited(text)
        if (problem := _profile_problem(name, [Result.load(path) for path in files(field)]))
    ]
    if problems:
        return problems
    diff = difflib.unified_diff(
        text.splitlines(), render(text, page).splitlines(), str(page), "regenerated", lineterm=""
    )
    return list(diff)


def _cite_files(parser: argparse.ArgumentParser, given: list[str]) -> list[str]:
    """The given result files, relative to the repository; a parser error for one that is not
    in bench/results/ or whose run failed."""
    cite_files = []
    for name in given:
        path = Path(name).resolve()
        if path.parent != RESULTS_DIR or not path.is_file():
            parser.error(f"{name}: not a file in {RESULTS_DIR.relative_to(REPO_ROOT)}/")
        cite_file = str(path.relative_to(REPO_ROOT))
        if errors := Result.load(cite_file).data.get("errors"):
            parser.error(f"{cite_file}: the run failed ({', '.join(errors)}): not published")
        cite_files.append(cite_file)
    return cite_files


def too_few_runs(cite_files: list[str], only: set[str] | None, texts: Iterable[str]) -> str | None:
    """Why `cite_files` cannot be cited: too few for a runs block named in `only`, or, with no
    `only`, on one of the pages (`texts`); None when they can."""
    if not 0 < len(cite_files) < MIN_RUNS:
        return None
    named = only if only else {name for text in texts for name, _ in cited(text)}
    if runs := sorted(named & set(RUNS_RENDERERS)):
        return (
            f"a {', '.join(runs)} block cites at least {MIN_RUNS} result files: give them all, "
            "or name the other blocks with --block"
        )
    return None


def no_runs_block(cite_files: list[str], only: set[str] | None, texts: Iterable[str]) -> str | None:
    """Why `cite_files` cannot be cited: several, where no block rendered is a runs block
    (none on the pages, or `only` leaves it out), and the others cite one; None when they can
    (the mirror of `too_few_runs`)."""
    if len(cite_files) < 2:
        return None
    on_pages = {name for text in texts for name, _ in cited(text)}
    if (on_pages & only if only else on_pages) & set(RUNS_RENDERERS):
        return None
    return (
        f"{len(cite_files)} result files given, but no block rendered is a runs block (none on "
        "the pages, or --block leaves it out): the others cite one file, give only that"
    )


def _runs_files_problem(cite_files: list[str]) -> str | None:
    """Why several given files cannot be a runs block's: one given twice, or runs of
    different profiles; None when they can (or when fewer than two are given)."""
    if len(cite_files) < 2:
        return None
    results = [Result.load(path) for path in cite_files]
    return _count_problem("runs", cite_files) or _profile_problem("runs", results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.publish", description=__doc__)
    parser.add_argument(
        "file",
        nargs="*",
        help="result files in bench/results/ to cite: a runs block cites them all, the others "
        "the last",
    )
    parser.add_argument("--block", action="append", choices=BLOCKS, help="only these")
    parser.add_argument("--check", action="store_true", help="write nothing; 1 if a page differs")
    args = parser.parse_args(argv)
    cite_files = _cite_files(parser, args.file)
    only = set(args.block) if args.block else None
    texts = {page: text for page in pages() if cited(text := (REPO_ROOT / page).read_text())}
    if not args.check and (
        problem := too_few_runs(cite_files, only, texts.values())
        or no_runs_block(cite_files, only, texts.values())
        or _runs_files_problem(cite_files)
    ):
        parser.error(problem)
    differs = False
    for page, text in texts.items():
        if args.check:
            if problems := check(page):
                print("\n".join(problems))
                differs = True
            continue
        new = render(text, page, cite_files, only)
        if new != text:
            (REPO_ROOT / page).write_text(new)
            print(f"{page}: regenerated")
    if args.check:
        if problems := check_helm_example():
            print("\n".join(problems))
            differs = True
    elif not args.block or "sizing" in args.block:
        text, rendered = helm_example_rendered()
        if rendered != text:
            (REPO_ROOT / HELM_EXAMPLE).write_text(rendered)
            print(f"{HELM_EXAMPLE}: regenerated")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
