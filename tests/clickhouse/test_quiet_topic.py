"""A quiet readings topic: every consumer of the Kafka table keeps polling its partitions,
and a lone reading is stored promptly (migration 0021).

With one thread per consumer, the engine's two threads came to share consumer 0 while the
topic was idle, and consumer 1's partitions went unpolled for up to ~25 s.
"""

from __future__ import annotations

import time
import uuid

from clickhouse_connect.driver.client import Client
from confluent_kafka import Producer

from kafka.message import pack
from kafka.reading import Reading
from kafka.topics import READINGS
from stack.config import StackSettings
from stack.processes import wait_until

IDLE_S = 45.0
# last_poll_time has whole seconds; a consumer polled at every turn (~1 s) reads 1-2 s old.
POLL_AGE_BOUND_S = 5
# A lone reading after the idle time: <= ~2 s measured; before 0021, up to 13 s and more.
STORED_BOUND_S = 5.0


def _produce(producer: Producer, partition: int, device_id: str) -> None:
    reading = Reading(int(time.time() * 1e6), device_id, "quiet_probe", 1.0)
    producer.produce(READINGS.name, pack([reading]).payload, key=device_id, partition=partition)


def _stored(client: Client, device_ids: list[str]) -> int:
    return client.command(
        "SELECT uniqExact(device_id) FROM metrics WHERE device_id IN {ids:Array(String)}",
        parameters={"ids": device_ids},
    )


def _consumers(client: Client) -> list[tuple[str, list[int], int]]:
    """Each consumer of the readings table: its id, partitions and the age of its last poll."""
    return client.query(
        "SELECT consumer_id, assignments.partition_id, dateDiff('second', last_poll_time, now()) "
        "FROM system.kafka_consumers WHERE database = currentDatabase() "
        "AND table = 'readings_queue'"
    ).result_rows


def _oldest_polls(client: Client, seconds: float) -> dict[str, int]:
    """The age of each consumer's last poll, at its oldest over `seconds` of watching."""
    oldest: dict[str, int] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for consumer, _, age in _consumers(client):
            oldest[consumer] = max(age, oldest.get(consumer, 0))
        time.sleep(0.5)
    return oldest


def test_every_consumer_polls_and_a_lone_reading_is_stored_after_idle(
    clickhouse: StackSettings, admin_client: Client
) -> None:
    producer = Producer({"bootstrap.servers": clickhouse.kafka_bootstrap, "linger.ms": 0})
    prefix = f"quiet-{uuid.uuid4().hex[:8]}"
    first = [f"{prefix}-warm"]
    _produce(producer, 0, first[0])
    assert producer.flush(30) == 0
    wait_until(lambda: _stored(admin_client, first) == 1, 60, "a first reading to be stored")

    oldest = _oldest_polls(admin_client, IDLE_S)
    assert len(oldest) >= 2, f"expected the table's consumers, got {oldest}"
    assert max(oldest.values()) <= POLL_AGE_BOUND_S, (
        f"a consumer went unpolled on the idle topic (oldest last poll, s): {oldest}"
    )

    # A lone reading on a partition of the consumer polled least recently: nothing else
    # arrives to keep the engine's threads busy (readings on every partition would).
    partitions = max(_consumers(admin_client), key=lambda row: row[2])[1]
    assert partitions, "the consumer polled least recently holds no partition"
    lone = [f"{prefix}-lone"]
    _produce(producer, partitions[0], lone[0])
    assert producer.flush(30) == 0
    start = time.monotonic()
    wait_until(
        lambda: _stored(admin_client, lone) == 1,
        STORED_BOUND_S,
        f"a lone reading on partition {partitions[0]} to be stored after {IDLE_S:.0f} s idle",
        interval=0.05,
    )
    print(f"stored {time.monotonic() - start:.2f} s after produce; oldest polls {oldest}")
