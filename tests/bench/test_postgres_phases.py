"""The PostgreSQL peer's phases (bench/systems/postgres.py) on the real server (Debian's
postgresql-15, which bench/install-peers.sh installs; skipped where it is not): the load
is timed to the COPYs' commits, the full count and VACUUM come after it, apart, and the
storage figure counts every table of the database, not only the partitioned `metrics`; its
binary COPY input stores exactly the data set's readings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from bench.dataset import DatasetSpec, load_or_generate
from bench.systems.base import Selection
from bench.systems.postgres import PG_BIN, Postgres


@pytest.fixture(autouse=True)
def _installed() -> None:
    assert (PG_BIN / "postgres").exists(), (
        "postgresql-15 is missing: stack/install-system-deps.sh installs it"
    )


def test_phases_and_storage_of_every_table(tmp_path: Path) -> None:
    data = load_or_generate(DatasetSpec(devices=2, duration_s=60), tmp_path / "data")
    pg = Postgres(tmp_path / "pg")
    pg.start()
    try:
        pg.load(data)
        assert pg.stored(data) == data.spec.readings
        pg.compact()
        by_table = pg.storage_by_table()

        assert set(by_table) == {"metrics", "promoted_metrics"}  # Kwollect's two tables
        assert by_table["metrics"] > 0
        assert pg.storage_bytes() == sum(by_table.values())
    finally:
        pg.stop()


def test_fetches_reuse_one_kept_connection(tmp_path: Path) -> None:
    """The querying client keeps one connection (issue 32: a new one per fetch timed a fork
    and cold caches): after three fetches one backend, the one that ran them, is still
    connected; a fetch on a connection of its own would leave none, a leaked one three."""
    data = load_or_generate(DatasetSpec(devices=2, duration_s=60), tmp_path / "data")
    pg = Postgres(tmp_path / "pg")
    pg.start()
    try:
        pg.load(data)
        selection = Selection("both", (0, 1), data.spec.start_us, data.spec.end_us)
        for _ in range(3):
            assert pg.count(pg.fetch(data, selection)) == data.spec.readings
        with pg._connect() as conn:
            backends = conn.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE backend_type = 'client backend' AND query LIKE 'COPY (SELECT%'"
            ).fetchall()
        pids = [pid for (pid,) in backends]
        assert len(pids) == 1
        assert pg.query_conn is not None and pids == [pg.query_conn.info.backend_pid]
    finally:
        pg.stop()
    assert pg.query_conn is None  # closed with the server


def test_binary_copy_stores_exactly_the_data_sets_readings(tmp_path: Path) -> None:
    """The pre-built COPY BINARY parts (bench/payloads.py `postgres_binary`) hold every
    reading once, with its microseconds, names and float64 value bit for bit."""
    data = load_or_generate(DatasetSpec(devices=3, duration_s=60), tmp_path / "data")
    pg = Postgres(tmp_path / "pg")
    pg.start()
    try:
        pg.load(data)
        with pg._connect() as conn:
            rows = conn.execute(
                "SELECT timestamp, device_id, metric_id, value, labels FROM metrics"
            ).fetchall()
    finally:
        pg.stop()
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    got = sorted(
        (
            (ts - epoch) // timedelta(microseconds=1),
            device,
            metric,
            np.float64(value).view(np.int64),
            labels,
        )
        for ts, device, metric, value, labels in rows
    )
    expected = sorted(
        (int(data.poll_us[t, d]), device, metric, data.values[t, d, m].view(np.int64), {})
        for t in range(data.spec.ticks)
        for d, device in enumerate(data.devices)
        for m, metric in enumerate(data.metrics)
    )
    assert len(got) == data.spec.readings
    assert got == expected
