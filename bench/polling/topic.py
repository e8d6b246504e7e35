"""Reading the readings topic beside a benchmark: a thread that takes every message until
asked to finish, then catches up with all that was produced until then and stops."""

from __future__ import annotations

import os
import threading
from abc import abstractmethod


class TopicFollower(threading.Thread):
    """Consumes `topic` from its start; `take` sees each message. Set `finish`, then join:
    the thread stops once it has read up to the topic's end as it was then."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.finish = threading.Event()
        self.error: BaseException | None = None

    @abstractmethod
    def take(self, key: bytes, value: bytes) -> None: ...

    def run(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"bench-{type(self).__name__}-{os.getpid()}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        try:
            consumer.subscribe([self.topic])
            targets: dict[int, int] | None = None
            while True:
                for msg in consumer.consume(1000, timeout=0.2):
                    if msg.error() is None:
                        self.take(msg.key() or b"", msg.value() or b"")
                if self.finish.is_set() and targets is None:
                    meta = consumer.list_topics(self.topic, timeout=10).topics[self.topic]
                    targets = {
                        p: consumer.get_watermark_offsets(TopicPartition(self.topic, p))[1]
                        for p in meta.partitions
                    }
                if targets is not None:
                    positions = consumer.position([TopicPartition(self.topic, p) for p in targets])
                    if all(
                        tp.offset >= targets[tp.partition] or targets[tp.partition] == 0
                        for tp in positions
                    ):
                        return
        except BaseException as exc:
            self.error = exc
        finally:
            consumer.close()


class ReadingsCounter(TopicFollower):
    """(tick timestamp µs, readings) of every message."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(bootstrap, topic)
        self.messages: list[tuple[int, int]] = []

    def take(self, key: bytes, value: bytes) -> None:
        from kafka.message import unpack

        readings = unpack(value)
        if readings:
            self.messages.append((readings[0].timestamp_us, len(readings)))
