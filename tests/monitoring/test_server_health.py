"""The ClickHouse server records what its /metrics computes in `server_health`
(stack/clickhouse_server/monitoring.py HealthRecorder, clickhouse/migrations/0027): the figures
the shipped alert rules watch, for SQL readers and the Devices dashboard (whose test, in
tests/superset/test_dashboards.py, draws them)."""

from __future__ import annotations

import time

import pytest
from clickhouse_connect.driver.client import Client

from stack.config import StackSettings
from stack.processes import wait_until

pytestmark = pytest.mark.slow
RECENT = "SELECT figure, subject, value FROM server_health WHERE time > now() - INTERVAL 5 MINUTE"


def test_server_health_recorded_for_sql_readers(
    clickhouse: StackSettings, reader_client: Client
) -> None:
    """Read as a read-only SQL user, through the server's SQL guard, as Superset reads it: the
    readings table's consumer lag, the minute rollup's refresh, the disk, the start time."""

    def recorded() -> dict[tuple[str, str], float] | None:
        rows = reader_client.query(RECENT).result_rows
        figures = {(figure, subject): value for figure, subject, value in rows}
        return figures if any(f == "kafka_consumer_lag" for f, _ in figures) else None

    # a record made before the migrations created the Kafka tables has no lag: the next has
    figures = wait_until(recorded, 150, "the server's health record with the consumer lag")
    lag = [v for (f, s), v in figures.items() if f == "kafka_consumer_lag" and "readings" in s]
    assert lag and all(v >= 0 for v in lag), figures
    assert ("rollup_refresh_age_seconds", "default.metrics_1m_refresh") in figures, figures
    assert figures[("data_bytes", "")] > 0 and figures[("disk_free_bytes", "")] > 0
    started = figures[("process_start_time_seconds", "")]
    assert time.time() - 86400 < started < time.time(), started
