"""The opt-in JSON topic (JOBSCOPE_JSON_TOPIC): the producers and the API's push publish
each message's readings a second time as JSON lines, and those decode to the very readings
of the readings topic; messages that waited in the spool get their copy when delivered; the
example consumer prints live power per node from it."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from fastapi.testclient import TestClient

from api.infra.config import ApiSettings
from api.main import create_app
from kafka import topics
from kafka.message import pack, unpack
from kafka.reading import Reading
from producers.config import ProducerSettings
from producers.publisher import Publisher
from stack import secrets, services
from stack.config import REPO_ROOT, StackSettings
from stack.processes import wait_until
from stack.transient import KAFKA_STARTING


@pytest.fixture
def json_topic(kafka: str) -> str:
    name = f"readings-json-{uuid.uuid4().hex[:8]}"
    topics.ensure_topics(kafka, (topics.json_readings(name),))
    return name


def from_time(bootstrap: str, topic: str, since_ms: int) -> Consumer:
    """A consumer of every partition of `topic` from the first message at or after
    `since_ms` (Kafka's message time)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}", "log_level": 3}
    )
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    wanted = [TopicPartition(topic, p, since_ms) for p in partitions]
    found = wait_until(  # a topic created a moment ago answers once it has leaders
        lambda: consumer.offsets_for_times(wanted, 2),
        30,
        f"the offsets of {topic} at {since_ms} ms",
        transient=KAFKA_STARTING,
    )
    consumer.assign(found)
    return consumer


class Collector:
    """Readings of the devices in `keep` from `topic`, from `since_ms` on: JSON lines, or the
    wire format (`json=False`)."""

    def __init__(self, bootstrap: str, topic: str, since_ms: int, keep: set[str], json: bool):
        self.consumer = from_time(bootstrap, topic, since_ms)
        self.keep, self.json = keep, json
        self.readings: list[Reading] = []
        self.messages = 0

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.consumer.close()

    def poll(self) -> list[Reading]:
        for message in self.consumer.consume(1000, timeout=0.3):
            if message.error() is not None or message.key().decode() not in self.keep:
                continue
            self.messages += 1
            if self.json:
                for line in message.value().splitlines():
                    d = json.loads(line)
                    self.readings.append(
                        Reading(
                            d["timestamp_us"],
                            d["device_id"],
                            d["metric_id"],
                            d["value"],
                            d["labels"],
                        )
                    )
            else:
                self.readings.extend(unpack(message.value()))
        return self.readings


def test_producers_copy_each_message_to_the_json_topic(
    clickhouse: StackSettings, json_topic: str, tmp_path: Path
) -> None:
    prefix = f"js-{uuid.uuid4().hex[:6]}"
    devices = {f"{prefix}-{i}" for i in range(3)}
    path = tmp_path / "devices.yaml"
    path.write_text(
        "".join(
            f"- {{name: m, device_id: {d}, url: 'tester://?metrics=5', update_every: 200}}\n"
            for d in sorted(devices)
        )
    )
    since_ms = int(time.time() * 1000)
    proc = services.process(clickhouse, f"producers-{prefix}")
    proc.start(
        [sys.executable, "-m", "producers", "--devices", str(path)],
        env={
            **services.component_env(clickhouse),
            "JOBSCOPE_JSON_TOPIC": json_topic,
            "JOBSCOPE_SPOOL_DIR": str(tmp_path / "spool"),
            "JOBSCOPE_METRICS_PORT": "0",
            "JOBSCOPE_SELF_INTERVAL_S": "86400",
        },
        cwd=REPO_ROOT,
    )
    with (
        Collector(clickhouse.kafka_bootstrap, json_topic, since_ms, devices, json=True) as copies,
        Collector(
            clickhouse.kafka_bootstrap, "readings", since_ms, devices, json=False
        ) as originals,
    ):
        try:
            wait_until(lambda: len(copies.poll()) >= 100, 60, "100 readings on the JSON topic")
        finally:
            proc.stop(timeout=30)
        wait_until(
            lambda: len(originals.poll()) >= len(copies.poll()), 60, "the readings topic's messages"
        )
        assert sorted(copies.readings, key=repr) == sorted(originals.readings, key=repr)
        assert copies.messages == originals.messages  # one copy per message, its lines together


def test_spooled_messages_get_their_copy_when_delivered(
    clickhouse: StackSettings, json_topic: str, tmp_path: Path
) -> None:
    """Published while no broker answers (they go to the spool), delivered by the next
    publisher: the copy is made from the spooled message."""
    device = f"sp-{uuid.uuid4().hex[:6]}"
    batches = [
        [
            Reading(1_795_400_000_000_000 + n, device, f"m{k}", n + k / 7, {"k": str(k)})
            for k in range(3)
        ]
        for n in range(40)
    ]
    since_ms = int(time.time() * 1000)
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        away = ProducerSettings(
            kafka_bootstrap=f"127.0.0.1:{dead.getsockname()[1]}",
            json_topic=json_topic,
            spool_dir=tmp_path / "spool",
            inflight_max_messages=5,
            memory_queue_max_bytes=1_000,
        )
        first = Publisher(away)

        async def publish_all() -> None:
            for batch in batches:
                packed = pack(batch, with_json=True)
                await first.publish(device, packed.payload, packed.count, packed.json)

        asyncio.run(publish_all())
        assert first.close(0.5).kept == len(batches)
    back = Publisher(
        ProducerSettings(
            kafka_bootstrap=clickhouse.kafka_bootstrap,
            json_topic=json_topic,
            spool_dir=tmp_path / "spool",
        )
    )

    def delivered() -> bool:
        back.serve_callbacks()
        return back.counters.json_messages_delivered >= len(batches)

    wait_until(delivered, 60, "the spooled messages and their copies delivered", interval=0.05)
    assert back.close(10).kept == 0
    with Collector(clickhouse.kafka_bootstrap, json_topic, since_ms, {device}, json=True) as copies:
        wait_until(lambda: len(copies.poll()) >= 120, 30, "the copies on the JSON topic")
    assert copies.readings == [r for batch in batches for r in batch]


def test_pushed_readings_are_copied(clickhouse: StackSettings, json_topic: str) -> None:
    values = secrets.load_or_create(clickhouse.state_dir)
    settings = ApiSettings(
        clickhouse_port=clickhouse.clickhouse_port,
        clickhouse_api_password=values["JOBSCOPE_CLICKHOUSE_API_PASSWORD"],
        kafka_bootstrap=clickhouse.kafka_bootstrap,
        admin_token=values["JOBSCOPE_ADMIN_TOKEN"],
        json_topic=json_topic,
    )
    device = f"push-{uuid.uuid4().hex[:6]}"
    since_ms = int(time.time() * 1000)
    body = [
        {"timestamp": time.time() - 1, "device_id": device, "metric_id": "app_step", "value": 3},
        {
            "timestamp": time.time(),
            "device_id": device,
            "metric_id": "app_step",
            "value": 4.5,
            "labels": {"phase": "solve"},
        },
    ]
    with TestClient(create_app(settings)) as client:
        headers = {"Authorization": f"Bearer {values['JOBSCOPE_ADMIN_TOKEN']}"}
        response = client.post("/api/metrics", json=body, headers=headers)
        assert response.status_code == 202, response.text
    with Collector(clickhouse.kafka_bootstrap, json_topic, since_ms, {device}, json=True) as copies:
        wait_until(lambda: len(copies.poll()) >= 2, 30, "the pushed readings on the JSON topic")
    assert [(r.metric_id, r.value, r.labels) for r in copies.readings] == [
        ("app_step", 3.0, {"source": "user:admin"}),
        ("app_step", 4.5, {"phase": "solve", "source": "user:admin"}),
    ]


def test_the_example_consumer_prints_live_node_power(
    clickhouse: StackSettings, json_topic: str, tmp_path: Path
) -> None:
    """examples/live_node_power.py, run as users run it, on readings a publisher copies."""
    run = uuid.uuid4().hex[:6]
    node_a, node_b = f"node-a-{run}", f"node-b-{run}"
    now_us = int(time.time() * 1e6)
    batches = [
        [
            Reading(now_us, node_a, "bmc_power_watt", 100.0),
            Reading(now_us, node_a, "bmc_temp_celsius", 99.0),  # not power: left out
        ],
        [Reading(now_us, f"pdu-{run}", "outlet_power_watt", 50.5, {"_device_alias": node_a})],
        [Reading(now_us, node_b, "bmc_power_watt", 20.0)],
    ]
    example = subprocess.Popen(
        [
            sys.executable,
            str(REPO_ROOT / "examples" / "live_node_power.py"),
            *("--bootstrap", clickhouse.kafka_bootstrap, "--topic", json_topic),
            *("--every", "0.2", "--from-beginning"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(example.stdout or ()), daemon=True)
    reader.start()
    publisher = Publisher(
        ProducerSettings(
            kafka_bootstrap=clickhouse.kafka_bootstrap, json_topic=json_topic, spool_dir=tmp_path
        )
    )
    try:

        async def publish_all() -> None:
            for batch in batches:
                packed = pack(batch, with_json=True)
                await publisher.publish(
                    batch[0].device_id, packed.payload, packed.count, packed.json
                )

        asyncio.run(publish_all())
        expected = {f"{node_a} 150.50 W", f"{node_b} 20.00 W"}

        def printed() -> bool:
            publisher.serve_callbacks()
            assert example.poll() is None, f"the example exited with {example.returncode}"
            return expected <= {line.split(" ", 1)[1].strip() for line in list(lines)}

        wait_until(printed, 60, f"the example to print {expected}")
    finally:
        publisher.close(10)
        example.send_signal(signal.SIGINT)
        try:
            example.wait(10)
        except subprocess.TimeoutExpired:
            report = _where_it_is_stuck(example.pid)
            example.kill()
            pytest.fail(f"the example did not exit within 10 s of SIGINT:\n{report}")
    assert example.returncode == 0
    assert not any(f"pdu-{run}" in line for line in lines)  # counted for the node it powers


def _where_it_is_stuck(pid: int) -> str:
    """A live process's signal masks, its threads' kernel waits and its Python stacks."""
    proc = Path(f"/proc/{pid}")
    lines = [line for line in (proc / "status").read_text().splitlines() if line.startswith("Sig")]
    for task in sorted(proc.glob("task/*")):
        state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        comm, wchan = (task / "comm").read_text().strip(), (task / "wchan").read_text()
        lines.append(f"thread {task.name} {comm}: {state} in {wchan}")
    spy = Path(sys.executable).with_name("py-spy")
    dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True)
    return "\n".join([*lines, dump.stdout, dump.stderr])


def test_memory_accounting_holds_with_copies(
    clickhouse: StackSettings, json_topic: str, tmp_path: Path
) -> None:
    """Messages that wait in memory for a one-message window, each with its JSON lines:
    once all are delivered, the memory queue's byte count is back to 0."""
    publisher = Publisher(
        ProducerSettings(
            kafka_bootstrap=clickhouse.kafka_bootstrap,
            json_topic=json_topic,
            spool_dir=tmp_path,
            inflight_max_messages=1,
        )
    )
    device = f"mem-{uuid.uuid4().hex[:6]}"

    async def publish_all() -> None:
        for n in range(30):
            packed = pack([Reading(1_795_400_000_000_000 + n, device, "m", float(n))], True)
            await publisher.publish(device, packed.payload, packed.count, packed.json)

    asyncio.run(publish_all())
    assert publisher.depth().memory_messages > 0

    def delivered() -> bool:
        publisher.serve_callbacks()
        return publisher.counters.json_messages_delivered >= 30

    wait_until(delivered, 30, "the messages and their copies delivered", interval=0.02)
    depth = publisher.depth()
    publisher.close(10)
    assert (depth.memory_messages, depth.memory_bytes) == (0, 0)
