"""The query figures of bench/report.py (issue 32): the ratios compare each system's user
layer (jobscope's API), and jobscope's time straight from ClickHouse is printed beside its
API time, with the API format, never in its place. On a results dict shaped as
bench/runner.py `query_phase` writes it; no servers."""

from __future__ import annotations

from typing import Any

from bench import report
from bench.profiles import KEY_SELECTION

SMALL = "devices=1,window=10min"


def systems() -> dict[str, dict[str, Any]]:
    def peer(label: str, seconds: float) -> dict[str, Any]:
        shapes = {sel: {"seconds": seconds} for sel in (KEY_SELECTION, SMALL)}
        return {"label": label, "queries": shapes, "query_100dev_10min_s": seconds}

    api = {"seconds": 0.2, "format": "arrow", "layers": {"clickhouse_direct": 0.05}}
    return {
        "jobscope": {
            "label": "jobscope",
            "queries": {KEY_SELECTION: api, SMALL: {**api, "format": "csv"}},
            "query_100dev_10min_s": 0.2,
            "query_layer": "the API",
        },
        "peer_victoriametrics": peer("VictoriaMetrics", 0.1),
        "peer_postgres": peer("PostgreSQL 15", 0.4),
    }


def test_ratios_compare_the_user_layers() -> None:
    results = report.flatten(systems(), {})

    assert results["ratios"]["query_100dev_10min_s_vs_victoriametrics"] == 0.1 / 0.2
    assert results["ratios"]["query_100dev_10min_s_vs_postgres"] == 0.4 / 0.2
    assert results["query_100dev_10min_direct_s"] == 0.05
    assert results["query_100dev_10min_format"] == "arrow"
    assert results["queries_direct_s"][SMALL] == 0.05


def test_the_table_shows_the_direct_time_beside_the_api_time() -> None:
    sy = systems()
    table = report.markdown(sy, report.flatten(sy, {}))
    key_row = next(line for line in table.splitlines() if line.startswith("| query 100 devices"))
    small_row = next(line for line in table.splitlines() if "devices=1, window=10min" in line)

    assert "| 0.200 (arrow; ClickHouse directly 0.050) | 0.100 | 0.400 | 0.50x | 2.00x |" in key_row
    assert "| 0.200 (csv; ClickHouse directly 0.050) |" in small_row


def test_a_format_quick_leaves_out_is_not_shown_as_failed() -> None:
    """QUICK times the job API in QUICK_FORMATS only: the others are said not measured, where
    a full run's missing format (abandoned, failed) is n/a."""
    js = {"api_1m_json_s": 0.3, "api_1m_direct_json_s": 0.2, "api_1m_parquet_s": None}
    js |= {"api_1m_direct_parquet_s": 0.1, "api_1m_arrow_s": 0.05, "api_1m_direct_arrow_s": 0.04}

    def by_format(quick: bool) -> str:
        return next(value for title, value in report.api_rows(js, quick) if "by format" in title)

    assert by_format(quick=True) == (
        "json 0.300 / 0.200; parquet n/a / 0.100; arrow 0.050 / 0.040; "
        "ndjson, csv not measured (QUICK)"
    )
    assert "ndjson n/a / n/a; csv n/a / n/a" in by_format(quick=False)
    sy = {"jobscope": {**systems()["jobscope"], **js}}
    table = report.markdown(sy, {**report.flatten(sy, {}), "profile": "quick"})
    assert "ndjson, csv not measured (QUICK)" in table
    assert "not measured (QUICK)" not in report.markdown(sy, report.flatten(sy, {}))
