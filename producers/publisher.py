"""Hands packed readings to Kafka: one message per (device, tick), keyed by device_id.

Delivery survives broker restarts: the client is idempotent
(`enable.idempotence`, `acks=all`), so its retries neither lose nor reorder nor duplicate
messages of a partition, and it keeps retrying a message until `message.timeout.ms`
(`JOBSCOPE_DELIVERY_TIMEOUT_MS`, 5 min by default) has passed: a broker that restarts
within that time loses nothing. Messages wait meanwhile in the client's queue (librdkafka
defaults: 100,000 messages or 1 GiB); when it is full, `publish` waits for room instead of
dropping, which slows down that device's ticks (logged as missed ticks) rather than losing them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from producers.config import ProducerSettings

log = logging.getLogger(__name__)

_QUEUE_FULL_BACKOFF_S = 0.05


@dataclass
class DeliveryCounters:
    """Running totals since start, read by the stats log line and tests."""

    messages_queued: int = 0
    messages_delivered: int = 0
    readings_delivered: int = 0
    messages_failed: int = 0
    readings_failed: int = 0
    queue_full_waits: int = 0


def producer_config(settings: ProducerSettings) -> dict[str, Any]:
    """The confluent-kafka configuration of the readings producer."""
    return {
        "bootstrap.servers": settings.kafka_bootstrap,
        "client.id": "jobscope-producers",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": settings.linger_ms,
        "compression.type": settings.compression,
        "message.timeout.ms": settings.delivery_timeout_ms,
        "logger": logging.getLogger("producers.kafka"),
    }


class Publisher:
    """The Kafka client of the producers process. Not thread-safe: use it from one thread."""

    def __init__(self, settings: ProducerSettings) -> None:
        self.topic = settings.readings_topic
        self.counters = DeliveryCounters()
        self.fatal_error: KafkaError | None = None
        """Set when the client can no longer deliver (e.g. lost idempotence state)."""
        self._producer = Producer({**producer_config(settings), "error_cb": self._on_error})

    async def publish(self, device_id: str, payload: bytes, readings: int) -> None:
        """Queue one message of `readings` readings; wait while the client's queue is full."""
        on_delivery = partial(self._on_delivery, readings)
        while True:
            try:
                self._producer.produce(self.topic, payload, device_id, on_delivery=on_delivery)
                break
            except BufferError:
                self.counters.queue_full_waits += 1
                self._producer.poll(0)
                await asyncio.sleep(_QUEUE_FULL_BACKOFF_S)
        self.counters.messages_queued += 1

    def serve_callbacks(self) -> None:
        """Run the delivery callbacks that are due; call it often (the runtime does)."""
        self._producer.poll(0)

    def undelivered(self) -> int:
        """Messages queued or in flight, not yet acknowledged or failed."""
        return len(self._producer)

    def flush(self, timeout: float) -> int:
        """Wait up to `timeout` seconds for every queued message; return those left."""
        return self._producer.flush(timeout)

    def _on_delivery(self, readings: int, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.counters.messages_delivered += 1
            self.counters.readings_delivered += readings
            return
        self.counters.messages_failed += 1
        self.counters.readings_failed += readings
        device_id = (msg.key() or b"").decode(errors="replace")
        log.error(
            "delivery failed for device_id=%s: %d readings lost: %s", device_id, readings, err.str()
        )

    def _on_error(self, err: KafkaError) -> None:
        """Client-wide errors. The client retries on its own, except after a fatal one."""
        if err.fatal():
            self.fatal_error = err
            log.critical("kafka client failed for good: %s", err.str())
        elif err.code() != KafkaError._TRANSPORT:  # connection errors: the client logs them
            log.warning("kafka: %s", err.str())
