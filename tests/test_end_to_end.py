"""Readings produced to Kafka come back from the API exactly, once each; poison does not
block them; the real producer process polls, publishes and is served end to end."""

from __future__ import annotations

import math
import random
import struct
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from clickhouse_connect.driver.client import Client
from confluent_kafka import Producer

from kafka.message import pack
from kafka.reading import Reading
from producers.plugins.tester.plugin import tester_value
from stack import services
from stack.config import StackSettings
from stack.processes import wait_until


def api_readings(api_url: str, devices: list[str], start: datetime, end: datetime) -> list[dict]:
    response = httpx.get(
        f"{api_url}/api/metrics",
        timeout=60,
        params={
            "devices": ",".join(devices),
            "start_time": start.isoformat(),
            "end_time": end.isoformat(),
        },
    )
    response.raise_for_status()
    return response.json()


def iso(timestamp_us: int) -> str:
    moment = datetime(1970, 1, 1) + timedelta(microseconds=timestamp_us)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")


def test_known_readings_come_back_exactly_once(
    kafka: str, api_url: str, admin_client: Client
) -> None:
    run = uuid.uuid4().hex[:8]
    devices = [f"e2e-{run}-{d}" for d in range(12)]
    rng = random.Random(42)
    start_us = int((time.time() - 600) * 1e6)
    tricky = [0.1 + 0.2, 1e-300, -1.7976931348623157e308, 123456789.123456789, 2.0, -0.0]
    sent: list[Reading] = []
    producer = Producer({"bootstrap.servers": kafka, "enable.idempotence": True, "acks": "all"})
    poison = f"not json, key {run}".encode()
    one = pack([Reading(start_us, devices[0], "m", 1.0, {})]).payload
    not_finite = one.replace(struct.pack("<d", 1.0), struct.pack("<d", math.nan))
    for tick in range(40):
        ts = start_us + tick * 5_000_000 + rng.randrange(1_000_000)  # microseconds matter
        for device in devices:
            readings = [
                Reading(
                    ts,
                    device,
                    f"metric_{m}",
                    rng.choice(tricky) if rng.random() < 0.1 else rng.uniform(-1e6, 1e6),
                    {"slot": str(m), "run": run},
                )
                for m in range(10)
            ]
            sent.extend(readings)
            producer.produce("readings", pack(readings).payload, key=device)
        if tick == 20:  # poison in the middle of the stream, on the same partitions
            producer.produce("readings", poison, key=devices[0])
            producer.produce("readings", not_finite, key=devices[1])
    assert producer.flush(30) == 0

    window = (
        datetime.fromtimestamp(start_us / 1e6 - 1, UTC).replace(tzinfo=None),
        datetime.fromtimestamp(start_us / 1e6 + 300, UTC).replace(tzinfo=None),
    )
    wait_until(
        lambda: len(api_readings(api_url, devices, *window)) >= len(sent),
        60,
        f"{len(sent)} readings to be served by the API",
    )
    got = api_readings(api_url, devices, *window)
    expected = [
        {
            "timestamp": iso(r.timestamp_us),
            "device_id": r.device_id,
            "metric_id": r.metric_id,
            "value": r.value,
            "labels": dict(r.labels),
        }
        for r in sent
    ]

    def key(row: dict) -> tuple:
        return row["timestamp"], row["device_id"], row["metric_id"]

    assert len(got) == len(sent) == 12 * 40 * 10  # as many as were sent: none lost, none twice
    assert sorted(got, key=key) == sorted(expected, key=key)  # values, µs timestamps, labels

    errors = admin_client.query(
        "SELECT raw_message, error FROM ingest_errors WHERE raw_message = {p:String} "
        "OR (position(raw_message, {d:String}) > 0 AND error = 'value is not finite')",
        parameters={"p": poison.decode(), "d": devices[0]},
    ).result_rows
    assert len(errors) == 2, errors
    assert {e[0] for e in errors} >= {poison.decode()}
    assert all(e[1] for e in errors)


def test_producer_process_to_api(clickhouse: StackSettings, api_url: str, tmp_path: Path) -> None:
    """`python -m producers` polls tester devices; the API serves exactly their values."""
    run = uuid.uuid4().hex[:6]
    devices_file = tmp_path / "devices.yaml"
    devices_file.write_text(
        "".join(
            f"- {{name: e2e_value, device_id: tester-{run}-{d}, url: 'tester://?metrics=5', "
            f"update_every: 250, labels: {{source: e2e}}}}\n"
            for d in range(3)
        )
    )
    proc = services.start_producers(clickhouse, devices_file, name="producers-e2e")
    try:
        start = datetime.now(UTC).replace(tzinfo=None) - timedelta(seconds=5)
        names = [f"tester-{run}-{d}" for d in range(3)]

        def enough() -> bool:
            now = datetime.now(UTC).replace(tzinfo=None)
            return len(api_readings(api_url, names, start, now)) >= 3 * 5 * 8

        wait_until(enough, 60, "two seconds of tester readings in the API")
    finally:
        proc.stop()
    rows = api_readings(api_url, names, start, datetime.now(UTC).replace(tzinfo=None))
    assert rows
    for row in rows:
        moment = datetime.fromisoformat(row["timestamp"])
        timestamp_us = (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
        assert row["value"] == tester_value(row["device_id"], row["metric_id"], timestamp_us)
        assert row["labels"] == {"source": "e2e"}
    per_series = {}
    for row in rows:
        per_series.setdefault((row["device_id"], row["metric_id"]), []).append(row["timestamp"])
    assert len(per_series) == 15
    assert all(len(ts) == len(set(ts)) for ts in per_series.values())
