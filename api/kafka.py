"""The API's Kafka producer (job writes), created on first use like the ClickHouse client."""

from __future__ import annotations

import threading

from confluent_kafka import KafkaError, KafkaException, Producer

from api.config import ApiSettings


class KafkaUnavailable(RuntimeError):
    pass


class KafkaPublisher:
    def __init__(self, settings: ApiSettings) -> None:
        self._settings = settings
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    def _get(self) -> Producer:
        with self._lock:
            if self._producer is None:
                self._producer = Producer(
                    {
                        "bootstrap.servers": self._settings.kafka_bootstrap,
                        "enable.idempotence": True,
                        "acks": "all",
                        "linger.ms": 0,
                        # past this a message fails instead of waiting in the queue: a write
                        # reported as failed must not land later
                        "message.timeout.ms": int(self._settings.kafka_write_timeout_s * 1000),
                        "log_level": 3,
                    }
                )
            return self._producer

    def publish(self, topic: str, key: str, value: bytes | None) -> None:
        """Send one message (None: a tombstone) and wait until the broker has it; raise
        KafkaUnavailable otherwise (the message then timed out: it will not land later), and
        the caller must not report it as accepted."""
        timeout = self._settings.kafka_write_timeout_s
        delivered: list[KafkaError | None] = []
        producer = self._get()
        try:
            producer.produce(
                topic, value, key.encode(), on_delivery=lambda err, _msg: delivered.append(err)
            )
        except (KafkaException, BufferError) as exc:
            raise KafkaUnavailable(f"Kafka at {self._settings.kafka_bootstrap}: {exc}") from exc
        producer.flush(timeout + 2)  # the delivery report comes once the message timed out
        if not delivered:
            raise KafkaUnavailable(
                f"Kafka at {self._settings.kafka_bootstrap} did not acknowledge the write "
                f"within {timeout:.0f} s"
            )
        if delivered[0] is not None:
            raise KafkaUnavailable(f"Kafka refused the write: {delivered[0].str()}")

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.flush(5)
                self._producer = None
