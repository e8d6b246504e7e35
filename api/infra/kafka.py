"""The API's Kafka producer (job writes), created on first use like the ClickHouse client."""

from __future__ import annotations

import threading

from confluent_kafka import KafkaError, KafkaException, Producer
from prometheus_client import Counter

from api.infra.config import ApiSettings
from kafka.topics import BATCH_OVERHEAD_BYTES


class KafkaUnavailable(RuntimeError):
    def __init__(self, message: str, acknowledged: int = 0) -> None:
        super().__init__(message)
        self.acknowledged = acknowledged
        """Messages of the batch the broker had acknowledged before the failure: they are in."""


def _acknowledged(delivered: list[KafkaError | None]) -> int:
    """Delivery reports without error (a KafkaError cannot be compared to None with ==)."""
    return sum(err is None for err in delivered)


class KafkaPublisher:
    def __init__(self, settings: ApiSettings, failures: Counter | None = None) -> None:
        self._settings = settings
        self._failures = failures
        """Failed writes by topic (api/infra/monitoring.py), when counted."""
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    def _get(self) -> Producer:
        with self._lock:
            if self._producer is None:
                self._producer = Producer(
                    {
                        **self._settings.kafka_client(),
                        "enable.idempotence": True,
                        "acks": "all",
                        "linger.ms": 0,
                        # past this a message fails instead of waiting in the queue: a write
                        # reported as failed must not land later
                        "message.timeout.ms": int(self._settings.kafka_write_timeout_s * 1000),
                        # a job record may be MBs of JSON (api/records.py bounds it; the
                        # job-records topic takes it: kafka/topics.py); zstd makes it a tenth
                        "message.max.bytes": max(
                            1_000_000, self._settings.records_max_bytes + BATCH_OVERHEAD_BYTES
                        ),
                        "compression.type": "zstd",
                        "log_level": 3,
                    }
                )
            return self._producer

    def publish(self, topic: str, key: str, value: bytes | None) -> None:
        """Send one message (None: a tombstone) and wait until the broker has it; raise
        KafkaUnavailable otherwise (the message then timed out: it will not land later), and
        the caller must not report it as accepted."""
        self.publish_batch(topic, [(key, value)])

    def publish_batch(self, topic: str, messages: list[tuple[str, bytes | None]]) -> None:
        """Send (key, value) messages and wait until the broker has every one; raise
        KafkaUnavailable otherwise, its `acknowledged` counting those that are in (Kafka has
        no transaction here: a batch that fails half-way is half written)."""
        try:
            self._send(topic, messages)
        except KafkaUnavailable:
            if self._failures is not None:
                self._failures.labels(topic).inc()
            raise

    def _send(self, topic: str, messages: list[tuple[str, bytes | None]]) -> None:
        timeout = self._settings.kafka_write_timeout_s
        delivered: list[KafkaError | None] = []
        producer = self._get()
        try:
            for key, value in messages:
                producer.produce(
                    topic, value, key.encode(), on_delivery=lambda err, _msg: delivered.append(err)
                )
        except (KafkaException, BufferError) as exc:
            producer.flush(timeout + 2)
            raise KafkaUnavailable(
                f"Kafka at {self._settings.kafka_bootstrap}: {exc}", _acknowledged(delivered)
            ) from exc
        producer.flush(timeout + 2)  # the delivery reports come once the messages timed out
        acknowledged = _acknowledged(delivered)
        if len(delivered) < len(messages):
            raise KafkaUnavailable(
                f"Kafka at {self._settings.kafka_bootstrap} did not acknowledge the write "
                f"within {timeout:.0f} s",
                acknowledged,
            )
        refused = [err for err in delivered if err is not None]
        if refused:
            raise KafkaUnavailable(f"Kafka refused the write: {refused[0].str()}", acknowledged)

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.flush(5)
                self._producer = None
