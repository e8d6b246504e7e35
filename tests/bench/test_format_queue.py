"""The bench's format comparison reads through the production readings table of
clickhouse/schema.sql, changed only where the comparison needs it: a row per reading in the
format under test, no error stream, the drain's broker, topic, group and consumer settings.
Compared as ClickHouse's parser writes them (the local engine's formatQuery); no server."""

from __future__ import annotations

import chdb

from bench.systems.jobscope import PRODUCTION_QUEUE, _bare_queue
from clickhouse.migrate import MigrationSettings
from clickhouse.schema import file_statements
from kafka.message import READING_STRUCTURE


def parsed(statement: str) -> str:
    """ClickHouse's canonical text of `statement` (a syntax error raises)."""
    escaped = statement.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
    result = chdb.query("SELECT formatQuery({q:String})", "TabSeparatedRaw", params={"q": escaped})
    return result.bytes().decode().strip()


def settings(create: str) -> dict[str, str]:
    """The SETTINGS clause of a parsed CREATE TABLE, name -> value as written."""
    clause = create.split("\nSETTINGS ", 1)[1]
    return dict(item.split(" = ", 1) for item in clause.split(", "))


def columns(create: str) -> str:
    return create.split("(", 1)[1].split("\n)\nENGINE", 1)[0]


def test_production_settings_but_the_error_stream() -> None:
    """With the defaults that schema.sql shows, only the error stream and the columns differ."""
    (production,) = file_statements([PRODUCTION_QUEUE])
    defaults = MigrationSettings(clickhouse_admin_password="unused")  # type: ignore[call-arg]

    bare = parsed(_bare_queue(defaults, "q", "RowBinary"))

    expected = settings(parsed(production))
    assert expected.pop("kafka_handle_error_mode") == "'stream'"
    assert settings(bare) == expected
    assert bare.startswith("CREATE TABLE q\n")
    assert columns(bare) == columns(parsed(f"CREATE TABLE q ({READING_STRUCTURE}) ENGINE = Null"))


def test_the_drains_connection_and_format() -> None:
    drain = MigrationSettings(  # type: ignore[call-arg]
        clickhouse_admin_password="unused",
        kafka_bootstrap="127.0.0.1:1",
        readings_topic="bench-csv-3",
        consumer_group="bench_csv_3",
        kafka_consumers=3,
        kafka_flush_interval_ms=750,
    )

    got = settings(parsed(_bare_queue(drain, "bench_csv_3.queue", "CSV")))

    (production,) = file_statements([PRODUCTION_QUEUE])
    expected = settings(parsed(production))
    del expected["kafka_handle_error_mode"]
    assert got == {
        **expected,
        "kafka_broker_list": "'127.0.0.1:1'",
        "kafka_topic_list": "'bench-csv-3'",
        "kafka_group_name": "'bench_csv_3'",
        "kafka_format": "'CSV'",
        "kafka_num_consumers": "3",
        "kafka_flush_interval_ms": "750",
    }
