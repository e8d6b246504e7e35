"""The ClickHouse server records what its /metrics computes in `server_health`
(stack/clickhouse_server/monitoring.py HealthRecorder, clickhouse/migrations/0027): the figures
the shipped alert rules watch, for SQL readers and the Devices dashboard (whose test, in
tests/superset/test_dashboards.py, draws them)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from stack.clickhouse_server.engine import Engine
from stack.clickhouse_server.monitoring import HealthRecorder
from stack.config import StackSettings
from stack.processes import wait_until

RECENT = "SELECT figure, subject, value FROM server_health WHERE time > now() - INTERVAL 5 MINUTE"
MIGRATION = Path(__file__).parents[2] / "clickhouse/migrations/0027_create_server_health.sql"


class _Figures:
    """What ServerMetrics.health returns, fixed: the figures of a stack would need one running
    (the slow test below records those)."""

    def __init__(self, rows: list[tuple[str, str, float]]) -> None:
        self.rows = rows

    def health(self) -> list[tuple[str, str, float]]:
        return self.rows


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    """The real engine, in memory, with the server_health table of the migration."""
    engine = Engine(tmp_path, ":memory:", 1)
    with engine.control() as conn:
        conn.run(MIGRATION.read_text())
    yield engine
    engine.close(0)


def _stored(engine: Engine) -> list[list[object]]:
    with engine.control() as conn:
        sql = "SELECT figure, subject, value FROM server_health ORDER BY subject"
        out = conn.run(sql, fmt="JSONCompactEachRow")
    return [json.loads(line) for line in out.decode().splitlines()]


def test_names_holding_quotes_are_stored_verbatim(engine: Engine) -> None:
    """A view or Kafka table may be named by anyone who can create one: its name is a value
    bound to the statement, never SQL (a name closing the quote must not add a row)."""
    attack = "default.v', 'x', 1), (now(), 'forged"
    rows = [("rollup_refresh_age_seconds", attack, 2.5), ("data_bytes", "back\\slash", 1e20)]
    assert HealthRecorder(_Figures(rows), engine, 0).record() == 2  # type: ignore[arg-type]
    assert _stored(engine) == [
        ["data_bytes", "back\\slash", 1e20],
        ["rollup_refresh_age_seconds", attack, 2.5],
    ]


def test_nothing_to_record_writes_nothing(engine: Engine) -> None:
    """No figure (no table, no view yet) is no statement, not a syntax error every 10 s."""
    assert HealthRecorder(_Figures([]), engine, 0).record() == 0  # type: ignore[arg-type]
    assert _stored(engine) == []


@pytest.mark.slow
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
