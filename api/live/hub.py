"""One Kafka consumer per API process, shared by every live stream.

It reads every partition of the readings topic from the end (no consumer group: it never
commits and never rebalances) and hands each message to the streams that asked for its
key, the device id: a message of no subscribed device is never decoded, so a stream costs
in proportion to its own devices, not to the site. It runs in a thread while at least one
stream is subscribed and stops `idle_s` after the last one left.

The consumer is watched: when a partition grew while the consumer did not move for
`_STALL_S`, it is replaced by a new one assigned at the same positions, so no message is
skipped. An assigned librdkafka consumer can stop fetching for good after a broker restart
(librdkafka issue 5153); a new one fetches again.

Each subscription holds at most `buffer_bytes` of messages not yet taken by its stream;
past that it is marked overflowed and fed no more (its stream then tells the client it was
dropped): a slow client costs bounded memory and never slows the others.

`Subscription.positions` is, per partition, the offset of the first message the
subscription receives: every later message reaches it, none before. The stream uses it to
join a replay from ClickHouse to the live messages (api/live/stream.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kafka.message import unpack
from kafka.reading import Reading

log = logging.getLogger("jobscope.api.live")
_POLL_S = 0.05
_ERROR_LOG_EVERY_S = 30.0
_LEADER_WAIT_S = 15.0
"""How long a partition may lack a leader (a topic just made, a broker just restarted)
before a first subscription fails."""
_LEADER_CHANGING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
)
_STALL_S = 5.0
"""How often the consumer's progress is checked against the partitions' ends."""


@dataclass(eq=False)
class Subscription:
    """What one stream receives; fed by the hub's thread, drained by the stream's task."""

    keys: frozenset[str]
    loop: asyncio.AbstractEventLoop
    buffer_bytes: int
    positions: dict[int, int] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    overflowed: bool = False
    _pending: deque[list[Reading]] = field(default_factory=deque)
    _bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def offer(self, readings: list[Reading], size: int) -> bool:
        """Queue a message's readings (hub thread); False once over the bound."""
        with self._lock:
            if self.overflowed:
                return False
            if self._bytes + size > self.buffer_bytes:
                self.overflowed = True
                self._pending.clear()
                self._bytes = 0
                return False
            self._pending.append(readings)
            self._bytes += size
            return True

    def take(self) -> list[Reading]:
        """Every queued reading, oldest first (stream task)."""
        with self._lock:
            taken = [r for message in self._pending for r in message]
            self._pending.clear()
            self._bytes = 0
            self.wake.clear()
        return taken

    def signal(self) -> None:
        self.loop.call_soon_threadsafe(self.wake.set)


@dataclass
class _Progress:
    """What the hub's stall check remembers, per partition."""

    seen: dict[int, tuple[int, int]] = field(default_factory=dict)
    """(position, end) at the last check."""
    replaced_at: dict[int, int] = field(default_factory=dict)
    """The position at which the consumer was last replaced for it."""

    def stalled(self, partition: int, position: int, end: int) -> bool:
        """Had messages to read at the last check and did not move since. Once replaced at
        a position, again only if the partition grew: a last offset that no message takes
        (a transaction marker) must not replace the consumer at every check."""
        last = self.seen.get(partition)
        if last is None or not last[0] == position < last[1]:
            return False
        return end > last[1] or self.replaced_at.get(partition) != position


def _end_offset(consumer: Consumer, tp: TopicPartition) -> int:
    """The partition's end, waiting up to `_LEADER_WAIT_S` while its leader is changing."""
    deadline = time.monotonic() + _LEADER_WAIT_S
    while True:
        try:
            return int(consumer.get_watermark_offsets(tp, timeout=10)[1])
        except KafkaException as exc:
            changing = exc.args[0].code() in _LEADER_CHANGING
            if not changing or time.monotonic() > deadline:
                raise
            log.info("live: %s[%d] has no leader yet (%s)", tp.topic, tp.partition, exc)
            time.sleep(0.2)


class ReadingsHub:
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        idle_s: float = 30.0,
        security: Mapping[str, str] | None = None,
    ) -> None:
        """`security`: Kafka's credentials (KafkaClientSettings.kafka_security)."""
        self.bootstrap = bootstrap
        self._security = dict(security or {})
        self.topic = topic
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._subscriptions: set[Subscription] = set()
        self._by_key: dict[bytes, set[Subscription]] = {}
        self._positions: dict[int, int] = {}
        self._consumer: Consumer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.malformed = 0
        """Messages that could not be decoded (ClickHouse's ingest_errors has them too)."""

    def subscribe(self, sub: Subscription) -> None:
        """Start receiving the messages of `sub.keys` published from now on; sets
        `sub.positions`. Blocking (starts the consumer if needed): call it in a thread."""
        with self._lock:
            if self._consumer is None:
                self._start()
            sub.positions = dict(self._positions)
            self._subscriptions.add(sub)
            self._index(sub, sub.keys)

    def update(self, sub: Subscription, keys: frozenset[str]) -> None:
        """Change the devices a subscription receives (its job's nodes or aliases changed)."""
        with self._lock:
            if sub not in self._subscriptions:
                return
            self._unindex(sub)
            sub.keys = keys
            self._index(sub, keys)

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subscriptions.discard(sub)
            self._unindex(sub)

    @property
    def subscribers(self) -> int:
        return len(self._subscriptions)

    def close(self) -> None:
        self._stopping = True
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)

    def _index(self, sub: Subscription, keys: frozenset[str]) -> None:
        for key in keys:
            self._by_key.setdefault(key.encode(), set()).add(sub)

    def _unindex(self, sub: Subscription) -> None:
        for key in sub.keys:
            subs = self._by_key.get(key.encode())
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._by_key[key.encode()]

    def _start(self) -> None:
        """Assign every partition at its current end (under `_lock`)."""
        consumer = self._new_consumer()
        try:
            metadata = consumer.list_topics(self.topic, timeout=10).topics[self.topic]
            if metadata.error is not None:
                raise RuntimeError(f"topic {self.topic}: {metadata.error.str()}")
            positions = {}
            for partition in sorted(metadata.partitions):
                positions[partition] = _end_offset(consumer, TopicPartition(self.topic, partition))
        except Exception:
            consumer.close()
            raise
        consumer.assign([TopicPartition(self.topic, p, o) for p, o in positions.items()])
        self._consumer, self._positions = consumer, positions
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="live readings", daemon=True)
        self._thread.start()
        log.info("live: reading %s from its end (%d partitions)", self.topic, len(positions))

    def _new_consumer(self) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                **self._security,
                "group.id": "jobscope-api-live",  # required by the client; never joined
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "fetch.wait.max.ms": 50,
                "log_level": 3,
            }
        )

    def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        idle_since: float | None = None
        error_logged = 0.0
        next_check = time.monotonic() + _STALL_S
        progress = _Progress()
        try:
            while not self._stopping:
                messages = consumer.consume(1000, _POLL_S)
                woken: set[Subscription] = set()
                with self._lock:
                    for message in messages:
                        error = message.error()
                        if error is not None:
                            if time.monotonic() - error_logged > _ERROR_LOG_EVERY_S:
                                error_logged = time.monotonic()
                                log.warning("live: Kafka: %s", error.str())
                            continue
                        self._positions[message.partition()] = message.offset() + 1
                        subs = self._by_key.get(message.key() or b"")
                        if subs:
                            self._dispatch(message.value() or b"", subs, woken)
                    if self._subscriptions:
                        idle_since = None
                    elif idle_since is None:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > self.idle_s:
                        self._consumer = None
                        break
                for sub in woken:
                    sub.signal()
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + _STALL_S
                    consumer = self._unstuck(consumer, progress)
        finally:
            consumer.close()
            log.info("live: stopped reading %s", self.topic)

    def _unstuck(self, consumer: Consumer, progress: _Progress) -> Consumer:
        """`consumer`, or a new one at the same positions if it did not move since the last
        check while a partition had messages to read then."""
        with self._lock:
            positions = dict(self._positions)
        stalled = []
        for partition, position in positions.items():
            tp = TopicPartition(self.topic, partition)
            try:
                end = consumer.get_watermark_offsets(tp, timeout=1)[1]
            except KafkaException:  # the broker is away: nothing to judge
                progress.seen.clear()
                return consumer
            if progress.stalled(partition, position, end):
                stalled.append(partition)
            progress.seen[partition] = (position, end)
        if not stalled:
            return consumer
        log.warning(
            "live: the Kafka consumer did not move for %.0f s with messages to read in "
            "partitions %s: replaced by a new one at the same offsets",
            _STALL_S,
            stalled,
        )
        consumer.close()
        consumer = self._new_consumer()
        consumer.assign([TopicPartition(self.topic, p, o) for p, o in positions.items()])
        with self._lock:
            self._consumer = consumer
        progress.seen.clear()
        progress.replaced_at.update((p, positions[p]) for p in stalled)
        return consumer

    def _dispatch(self, payload: bytes, subs: set[Subscription], woken: set[Subscription]) -> None:
        try:
            readings = unpack(payload)
        except ValueError:
            self.malformed += 1
            return
        for sub in subs:
            if sub.offer(readings, len(payload)) or sub.overflowed:
                woken.add(sub)
