"""Helpers for the fault tests: a load generator with known readings, the ground truth of
what Kafka accepted, and what readers see in ClickHouse and through the API."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime

import httpx
import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from api.infra.params import to_us
from kafka.message import pack, unpack
from kafka.reading import Reading
from stack import services
from stack.config import StackSettings
from stack.processes import wait_until

Key = tuple[str, str, int]  # device_id, metric_id, timestamp_us


class LoadGenerator(threading.Thread):
    """Produces known readings at a steady rate with an idempotent producer, as jobscope's
    producers do, and records which ones Kafka acknowledged."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        devices: int = 20,
        metrics: int = 20,
        ticks: int = 200,
        interval_s: float = 0.05,
        poison_every: int = 0,
    ) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.prefix = bootstrap, prefix
        self.devices = [f"{prefix}-{d}" for d in range(devices)]
        self.metrics, self.ticks, self.interval_s = metrics, ticks, interval_s
        self.poison_every = poison_every
        self.expected: dict[Key, float] = {}
        self.acked = 0
        self.failed: list[str] = []
        self.poison_sent = 0
        self.progress = 0

    def _delivered(self, err: KafkaError | None, msg: object) -> None:
        if err is None:
            self.acked += 1
        else:
            self.failed.append(str(err))

    def run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 300_000,
                "log_level": 0,
            }
        )
        base_us = int((time.time() - 3600) * 1e6) // 1000 * 1000
        for tick in range(self.ticks):
            ts = base_us + tick * 1_000_000 + 123  # µs that must survive
            for n, device in enumerate(self.devices):
                readings = [
                    Reading(ts, device, f"m{m}", tick * 1000 + n + m / 1000, {"t": str(tick)})
                    for m in range(self.metrics)
                ]
                for r in readings:
                    self.expected[(r.device_id, r.metric_id, r.timestamp_us)] = r.value
                producer.produce(
                    "readings", pack(readings).payload, key=device, on_delivery=self._delivered
                )
                if self.poison_every and (tick * len(self.devices) + n) % self.poison_every == 0:
                    producer.produce(
                        "readings",
                        f"poison {self.prefix} {tick} {n}".encode(),
                        key=device,
                        on_delivery=self._delivered,
                    )
                    self.poison_sent += 1
            producer.poll(0)
            self.progress = tick + 1
            time.sleep(self.interval_s)
        remaining = producer.flush(300)
        if remaining:
            self.failed.append(f"{remaining} messages never delivered")

    def wait_progress(self, fraction: float) -> None:
        wait_until(
            lambda: self.progress >= self.ticks * fraction,
            60,
            f"{fraction:.0%} of the load to be produced",
        )


def kafka_ground_truth(bootstrap: str, prefix: str) -> dict[Key, float]:
    """Every reading of devices starting with `prefix` that the readings topic holds."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"truth-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    metadata = consumer.list_topics("readings", timeout=30)
    partitions = [
        TopicPartition("readings", p, OFFSET_BEGINNING)
        for p in metadata.topics["readings"].partitions
    ]
    ends = {p.partition: consumer.get_watermark_offsets(p, timeout=30)[1] for p in partitions}
    consumer.assign(partitions)
    done = {p for p, end in ends.items() if end == 0}
    truth: dict[Key, float] = {}
    deadline = time.monotonic() + 120
    while len(done) < len(ends) and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None or msg.error():
            continue
        if msg.offset() >= ends[msg.partition()] - 1:
            done.add(msg.partition())
        if (msg.key() or b"").decode().startswith(prefix):
            try:
                readings = unpack(msg.value())
            except ValueError:
                continue  # poison: not a reading
            for r in readings:
                truth[(r.device_id, r.metric_id, r.timestamp_us)] = r.value
    consumer.close()
    assert len(done) == len(ends), "could not read the readings topic to its end"
    return truth


def kafka_reading_copies(bootstrap: str, prefix: str) -> Counter[Key]:
    """How many times the readings topic holds each reading of devices starting with
    `prefix` (a producer that sent a message twice shows copies of 2)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"copies-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        metadata = consumer.list_topics("readings", timeout=30)
        partitions = [
            TopicPartition("readings", p, OFFSET_BEGINNING)
            for p in metadata.topics["readings"].partitions
        ]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=30)[1] for p in partitions}
        consumer.assign(partitions)
        positions = dict.fromkeys(ends, 0)
        copies: Counter[Key] = Counter()

        def at_end() -> bool:
            for msg in consumer.consume(10_000, timeout=0.5):
                if msg.error():
                    continue
                positions[msg.partition()] = msg.offset() + 1
                if (msg.key() or b"").decode().startswith(prefix):
                    try:
                        readings = unpack(msg.value())
                    except ValueError:
                        continue  # poison: not a reading
                    copies.update((r.device_id, r.metric_id, r.timestamp_us) for r in readings)
            return all(positions[p] >= end for p, end in ends.items())

        wait_until(at_end, 120, "the readings topic read to its end")
        return copies
    finally:
        consumer.close()


def stored(client: Client, prefix: str) -> list[tuple[str, str, int, float]]:
    rows = client.query(
        "SELECT device_id, metric_id, toUnixTimestamp64Micro(timestamp), value FROM metrics "
        "WHERE startsWith(device_id, {p:String})",
        parameters={"p": prefix},
    ).result_rows
    return [tuple(r) for r in rows]  # type: ignore[misc]


def assert_exactly_once(
    reader: Client,
    api_url: str,
    prefix: str,
    devices: Iterable[str],
    expected: dict[Key, float],
    timeout: float = 120,
) -> None:
    """Every expected reading is visible once, to SQL readers and through the API."""
    wait_until(
        lambda: (
            reader.command(
                "SELECT count() FROM metrics WHERE startsWith(device_id, {p:String})",
                parameters={"p": prefix},
            )
            >= len(expected)
        ),
        timeout,
        f"{len(expected)} readings of {prefix} to be stored",
    )
    rows = stored(reader, prefix)
    keys = [(d, m, t) for d, m, t, _v in rows]
    assert len(keys) == len(set(keys)), "a reader sees a reading twice"
    assert {(d, m, t): v for d, m, t, v in rows} == expected
    response = httpx.get(
        f"{api_url}/api/metrics",
        timeout=120,
        params={
            "devices": ",".join(devices),
            "start_time": "2000-01-01T00:00:00",
            "end_time": datetime.now(UTC).isoformat(),
        },
    )
    assert response.status_code == 200, response.text
    served = [
        ((r["device_id"], r["metric_id"], _timestamp_us(r["timestamp"])), r["value"])
        for r in response.json()
    ]
    assert len(served) == len(dict(served)), "the API serves a reading twice"
    got = dict(served)
    wrong = {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
    unexpected = got.keys() - expected.keys()
    assert not wrong and not unexpected, (
        f"the API serves {len(wrong)} readings wrongly or not at all (served, expected: "
        f"{sorted(wrong.items())[:3]}) and {len(unexpected)} unexpected ones"
    )


def _timestamp_us(iso: str) -> int:
    """Microseconds since the epoch of a timestamp as the API writes it (with its offset)."""
    return to_us(datetime.fromisoformat(iso).astimezone(UTC).replace(tzinfo=None))


@pytest.fixture
def reader(clickhouse: StackSettings) -> Client:
    """A fresh client per test: the fault tests restart the server under it."""
    return services.clickhouse_client(clickhouse, "reader")


@pytest.fixture
def admin(clickhouse: StackSettings) -> Client:
    return services.clickhouse_client(clickhouse, "jobscope")
