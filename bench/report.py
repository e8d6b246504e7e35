"""Turn the measurements into bench-results.json, a Markdown table and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.profiles import KEY_SELECTION, QUICK
from bench.systems.jobscope_api import FORMATS, formats
from bench.systems.jobscope_api import GOALS as API_GOALS

OURS = "jobscope"
PEERS = ("peer_victoriametrics", "peer_postgres")
HIGHER_IS_BETTER = {"ingest_readings_per_s"}

# (row title, per-system result key, unit format)
ROWS = [
    ("ingest, readings/s until all queryable", "ingest_readings_per_s", "{:,.0f}"),
    (
        "ingest, CPU of the servers per reading (load phase, jobscope's rollups in it), µs",
        "ingest_cpu_us_per_reading",
        "{:.2f}",
    ),
    ("compaction after the load (timed apart), s", "compaction_seconds", "{:.2f}"),
    ("compaction, CPU of the servers, s", "compaction_cpu_s", "{:.2f}"),
    ("bytes per reading (float values, every table)", "bytes_per_reading", "{:.2f}"),
    ("bytes per reading, the readings' table alone", "bytes_per_reading_metrics", "{:.2f}"),
    ("bytes per reading (integer values)", "bytes_per_reading_int", "{:.2f}"),
    ("query 100 devices x 10 min, s", "query_100dev_10min_s", "{:.3f}"),
]

QUERY_KEYS = {KEY_SELECTION: "query_100dev_10min_s"}  # query shapes that have a row of their own

# jobscope's job API (bench/systems/jobscope_api.py: its FORMATS): top-level keys and goals.
ABUSE_KEYS = [
    "api_p99_no_abuse_s",
    "api_success_ratio_no_abuse",
    "api_p99_under_sql_abuse_s",
    "api_success_ratio_under_sql_abuse",
    "api_under_sql_abuse_goal_met",
    "freshness_p99_no_abuse_s",
    "freshness_p99_under_sql_abuse_s",
    "freshness_seen_ratio_under_sql_abuse",
    "freshness_under_sql_abuse_goal_met",
    "api_small_queries_per_s",
    "api_small_queries_p99_s",
    "api_small_queries_success_ratio",
]
API_KEYS = [
    "api_1m_readings_s",
    "api_1m_best_format",
    "api_1m_direct_s",
    "api_1m_overhead_ratio",
    *(f"api_1m_{f}_s" for f in FORMATS),
    *(f"api_1m_direct_{f}_s" for f in FORMATS),
    "api_summary_1m_readings_s",
    "api_summary_1m_record_s",
    "api_step_1m_s",
    "api_export_peak_rss_mb",
    "api_export_rss_growth_mb",
    "api_export_readings",
    "api_export_format",
    "report_100_nodes_24h_s",
    "report_100_nodes_24h_pdf_s",
]
# Issue 30 names `api_summary_1m_readings_s` so: the same figure under both keys.
ALIASES = {"summary_1m_readings_s": "api_summary_1m_readings_s"}

NOTES = [
    "VictoriaMetrics keeps millisecond timestamps (the data has microseconds; jobscope and "
    "PostgreSQL keep them): its expected counts are computed on truncated timestamps.",
    "PostgreSQL stands in for Kwollect's TimescaleDB (not packaged by Debian): Kwollect "
    "1.3.1's schema (kwollect/db/kwollect_setup_db.py: its columns and indexes, (timestamp "
    "DESC), (device_id, timestamp DESC), the partial alias index), declarative 6-hour range "
    "partitions instead of 6-hour hypertable chunks, no chunk compression (Kwollect "
    "compresses chunks after 24 h) and no metrics_summary continuous aggregate.",
    "Queries fetch every value of the selection completely in the client, at each system's "
    "user layer, over a client kept between fetches: jobscope its API (GET /api/metrics in "
    "the API's fastest format for the shape, named beside the time), VictoriaMetrics "
    "/api/v1/export (JSON lines), PostgreSQL COPY (SELECT ...) TO STDOUT on one kept "
    "connection; the ratios compare these. Beside jobscope's, its time straight from "
    "ClickHouse (Native, the API bypassed). One untimed fetch first on every system, then "
    "the median of the runs.",
    "The same phases for every system: the load, timed until every reading is queryable by "
    "one cheap check (jobscope count() of metrics, VictoriaMetrics its /metrics row counters, "
    "PostgreSQL the COPYs' commits), its CPU including what follows at once (jobscope's "
    "rollups); a full count, untimed; then compaction, timed apart (VictoriaMetrics "
    "force_flush + force_merge, jobscope OPTIMIZE FINAL of every table, PostgreSQL VACUUM "
    "ANALYZE), before storage and queries. jobscope's rollup refreshes stay on throughout.",
    "jobscope's Kafka broker (a JVM) is warmed before its ingest is timed, with 2.4 M readings "
    "on a topic of its own, as a running broker is; the peers (Go, C) need no warm-up.",
    "Ratios compare jobscope with a peer measured in the same run on the same data; > 1 means "
    "jobscope is better (faster, smaller or higher throughput).",
]


def ratio(ours: float | None, peer: float | None, key: str) -> float | None:
    """How many times better jobscope is than the peer on `key` (>1 = jobscope better)."""
    if not ours or not peer:
        return None
    return ours / peer if key in HIGHER_IS_BETTER else peer / ours


def flatten(systems: dict[str, dict[str, Any]], extra: dict[str, Any]) -> dict[str, Any]:
    """bench-results.json: the named top-level keys, then details."""
    ours = systems.get(OURS, {})
    out: dict[str, Any] = {
        "ingest_drain_readings_per_s": ours.get("ingest_drain_readings_per_s"),
        "ingest_drain_overall_readings_per_s": ours.get("ingest_drain_overall_readings_per_s"),
        "consumer_start_s": ours.get("consumer_start_s"),
        "ingest_e2e_readings_per_s": ours.get("ingest_readings_per_s"),
        "ingest_cpu_us_per_reading": ours.get("ingest_cpu_us_per_reading"),
        "rollup_cpu_us_per_reading": ours.get("rollup_cpu_us_per_reading"),
        "rollup_seconds": ours.get("rollup_seconds"),
        "compaction_seconds": ours.get("compaction_seconds"),
        "compaction_cpu_s": ours.get("compaction_cpu_s"),
        "bytes_per_reading_metrics": ours.get("bytes_per_reading_metrics"),
        "freshness_p50_s": ours.get("freshness_p50_s"),
        "freshness_p99_s": ours.get("freshness_p99_s"),
        "query_100dev_10min_s": ours.get("query_100dev_10min_s"),
        "query_100dev_10min_format": _shape(ours, KEY_SELECTION).get("format"),
        "query_100dev_10min_direct_s": _direct(ours, KEY_SELECTION),
        "bytes_per_reading": ours.get("bytes_per_reading"),
        "bytes_per_reading_int": ours.get("bytes_per_reading_int"),
        "query_floor_s": ours.get("query_floor_s"),
        "engine_select1_s": ours.get("engine_select1_s"),
        **{key: ours.get(key) for key in (*API_KEYS, *ABUSE_KEYS)},
        **{alias: ours.get(key) for alias, key in ALIASES.items()},
    }
    for peer in PEERS:
        r = systems.get(peer, {})
        out[f"{peer}_ingest_readings_per_s"] = r.get("ingest_readings_per_s")
        out[f"{peer}_ingest_cpu_us_per_reading"] = r.get("ingest_cpu_us_per_reading")
        out[f"{peer}_compaction_seconds"] = r.get("compaction_seconds")
        out[f"{peer}_compaction_cpu_s"] = r.get("compaction_cpu_s")
        out[f"{peer}_bytes_per_reading"] = r.get("bytes_per_reading")
        out[f"{peer}_bytes_per_reading_metrics"] = r.get("bytes_per_reading_metrics")
        out[f"{peer}_bytes_per_reading_int"] = r.get("bytes_per_reading_int")
        out[f"{peer}_query_100dev_10min_s"] = r.get("query_100dev_10min_s")
    out["ratios"] = {
        f"{key}_vs_{peer.removeprefix('peer_')}": ratio(
            ours.get(key), systems.get(peer, {}).get(key), key
        )
        for _, key, _ in ROWS
        for peer in PEERS
    }
    out["queries_s"] = {
        name: {sel: q["seconds"] for sel, q in r.get("queries", {}).items()}
        for name, r in systems.items()
    }
    out["queries_direct_s"] = {sel: _direct(ours, sel) for sel in ours.get("queries", {})}
    out["query_layers"] = {name: r.get("query_layer") for name, r in systems.items()}
    out["errors"] = {name: r["error"] for name, r in systems.items() if "error" in r}
    for name, r in systems.items():
        for step, error in r.get("failed_measurements", {}).items():
            out["errors"][f"{name}.{step}"] = error
    out.update(extra)
    out["notes"] = NOTES
    out["systems"] = systems
    return out


def _shape(r: dict[str, Any], selection: str) -> dict[str, Any]:
    """A system's figures of one query shape (empty if it has none)."""
    return r.get("queries", {}).get(selection, {})


def _direct(r: dict[str, Any], selection: str) -> float | None:
    """jobscope's time of a shape straight from ClickHouse, the API bypassed."""
    return _shape(r, selection).get("layers", {}).get("clickhouse_direct")


def _query_detail(r: dict[str, Any], selection: str) -> str:
    """What a query figure is beside: the API's format, the time straight from ClickHouse."""
    q = _shape(r, selection)
    parts = [q["format"]] if q.get("format") else []
    if (direct := _direct(r, selection)) is not None:
        parts.append(f"ClickHouse directly {direct:.3f}")
    return f" ({'; '.join(parts)})" if parts else ""


def _fmt(value: float | None, fmt: str, scale: float = 1) -> str:
    return "n/a" if value is None else fmt.format(value * scale)


def markdown(systems: dict[str, dict[str, Any]], results: dict[str, Any]) -> str:
    names = [n for n in (OURS, *PEERS) if n in systems]
    labels = [systems[n]["label"] for n in names]
    peers = [n for n in names if n != OURS]
    head = ["measure", *labels]
    if OURS in systems:
        head += [f"jobscope vs {systems[p]['label']}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    key_rows = {key for _, key, _ in ROWS}
    query_rows = [
        (f"query {sel.replace(',', ', ')}, s", sel)
        for sel in (systems[names[0]].get("queries", {}) if names else {})
        if QUERY_KEYS.get(sel) not in key_rows
    ]

    def row(title: str, get: Any, fmt: str, key: str, selection: str | None = None) -> None:
        """`selection`: a query shape, whose cells say what each figure is beside."""
        cells = [title] + [
            _fmt(get(systems[n]), fmt) + (_query_detail(systems[n], selection) if selection else "")
            for n in names
        ]
        if OURS in systems:
            for p in peers:
                r = ratio(get(systems[OURS]), get(systems[p]), key)
                cells.append("n/a" if r is None else f"{r:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")

    by_key = {key: sel for sel, key in QUERY_KEYS.items()}
    inputs = [systems[n].get("ingest_input") or "n/a" for n in names]
    cells = ["ingest: what each system was sent", *inputs]
    lines.append("| " + " | ".join(cells + [""] * (len(head) - len(cells))) + " |")
    for title, key, fmt in ROWS:
        row(title, lambda r, key=key: r.get(key), fmt, key, by_key.get(key))
        if key == "ingest_cpu_us_per_reading":
            lines += remote_write_row(names, results, len(head))
    for title, sel in query_rows:
        row(title, lambda r, sel=sel: _shape(r, sel).get("seconds"), "{:.3f}", "query", sel)
    if OURS in systems:
        quick = results.get("profile") == QUICK.name
        for title, value in jobscope_rows(systems[OURS], quick):
            lines.append("| " + " | ".join([title, value] + [""] * (len(head) - 2)) + " |")
    machine = results.get("machine", {})
    dataset = results.get("dataset", {})
    footer = [
        "",
        f"Data: {dataset.get('description', '?')}; timestamps from {dataset.get('start', '?')}.",
        f"Machine: {machine.get('cpu_count')} CPUs, load average before "
        f"{machine.get('loadavg_before')}, after {machine.get('loadavg_after')}, max 1-min load "
        f"during {machine.get('load1_max_during')}, CPU busy "
        f"{100 * machine.get('cpu_busy_fraction_during', 0):.0f}% over "
        f"{machine.get('run_seconds')} s.",
        "Versions: "
        + ", ".join(f"{systems[n]['label']} {systems[n].get('version', '?')}" for n in names)
        + ".",
        *[f"- {note}" for note in NOTES],
    ]
    vm = systems.get("peer_victoriametrics", {})
    if vm.get("values_bit_exact_fraction") is not None:
        footer.append(
            f"- VictoriaMetrics returned {100 * vm['values_bit_exact_fraction']:.1f}% of "
            f"{vm['values_checked']:,} float values bit-exact (largest relative error "
            f"{vm['values_max_relative_error']:.1e}): it keeps about 12 significant digits, "
            "where jobscope and PostgreSQL keep float64 exactly."
        )
    for name, error in results.get("errors", {}).items():
        footer.append(f"- FAILED {name}: {error}")
    return "\n".join(lines + footer)


def remote_write_row(names: list[str], results: dict[str, Any], width: int) -> list[str]:
    """The same remote writes to jobscope's gateway and VictoriaMetrics (the `remote_write`
    polling part), per CPU-second: jobscope's row fed the peer's input."""
    ours = results.get("remote_write_samples_per_core_s")
    theirs = results.get("remote_write_victoriametrics_samples_per_core_s")
    if ours is None or theirs is None:
        return []
    by_system = {OURS: ours, "peer_victoriametrics": theirs}
    cells = [
        "ingest by remote write, samples per CPU-second (part `remote_write`: jobscope's "
        "gateway to Kafka; VictoriaMetrics decoded and stored)",
        *(_fmt(by_system.get(n), "{:,.0f}") for n in names),
    ]
    if OURS in names:
        cells += [f"{ours / theirs:.2f}x" if p in by_system else "n/a" for p in names[1:]]
    return ["| " + " | ".join(cells + [""] * (width - len(cells))) + " |"]


def _goal(js: dict[str, Any], key: str, fmt: str, detail: str = "") -> str:
    """A figure, what it is beside, and whether it meets its goal (at most API_GOALS[key])."""
    value, goal = js.get(key), API_GOALS.get(key)
    text = _fmt(value, fmt) + (f" ({detail})" if detail else "")
    if value is None or goal is None:
        return text
    return f"{text}; goal <= {goal:g}: {'met' if value <= goal else 'MISSED'}"


def _by_format(js: dict[str, Any], quick: bool) -> str:
    """Each format's time through the API / straight from ClickHouse; those QUICK leaves out
    (jobscope_api.formats) said so, not shown as n/a like a format that failed."""
    measured = formats(quick)
    left_out = [f for f in FORMATS if f not in measured]
    return "; ".join(
        [
            f"{f} {_fmt(js.get(f'api_1m_{f}_s'), '{:.3f}')} / "
            f"{_fmt(js.get(f'api_1m_direct_{f}_s'), '{:.3f}')}"
            for f in measured
        ]
        + ([f"{', '.join(left_out)} not measured (QUICK)"] if left_out else [])
    )


def api_rows(js: dict[str, Any], quick: bool = False) -> list[tuple[str, str]]:
    """The job API's figures (bench/systems/jobscope_api.py); `quick`: a QUICK run's."""
    best = js.get("api_1m_best_format")
    readings = js.get("api_1m_readings")
    size = f"{readings / 1e6:.1f} M" if readings else "1 M"
    rows = [
        (
            f"jobscope: API, job of {size} readings (GET /api/jobs/{{id}}/metrics) received "
            "completely, best format, s",
            js["api_note"]
            if js.get("api_1m_readings_s") is None and "api_note" in js
            else _goal(js, "api_1m_readings_s", "{:.3f}", best or ""),
        ),
        (
            f"jobscope: API, job of {size} readings by format: API / ClickHouse directly "
            "(same SQL and format, read-only user), s",
            _by_format(js, quick),
        ),
        (
            "jobscope: API overhead, best format's time / ClickHouse directly in that format",
            _goal(js, "api_1m_overhead_ratio", "{:.2f}x", best or ""),
        ),
        (
            "jobscope: API, summary of that job computed from its raw readings, as a running "
            "job's (GET /api/jobs/{id}/summary?start=...; `summary_1m_readings_s`), s",
            _goal(
                js,
                "api_summary_1m_readings_s",
                "{:.3f}",
                f"in-process {_fmt(js.get('api_summary_direct_s'), '{:.3f}')} s",
            ),
        ),
        (
            "jobscope: API, the same summary from the job's record, as an ended job's, s",
            _fmt(js.get("api_summary_1m_record_s"), "{:.3f}"),
        ),
        (
            "jobscope: API, step=1m&agg=avg, same devices over the whole data set "
            f"({_fmt(js.get('api_step_rows'), '{:,}')} rows, JSON), s",
            _goal(js, "api_step_1m_s", "{:.3f}")
            + "; server time (nothing encoded) "
            + _goal(
                js,
                "api_step_server_s",
                "{:.3f}",
                f"ClickHouse directly, JSON {_fmt(js.get('api_step_direct_s'), '{:.3f}')} s",
            ),
        ),
    ]
    if "report_100_nodes_24h_s" in js:
        rows.append(
            (
                "jobscope: API, report of a 100-node, 24-hour job "
                f"({_fmt(js.get('report_job_readings'), '{:,}')} readings; GET "
                "/api/jobs/{id}/report?format=html, `report_100_nodes_24h_s`), median, s",
                _goal(
                    js,
                    "report_100_nodes_24h_s",
                    "{:.3f}",
                    f"best {js['report_100_nodes_24h_best_s']:.3f}; summarise in-process "
                    f"{_fmt(js.get('report_summarise_direct_s'), '{:.3f}')}; PDF "
                    f"`report_100_nodes_24h_pdf_s` {js['report_100_nodes_24h_pdf_s']:.3f}, "
                    f"best {js['report_100_nodes_24h_pdf_best_s']:.3f}",
                ),
            )
        )
    if js.get("api_export_peak_rss_mb") is not None:
        rows.append(
            (
                f"jobscope: API process peak RSS while exporting "
                f"{js['api_export_readings']:,} readings as {js['api_export_format']} "
                "(streamed, discarded by the client), MB",
                f"{js['api_export_peak_rss_mb']:.0f} ({js['api_export_rss_growth_mb']:+.0f} "
                f"over the {js['api_export_rss_before_mb']:.0f} before; "
                f"{js['api_export_s']:.1f} s)"
                + (f"; {js['api_export_note']}" if js.get("api_export_note") else ""),
            )
        )
    return rows


def jobscope_rows(js: dict[str, Any], quick: bool = False) -> list[tuple[str, str]]:
    """Figures only jobscope has (no peer equivalent in this run); `quick`: a QUICK run's."""
    rows = [
        (
            "jobscope: Kafka engine drain of a full topic (production schema, RowBinary, 100 "
            "readings/message), readings/s from the first messages read until all queryable",
            _fmt(js.get("ingest_drain_readings_per_s"), "{:,.0f}"),
        ),
        (
            "jobscope: drain, consumer start (schema applied until the first messages read), s",
            _fmt(js.get("consumer_start_s"), "{:.2f}"),
        ),
        (
            "jobscope: drain overall (schema applied until all queryable), readings/s",
            _fmt(js.get("ingest_drain_overall_readings_per_s"), "{:,.0f}"),
        ),
        (
            "jobscope: rollups of the loaded readings (at the end of the ingest, in its CPU "
            "figure), CPU of the servers per reading, µs / wall, s",
            f"{_fmt(js.get('rollup_cpu_us_per_reading'), '{:.2f}')} / "
            f"{_fmt(js.get('rollup_seconds'), '{:.2f}')}",
        ),
        (
            "jobscope: freshness p50 / p99 under steady load, s",
            f"{_fmt(js.get('freshness_p50_s'), '{:.2f}')} / "
            f"{_fmt(js.get('freshness_p99_s'), '{:.2f}')}",
        ),
        (
            "jobscope: query floor, `SELECT 1` through the HTTP front / in the engine, ms",
            f"{_fmt(js.get('query_floor_s'), '{:.2f}', 1000)} / "
            f"{_fmt(js.get('engine_select1_s'), '{:.3f}', 1000)}",
        ),
        *api_rows(js, quick),
        *abuse_rows(js),
    ]
    for name, v in js.get("drain_variants", {}).items():
        fmt, per, *_ = name.split("_")
        fmt = {"rowbinary": "RowBinary", "jsoneachrow": "JSONEachRow"}.get(fmt, fmt)
        rows.append(
            (
                f"jobscope: drain, {fmt}, {per} readings/message (one array), readings/s "
                "after the consumer start",
                _drain(v),
            )
        )
    for fmt, v in js.get("format_variants", {}).items():
        rows.append(
            (
                f"jobscope: drain, {fmt}, a row per reading through a bare Kafka table, "
                "readings/s after the consumer start",
                _drain(v),
            )
        )
    return rows


def _drain(v: dict[str, Any]) -> str:
    """A drain's rate from the first messages read, its size, the consumer start and the
    overall rate."""
    return (
        f"{v['readings_per_s']:,.0f} ({v['readings']:,} readings; consumer start "
        f"{_fmt(v.get('consumer_start_s'), '{:.2f}')} s; overall "
        f"{_fmt(v.get('overall_readings_per_s'), '{:,.0f}')}/s)"
    )


SNMP_GOAL = 1.5  # snmp_vs_exporter: jobscope's OIDs per CPU-second / snmp_exporter's


def live_rows(results: dict[str, Any]) -> list[str]:
    """The API's live stream (bench/polling/live.py): latency and CPU per client."""
    if "live_latency_p99_s" not in results:
        return []
    live, p99 = results["live"], results["live_latency_p99_s"]
    k, goal = live["k_max"], live["goal_p99_s"]
    idle = live["phases"]["idle"]["api_cpu_cores"]
    busy = max(p["machine_busy_fraction"] for p in live["phases"].values())
    rows = [
        "| Live stream (GET /api/jobs/{id}/live): reading's timestamp to its arrival at the "
        f"client, s (p50 / p99 / max; {live['latency_readings']:,} readings, up to {k} clients) | "
        f"{_fmt(results['live_latency_p50_s'], '{:.3f}')} / {_fmt(p99, '{:.3f}')} / "
        f"{_fmt(results['live_latency_max_s'], '{:.3f}')}; goal p99 <= {goal:g}: "
        + ("met" if p99 is not None and p99 <= goal else "MISSED")
        + f" (machine CPU busy up to {100 * busy:.0f}% in a window) |",
        "| Live stream: API CPU per connected client, % of a core (1 client; "
        f"{k} on one job; {k} on {k} jobs) | "
        f"{_fmt(results['live_cpu_per_client_k1'], '{:.2f}')}; "
        f"{_fmt(results['live_cpu_per_client'], '{:.2f}')}; "
        f"{_fmt(results['live_cpu_per_client_distinct_jobs'], '{:.2f}')} "
        f"(API with no client: {100 * idle:.2f}%) |",
    ]
    replay = live["replay"]
    rows.append(
        f"| Live stream: since= replay of {replay['replayed']:,} readings until the 'live' "
        "event; job's end (PATCH) until the 'end' event, s | "
        f"{replay['replay_to_live_s']:.2f}; {_fmt(live['end_event_s'], '{:.2f}')}"
        + (f" ({live['end_note']})" if live.get("end_note") else "")
        + " |"
    )
    if live.get("problems"):
        found = "; ".join(f"{kind}: {n:,}" for kind, n in live["problems"].items())
        rows.append(f"| Live stream: PROBLEMS (examples in bench-results.json) | {found} |")
    return rows


def abuse_rows(js: dict[str, Any]) -> list[tuple[str, str]]:
    """The API and ingestion under SQL abuse (bench/systems/jobscope_abuse.py)."""
    if "api_p99_under_sql_abuse_s" not in js:
        return []
    abuse = js["abuse"]
    goals, share = abuse["goals"], abuse["success_goal"]

    def verdict(key: str, met_key: str, what: str) -> str:
        return f"goal p99 <= {goals[key]:g} and >= {share:.0%} {what}: " + (
            "met" if js[met_key] else "MISSED"
        )

    def ratio(key: str) -> str:
        return _fmt(js[key], "{:.1%}")

    def outcomes(phase: dict[str, Any]) -> str:
        return ", ".join(f"{kind}: {n:,}" for kind, n in sorted(phase["outcomes"].items()))

    small = abuse["small_query"]
    return [
        (
            f"jobscope: SQL abuse: small job query ({small['devices']} devices x "
            f"{small['seconds']} s, {small['readings']:,} readings) p99 of the successful "
            f"answers, s (answers successful), alone; with {abuse['abuser_threads']} heavy "
            "reader queries",
            f"{_fmt(js['api_p99_no_abuse_s'], '{:.3f}')} "
            f"({ratio('api_success_ratio_no_abuse')}); "
            f"{_fmt(js['api_p99_under_sql_abuse_s'], '{:.3f}')} "
            f"({ratio('api_success_ratio_under_sql_abuse')}), "
            + verdict("api_p99_under_sql_abuse_s", "api_under_sql_abuse_goal_met", "successful")
            + f" (answers: {outcomes(abuse['sql_abuse']['api'])})",
        ),
        (
            "jobscope: SQL abuse: freshness p99 of the probes seen, s, alone; under abuse "
            "(probes seen)",
            f"{_fmt(js['freshness_p99_no_abuse_s'], '{:.3f}')}; "
            f"{_fmt(js['freshness_p99_under_sql_abuse_s'], '{:.3f}')} "
            f"({ratio('freshness_seen_ratio_under_sql_abuse')}), "
            + verdict(
                "freshness_p99_under_sql_abuse_s", "freshness_under_sql_abuse_goal_met", "seen"
            ),
        ),
        (
            f"jobscope: SQL abuse: small job queries per s with {abuse['clients']} clients "
            "(p99 of the successful answers, s; answers successful)",
            f"{_fmt(js['api_small_queries_per_s'], '{:,.1f}')} "
            f"({_fmt(js['api_small_queries_p99_s'], '{:.3f}')}; "
            f"{ratio('api_small_queries_success_ratio')}; "
            f"answers: {outcomes(abuse['throughput'])})",
        ),
        (
            "jobscope: SQL abuse: what the abusive reader got",
            f"{outcomes(abuse['abusers'])}; {abuse['abusers']['still_running']} still running "
            "after KILL",
        ),
    ]


def polling_markdown(results: dict[str, Any]) -> str:
    """The polling benchmarks (bench/polling/): collectors' efficiency on real devices."""
    lines = ["| polling (real devices) | value |", "|---|---|"]
    snmp = results.get("snmp_polling")
    if snmp is not None:
        ratio = results.get("snmp_vs_exporter")
        kw = results.get("kwollector_oids_per_core_s")
        rows = [
            ("SNMP: jobscope producer, OIDs per CPU-second", results.get("snmp_oids_per_core_s")),
            (
                f"SNMP: snmp_exporter {snmp['versions']['snmp_exporter']}, OIDs per CPU-second",
                results.get("snmp_exporter_oids_per_core_s"),
            ),
        ]
        for title, value in rows:
            lines.append(f"| {title} | {_fmt(value, '{:,.0f}')} |")
        lines.append(
            "| SNMP: Kwollect's kwollector 1.3.1 (to PostgreSQL), OIDs per CPU-second | "
            + (_fmt(kw, "{:,.0f}") if kw else f"n/a ({results.get('kwollector_error', '?')})")
            + " |"
        )
        verdict = "" if ratio is None else f"; goal >= {SNMP_GOAL:g}: "
        verdict += "" if ratio is None else ("met" if ratio >= SNMP_GOAL else "MISSED")
        lines += [
            f"| SNMP: jobscope / snmp_exporter | {_fmt(ratio, '{:.2f}x')}{verdict} |",
            "| SNMP: jobscope / kwollector | "
            f"{_fmt(results.get('snmp_vs_kwollector'), '{:.2f}x')} |",
            "| SNMP: jobscope tick lateness p99 under that load, ms | "
            f"{_fmt(results.get('snmp_tick_lateness_p99_ms'), '{:.1f}')} |",
            "| SNMP: agents' CPU while polled (all snmpd processes, the busiest run), cores | "
            f"{_fmt(results.get('snmp_agents_cpu_cores'), '{:.3f}')} |",
        ]
    if "ipmi_sensors_per_core_s" in results or any(k.startswith("ipmi_") for k in results):
        ipmi = results.get("ipmi_polling", {})
        lines += [
            "| IPMI: jobscope producer (to Kafka), readings per CPU-second | "
            f"{_fmt(results.get('ipmi_sensors_per_core_s'), '{:,.0f}')} |",
            "| IPMI: jobscope producer CPU per reading, µs; readings stored per second "
            f"({ipmi.get('bmcs', '?')} BMCs every {ipmi.get('period_ms', '?')} ms) | "
            f"{_fmt(results.get('ipmi_producer_cpu_us_per_reading'), '{:,.0f}')}; "
            f"{_fmt(results.get('ipmi_readings_per_s'), '{:,.0f}')} |",
            f"| IPMI: peer | none ({ipmi.get('no_peer', 'not measured')}) |",
        ]
    if "wattmeter_polling" in results:
        met = results.get("wattmeter_goal_met")
        lines += [
            "| Wattmeters 50 Hz: jobscope producer, readings per CPU-second | "
            f"{_fmt(results.get('wattmeter_readings_per_core_s'), '{:,.0f}')}"
            + ("" if met is None else "; goal >= 200,000: " + ("met" if met else "MISSED"))
            + " |",
            "| Wattmeters 50 Hz: Kwollect's kwollector_wattmetre, readings per CPU-second | "
            f"{_fmt(results.get('kwollector_wattmetre_readings_per_core_s'), '{:,.0f}')}"
            + (" (did NOT keep up)" if results.get("kwollector_wattmetre_kept_up") is False else "")
            + " |",
            "| Wattmeters: jobscope / kwollector_wattmetre, at "
            f"{_fmt(results.get('wattmeter_vs_kwollector_meters'), '{:,}')} meters each | "
            f"{_fmt(results.get('wattmeter_vs_kwollector'), '{:.2f}x')} |",
        ]
        if "jobscope_at_kwollect_load" in results["wattmeter_polling"]["systems"]:
            lines.insert(
                -2,
                "| Wattmeters 50 Hz: jobscope producer at Kwollect's load, readings per "
                "CPU-second | "
                f"{_fmt(results.get('wattmeter_at_kwollect_load_readings_per_core_s'), '{:,.0f}')}"
                " |",
            )
    if "prometheus_polling" in results:
        lines += [
            "| Prometheus exporters: jobscope producer, samples per CPU-second | "
            f"{_fmt(results.get('prometheus_samples_per_core_s'), '{:,.0f}')} |",
            "| Prometheus exporters: Prometheus server, samples per CPU-second | "
            f"{_fmt(results.get('prometheus_server_samples_per_core_s'), '{:,.0f}')} |",
            "| Prometheus exporters: jobscope / Prometheus | "
            f"{_fmt(results.get('prometheus_vs_server'), '{:.2f}x')} |",
        ]
    for name, title in (
        ("remote_write", "remote_write"),
        ("line_protocol", "Influx line protocol"),
    ):
        ratio, goal = results.get(f"{name}_vs_victoriametrics"), results.get("remote_write_goal")
        if ratio is None or goal is None:
            continue
        lines += [
            f"| {title}: jobscope's gateway (to Kafka), samples per CPU-second | "
            f"{_fmt(results.get(f'{name}_samples_per_core_s'), '{:,.0f}')} |",
            f"| {title}: VictoriaMetrics, samples per CPU-second | "
            f"{_fmt(results.get(f'{name}_victoriametrics_samples_per_core_s'), '{:,.0f}')} |",
            f"| {title}: jobscope / VictoriaMetrics | {ratio:.2f}x; goal >= {goal:g}: "
            + ("met" if ratio >= goal else "MISSED")
            + " |",
        ]
    if "on_demand_activation_s" in results:
        median, worst = results["on_demand_activation_s"], results["on_demand_activation_max_s"]
        goal = results["on_demand"]["goal_s"]
        lines.append(
            "| On-demand: API call to first activated reading stored, s (median; max) | "
            f"{median:.2f}; {worst:.2f}; goal <= {goal:g}: "
            + ("met" if worst <= goal else "MISSED")
            + " |"
        )
    lines += live_rows(results)
    for step in results.get("polling_not_available", []):
        lines.append(f"| {step} | not available |")
    if snmp is not None:
        lines += [
            "",
            f"SNMP load: {snmp['devices']} devices (one endpoint each, port {snmp['port']}) on "
            f"{snmp['agents']} snmpd {snmp['versions']['snmpd']} agents, "
            f"{snmp['oids_per_device']} OIDs per device in one GET every {snmp['period_ms']} ms "
            f"({snmp['oids_asked_per_s']:,.0f} OIDs/s asked); each collector alone, "
            f"{snmp['measure_s']} s after {snmp['warmup_s']} s of warm-up; CPU of the "
            "collector process only (not Kafka's, PostgreSQL's or the scraper's).",
        ]
        for name, r in snmp["systems"].items():
            if "error" in r:
                lines.append(f"- {name}: FAILED: {r['error']}")
                continue
            lines.append(
                f"- {name}: {r['oids_per_s']:,.0f} OIDs/s collected (completeness "
                f"{r['completeness']:.3f}), collector {r['collector_cpu_cores']:.3f} cores, "
                + ("" if r["sink_cpu_cores"] is None else f"its sink {r['sink_cpu_cores']:.3f}, ")
                + f"agents {r['agents_cpu_cores']:.3f} "
                f"(busiest {r['agent_max_cpu_cores']:.3f}), machine busy "
                f"{100 * (r['machine_busy_fraction'] or 0):.0f}%"
            )
    return "\n".join(lines)


def write_json(path: Path, results: dict[str, Any]) -> None:
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")


def plots(systems: dict[str, dict[str, Any]], folder: Path, range_minutes: float) -> list[Path]:
    """One PNG per figure: query time vs devices, vs window; ingest rate; storage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    names = [n for n in (OURS, *PEERS) if n in systems]
    written = []

    def save(fig: Any, ax: Any, filename: str, title: str, ylabel: str, log_y: bool) -> None:
        if log_y:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        fig.tight_layout()
        fig.savefig(folder / filename, dpi=120)
        plt.close(fig)
        written.append(folder / filename)

    def line_plot(
        filename: str, title: str, xlabel: str, keep: Any, x_of: Any, log_x: bool = False
    ) -> None:
        fig, ax = plt.subplots(figsize=(6, 4))
        for n in names:
            points = sorted(
                (x_of(sel), q["seconds"])
                for sel, q in systems[n].get("queries", {}).items()
                if keep(sel)
            )
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", label=systems[n]["label"])
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        save(fig, ax, filename, title, "seconds to fetch every value (log)", log_y=True)

    line_plot(
        "query_vs_devices.png",
        "Every metric of N devices, 10-minute window",
        "devices (log)",
        lambda sel: sel.endswith(",window=10min"),
        lambda sel: int(sel.split(",")[0].split("=")[1]),
        log_x=True,
    )
    line_plot(
        "query_vs_window.png",
        "Every metric of 10 devices, window length",
        "window (minutes)",
        lambda sel: sel.startswith("devices=10,"),
        _window_minutes(range_minutes),
    )

    def bar_plot(filename: str, title: str, key: str, ylabel: str, log: bool) -> None:
        fig, ax = plt.subplots(figsize=(6, 4))
        present = [n for n in names if systems[n].get(key)]
        ax.bar(
            [systems[n]["label"] for n in present],
            [systems[n][key] for n in present],
            color=["C0", "C1", "C2"][: len(present)],
        )
        save(fig, ax, filename, title, ylabel, log_y=log)

    bar_plot(
        "ingest.png",
        "Ingest rate until every reading is queryable",
        "ingest_readings_per_s",
        "readings/s",
        log=False,
    )
    bar_plot(
        "storage.png",
        "Bytes per reading on disk (float values)",
        "bytes_per_reading",
        "bytes per reading (log)",
        log=True,
    )
    return written


def _window_minutes(range_minutes: float) -> Any:
    def minutes(sel: str) -> float:
        window = sel.split("window=")[1]
        return range_minutes if window == "all" else float(window.removesuffix("min"))

    return minutes
