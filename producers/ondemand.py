"""On-demand metrics: which devices have which metrics switched on, and until when.

An activation names devices (a job's nodes, or devices directly), a metric pattern and an
end. It is published on the compacted on-demand topic (`ondemand`, keyed by activation id:
`job/<job_id>` for the activation of a job); a tombstone (empty value) removes it. The
message is the contract's (kafka/ondemand.py, kafka/WIRE_FORMAT.md), read here with its
`decode`.

`metrics` is a regular expression matched from the start of the metric name, as Kwollect
takes `oarsub -t monitor='<regexp>'`; null means every metric. It is RE2's syntax, run in
time linear in the name (kafka/patterns.py): an activation whose pattern is longer than
`JOBSCOPE_ONDEMAND_MAX_PATTERN_CHARS` or not RE2's (backreferences, look-around) is
refused, logged and counted (`activations_refused`), and polling goes on. `until` null
means until removed (a job's activation is removed when the job ends). An entry is
activated when its device, or the device it measures (`_device_alias`), is named by an
active activation whose pattern matches the entry's metric name.

The producers read the whole topic at start (so a restart recovers the active set) and
follow it; `Activations` is the set they consult, the runtime for `optional` entries and
`optional_period`, and streaming plugins (wattmeters) for each device they serve.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from kafka.ondemand import decode
from kafka.patterns import NameMatcher, PatternError, prefix_matcher

ALIAS_LABEL = "_device_alias"
_BATCH = 500
_FOLLOW_INTERVAL_S = 0.2
_RETRY_S = 5.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Activation:
    id: str
    devices: frozenset[str]
    pattern: NameMatcher | None
    """None: every metric."""
    until_us: int | None
    """UTC µs; None: until removed."""
    job_id: str | None = None

    def active(self, now_us: int) -> bool:
        return self.until_us is None or now_us < self.until_us

    def covers(self, devices: Iterable[str | None], metric: str) -> bool:
        return any(device in self.devices for device in devices) and (
            self.pattern is None or self.pattern.match(metric)
        )


def parse_activation(key: str, value: bytes, max_pattern_chars: int) -> Activation:
    """The activation of one message of the on-demand topic (kafka/ondemand.py); ValueError
    if malformed or if its pattern is longer than `max_pattern_chars` or not RE2's."""
    message = decode(key, value)
    try:
        pattern = prefix_matcher(message.metrics, max_pattern_chars) if message.metrics else None
    except PatternError as exc:
        raise ValueError(f"metrics: {exc}") from None
    return Activation(
        message.id, frozenset(message.devices), pattern, message.until_us(), message.job_id
    )


class Activations:
    """The active set, as last read from the on-demand topic. Empty by default: nothing
    is activated (optional entries are not polled, `optional_period` is not used)."""

    def __init__(self, activations: Mapping[str, Activation] | None = None) -> None:
        self._by_id: dict[str, Activation] = dict(activations or {})
        self.version = 0
        """Incremented on every change of the set (not on expiry: compare `active_ids`)."""
        self.refused = 0
        """Messages of the topic refused as malformed (a bad or too long pattern included)."""

    def put(self, activation: Activation) -> None:
        self._by_id[activation.id] = activation
        self.version += 1

    def remove(self, activation_id: str) -> None:
        if self._by_id.pop(activation_id, None) is not None:
            self.version += 1

    def active_ids(self, now_us: int) -> frozenset[str]:
        """The ids of the activations in force at `now_us`."""
        return frozenset(a.id for a in self._by_id.values() if a.active(now_us))

    def active(self, device_id: str, alias: str | None, metric: str, now_us: int) -> bool:
        """Whether `metric` of `device_id` (measuring `alias`, if any) is activated now."""
        return any(
            a.active(now_us) and a.covers((device_id, alias), metric) for a in self._by_id.values()
        )


class Follower:
    """Reads the on-demand topic from its start into an `Activations`, then follows it.

    No consumer group takes part: every producer process reads every partition, from the
    beginning (the topic is compacted, so that is the current set plus recent changes).
    """

    def __init__(
        self,
        kafka: Mapping[str, Any],
        topic: str,
        activations: Activations,
        logger: logging.Logger,
        max_pattern_chars: int,
    ) -> None:
        """`kafka`: the client's bootstrap and security (KafkaClientSettings.kafka_client);
        `max_pattern_chars`: a longer pattern is refused."""
        self.topic = topic
        self.activations = activations
        self.max_pattern_chars = max_pattern_chars
        self._consumer = Consumer(
            {
                **kafka,
                # required by the client; assign() below never joins or commits to it
                "group.id": "jobscope-producers-ondemand",
                "enable.auto.commit": False,
                "logger": logger,
            }
        )
        self._bad: set[str] = set()

    async def run(self) -> None:
        """Follow the topic until cancelled; waits (logging once) while it does not exist."""
        try:
            await self._assign()
            while True:
                messages = self._consumer.consume(_BATCH, timeout=0)
                for message in messages:
                    self._apply(message)
                if len(messages) < _BATCH:
                    await asyncio.sleep(_FOLLOW_INTERVAL_S)
        finally:
            self._consumer.close()

    async def _assign(self) -> None:
        warned = False
        while True:
            metadata = await asyncio.to_thread(self._consumer.list_topics, self.topic, 10)
            topic = metadata.topics.get(self.topic)
            if topic is not None and topic.error is None and topic.partitions:
                self._consumer.assign(
                    [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in topic.partitions]
                )
                log.info("following on-demand activations on topic %s", self.topic)
                return
            if not warned:
                warned = True
                log.warning(
                    "on-demand topic %s not found yet; optional metrics stay off", self.topic
                )
            await asyncio.sleep(_RETRY_S)

    def _apply(self, message: Message) -> None:
        if message.error() is not None:
            log.warning("on-demand topic: %s", message.error().str())
            return
        key = (message.key() or b"").decode(errors="replace")
        value = message.value()
        if not value:
            self.activations.remove(key)
            log.info("on-demand activation removed: %s", key)
            return
        try:
            activation = parse_activation(key, value, self.max_pattern_chars)
        except ValueError as exc:
            self.activations.refused += 1
            if key not in self._bad:
                self._bad.add(key)
                log.error("on-demand activation %s ignored: %s", key, exc)
            return
        self._bad.discard(key)
        self.activations.put(activation)
        log.info(
            "on-demand activation %s: devices %s, metrics %s, until %s",
            key,
            ",".join(sorted(activation.devices)),
            activation.pattern.pattern if activation.pattern else "(all)",
            "removed" if activation.until_us is None else _iso(activation.until_us),
        )


def _iso(timestamp_us: int) -> str:
    return datetime.fromtimestamp(timestamp_us / 1e6, UTC).isoformat()
