"""The bench's rollups at once (bench/systems/jobscope_rollups.py): the refreshes' own
queries of clickhouse/schema.sql, run in a chdb engine of this process on the tables and
views they read and write (less the TTLs: the data is dated 2026-01-01), roll up every
reading noted so far once, and the storage figure counts every table that holds parts.
No server."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from chdb import session

from bench.systems import jobscope_rollups
from clickhouse.schema import file_statements

OBJECTS = [
    "metrics",
    "metrics_1m",
    "metrics_1h",
    "metrics_latest",
    "rollup_marks",
    "rollup_pending",
    "metrics_latest_mv",
    "rollup_pending_mv",
    "rollup_marks_1m_mv",
    "rollup_marks_1h_mv",
    "rollup_pending_1m",
]
READINGS = 12_000  # 7 devices x 3 metrics, one reading every 5 s from 2026-01-01 00:00


@pytest.fixture()
def engine() -> Iterator[session.Session]:
    engine = session.Session()
    for create in file_statements(OBJECTS):
        engine.query(re.sub(r"\nTTL [^\n]*", "", create))
    engine.query(
        "INSERT INTO metrics SELECT toDateTime64('2026-01-01 00:00:00', 6, 'UTC') "
        "+ toIntervalMillisecond(number * 5000), concat('d', toString(number % 7)), "
        f"concat('m', toString(number % 3)), number, map() FROM numbers({READINGS})"
    )
    yield engine
    engine.close()


def rows(
    engine: session.Session, sql: str, params: dict[str, Any] | None = None
) -> list[list[str]]:
    answer = engine.query(sql, "TabSeparated", params=params or {}).bytes().decode()
    return [line.split("\t") for line in answer.splitlines()]


def rolled_up(engine: session.Session) -> list[int]:
    counts = rows(
        engine,
        "SELECT (SELECT sum(count) FROM metrics_1m FINAL), "
        "(SELECT sum(count) FROM metrics_1h FINAL)",
    )
    return [int(c) for c in counts[0]]


def test_every_reading_rolled_up_once(engine: session.Session) -> None:
    jobscope_rollups.roll_up_now(engine.query)

    assert rolled_up(engine) == [READINGS, READINGS]
    assert rows(
        engine,
        "SELECT count(), sum(sum), min(min), max(max) FROM metrics_1m FINAL WHERE device_id = 'd0'",
    ) == rows(
        engine,
        "SELECT uniqExact(metric_id, toStartOfMinute(timestamp)), sum(value), min(value), "
        "max(value) FROM metrics WHERE device_id = 'd0'",
    )
    jobscope_rollups.roll_up_now(engine.query)  # nothing noted since: nothing added
    assert rows(engine, "SELECT count() FROM metrics_1m") == rows(
        engine, "SELECT count() FROM metrics_1m FINAL"
    )


def test_the_scheduled_refresh_would_take_nothing_yet() -> None:
    """The view's own `until`, the minute closed 10 s ago, is what is replaced: without the
    change, readings noted this minute are not taken (what the bench would wait for)."""
    (create,) = file_statements(["metrics_1m_refresh"])
    statement = jobscope_rollups.insert_now(create)

    assert "now64(3, 'UTC') AS until" in statement
    assert "toStartOfMinute(now() - toIntervalSecond(10))" not in statement
    assert statement.startswith("INSERT INTO metrics_1m (bucket, device_id, metric_id, ")
    with pytest.raises(ValueError, match="no longer ends at a closed minute"):
        jobscope_rollups.insert_now(create.replace("toIntervalSecond(10)", "toIntervalSecond(5)"))
    with pytest.raises(ValueError, match="expected shape"):
        jobscope_rollups.insert_now(create.replace("APPEND TO", "TO"))


def test_storage_counts_every_table(engine: session.Session) -> None:
    jobscope_rollups.roll_up_now(engine.query)
    database = rows(engine, "SELECT currentDatabase()")[0][0]

    def query(sql: str, params: dict[str, Any]) -> list[list[str]]:
        return rows(engine, sql, params)

    compacted = jobscope_rollups.compact(query, engine.query, database)
    by_table = jobscope_rollups.bytes_by_table(query, database)

    expected = {
        "metrics",
        "metrics_1m",
        "metrics_1h",
        "metrics_latest",
        "rollup_marks",
        "rollup_pending",
    }
    assert set(compacted) == set(by_table) == expected
    assert all(size > 0 for size in by_table.values())
    assert (
        rows(
            engine,
            "SELECT table FROM system.parts WHERE active AND database = {db:String} "
            "GROUP BY table, partition HAVING count() > 1",
            {"db": database},
        )
        == []
    )


def test_waits_for_every_bucket_noted(engine: session.Session) -> None:
    """Buckets are noted by a view a moment after their readings are queryable: the rollups
    run at once only once every bucket of the load is noted."""
    buckets = int(
        rows(engine, "SELECT uniqExact(device_id, toStartOfMinute(timestamp)) FROM metrics")[0][0]
    )

    jobscope_rollups.wait_noted(engine.query, buckets, timeout=5)
    with pytest.raises(TimeoutError, match="buckets noted"):
        jobscope_rollups.wait_noted(engine.query, buckets + 1, timeout=0.5)
