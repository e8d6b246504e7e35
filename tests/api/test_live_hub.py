"""The live streams' Kafka consumer (api/live/hub.py) in-process, against the real broker.

An assigned librdkafka consumer can stop fetching for good after a broker restart (librdkafka
issue 5153), rarely and only on a long-lived consumer, so it cannot be caused on demand. The
test stands in for it with a real consumer whose `consume` returns nothing once told to (the
one mocked part), and checks that the hub replaces it and that no message is skipped or
repeated.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from api.live import hub as hub_module
from api.live.hub import ReadingsHub, Subscription, _Progress
from kafka.message import pack_by_device
from kafka.reading import Reading
from stack.processes import wait_until
from tests.conftest import new_topic


@pytest.fixture
def topic(kafka: str) -> str:
    return new_topic(kafka, "test-live-hub")


class Stalling:
    """A real consumer whose `consume` returns nothing once `stalled` is set."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.stalled = threading.Event()

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        if self.stalled.is_set():
            time.sleep(timeout)
            return []
        return self.consumer.consume(num_messages, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.consumer, name)


@pytest.fixture
def hub(kafka: str, topic: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ReadingsHub]:
    """A hub checking its consumer every second, whose first consumer is `Stalling`."""
    monkeypatch.setattr(hub_module, "_STALL_S", 1.0)
    readings_hub = ReadingsHub(kafka, topic)
    real = readings_hub._new_consumer
    made: list[Consumer] = []

    def new_consumer() -> Consumer:
        made.append(real() if made else Stalling(real()))  # type: ignore[arg-type]
        return made[-1]

    monkeypatch.setattr(readings_hub, "_new_consumer", new_consumer)
    yield readings_hub
    readings_hub.close()


def _publish(kafka: str, topic: str, values: range) -> None:
    producer = Producer({"bootstrap.servers": kafka, "enable.idempotence": True})
    for value in values:
        for device in ("hub-a", "hub-b", "hub-c"):
            reading = Reading(1_800_000_000_000_000 + value, device, "hub_value", float(value))
            for device_id, packed in pack_by_device([reading]):
                producer.produce(topic, packed.payload, device_id.encode())
    assert producer.flush(30) == 0


def test_a_consumer_that_stops_fetching_is_replaced_at_the_same_offsets(
    kafka: str, topic: str, hub: ReadingsHub, caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.new_event_loop()
    sub = Subscription(frozenset({"hub-a", "hub-b", "hub-c"}), loop, 1 << 20)
    hub.subscribe(sub)
    received: list[tuple[str, float]] = []

    def received_all(count: int) -> bool:
        received.extend((r.device_id, r.value) for r in sub.take())
        return len(received) >= count

    _publish(kafka, topic, range(0, 20))
    wait_until(lambda: received_all(60), 30, "the first readings through the hub")
    stuck = hub._consumer
    assert isinstance(stuck, Stalling)
    stuck.stalled.set()
    with caplog.at_level(logging.WARNING, logger="jobscope.api.live"):
        _publish(kafka, topic, range(20, 40))
        wait_until(lambda: received_all(120), 30, "the readings published while it was stuck")
        _publish(kafka, topic, range(40, 60))
        wait_until(lambda: received_all(180), 30, "the readings published after")
    assert hub._consumer is not stuck
    assert "did not move for 1 s with messages to read" in caplog.text
    expected = [(d, float(v)) for v in range(60) for d in ("hub-a", "hub-b", "hub-c")]
    assert sorted(received) == sorted(expected)
    hub.unsubscribe(sub)
    loop.close()


def test_the_stall_check_replaces_once_per_position_unless_the_partition_grows() -> None:
    """A quiet partition whose last offset no message takes (a transaction marker) looks
    stalled: replaced once, not at every check."""
    progress = _Progress()
    assert not progress.stalled(0, 10, 11)  # first look
    progress.seen[0] = (10, 10)
    assert not progress.stalled(0, 10, 11)  # nothing to read at the last check
    progress.seen[0] = (10, 11)
    assert progress.stalled(0, 10, 11)
    progress.replaced_at[0] = 10
    assert not progress.stalled(0, 10, 11)
    assert progress.stalled(0, 10, 12)  # it grew and the consumer still did not move
    assert not progress.stalled(0, 11, 12)  # it moved


class LeaderChanging:
    """A real consumer whose first `failures` end-offset requests fail as a broker does while
    a partition's leader changes (the mocked part: a leader election cannot be timed)."""

    def __init__(self, consumer: Consumer, failures: int, code: int) -> None:
        self.consumer, self.failures, self.code = consumer, failures, code

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        if self.failures > 0:
            self.failures -= 1
            raise KafkaException(KafkaError(self.code))
        return self.consumer.get_watermark_offsets(tp, timeout=timeout)


def test_a_partition_without_a_leader_yet_is_waited_for(kafka: str, topic: str) -> None:
    _publish(kafka, topic, range(3))
    real = ReadingsHub(kafka, topic)._new_consumer()
    try:
        tp = TopicPartition(topic, 0)
        expected = real.get_watermark_offsets(tp, timeout=10)[1]
        changing = LeaderChanging(real, 3, KafkaError.NOT_LEADER_FOR_PARTITION)
        assert hub_module._end_offset(changing, tp) == expected  # type: ignore[arg-type]
        assert changing.failures == 0
        broken = LeaderChanging(real, 1, KafkaError.TOPIC_AUTHORIZATION_FAILED)
        with pytest.raises(KafkaException):
            hub_module._end_offset(broken, tp)  # type: ignore[arg-type]
    finally:
        real.close()
