"""Migrations apply in order to a fresh database, again as a no-op, and refuse edits."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka.admin import AdminClient, NewTopic

from clickhouse.migrate import (
    MIGRATIONS_DIR,
    MigrationSettings,
    apply_migrations,
    connect,
    statements,
    superseded,
)
from stack import services
from stack.config import StackSettings


@contextmanager
def scratch_database(
    clickhouse: StackSettings, admin_client: Client, prefix: str
) -> Iterator[tuple[Client, MigrationSettings]]:
    """A fresh database with topics and consumer groups of its own, dropped afterwards
    (Kafka tables included)."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin_client.command(f"CREATE DATABASE {name}")
    settings = services.migration_settings(
        clickhouse,
        clickhouse_database=name,
        readings_topic=f"{name}-readings",
        jobs_topic=f"{name}-jobs",
        consumer_group=f"{name}-group",
    )
    admin = AdminClient({"bootstrap.servers": clickhouse.kafka_bootstrap})
    for topic in (settings.readings_topic, settings.jobs_topic):
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    try:
        yield connect(settings), settings
    finally:
        admin_client.command(f"DROP DATABASE {name}")


def release(tmp_path: Path, pattern: str) -> Path:
    """A folder holding the migrations of an earlier release (those matching `pattern`)."""
    old = tmp_path / "release"
    old.mkdir()
    for path in sorted(MIGRATIONS_DIR.glob(pattern)):
        shutil.copy(path, old)
    return old


@pytest.fixture(scope="module")
def database(
    clickhouse: StackSettings, admin_client: Client
) -> Iterator[tuple[Client, MigrationSettings]]:
    """One fresh database for this module."""
    with scratch_database(clickhouse, admin_client, "mig") as database:
        yield database


def test_fresh_then_again(database: tuple[Client, MigrationSettings]) -> None:
    client, settings = database
    files = sorted(p.name for p in MIGRATIONS_DIR.glob("*.sql"))
    replaced = {old for p in MIGRATIONS_DIR.glob("*.sql") for old in superseded(p.read_text())}
    assert "0006_create_readings_queue.sql" in replaced  # the consumer of the old layout
    assert apply_migrations(client, settings) == [f for f in files if f not in replaced]
    recorded = client.query("SELECT name FROM schema_migrations ORDER BY name").result_rows
    assert [row[0] for row in recorded] == files  # superseded ones too: never run later
    assert apply_migrations(client, settings) == []
    assert apply_migrations(client, settings) == []
    tables = {row[0] for row in client.query("SHOW TABLES").result_rows}
    assert {
        "metrics",
        "ingest_errors",
        "readings_queue",
        "readings_queue_metrics_mv",
        "readings_queue_errors_mv",
    } <= tables
    # 0008 replaced the row-per-reading pipeline of 0003-0007
    assert not {"readings_stream", "readings_queue_mv", "readings_metrics_mv"} & tables
    engine = client.command(
        "SELECT engine FROM system.tables WHERE database = currentDatabase() "
        "AND name = 'readings_queue'"
    )
    assert engine == "Kafka"


def test_upgrade_from_the_row_per_reading_pipeline(
    clickhouse: StackSettings, admin_client: Client, tmp_path: Path
) -> None:
    """A database made by 0001-0007 (a landed release) gets 0008: the old consumer and its
    views go, the array pipeline takes the same topic and group."""
    old = release(tmp_path, "000[1-7]_*.sql")
    with scratch_database(clickhouse, admin_client, "up") as (client, settings):
        apply_migrations(client, settings, old)
        assert client.command("EXISTS TABLE readings_stream") == 1
        later = sorted(p.name for p in MIGRATIONS_DIR.glob("*.sql") if p.name >= "0008")
        assert apply_migrations(client, settings) == later
        tables = {row[0] for row in client.query("SHOW TABLES").result_rows}
        assert {"readings_queue", "readings_queue_metrics_mv", "readings_queue_errors_mv"} <= tables
        assert not {"readings_stream", "readings_queue_mv", "readings_metrics_mv"} & tables
        assert "Array(Tuple(" in client.command(
            "SELECT create_table_query FROM system.tables "
            "WHERE database = currentDatabase() AND name = 'readings_queue'"
        )


def test_edited_migration_is_refused(
    database: tuple[Client, MigrationSettings], tmp_path: Path
) -> None:
    client, settings = database
    copy = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, copy)
    apply_migrations(client, settings, copy)  # same files as applied: nothing to do
    first = sorted(copy.glob("*.sql"))[0]
    first.write_text(first.read_text() + "\n-- edited\n")
    with pytest.raises(RuntimeError, match="changed after it was applied"):
        apply_migrations(client, settings, copy)


def test_retention_follows_configuration(database: tuple[Client, MigrationSettings]) -> None:
    client, settings = database
    apply_migrations(client, settings.model_copy(update={"retention_days": 7}))
    create = client.command(
        "SELECT create_table_query FROM system.tables "
        "WHERE database = currentDatabase() AND name = 'metrics'"
    )
    assert "toIntervalDay(7)" in create
    rollup = client.command(
        "SELECT create_table_query FROM system.tables "
        "WHERE database = currentDatabase() AND name = 'metrics_1m'"
    )
    assert "toIntervalDay(7)" in rollup


def test_upgrade_keeps_readings_and_fills_derived_tables(
    clickhouse: StackSettings, admin_client: Client, tmp_path: Path
) -> None:
    """A database of the previous release (0001-0009) with readings: 0010 rebuilds `metrics`
    with the series key and keeps every reading; the rollups, latest values and aliases are
    filled from them; readings that differ only by labels are then kept apart."""
    old = release(tmp_path, "000*.sql")
    columns = ["timestamp", "device_id", "metric_id", "value", "labels"]
    with scratch_database(clickhouse, admin_client, "up") as (client, settings):
        apply_migrations(client, settings, old)
        client.command(
            "INSERT INTO metrics SELECT toStartOfHour(now64(6)) - INTERVAL 1 HOUR + number, "
            "'pdu-1', 'pdu_outlet_power_watt', number, map('_device_alias', 'node-1') "
            "FROM numbers(150)"
        )
        apply_migrations(client, settings)
        assert client.command("SELECT count() FROM metrics FINAL") == 150
        assert client.command("SELECT sum(count) FROM metrics_1m") == 150
        assert client.command("SELECT sum(count) FROM metrics_1h") == 150
        assert client.query("SELECT device_id, value FROM metrics_latest FINAL").result_rows == [
            ("pdu-1", 149.0)
        ]
        assert client.query("SELECT alias, device_id FROM device_aliases").result_rows == [
            ("node-1", "pdu-1")
        ]
        assert client.command("EXISTS TABLE jobs") == 1
        t = datetime.now(UTC).replace(tzinfo=None)
        client.insert(
            "metrics",
            [
                [t, "pdu-1", "p_watt", 1.0, {"outlet": "1"}],
                [t, "pdu-1", "p_watt", 2.0, {"outlet": "2"}],
            ],
            column_names=columns,
        )
        assert client.command("SELECT count() FROM metrics FINAL WHERE metric_id = 'p_watt'") == 2


def test_a_file_holds_statements_ending_at_line_ends() -> None:
    sql = (
        "-- what and why\nDROP VIEW IF EXISTS a;\n\n"
        "CREATE TABLE b\n(x String DEFAULT ';')\n;\nSELECT 1"
    )
    assert statements(sql) == [
        "-- what and why\nDROP VIEW IF EXISTS a",
        "CREATE TABLE b\n(x String DEFAULT ';')",
        "SELECT 1",
    ]
    assert statements("-- a comment only;\n") == []
