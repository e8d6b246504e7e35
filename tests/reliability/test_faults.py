"""Faults under load lose no accepted reading and show none twice (issue: reliability).

Each test produces a known set of readings while a component fails, then checks that every
reading Kafka accepted is queryable exactly once by SQL readers and through the API.
Delivery is at-least-once underneath (a restart can store a block twice); the read-only
user's FINAL makes such duplicates invisible.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka import Producer

from kafka.message import pack
from kafka.reading import Reading
from stack import services
from stack.config import StackSettings
from stack.processes import wait_until
from tests.schedules import assert_unbroken

from .conftest import LoadGenerator, assert_exactly_once, kafka_ground_truth, stored

pytestmark = [pytest.mark.slow, pytest.mark.disruptive]


def run_with_fault(settings: StackSettings, fault, **load: int) -> LoadGenerator:
    gen = LoadGenerator(settings.kafka_bootstrap, f"fault-{uuid.uuid4().hex[:8]}", **load)
    gen.start()
    gen.wait_progress(0.3)
    fault()
    gen.join(300)
    assert not gen.is_alive(), "the load generator did not finish"
    assert gen.failed == [], gen.failed
    return gen


def test_kafka_broker_killed_mid_stream(
    clickhouse: StackSettings, api_url: str, reader: Client
) -> None:
    def fault() -> None:
        services.process(clickhouse, "kafka").kill()
        time.sleep(2)  # producers and the Kafka engine see the broker gone
        services.start_kafka(clickhouse)

    gen = run_with_fault(clickhouse, fault)
    assert_exactly_once(reader, api_url, gen.prefix, gen.devices, gen.expected)


@pytest.mark.parametrize("how", ["restart", "kill -9"])
def test_clickhouse_server_restarted_mid_stream(
    clickhouse: StackSettings, api_url: str, how: str, admin: Client
) -> None:
    def fault() -> None:
        proc = services.process(clickhouse, "clickhouse")
        proc.stop() if how == "restart" else proc.kill()
        services.start_clickhouse(clickhouse)

    gen = run_with_fault(clickhouse, fault)
    reader = services.clickhouse_client(clickhouse, "reader")  # after the server restarted
    assert_exactly_once(reader, api_url, gen.prefix, gen.devices, gen.expected)


def test_poison_messages_mixed_into_the_stream(
    clickhouse: StackSettings, api_url: str, reader: Client, admin: Client
) -> None:
    gen = LoadGenerator(
        clickhouse.kafka_bootstrap, f"poison-{uuid.uuid4().hex[:8]}", ticks=60, poison_every=7
    )
    gen.run()  # in this thread: no fault but the poison itself
    assert gen.failed == [] and gen.poison_sent > 100
    assert_exactly_once(reader, api_url, gen.prefix, gen.devices, gen.expected)
    wait_until(
        lambda: (
            admin.command(
                "SELECT count() FROM ingest_errors WHERE startsWith(raw_message, {p:String})",
                parameters={"p": f"poison {gen.prefix} "},
            )
            == gen.poison_sent
        ),
        60,
        "every poison message in ingest_errors",
    )


def test_consumption_resumes_promptly_after_clickhouse_kill(clickhouse: StackSettings) -> None:
    """A killed engine's consumers stay members of the consumer group until their session
    times out, and the group waits for them before the new consumers get partitions: the
    engine's session timeout (6 s, librdkafka's default is 45 s) bounds that stall."""
    producer = Producer({"bootstrap.servers": clickhouse.kafka_bootstrap})

    def store_one(client: Client, what: str) -> None:
        device = f"resume-{uuid.uuid4().hex[:8]}"
        reading = Reading(int(time.time() * 1e6), device, "m", 1.0, {})
        producer.produce("readings", pack([reading]).payload, key=device)
        assert producer.flush(30) == 0
        wait_until(
            lambda: (
                client.command(
                    "SELECT count() FROM metrics WHERE device_id = {d:String}",
                    parameters={"d": device},
                )
                == 1
            ),
            25,
            what,
        )

    store_one(services.clickhouse_client(clickhouse, "reader"), "the consumers to be running")
    services.process(clickhouse, "clickhouse").kill()
    services.start_clickhouse(clickhouse)
    store_one(
        services.clickhouse_client(clickhouse, "reader"),
        "a reading produced after kill -9 of ClickHouse to be stored (the group's stall is "
        "bounded by the engine's Kafka session timeout)",
    )


def _devices_file(path: Path, prefix: str, hang_file: Path | None = None) -> Path:
    lines = [
        f"- {{name: rel, device_id: {prefix}-{d}, url: 'tester://?metrics=10', update_every: 100}}"
        for d in range(4)
    ]
    if hang_file is not None:
        lines.append(
            f"- {{name: rel, device_id: {prefix}-hang, "
            f"url: 'tester://?metrics=10&hang_file={hang_file}', update_every: 100}}"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def _series_ticks(rows: list[tuple[str, str, int, float]], device: str) -> list[int]:
    return sorted({t for d, m, t, _v in rows if d == device and m == "rel_0"})


def test_producer_killed_and_restarted(
    clickhouse: StackSettings, api_url: str, reader: Client, tmp_path: Path
) -> None:
    """kill -9 loses only what Kafka never accepted; all it accepted is stored once."""
    prefix = f"pk-{uuid.uuid4().hex[:8]}"
    devices = _devices_file(tmp_path / "devices.yaml", prefix)
    proc = services.start_producers(clickhouse, devices, name="producers-fault")
    try:
        wait_until(
            lambda: (
                reader.command(
                    "SELECT count() FROM metrics WHERE startsWith(device_id, {p:String})",
                    parameters={"p": prefix},
                )
                >= 200
            ),
            60,
            "the producer to publish",
        )
        proc.kill()
        killed_at = time.time()
        services.start_producers(clickhouse, devices, name="producers-fault")
        wait_until(
            lambda: (
                reader.command(
                    "SELECT max(toUnixTimestamp64Micro(timestamp)) FROM metrics "
                    "WHERE startsWith(device_id, {p:String})",
                    parameters={"p": prefix},
                )
                > (killed_at + 2) * 1e6
            ),
            60,
            "readings after the restart",
        )
    finally:
        proc.stop()
    truth = kafka_ground_truth(clickhouse.kafka_bootstrap, prefix)
    assert_exactly_once(reader, api_url, prefix, [f"{prefix}-{d}" for d in range(4)], truth)
    ticks = _series_ticks(stored(reader, prefix), f"{prefix}-0")
    assert ticks[0] < killed_at * 1e6 < ticks[-1]


def test_hanging_device_does_not_hold_back_the_others(
    clickhouse: StackSettings, api_url: str, reader: Client, tmp_path: Path
) -> None:
    prefix = f"hd-{uuid.uuid4().hex[:8]}"
    hang = tmp_path / "hang"
    devices = _devices_file(tmp_path / "devices.yaml", prefix, hang_file=hang)
    proc = services.start_producers(clickhouse, devices, name="producers-hang")

    def newest_of_hang() -> float:
        return reader.command(
            "SELECT max(toUnixTimestamp64Micro(timestamp)) FROM metrics "
            "WHERE device_id = {d:String}",
            parameters={"d": f"{prefix}-hang"},
        )

    try:
        wait_until(lambda: newest_of_hang() > 0, 60, "readings of the device before it hangs")
        hang.touch()
        hung_from = time.time()
        time.sleep(2.0)  # the hang
        hang.unlink()
        hung_until = time.time()
        wait_until(lambda: newest_of_hang() > hung_until * 1e6, 60, "the device to recover")
    finally:
        proc.stop()
    truth = kafka_ground_truth(clickhouse.kafka_bootstrap, prefix)
    everyone = [f"{prefix}-{d}" for d in range(4)] + [f"{prefix}-hang"]
    assert_exactly_once(reader, api_url, prefix, everyone, truth)
    rows = stored(reader, prefix)
    healthy = _series_ticks(rows, f"{prefix}-0")
    # every tick but those the producer reported skipped (a busy machine may skip a few;
    # how late a poll starts is the bench's figure): tests/schedules.py
    assert_unbroken(healthy, 100_000, proc.log_file.read_text(), f"{prefix}-0")
    # held back, a healthy device would wait out the 2 s hang (its ticks reported skipped)
    during = [t for t in healthy if hung_from * 1e6 < t < hung_until * 1e6]
    assert len(during) >= 10, f"a healthy device polled {len(during)} times in the 2 s hang"
    hung = _series_ticks(rows, f"{prefix}-hang")
    inside = [t for t in hung if hung_from * 1e6 + 200_000 < t < hung_until * 1e6 - 200_000]
    assert inside == [], "the hanging device produced readings while hung"
    assert hung[0] < hung_from * 1e6 and hung[-1] > hung_until * 1e6, "it recovered"
