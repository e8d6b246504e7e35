"""`clickhouse.schema.file_statements` gives what clickhouse/schema.sql defines, the live
definition of each object (what code such as the bench builds production objects from), not
one of the migrations' earlier ones. No server: the file is read as committed
(tests/clickhouse/test_schema_file.py checks that it is what the migrations give)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clickhouse import schema

METRICS_VIEW = "readings_queue_metrics_mv"


def test_objects_of_the_migrations_that_stand() -> None:
    """Each a migration's; metrics_1h_mv (0012), replaced by a refresh in 0022, is not."""
    defined = set(schema.file_definitions())

    assert defined <= schema.migration_objects()
    assert {"metrics", "readings_queue", METRICS_VIEW, "metrics_1h_refresh"} <= defined
    assert "metrics_1h_mv" not in defined


def test_a_redefined_view_is_its_last_definition() -> None:
    """readings_queue_metrics_mv is created by 0008, 0015, 0018 and 0021: the live one (as
    0018 made it, re-created unchanged by 0021) labels readings with the topic's site."""
    (create,) = schema.file_statements([METRICS_VIEW])

    assert create.startswith(f"CREATE MATERIALIZED VIEW {METRICS_VIEW} TO metrics\n")
    assert "mapUpdate(r.labels, map('_site', site))" in create
    assert not create.endswith(";")
    assert schema.SCHEMA_FILE.read_text().count(f"VIEW {METRICS_VIEW} ") == 1


def test_a_recreated_table_has_its_last_settings() -> None:
    """readings_queue: 0008 gave a thread per consumer, 0021 one thread polling them all."""
    (create,) = schema.file_statements(["readings_queue"])

    assert "kafka_thread_per_consumer = 0," in create


def test_without_the_files_header() -> None:
    """The file's first statement follows its header of comments, which is not part of it."""
    first = next(iter(schema.file_definitions()))

    assert schema.file_statements([first])[0].startswith(f"CREATE FUNCTION {first} AS ")


def test_names_in_the_order_asked() -> None:
    names = ["metrics", "jobscope_topic_site", "readings_queue"]

    creates = schema.file_statements(names)

    assert [c.split("\n")[0].split(" ")[2] for c in creates] == [
        "metrics",
        "jobscope_topic_site",
        "readings_queue",
    ]


def test_a_name_the_file_lacks_is_refused() -> None:
    with pytest.raises(KeyError, match="no_such_table"):
        schema.file_statements(["metrics", "no_such_table"])


def test_a_file_defining_a_name_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "schema.sql"
    path.write_text(
        "-- header\n\nCREATE TABLE t\n(\n    `a` UInt8\n)\nENGINE = Memory;\n\n"
        "CREATE VIEW t AS SELECT 1;\n"
    )

    with pytest.raises(ValueError, match="t is defined twice"):
        schema.file_definitions(path)
