"""The PostgreSQL peer's phases (bench/systems/postgres.py) on the real server (Debian's
postgresql-15, which bench/install-peers.sh installs; skipped where it is not): the load
is timed to the COPYs' commits, the full count and VACUUM come after it, apart, and the
storage figure counts every table of the database, not only the partitioned `metrics`."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.dataset import DatasetSpec, load_or_generate
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
