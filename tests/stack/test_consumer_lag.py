"""The consumer lag that `make down` waits on before stopping ClickHouse (kafka/topics.py)."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Producer

from kafka import topics
from kafka.message import pack
from kafka.reading import Reading
from stack import services
from stack.config import StackSettings
from stack.processes import wait_until
from stack.transient import KAFKA_STARTING
from tests.conftest import new_topic


def test_lag_counts_what_a_group_has_not_committed(clickhouse: StackSettings) -> None:
    topic = new_topic(clickhouse.kafka_bootstrap, "lag")
    producer = Producer({"bootstrap.servers": clickhouse.kafka_bootstrap})
    for n in range(7):
        producer.produce(topic, b"x", key=str(n))
    assert producer.flush(30) == 0
    wait_until(
        lambda: topics.consumer_lag(clickhouse.kafka_bootstrap, "never-consumed", topic) == 7,
        30,
        "the lag of a group that never consumed to be the whole topic (7)",
        transient=KAFKA_STARTING,  # the group coordinator may still be loading
    )


def test_clickhouse_group_catches_up(clickhouse: StackSettings) -> None:
    migration = services.migration_settings(clickhouse)
    device = f"lag-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": clickhouse.kafka_bootstrap})
    reading = Reading(int(time.time() * 1e6), device, "m", 1.0, {})
    producer.produce(migration.readings_topic, pack([reading]).payload, key=device)
    assert producer.flush(30) == 0

    def lag() -> int:
        return topics.consumer_lag(
            clickhouse.kafka_bootstrap, migration.consumer_group, migration.readings_topic
        )

    wait_until(
        lambda: lag() == 0,
        30,
        "ClickHouse's consumer group to commit everything",
        transient=KAFKA_STARTING,
    )
    reader = services.clickhouse_client(clickhouse, "reader")
    count = "SELECT count() FROM metrics WHERE device_id = {d:String}"
    assert reader.command(count, parameters={"d": device}) == 1  # committed after stored
