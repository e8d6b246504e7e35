"""Canary for the pinned engine: a Kafka table + materialized view consume a real topic.

chdb-core 26.3 and newer fail at `CREATE TABLE ... ENGINE = Kafka`; an upgrade that breaks
the Kafka engine must fail here, loudly.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafka import topics
from stack.config import StackSettings
from stack.processes import wait_until
from stack.transient import KAFKA_STARTING


def test_kafka_table_consumes_a_topic(clickhouse: StackSettings, admin_client: Client) -> None:
    name = f"canary_{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": clickhouse.kafka_bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)])[name].result(30)
    _create_pipeline(admin_client, clickhouse.kafka_bootstrap, name, f"{name}_dest")
    producer = Producer({"bootstrap.servers": clickhouse.kafka_bootstrap})
    for n in range(100):
        producer.produce(name, f'{{"n": {n}, "s": "row {n}"}}\n'.encode(), key=str(n % 7))
    assert producer.flush(30) == 0
    wait_until(
        lambda: admin_client.command(f"SELECT count() FROM {name}_dest") == 100,
        60,
        "the Kafka engine to consume 100 messages",
    )
    assert admin_client.command(f"SELECT sum(n) FROM {name}_dest") == sum(range(100))
    wait_until(
        lambda: topics.consumer_lag(clickhouse.kafka_bootstrap, name, name) == 0,
        30,
        "the engine to commit the offsets of the 100 messages",
        transient=KAFKA_STARTING,  # the group's coordinator may still be loading
    )
    # A consuming Kafka table and its view can be dropped (migrations replace pipelines so),
    # and the consumer stops: what is produced afterwards stays in the topic, and the group's
    # next consumer reads exactly that.
    _drop_pipeline(admin_client, name)
    assert admin_client.command(f"EXISTS TABLE {name}_queue") == 0
    producer.produce(name, b'{"n": 1000, "s": "after"}\n')
    assert producer.flush(30) == 0
    _create_pipeline(admin_client, clickhouse.kafka_bootstrap, name, f"{name}_after")
    try:
        wait_until(
            lambda: admin_client.command(f"SELECT count() FROM {name}_after") > 0,
            60,
            "the group's next consumer to read the message produced after the drop",
        )
        rows = admin_client.query(f"SELECT n, s FROM {name}_after").result_rows
        assert rows == [(1000, "after")], rows
        assert admin_client.command(f"SELECT count() FROM {name}_dest") == 100
    finally:
        _drop_pipeline(admin_client, name)


def _create_pipeline(client: Client, bootstrap: str, name: str, dest: str) -> None:
    """`{name}_queue`, a Kafka table of topic and group `name`, and `{name}_mv` into `dest`."""
    client.command(f"CREATE TABLE {dest} (n UInt32, s String) ENGINE = MergeTree ORDER BY n")
    client.command(
        f"CREATE TABLE {name}_queue (n UInt32, s String) ENGINE = Kafka SETTINGS "
        f"kafka_broker_list = '{bootstrap}', kafka_topic_list = '{name}', "
        f"kafka_group_name = '{name}', kafka_format = 'JSONEachRow', kafka_flush_interval_ms = 200"
    )
    client.command(f"CREATE MATERIALIZED VIEW {name}_mv TO {dest} AS SELECT n, s FROM {name}_queue")


def _drop_pipeline(client: Client, name: str) -> None:
    for statement in (f"DROP VIEW {name}_mv", f"DROP TABLE {name}_queue"):
        _within(20.0, lambda statement=statement: client.command(statement), statement)


def _within(seconds: float, action: Callable[[], object], what: str) -> None:
    """Run `action`, failing (not hanging the suite) if it has not returned in `seconds`."""
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(seconds), f"{what} did not return within {seconds} s"
    if errors:
        raise errors[0]


def test_drop_sync_is_refused_not_hung(admin_client: Client) -> None:
    """The pinned engine never returns from DROP ... SYNC; the server says so instead."""
    name = f"sync_{uuid.uuid4().hex[:8]}"
    admin_client.command(f"CREATE TABLE {name} (n UInt8) ENGINE = MergeTree ORDER BY n")
    for statement in (f"DROP TABLE {name} SYNC", f"DROP TABLE IF EXISTS default.{name}  sync"):
        with pytest.raises(DatabaseError, match="never returns in the embedded engine"):
            _within(20.0, lambda statement=statement: admin_client.command(statement), statement)
    _within(20.0, lambda: admin_client.command(f"DROP TABLE {name}"), "plain DROP")
    assert admin_client.command(f"EXISTS TABLE {name}") == 0
