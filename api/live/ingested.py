"""How far ClickHouse has ingested the readings topic: the offsets its Kafka engine's
consumer group committed. The engine commits a block's offsets only after the block is
written to `metrics`, so every message before a committed offset can be queried."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from confluent_kafka import Consumer, TopicPartition


class IngestWatch:
    def __init__(
        self, bootstrap: str, group: str, topic: str, security: Mapping[str, str] | None = None
    ) -> None:
        """`security`: Kafka's credentials (KafkaClientSettings.kafka_security)."""
        self.topic = topic
        self.group = group
        self._bootstrap = bootstrap
        self._security = dict(security or {})
        self._consumer: Consumer | None = None
        self._lock = threading.Lock()

    def _get(self) -> Consumer:
        if self._consumer is None:
            # Only asks for the group's committed offsets: it never joins the group.
            self._consumer = Consumer(
                {
                    "bootstrap.servers": self._bootstrap,
                    **self._security,
                    "group.id": self.group,
                    "enable.auto.commit": False,
                    "log_level": 3,
                }
            )
        return self._consumer

    def behind(self, positions: dict[int, int], timeout_s: float = 5.0) -> int:
        """Messages before `positions` (partition -> offset) ClickHouse has not committed."""
        with self._lock:
            partitions = [TopicPartition(self.topic, p) for p in positions]
            committed = self._get().committed(partitions, timeout=timeout_s)
        return sum(max(0, positions[tp.partition] - max(tp.offset, 0)) for tp in committed)

    def wait(self, positions: dict[int, int], timeout_s: float) -> int:
        """Wait until ClickHouse has ingested every message before `positions`; return how
        many it still lacked when `timeout_s` ran out (0: all in)."""
        deadline = time.monotonic() + timeout_s
        while (missing := self.behind(positions)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return missing

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
