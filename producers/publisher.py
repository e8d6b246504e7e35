"""Hands packed readings to Kafka: one message per (device, tick), keyed by device_id, and
loses none while the broker is away.

A message goes through at most three places, oldest first, so that each device's messages
reach Kafka in order:

1. **In flight**: handed to the Kafka client (confluent-kafka), at most
   `inflight_max_messages` at a time. The client is idempotent (`enable.idempotence`,
   `acks=all`) and never times a message out (`message.timeout.ms=0`): it retries each one
   until the broker acknowledges it, and its retries neither lose, duplicate nor reorder the
   messages of a partition. So a message is handed to the client once, never sent again by
   us while this process lives, and an outage of any length loses nothing it holds.
2. **Memory**: messages that find the window full wait in a queue, up to
   `memory_queue_max_bytes` of payload. `publish` never waits: polling goes on at its pace.
3. **Spool** (producers/spool.py): past that bound, the oldest messages of the memory queue
   move to a disk spool (append-only, segmented, checksummed, at most `spool_max_bytes`).
   Only messages never handed to the client go there. The window is refilled from the spool
   first, then from memory, so newer messages always stay behind older ones; a spool file is
   deleted once all its messages are acknowledged. When the spool is full too, the oldest
   messages of the memory queue are dropped as new ones come: counted (messages and readings
   dropped), logged once when it starts and once when it ends, never silently.

Shutdown (`close`): deliveries get up to the timeout; then whatever is left is kept in the
spool for the next start, which delivers it before anything new. Messages of the window are
taken back from the client first (`purge`): one the client had not sent yet is certain not
to be in Kafka; one it was sending when the broker went away might be, and sending it again
may store it twice (counted as `messages_maybe_duplicated`; ClickHouse's `metrics` is a
ReplacingMergeTree read with FINAL, so readers never see the copy). A process killed with
SIGKILL loses its window and its memory queue (at most both bounds), and sends again the
spool messages acknowledged since the spool's last checkpoint (one per second).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from itertools import count
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from kafka.message import json_lines, unpack
from producers.config import ProducerSettings
from producers.spool import Spool, SpoolItem, SpoolRecord

log = logging.getLogger(__name__)

_CHECKPOINT_INTERVAL_S = 1.0
_CLIENT_LOG_REPEAT_S = 60.0
_CLOSE_STEP_S = 0.1
_PURGE_WAIT_S = 5.0
_SPILL_TO = 0.75
"""A spill empties the memory queue down to this share of its bound (spills come in chunks)."""
_RETURNED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT, KafkaError._FATAL})
"""Delivery reports of messages the client gave back undelivered: kept, not failed."""
_NOT_SENT = KafkaError._PURGE_QUEUE
"""The only one of those certain not to be in Kafka."""


@dataclass
class DeliveryCounters:
    """Running totals since start, read by the stats log line and tests."""

    messages_queued: int = 0
    """Messages `publish` accepted."""
    readings_queued: int = 0
    messages_delivered: int = 0
    readings_delivered: int = 0
    messages_failed: int = 0
    """Messages Kafka refused for good (e.g. too large): lost."""
    readings_failed: int = 0
    queue_full_waits: int = 0
    """Times the client refused a message for lack of room (it stays queued)."""
    messages_spilled: int = 0
    """Messages moved from memory to the spool."""
    readings_spilled: int = 0
    messages_replayed: int = 0
    """Messages delivered from the spool (this run's or an earlier one's)."""
    readings_replayed: int = 0
    messages_dropped: int = 0
    """Messages lost because the spool was full (or the disk failed)."""
    readings_dropped: int = 0
    messages_recovered: int = 0
    """Messages found in the spool at start, left by an earlier run."""
    messages_maybe_duplicated: int = 0
    """Messages kept at shutdown that the client might already have delivered."""
    spool_corrupt_bytes: int = 0
    """Spool bytes found unreadable at start (records cut by a crash), skipped."""
    json_messages_delivered: int = 0
    """Copies delivered to the JSON topic (when `json_topic` is set)."""
    json_messages_lost: int = 0
    """Copies the JSON topic did not get (refused, or purged at shutdown): best effort."""


@dataclass(frozen=True)
class QueueDepth:
    """Where the messages not yet delivered are, now."""

    memory_messages: int
    memory_bytes: int
    inflight_messages: int
    spool_messages: int
    """Messages in the spool not yet acknowledged (some of them may be in flight)."""
    spool_bytes: int
    spool_segments: int

    def gauges(self) -> dict[str, tuple[str, float]]:
        """As self-monitoring gauges: name -> (documentation, value)."""
        return {
            "memory_queue_messages": ("messages waiting in memory", self.memory_messages),
            "memory_queue_bytes": ("payload bytes waiting in memory", self.memory_bytes),
            "inflight_messages": ("messages handed to the Kafka client", self.inflight_messages),
            "spool_messages": ("messages in the disk spool", self.spool_messages),
            "spool_bytes": ("bytes of the disk spool", self.spool_bytes),
            "spool_segments": ("files of the disk spool", self.spool_segments),
        }


@dataclass(frozen=True)
class CloseResult:
    """What `close` left for the next start."""

    kept: int
    """Messages in the spool, delivered first by the next start (0: all delivered)."""
    dropped: int
    """Messages that found no room in the spool at shutdown (also in messages_dropped)."""


class _Message:
    """One message on its way; `origin` is set when it comes from the spool."""

    __slots__ = ("after", "json", "key", "origin", "payload", "readings", "sent", "serial")

    def __init__(
        self,
        key: str,
        payload: bytes,
        readings: int,
        origin: SpoolItem | None = None,
        json: bytes = b"",
    ) -> None:
        self.key, self.payload, self.readings, self.origin = key, payload, readings, origin
        self.json = json
        """Its JSON lines for the JSON topic (not spooled: made again from the payload)."""
        self.serial = 0
        """Order in which messages were handed to the client."""
        self.after = 0
        """For a message from memory: the spool segment it was handed after."""
        self.sent = False
        """The client gave it back, but it might have been delivered."""

    @property
    def size(self) -> int:
        return len(self.payload) + len(self.json)

    def record(self) -> SpoolRecord:
        return SpoolRecord(self.key, self.payload, self.readings)


class _RepeatFilter(logging.Filter):
    """Lets each distinct line of the Kafka client through once a minute at most: while a
    broker is away, the client reports every reconnection attempt (several per second)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text, now = record.getMessage(), time.monotonic()
        if now - self._seen.get(text, -_CLIENT_LOG_REPEAT_S) < _CLIENT_LOG_REPEAT_S:
            return False
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[text] = now
        return True


def client_logger() -> logging.Logger:
    """The logger of the process's Kafka clients, repeats filtered."""
    client_log = logging.getLogger("producers.kafka")
    if not any(isinstance(f, _RepeatFilter) for f in client_log.filters):
        client_log.addFilter(_RepeatFilter())
    return client_log


def producer_config(settings: ProducerSettings) -> dict[str, Any]:
    """The confluent-kafka configuration of the readings producer."""
    client_log = client_logger()
    return {
        **settings.kafka_client(),
        "client.id": "jobscope-producers",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": settings.linger_ms,
        "compression.type": settings.compression,
        "message.timeout.ms": 0,  # never: retried until delivered (see the module's doc)
        "logger": client_log,
    }


class Publisher:
    """The Kafka client of the producers process, its memory queue and its disk spool.
    Not thread-safe: use it from one thread (the event loop's)."""

    def __init__(self, settings: ProducerSettings) -> None:
        self.topic = settings.readings_topic
        self.json_topic = settings.json_topic
        self._json_error: int | None = None
        self.counters = DeliveryCounters()
        self.fatal_error: KafkaError | None = None
        """Set when the client can no longer deliver (e.g. lost idempotence state)."""
        self._window = settings.inflight_max_messages
        self._memory_max = settings.memory_queue_max_bytes
        self._memory: deque[_Message] = deque()
        self._memory_bytes = 0
        self._inflight = 0
        self._inflight_spooled = 0
        self._serials = count(1)
        self._returned: list[_Message] = []
        self._spilling = False
        self._dropping = False
        self._dropped_in_episode = (0, 0)
        self._produce_error: int | None = None
        self._delivery_error: int | None = None
        self._brokers_down = False
        self._checkpoint_at = time.monotonic()
        self._closed: CloseResult | None = None
        self._spool = Spool(
            settings.spool_path, settings.spool_max_bytes, settings.spool_segment_bytes
        )
        self.counters.messages_recovered = self._spool.recovered_messages
        self.counters.spool_corrupt_bytes = self._spool.corrupt_bytes
        if self._spool.messages:
            log.warning(
                "spool %s: %d messages (%d bytes in %d files) left by an earlier run, "
                "delivered before any new one",
                self._spool.directory,
                self._spool.messages,
                self._spool.bytes,
                self._spool.segments,
            )
            self._spilling = True
        self._producer = Producer({**producer_config(settings), "error_cb": self._on_error})

    async def publish(
        self, device_id: str, payload: bytes, readings: int, json: bytes = b""
    ) -> None:
        """Take one message of `readings` readings (and its JSON lines, for the JSON topic);
        never waits (see the module's doc)."""
        self.counters.messages_queued += 1
        self.counters.readings_queued += readings
        message = _Message(device_id, payload, readings, json=json)
        if self._inflight >= self._window:
            self._producer.poll(0)  # acknowledgements due free room in the window
        if (
            not self._memory
            and not self._spool.unread
            and self._inflight < self._window
            and self._hand(message)
        ):
            return
        self._memory.append(message)
        self._memory_bytes += message.size
        if self._memory_bytes > self._memory_max:
            self._spill()

    def serve_callbacks(self) -> None:
        """Run the delivery callbacks that are due and refill the window; call it often
        (the runtime does, every 100 ms)."""
        self._producer.poll(0)
        self._pump()

    def depth(self) -> QueueDepth:
        return QueueDepth(
            memory_messages=len(self._memory),
            memory_bytes=self._memory_bytes,
            inflight_messages=self._inflight,
            spool_messages=self._spool.messages,
            spool_bytes=self._spool.bytes,
            spool_segments=self._spool.segments,
        )

    def undelivered(self) -> int:
        """Messages not yet acknowledged: in flight, in memory or in the spool."""
        return self._inflight - self._inflight_spooled + len(self._memory) + self._spool.messages

    def flush(self, timeout: float) -> int:
        """Shutdown, as `close`; return the messages not delivered (kept in the spool or
        dropped). Kept for callers of the earlier API."""
        result = self.close(timeout)
        return result.kept + result.dropped

    def close(self, timeout_s: float) -> CloseResult:
        """Deliver for up to `timeout_s` seconds, then keep what is left in the spool for
        the next start (see the module's doc). Publish nothing afterwards; calling it again
        returns the same result."""
        if self._closed is not None:
            return self._closed
        deadline = time.monotonic() + timeout_s
        while self.fatal_error is None and self.undelivered():
            self.serve_callbacks()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._producer.flush(min(remaining, _CLOSE_STEP_S))
        self._producer.purge(in_queue=True, in_flight=True)
        self._producer.flush(_PURGE_WAIT_S)  # serves the reports of what purge took back
        if self._inflight:
            log.error("%d messages handed to the Kafka client were not given back", self._inflight)
        dropped = self._keep_at_close()
        self._spool.close()
        self._closed = CloseResult(self._spool.messages, dropped)
        sent = self.counters
        log.info(
            "closed: %d messages (%d readings) published, %d (%d readings) delivered, %d of "
            "them from the spool; %d (%d readings) failed, %d (%d readings) dropped; %d kept "
            "in the spool",
            sent.messages_queued,
            sent.readings_queued,
            sent.messages_delivered,
            sent.readings_delivered,
            sent.messages_replayed,
            sent.messages_failed,
            sent.readings_failed,
            sent.messages_dropped,
            sent.readings_dropped,
            self._closed.kept,
        )
        if self._closed.kept or dropped:
            log.warning(
                "closed with %d messages undelivered: %d kept in the spool %s for the next "
                "start (%d of them might have been delivered already: a copy is hidden by "
                "FINAL), %d dropped (no room in the spool)",
                self._closed.kept + dropped,
                self._closed.kept,
                self._spool.directory,
                self.counters.messages_maybe_duplicated,
                dropped,
            )
        return self._closed

    def _keep_at_close(self) -> int:
        """Write the messages given back by the client, then the memory queue, to the spool
        (messages from the spool are still in it); return how many found no room."""
        returned = sorted(self._returned, key=lambda m: m.serial)
        self._returned.clear()
        self.counters.messages_maybe_duplicated += sum(m.sent for m in returned)
        dropped = 0
        groups: dict[int, list[_Message]] = {}
        for message in returned:
            if message.origin is None:
                groups.setdefault(message.after, []).append(message)
        for after, messages in groups.items():
            kept = self._spool.insert_after(after, [m.record() for m in messages])
            dropped += self._drop(messages[kept:])
        memory = list(self._memory)
        self._memory.clear()
        self._memory_bytes = 0
        kept = self._spool.append([m.record() for m in memory])
        self.counters.messages_spilled += kept
        self.counters.readings_spilled += sum(m.readings for m in memory[:kept])
        return dropped + self._drop(memory[kept:])

    def _hand(self, message: _Message) -> bool:
        """Give `message` to the client; False if it must wait (it stays where it is)."""
        try:
            self._producer.produce(
                self.topic,
                message.payload,
                message.key,
                on_delivery=partial(self._on_delivery, message),
            )
        except BufferError:
            self.counters.queue_full_waits += 1
            return False
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                self._failed(message, err)
                if message.origin is not None:
                    self._spool.ack(message.origin)
                return True
            if self._produce_error != err.code():
                self._produce_error = err.code()
                log.error("kafka refuses new messages (they wait): %s", err.str())
            return False
        self._produce_error = None
        if self.json_topic:
            self._copy(message)
        message.serial = next(self._serials)
        if message.origin is None:
            message.after = self._spool.last_major
        else:
            self._inflight_spooled += 1
        self._inflight += 1
        return True

    def _copy(self, message: _Message) -> None:
        """Its JSON copy, handed with it: in the same order per device, best effort (a copy
        the client refuses is counted and logged, never retried)."""
        try:
            body = message.json or json_lines(unpack(message.payload))  # spooled: made again
            self._producer.produce(
                self.json_topic, body, message.key, on_delivery=self._on_json_delivery
            )
        except (BufferError, KafkaException, ValueError) as exc:
            self._json_lost(str(exc))

    def _on_json_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.counters.json_messages_delivered += 1
            self._json_error = None
        else:
            self._json_lost(err.str(), err.code())

    def _json_lost(self, why: str, code: int = -1) -> None:
        self.counters.json_messages_lost += 1
        if self._json_error != code:
            self._json_error = code
            log.warning(
                "a copy for the JSON topic %s was lost (%s); more are only counted until one "
                "is delivered",
                self.json_topic,
                why,
            )

    def _pump(self) -> None:
        """Fill the window: from the spool while it has messages not handed yet (they are
        older), then from memory."""
        while self._inflight < self._window and self.fatal_error is None and not self._closed:
            if self._spool.unread:
                items = self._spool.peek(self._window - self._inflight)
                handed = 0
                for item in items:
                    key, payload, readings = item.record
                    if not self._hand(_Message(key, payload, readings, item)):
                        break
                    handed += 1
                self._spool.consume(handed)
                if handed < len(items):
                    break
            elif self._memory:
                if not self._hand(self._memory[0]):
                    break
                self._memory_bytes -= self._memory.popleft().size
            else:
                break
        if self._spilling and not self._spool.messages:
            self._spilling = False
            log.info("spool empty again: every spilled message is delivered")
        if time.monotonic() - self._checkpoint_at >= _CHECKPOINT_INTERVAL_S:
            self._checkpoint_at = time.monotonic()
            self._spool.checkpoint()

    def _spill(self) -> None:
        """Move the oldest messages of memory to the spool, down to `_SPILL_TO` of the bound."""
        batch: list[_Message] = []
        while self._memory and self._memory_bytes > self._memory_max * _SPILL_TO:
            message = self._memory.popleft()
            self._memory_bytes -= message.size
            batch.append(message)
        if not self._spilling:
            self._spilling = True
            log.warning(
                "kafka is not taking messages (%d in flight, %d bytes waiting in memory): "
                "the oldest waiting ones go to the spool %s, delivered in order later",
                self._inflight,
                self._memory_bytes + sum(m.size for m in batch),
                self._spool.directory,
            )
        kept = self._spool.append([m.record() for m in batch])
        self.counters.messages_spilled += kept
        self.counters.readings_spilled += sum(m.readings for m in batch[:kept])
        self._drop(batch[kept:])
        if kept == len(batch) and self._dropping:
            self._dropping = False
            messages, readings = self._dropped_in_episode
            log.warning(
                "spool has room again: %d messages (%d readings) were dropped while it was full",
                messages,
                readings,
            )

    def _drop(self, messages: list[_Message]) -> int:
        if not messages:
            return 0
        readings = sum(m.readings for m in messages)
        self.counters.messages_dropped += len(messages)
        self.counters.readings_dropped += readings
        if self._dropping:
            before = self._dropped_in_episode
            self._dropped_in_episode = (before[0] + len(messages), before[1] + readings)
        else:
            self._dropping = True
            self._dropped_in_episode = (len(messages), readings)
            log.error(
                "spool %s is full (%d bytes, JOBSCOPE_SPOOL_MAX_BYTES=%d): the oldest messages "
                "waiting in memory are dropped until it has room (counted in messages_dropped "
                "and readings_dropped; this is logged again when it ends)",
                self._spool.directory,
                self._spool.bytes,
                self._spool.max_bytes,
            )
        return len(messages)

    def _on_delivery(self, message: _Message, err: KafkaError | None, msg: Message) -> None:
        self._inflight -= 1
        if message.origin is not None:
            self._inflight_spooled -= 1
        if err is None:
            self._delivery_error = None
            self._brokers_down = False
            self.counters.messages_delivered += 1
            self.counters.readings_delivered += message.readings
            if message.origin is not None:
                self.counters.messages_replayed += 1
                self.counters.readings_replayed += message.readings
                self._spool.ack(message.origin)
            return
        if err.code() in _RETURNED:
            message.sent = err.code() != _NOT_SENT
            self._returned.append(message)
            return
        self._failed(message, err)
        if message.origin is not None:
            self._spool.ack(message.origin)  # failed for good: sending it again would fail too

    def _failed(self, message: _Message, err: KafkaError) -> None:
        """Kafka refused the message for good: lost, counted, logged once per kind of error
        until a delivery succeeds again."""
        self.counters.messages_failed += 1
        self.counters.readings_failed += message.readings
        if self._delivery_error != err.code():
            self._delivery_error = err.code()
            log.error(
                "delivery failed for device_id=%s: %d readings lost: %s (more such failures "
                "are only counted until a delivery succeeds)",
                message.key,
                message.readings,
                err.str(),
            )

    def _on_error(self, err: KafkaError) -> None:
        """Client-wide errors. The client retries on its own, except after a fatal one."""
        if err.fatal():
            self.fatal_error = err
            log.critical("kafka client failed for good: %s", err.str())
        elif err.code() == KafkaError._ALL_BROKERS_DOWN:
            if not self._brokers_down:  # once until a delivery succeeds again
                self._brokers_down = True
                log.warning("kafka: %s; messages wait until one is back", err.str())
        elif err.code() != KafkaError._TRANSPORT:  # connection errors: the client logs them
            log.warning("kafka: %s", err.str())
