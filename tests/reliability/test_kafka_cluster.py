"""A three-broker Kafka cluster loses brokers under load: every reading accepted is stored
exactly once, and nobody intervenes.

The stack's own code starts three KRaft nodes (JOBSCOPE_KAFKA_BROKERS=3: topics replicated 3
times, 2 in sync) and a ClickHouse server whose Kafka-engine table consumes the readings
topic. jobscope's Publisher (producers/publisher.py) produces known readings at a steady
rate while node 1 is killed with SIGKILL (and later started again) and node 2 is restarted
(SIGTERM, start). At the end the publisher reports every reading delivered, the topic holds
each once, and ClickHouse stores each once (`count()` with and without FINAL).
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka.admin import AdminClient

from kafka import topics
from kafka.message import pack
from kafka.reading import Reading
from producers.config import ProducerSettings
from producers.publisher import CloseResult, Publisher
from stack import kafka_broker, services
from stack.config import StackSettings
from stack.processes import wait_until
from stack.transient import KAFKA_STARTING
from tests import ports

from .conftest import kafka_reading_copies

pytestmark = pytest.mark.slow

DEVICES = 20
METRICS = 10
INTERVAL_S = 0.1  # one message per device per tick
# How soon the controller fences the SIGKILLed node and moves its partitions' leaders: the
# same fencing, election and producer retries as with Kafka's 9 s, sooner. Still four
# heartbeats (1 s each), so a node slowed by a loaded machine is not fenced while it lives.
BROKER_SESSION_MS = 4000


@pytest.fixture(scope="module")
def cluster() -> Iterator[StackSettings]:
    """Three Kafka nodes and a ClickHouse server on this session's ports (tests/ports.py).
    The killed node is fenced after BROKER_SESSION_MS instead of Kafka's 9 s."""
    settings = ports.stack_settings(
        "kafka-cluster",
        kafka_brokers=3,
        kafka_heap="384m",
        kafka_broker_session_timeout_ms=BROKER_SESSION_MS,
    )
    services.stop_all(settings)
    shutil.rmtree(settings.state_dir, ignore_errors=True)
    try:
        services.start_kafka(settings)
        services.start_clickhouse(settings)
        yield settings
    finally:
        services.process(settings, "clickhouse").stop()
        for node in kafka_broker.nodes(settings):  # state discarded: no orderly shutdown
            kafka_broker.process(settings, node.node_id).kill()
        shutil.rmtree(settings.state_dir, ignore_errors=True)


class Load(threading.Thread):
    """Publishes DEVICES x METRICS readings per tick through one Publisher until `done` is
    set, then closes it (the Publisher belongs to this thread)."""

    def __init__(self, bootstrap: str, prefix: str, spool: Path) -> None:
        super().__init__(daemon=True)
        self.publisher = Publisher(ProducerSettings(kafka_bootstrap=bootstrap, spool_dir=spool))
        self.devices = [f"{prefix}-{d}" for d in range(DEVICES)]
        self.sent = 0
        self.done = threading.Event()
        self.result: CloseResult | None = None

    def delivered(self) -> int:
        return self.publisher.counters.readings_delivered

    def run(self) -> None:
        asyncio.run(self._produce())
        self.result = self.publisher.close(60)

    async def _produce(self) -> None:
        start_us = int(time.time() * 1e6)
        tick = 0
        while not self.done.is_set():
            for device in self.devices:
                readings = [
                    Reading(start_us + tick * 100_000, device, f"m{m}", float(tick))
                    for m in range(METRICS)
                ]
                await self.publisher.publish(device, pack(readings).payload, len(readings))
                self.sent += len(readings)
            self.publisher.serve_callbacks()
            tick += 1
            await asyncio.sleep(INTERVAL_S)


def stored(client: Client, prefix: str, final: bool = False) -> int:
    return int(
        client.command(
            f"SELECT count() FROM metrics {'FINAL' if final else ''} "
            "WHERE startsWith(device_id, {p:String})",
            parameters={"p": prefix},
        )
    )


def recovery_s(progress: Callable[[], int], since: float, what: str, timeout: float) -> float:
    """Seconds from `since` until `progress` moves past its value now (one tick's worth)."""
    base = progress()
    wait_until(lambda: progress() >= base + DEVICES * METRICS, timeout, what, interval=0.1)
    return time.monotonic() - since


def all_in_sync(bootstrap: str) -> bool:
    topic = AdminClient({"bootstrap.servers": bootstrap}).list_topics("readings", timeout=5)
    partitions = topic.topics["readings"].partitions.values()
    return all(len(p.isrs) == 3 for p in partitions)


def break_brokers(
    cluster: StackSettings, client: Client, load: Load, prefix: str
) -> dict[str, float]:
    """Kill node 1 (SIGKILL) then start it again, then restart node 2, while `load` runs;
    return how long deliveries and ingest took to move again after each."""
    figures: dict[str, float] = {}
    wait_until(lambda: load.delivered() > 0, 30, "the first readings to be delivered")
    wait_until(lambda: stored(client, prefix) > 0, 60, "the first readings to be stored")

    steady = 30 * DEVICES * METRICS  # 3 s of load before the first fault
    wait_until(lambda: load.delivered() >= steady, 60, "a steady load")
    killed = time.monotonic()
    kafka_broker.process(cluster, 1).kill()  # SIGKILL
    figures["produce after kill -9 (s)"] = recovery_s(
        load.delivered, killed, "deliveries after kill -9 of node 1", 60
    )
    figures["store after kill -9 (s)"] = recovery_s(
        lambda: stored(client, prefix), killed, "ingest after kill -9 of node 1", 90
    )
    kafka_broker.start(cluster)  # node 1 again
    wait_until(
        lambda: all_in_sync(cluster.kafka_bootstrap),
        60,
        "every replica in sync",
        transient=KAFKA_STARTING,  # node 1, just started, may be the one asked first
    )

    restarted = time.monotonic()
    kafka_broker.process(cluster, 2).stop(timeout=30)
    kafka_broker.start(cluster)
    figures["node 2 restart (s)"] = time.monotonic() - restarted
    figures["produce after restart (s)"] = recovery_s(
        load.delivered, restarted, "deliveries after the restart of node 2", 60
    )
    figures["store after restart (s)"] = recovery_s(
        lambda: stored(client, prefix), restarted, "ingest after the restart of node 2", 90
    )
    return figures


def test_broker_loss_under_load(cluster: StackSettings, tmp_path: Path) -> None:
    client = services.clickhouse_client(cluster, "jobscope")
    prefix = f"kc-{uuid.uuid4().hex[:6]}"
    load = Load(cluster.kafka_bootstrap, prefix, tmp_path / "spool")
    load.start()
    try:
        figures = break_brokers(cluster, client, load, prefix)
    finally:
        load.done.set()
    load.join(90)
    assert load.result is not None, "the publisher did not close"
    result, counters = load.result, load.publisher.counters
    assert (result.kept, result.dropped) == (0, 0)
    assert counters.readings_failed == 0
    assert counters.readings_delivered == counters.readings_queued == load.sent
    copies = kafka_reading_copies(cluster.kafka_bootstrap, prefix)
    assert len(copies) == load.sent and max(copies.values()) == 1, "the topic holds a copy"
    wait_until(
        lambda: stored(client, prefix, final=True) >= load.sent,
        90,
        f"{load.sent} readings of {prefix} to be stored",
    )
    migration = services.migration_settings(cluster)
    wait_until(
        lambda: (
            topics.consumer_lag(cluster.kafka_bootstrap, migration.consumer_group, "readings") == 0
        ),
        60,
        "ClickHouse to commit the whole topic",
        transient=KAFKA_STARTING,  # the group's coordinator may have moved with the brokers
    )  # a copy consumed again would be stored by now
    assert stored(client, prefix, final=True) == load.sent
    assert stored(client, prefix) == load.sent, "a reading is stored twice"
    print(
        f"readings sent {load.sent}, stored {stored(client, prefix)}; "
        + ", ".join(f"{name} {value:.1f}" for name, value in figures.items())
    )
