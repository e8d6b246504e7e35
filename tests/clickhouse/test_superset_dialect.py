"""Superset's `clickhousedb://` dialect (clickhouse-connect's SQLAlchemy dialect, with the
SQLAlchemy 1.4 Superset 6.1 requires) introspects and queries the local server as `reader`."""

from __future__ import annotations

from urllib.parse import quote

import sqlalchemy as sa

from stack import services
from stack.config import StackSettings


def test_clickhousedb_dialect(clickhouse: StackSettings) -> None:
    password = services.clickhouse_password(clickhouse, "reader")
    engine = sa.create_engine(
        f"clickhousedb://reader:{quote(password)}@{clickhouse.host}:{clickhouse.clickhouse_port}"
        "/default"
    )
    inspector = sa.inspect(engine)
    assert {"metrics", "ingest_errors"} <= set(inspector.get_table_names())
    columns = {c["name"]: str(c["type"]) for c in inspector.get_columns("metrics")}
    assert list(columns) == ["timestamp", "device_id", "metric_id", "value", "labels"]
    with engine.connect() as conn:
        got = conn.execute(
            sa.text("SELECT count() AS n FROM metrics WHERE device_id = :d"),
            {"d": "no-such-device"},
        ).scalar()
        assert got == 0
        metrics = sa.Table("metrics", sa.MetaData(), autoload_with=conn)
        query = (
            sa.select(sa.func.count())
            .select_from(metrics)
            .where(metrics.c.device_id == "x' OR 1=1 --")
        )
        assert conn.execute(query).scalar() == 0
