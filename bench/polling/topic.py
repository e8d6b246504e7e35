"""Reading the readings topic beside a benchmark: a thread that takes every message produced
after it started until asked to finish, then catches up with all that was produced until
then and stops."""

from __future__ import annotations

import os
import threading
from abc import abstractmethod
from typing import Any

from stack.processes import wait_until
from stack.transient import KAFKA_STARTING


class TopicFollower(threading.Thread):
    """Consumes `topic` from its end as the thread found it (the polling benchmarks share one
    stack: what earlier ones produced is not this one's); `take` sees each message. Set
    `finish`, then join: the thread stops once it has read up to the topic's end as it was
    then. `started` is set once its partitions are assigned."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.finish = threading.Event()
        self.started = threading.Event()
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
            ends = self._ends(consumer)
            consumer.assign([TopicPartition(self.topic, p, end) for p, end in ends.items()])
            self.started.set()
            targets: dict[int, int] | None = None
            while True:
                for msg in consumer.consume(1000, timeout=0.2):
                    if msg.error() is None:
                        self.take(msg.key() or b"", msg.value() or b"")
                if self.finish.is_set() and targets is None:
                    targets = self._ends(consumer)
                if targets is not None:
                    positions = consumer.position([TopicPartition(self.topic, p) for p in targets])
                    if all(  # a partition with nothing new has no position to compare
                        tp.offset >= targets[tp.partition]
                        or targets[tp.partition] <= ends.get(tp.partition, 0)
                        for tp in positions
                    ):
                        return
        except BaseException as exc:
            self.error = exc
        finally:
            consumer.close()

    def _ends(self, consumer: Any) -> dict[int, int]:
        """The topic's end offset in each of its partitions, asked again while the broker
        cannot tell (a partition without a leader yet, a watermark query timed out)."""
        from confluent_kafka import TopicPartition

        def ends() -> dict[int, int] | None:
            meta = consumer.list_topics(self.topic, timeout=10).topics[self.topic]
            if meta.error is not None or not meta.partitions:
                return None
            marks = {
                p: consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)
                for p in meta.partitions
            }
            return None if None in marks.values() else {p: m[1] for p, m in marks.items()}

        return wait_until(ends, 60, f"the end of topic {self.topic}", transient=KAFKA_STARTING)


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
