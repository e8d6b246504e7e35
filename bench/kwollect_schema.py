"""Kwollect's PostgreSQL schema: the one definition behind every PostgreSQL peer of the bench
(the storage and query peer, bench/systems/postgres.py; kwollector and kwollector-wattmetre,
bench/polling/).

Reproduced from Kwollect 1.3.1 (PyPI `kwollect==1.3.1`), `kwollect/db/kwollect_setup_db.py`,
the `kwollect-setup-db` entry point, with its default configuration (`chunk_interval_hour: 6`,
`chunk_compress_hour: 24`): the `metrics` table (its columns, defaults and its two indexes,
names included) and `promoted_metrics`, as that script writes them.

Kwollect runs on TimescaleDB, which Debian does not package (bookworm has no timescaledb
package), so its TimescaleDB parts are reproduced in plain PostgreSQL or left out:
- `create_hypertable(..., chunk_time_interval => 6 hours)`: declarative range partitions of
  CHUNK_INTERVAL_S, aligned on the Unix epoch as TimescaleDB aligns its chunks, created
  ahead for the span asked (TimescaleDB creates a chunk when a row first needs it); with
  what `create_hypertable` adds by default: NOT NULL on the time column and an index on
  (timestamp DESC).
- Not reproduced: its compression policy (chunks older than 24 h, segmented by `device_id,
  metric_id, labels`), so every chunk here is stored as Kwollect stores its last day; the
  `metrics_summary` continuous aggregate (5-minute buckets refreshed every 5 minutes), whose
  refreshes a deployed Kwollect pays beside its ingest; the `timescaledb_toolkit` extension.
- Not created, the bench querying `metrics` itself: roles, grants and timeouts, the views
  `metrics_by_device`, `metrics_by_job` and `nodetime_by_job`, the `api` schema's functions
  served by PostgREST.
"""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg

CHUNK_INTERVAL_S = 6 * 3600
"""kwollect-setup-db's default `chunk_interval_hour: 6`."""
US = 1_000_000


def metrics_statements(table: str, start_us: int, end_us: int) -> list[str]:
    """CREATE statements of Kwollect's `metrics` table named `table` (its indexes named after
    it: Kwollect's own names for `metrics`), partitioned to hold [start_us, end_us)."""
    statements = [
        f"""CREATE TABLE {table} (
  timestamp   TIMESTAMPTZ       NOT NULL DEFAULT NOW(),
  device_id   TEXT              NOT NULL,
  metric_id   TEXT              NOT NULL,
  value       DOUBLE PRECISION  DEFAULT 'NaN',
  labels      JSONB             DEFAULT '{{}}'::JSONB
) PARTITION BY RANGE (timestamp)"""
    ]
    lo = start_us // US // CHUNK_INTERVAL_S * CHUNK_INTERVAL_S
    while lo * US < end_us:
        hi = lo + CHUNK_INTERVAL_S
        bounds = [datetime.fromtimestamp(t, UTC).isoformat() for t in (lo, hi)]
        statements.append(
            f"CREATE TABLE {table}_{lo} PARTITION OF {table} "
            f"FOR VALUES FROM ('{bounds[0]}') TO ('{bounds[1]}')"
        )
        lo = hi
    statements += [
        # create_hypertable's default index on the time column
        f"CREATE INDEX {table}_timestamp_idx ON {table} (timestamp DESC)",
        f"CREATE INDEX {table}_device_idx ON {table} (device_id, timestamp DESC)",
        f"CREATE INDEX {table}_alias_idx ON {table} ((labels->>'_device_alias'), timestamp DESC) "
        "WHERE labels ? '_device_alias'",
    ]
    return statements


PROMOTED_METRICS = """CREATE TABLE IF NOT EXISTS promoted_metrics (
  device_id   TEXT              NOT NULL,
  metric_id   TEXT              DEFAULT NULL
)"""
"""The devices and metrics Kwollect's collectors keep at full rate (on-demand monitoring)."""


def create(conn: psycopg.Connection, table: str, start_us: int, end_us: int) -> None:
    """Kwollect's tables in `conn`'s database: `table` as its `metrics`, partitioned to hold
    [start_us, end_us), and `promoted_metrics` if not there yet."""
    for statement in [*metrics_statements(table, start_us, end_us), PROMOTED_METRICS]:
        conn.execute(statement)
