"""Revoked tokens, shared by every API replica through a compacted Kafka topic.

`DELETE /api/tokens/{jti}` (`jobscope token revoke`) publishes `{"jti", "expires_at",
"revoked_at", "by"}` keyed by the token's id to JOBSCOPE_REVOCATIONS_TOPIC. Every API process
reads the whole topic at start and then follows it (a consumer of its own, in no group), so
a token revoked through one replica is refused by the others as soon as their consumer
fetches the message (well under a second while Kafka is up; tests/api/test_tokens.py
measures it), and at once by the replica that took the revocation. Until a process has read
the topic to its end it cannot tell a revoked token from a good one, and refuses every signed
token (503).

An entry is kept until `expires_at`: the revocation time plus JOBSCOPE_TOKEN_MAX_TTL_DAYS,
past which no accepted token is still valid (api/infra/tokens.py refuses longer-lived ones). So
memory holds only the revocations of tokens that could still be used.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

log = logging.getLogger("jobscope.api")
_PURGE_EVERY_S = 60.0


class NotLoaded(RuntimeError):
    """The revocation list has not been read to its end yet."""


def message(jti: str, expires_at: float, revoked_at: float, by: str) -> bytes:
    """The value published for one revocation."""
    record = {"jti": jti, "expires_at": expires_at, "revoked_at": revoked_at, "by": by}
    return json.dumps(record).encode()


class Revocations:
    """The ids of revoked tokens, kept current by a thread following the topic."""

    def __init__(self, kafka_client: dict[str, Any], topic: str) -> None:
        """`kafka_client`: the confluent-kafka base configuration (servers, security)."""
        self.topic = topic
        self._kafka_client = kafka_client
        self._revoked: dict[str, float] = {}
        self._lock = threading.Lock()
        self._loaded = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="revocations", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait_loaded(self, timeout_s: float) -> bool:
        return self._loaded.wait(timeout_s)

    def is_revoked(self, jti: str) -> bool:
        """Whether `jti` is revoked; NotLoaded before the topic was read to its end."""
        if not self._loaded.is_set():
            raise NotLoaded(f"the revocation list (Kafka topic {self.topic}) is not read yet")
        with self._lock:
            expires_at = self._revoked.get(jti)
        return expires_at is not None and expires_at > time.time()

    def add(self, jti: str, expires_at: float) -> None:
        """Record a revocation this process has published (the topic brings it back too)."""
        with self._lock:
            self._revoked[jti] = max(expires_at, self._revoked.get(jti, 0.0))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _follow(self) -> None:
        consumer = Consumer(
            {
                **self._kafka_client,
                "group.id": "jobscope-api-revocations",  # never joined nor committed: assign()
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 100,
                "log_level": 3,
            }
        )
        try:
            pending = self._assign(consumer)
            purged = time.monotonic()
            while not self._stop.is_set():
                msg = consumer.poll(0.2)
                if msg is not None:
                    self._take(msg, pending)
                if time.monotonic() - purged > _PURGE_EVERY_S:
                    self._purge()
                    purged = time.monotonic()
        except Exception:  # the thread must say why revocations stopped being followed
            log.exception("token revocations: the topic %s is no longer followed", self.topic)
            raise
        finally:
            consumer.close()

    def _assign(self, consumer: Consumer) -> set[int]:
        """Every partition of the topic from its start (waiting for the topic to exist);
        the partitions not yet read to their end."""
        while not self._stop.is_set():
            try:
                metadata = consumer.list_topics(self.topic, timeout=5).topics.get(self.topic)
            except KafkaException as exc:  # Kafka down at start: retried, never given up
                log.warning("token revocations: Kafka unreachable (%s), signed tokens refused", exc)
                self._stop.wait(1.0)
                continue
            if metadata is not None and metadata.error is None and metadata.partitions:
                partitions = sorted(metadata.partitions)
                consumer.assign(
                    [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions]
                )
                return set(partitions)
            log.warning(
                "token revocations: topic %s not found yet, signed tokens refused", self.topic
            )
            self._stop.wait(1.0)
        return set()

    def _take(self, msg: Message, pending: set[int]) -> None:
        error = msg.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                pending.discard(msg.partition())
                if not pending and not self._loaded.is_set():
                    self._loaded.set()
                    log.info("token revocations: %d in force", len(self._revoked))
            else:
                log.warning("token revocations: %s", error.str())
            return
        key = (msg.key() or b"").decode(errors="replace")
        value = msg.value()
        if value is None:  # a tombstone: the revocation is withdrawn
            with self._lock:
                self._revoked.pop(key, None)
            return
        try:
            record = json.loads(value)
            jti, expires_at = str(record["jti"]), float(record["expires_at"])
        except (ValueError, KeyError, TypeError):
            log.warning("token revocations: message at offset %d is malformed", msg.offset())
            return
        if expires_at > time.time():
            self.add(jti, expires_at)

    def _purge(self) -> None:
        now = time.time()
        with self._lock:
            for jti in [j for j, expires_at in self._revoked.items() if expires_at <= now]:
                del self._revoked[jti]
