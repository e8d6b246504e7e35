"""The data of the bench's report figure (bench/systems/jobscope_report.py): its INSERTs run
in a chdb engine of this process, into `metrics` as clickhouse/schema.sql defines it (less
its TTL: the bench's store keeps ten years), and what they wrote is what a site's monitoring
leaves for a 100-node, 24-hour job. No server."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from chdb import session

from bench.dataset import US
from bench.systems import jobscope_report as report
from clickhouse.schema import file_statements


@pytest.fixture(scope="module")
def engine() -> Iterator[session.Session]:
    (metrics,) = file_statements(["metrics"])
    engine = session.Session()
    engine.query(re.sub(r"\nTTL [^\n]*", "", metrics))
    for series in report.SERIES:
        sql, params = report.insert_sql(series)
        engine.query(sql, params=params)
    yield engine
    engine.close()


def rows(engine: session.Session, sql: str, **params: object) -> list[list[str]]:
    answer = engine.query(sql, "TabSeparated", params=params).bytes().decode()
    return [line.split("\t") for line in answer.splitlines()]


def test_every_reading_once_around_the_job(engine: session.Session) -> None:
    got = rows(
        engine,
        "SELECT metric_id, count(), uniqExact(timestamp, device_id, labels), "
        "toUnixTimestamp64Micro(min(timestamp)), toUnixTimestamp64Micro(max(timestamp)) "
        "FROM metrics GROUP BY metric_id",
    )

    start = report.job_start_us()
    for metric_id, count, distinct, first, last in got:
        series = next(s for s in report.SERIES if s.metric_id == metric_id)
        assert int(count) == int(distinct) == report.ticks(series) * report.NODES
        margin = report.MARGIN_S * US + report.JITTER_US
        assert start - margin <= int(first) < start - margin + series.period_s * US
        assert int(last) <= start + (report.JOB_S + report.MARGIN_S) * US + report.JITTER_US
    assert {r[0] for r in got} == {s.metric_id for s in report.SERIES}
    assert sum(int(r[1]) for r in got) == report.readings()


def test_each_node_measured_by_its_bmc_and_one_pdu_outlet(engine: session.Session) -> None:
    by_node = rows(
        engine,
        "SELECT labels['_device_alias'] AS node, uniqExact(device_id), uniqExact(labels['outlet']) "
        "FROM metrics WHERE metric_id = 'pdu_outlet_power_watt' GROUP BY node ORDER BY node",
    )
    bmc = rows(
        engine,
        "SELECT DISTINCT device_id FROM metrics WHERE metric_id = 'bmc_node_power_watt' "
        "ORDER BY device_id",
    )

    assert [r[0] for r in by_node] == report.nodes() == [r[0] for r in bmc]
    assert all(r[1:] == ["1", "1"] for r in by_node)
    pdus = rows(
        engine, "SELECT DISTINCT device_id FROM metrics WHERE mapContains(labels, 'outlet')"
    )
    assert sorted(r[0] for r in pdus) == report.pdus()


def test_power_sources_agree_as_a_bmc_and_a_plug_meter_do(engine: session.Session) -> None:
    """The BMC reads ~6% under the outlet, both follow the node's load within its range."""
    ((ratio, low, high),) = rows(
        engine,
        "SELECT avgIf(value, metric_id = 'bmc_node_power_watt') / "
        "avgIf(value, metric_id = 'pdu_outlet_power_watt'), min(value), max(value) "
        "FROM metrics WHERE metric_id LIKE '%power_watt'",
    )

    assert 0.92 < float(ratio) < 0.96
    assert float(low) >= 90 and float(high) <= 380


def test_counters_only_increase(engine: session.Session) -> None:
    ((decreases, series),) = rows(
        engine,
        "SELECT countIf(d < 0), uniqExact(device_id, metric_id) FROM ("
        "SELECT device_id, metric_id, value - lagInFrame(value, 1, value) OVER ("
        "PARTITION BY device_id, metric_id ORDER BY timestamp) AS d "
        "FROM metrics WHERE metric_id LIKE '%bytes_total')",
    )

    assert (decreases, series) == ("0", str(2 * report.NODES))


def test_devices_poll_at_their_own_phase(engine: session.Session) -> None:
    """Within a period the nodes' polls are spread over every second, each with jitter."""
    ((seconds, jitter),) = rows(
        engine,
        "SELECT uniqExact(intDiv(us - {s:Int64}, 1000000) % 10), uniqExact(us % 1000) "
        "FROM (SELECT toUnixTimestamp64Micro(timestamp) AS us FROM metrics "
        "WHERE metric_id = 'bmc_node_power_watt')",
        s=report.job_start_us() - (report.MARGIN_S + 1) * US,  # every difference positive
    )

    assert int(seconds) == 10
    assert int(jitter) > 900


def test_the_job_spans_24_hours_of_its_nodes() -> None:
    job = report.job_document()

    span = datetime.fromisoformat(job["end"]) - datetime.fromisoformat(job["start"])
    assert span == timedelta(hours=24, microseconds=-1)
    assert job["nodes"] == report.nodes() and len(job["nodes"]) == report.NODES
    assert job["state"] == "terminated"
