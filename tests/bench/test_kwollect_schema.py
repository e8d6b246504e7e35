"""Every PostgreSQL peer of the bench holds Kwollect 1.3.1's schema (bench/kwollect_schema.py):
the storage and query peer (bench/systems/postgres.py), loading a small data set, and the
polling peers' tables (bench/polling/kwollect.py), on a real PostgreSQL 15 as the bench
starts it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from bench.dataset import DatasetSpec, load_or_generate
from bench.kwollect_schema import CHUNK_INTERVAL_S
from bench.polling.kwollect import create_tables
from bench.systems.postgres import PG_BIN, Postgres


@pytest.fixture(autouse=True)
def _installed() -> None:
    assert (PG_BIN / "postgres").exists(), (
        "postgresql-15 is missing: stack/install-system-deps.sh installs it"
    )


# What kwollect/db/kwollect_setup_db.py (Kwollect 1.3.1) makes of `metrics`, as PostgreSQL
# describes it: its two indexes and the time index create_hypertable adds.
KWOLLECT_INDEXES = {
    'CREATE INDEX metrics_timestamp_idx ON ONLY public.metrics USING btree ("timestamp" DESC)',
    "CREATE INDEX metrics_device_idx ON ONLY public.metrics USING btree "
    '(device_id, "timestamp" DESC)',
    "CREATE INDEX metrics_alias_idx ON ONLY public.metrics USING btree "
    "(((labels ->> '_device_alias'::text)), \"timestamp\" DESC) "
    "WHERE (labels ? '_device_alias'::text)",
}
KWOLLECT_COLUMNS = [
    ("timestamp", "timestamp with time zone", "NO", "now()"),
    ("device_id", "text", "NO", None),
    ("metric_id", "text", "NO", None),
    ("value", "double precision", "YES", "'NaN'::double precision"),
    ("labels", "jsonb", "YES", "'{}'::jsonb"),
]


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    server = Postgres(tmp_path_factory.mktemp("kwollect-pg"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _connect(pg: Postgres, dbname: str) -> psycopg.Connection:
    return psycopg.connect(
        host="127.0.0.1", port=pg.port, user="postgres", dbname=dbname, autocommit=True
    )


def _schema(conn: psycopg.Connection, table: str) -> tuple[set[str], list[tuple], list[tuple]]:
    """`table`'s index definitions (its name written `metrics`), columns and partitions."""
    indexes = {
        row[0].replace(table, "metrics")
        for row in conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", (table,))
    }
    columns = conn.execute(
        "SELECT column_name, data_type, is_nullable, column_default "
        "FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    partitions = conn.execute(
        "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_partition_tree(%s) t "
        "JOIN pg_class c ON c.oid = t.relid WHERE t.isleaf ORDER BY 1",
        (table,),
    ).fetchall()
    return indexes, columns, partitions


def test_storage_peer_loads_into_kwollects_schema(pg: Postgres, tmp_path: Path) -> None:
    """The storage peer's tables, the loaded one and the integer variant's, are Kwollect's
    `metrics`, partitioned in 6-hour chunks aligned on the epoch; every reading goes in."""
    data = load_or_generate(DatasetSpec(devices=2, duration_s=60), tmp_path / "data")
    ingest = pg.load(data)
    assert ingest.readings == data.spec.readings == 2_400
    pg.storage_bytes_of(data)
    with _connect(pg, "postgres") as conn:
        for table in pg.tables:
            indexes, columns, partitions = _schema(conn, table)
            assert indexes == KWOLLECT_INDEXES, table
            assert columns == KWOLLECT_COLUMNS, table
            assert partitions == [
                ("FOR VALUES FROM ('2026-01-01 00:00:00+00') TO ('2026-01-01 06:00:00+00')",)
            ]
        (promoted,) = conn.execute(  # type: ignore[misc]
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'promoted_metrics'"
        ).fetchone()
        (stored,) = conn.execute("SELECT count(*) FROM metrics").fetchone()  # type: ignore[misc]
    assert promoted == 1
    assert stored == data.spec.readings
    assert CHUNK_INTERVAL_S == 6 * 3600


def test_polling_peers_write_into_the_same_schema(pg: Postgres) -> None:
    """kwollector's and kwollector-wattmetre's tables (readings of now) are the same `metrics`
    and `promoted_metrics`, and take a reading of now as the collectors write it."""
    with _connect(pg, "postgres") as conn:
        conn.execute("CREATE DATABASE live")
    with _connect(pg, "live") as conn:
        create_tables(conn)
        indexes, columns, partitions = _schema(conn, "metrics")
        conn.execute(
            "INSERT INTO metrics(timestamp, device_id, metric_id, value, labels) "
            "VALUES (now(), 'node-1', 'wattmetre_power_watt', 1.5, '{}')"
        )
        conn.execute("INSERT INTO promoted_metrics (device_id, metric_id) VALUES ('node-1', 'w')")
    assert indexes == KWOLLECT_INDEXES
    assert columns == KWOLLECT_COLUMNS
    assert len(partitions) >= 8  # a day either side of now, in 6-hour chunks
