"""`python -m producers` against the real broker: what reaches Kafka, tick by tick.

One producer process runs healthy, hung, failing and flapping tester devices every 200 ms
into a topic of its own; the tests then check every message it published.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from kafka.message import unpack
from kafka.reading import Reading
from producers.plugins.tester.plugin import tester_value
from producers.runtime import now_us
from stack import services
from stack.config import StackSettings
from stack.processes import free_port, wait_until
from stack.transient import KAFKA_STARTING
from tests.conftest import new_topic
from tests.schedules import assert_every_tick, assert_unbroken, reported_skips, ticks_of

REPO_ROOT = Path(__file__).resolve().parents[2]
SELF_DEVICE = "jobscope-producer-0"
PERIOD_US = 200_000

DEVICES = """\
- name: tester_value
  device_id: node-a
  url: tester://?metrics=3
  update_every: 200
  labels: {{rack: r1, source: tester}}
- name: tester_power_watt
  device_id: node-a
  url: tester://
  update_every: 200
  labels: {{source: tester}}
- name: tester_temp_celsius
  device_id: node-a
  url: tester://?metrics=2
  update_every: 400
- name: tester_value
  device_id: node-b
  url: tester://?metrics=2
  update_every: 200
- name: tester_value
  device_id: node-flap
  url: tester://?hang_file={flap}
  update_every: 200
- name: tester_value
  device_id: node-hang
  url: tester://?hang=1
  update_every: 200
- name: tester_value
  device_id: node-fail
  url: tester://?fail=1
  update_every: 200
"""
LABELS = {
    "tester_value_0": {"rack": "r1", "source": "tester"},
    "tester_value_1": {"rack": "r1", "source": "tester"},
    "tester_value_2": {"rack": "r1", "source": "tester"},
    "tester_power_watt": {"source": "tester"},
}
"""The labels of node-a's 200 ms metrics; every other metric has none."""


@dataclass(frozen=True)
class Received:
    key: str
    readings: list[Reading]

    @property
    def timestamp_us(self) -> int:
        return self.readings[0].timestamp_us


class TopicReader:
    """Reads a whole topic from its beginning, without a consumer group."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.consumer = self._open()
        self.messages: list[Received] = []

    def _open(self) -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.topic,
                "enable.auto.commit": False,
            }
        )
        partitions = consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions
        self.partitions = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions]
        consumer.assign(self.partitions)
        return consumer

    def reopen(self) -> None:
        """Read the topic again from its beginning with a new consumer: an assigned consumer
        can stop fetching for good after a broker restart (librdkafka issue 5153)."""
        self.consumer.close()
        self.consumer = self._open()
        self.messages = []

    def fetch(self) -> None:
        """Keep every message of the batch, then raise the first error in it, if any: a
        message after an error must not be consumed and dropped."""
        batch = self.consumer.consume(num_messages=1000, timeout=0.2)
        self.messages += [
            Received(msg.key().decode(), unpack(msg.value())) for msg in batch if not msg.error()
        ]
        if errors := [msg.error() for msg in batch if msg.error()]:
            raise KafkaException(errors[0])

    def of(self, device_id: str, after_us: int = 0) -> list[Received]:
        self.fetch()
        return [m for m in self.messages if m.key == device_id and m.timestamp_us > after_us]

    def drain(self) -> None:
        """Fetch until every partition has been read up to its end."""
        ends = {
            tp.partition: self.consumer.get_watermark_offsets(tp, timeout=10)[1]
            for tp in self.partitions
        }

        def at_end() -> bool:
            self.fetch()
            positions = self.consumer.position(
                [TopicPartition(tp.topic, tp.partition) for tp in self.partitions]
            )
            return all(
                tp.offset >= ends[tp.partition] for tp in positions if ends[tp.partition] > 0
            )

        wait_until(at_end, 20, "the whole topic")


@dataclass(frozen=True)
class Run:
    messages: list[Received]
    """The messages of the tester devices."""
    self_readings: list[Reading]
    """The producer's self-monitoring readings (device jobscope-producer-0)."""
    exposed: str
    """What its /metrics endpoint served during the run."""
    log: str
    returncode: int
    flap_hung_us: tuple[int, int]
    """While node-flap's hang file existed."""


def _start_producers(
    kafka: str, topic: str, tmp_path: Path, devices: str, **settings: str
) -> tuple[subprocess.Popen[bytes], Path]:
    """`python -m producers` on `devices` (YAML text) into `topic`; returns it and its log."""
    devices_file = tmp_path / "devices.yaml"
    devices_file.write_text(devices)
    env = {
        **os.environ,
        "JOBSCOPE_KAFKA_BOOTSTRAP": kafka,
        "JOBSCOPE_READINGS_TOPIC": topic,
        # no /metrics endpoint, no self-monitoring readings, unless a test asks for them
        "JOBSCOPE_METRICS_PORT": "0",
        "JOBSCOPE_SELF_INTERVAL_S": "3600",
        **{f"JOBSCOPE_{name.upper()}": value for name, value in settings.items()},
    }
    log_file = tmp_path / "producers.log"
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "producers", "--devices", str(devices_file)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO_ROOT,
        )
    return proc, log_file


@pytest.fixture(scope="module")
def run(kafka: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("producers")
    flap = tmp / "node-flap.hang"
    topic = new_topic(kafka, "test-producers")
    metrics_port = free_port()
    proc, log_file = _start_producers(
        kafka,
        topic,
        tmp,
        DEVICES.format(flap=flap),
        linger_ms="500",
        stats_interval_s="1",
        self_interval_s="1",
        metrics_port=str(metrics_port),
    )
    reader = TopicReader(kafka, topic)
    exposed = ""
    try:
        wait_until(
            lambda: len(reader.of("node-flap")) >= 3 and len(reader.of("node-b")) >= 3,
            30,
            "the first ticks of node-flap and node-b",
        )
        flap.touch()
        hang_from = now_us()
        wait_until(
            lambda: len(reader.of("node-b", after_us=hang_from)) >= 5,
            10,
            "5 ticks of node-b while node-flap hangs",
        )
        hang_until = now_us()
        flap.unlink()
        wait_until(
            lambda: len(reader.of("node-flap", after_us=hang_until)) >= 2,
            10,
            "node-flap to recover",
        )
        exposed = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        proc.send_signal(signal.SIGTERM)
        returncode = proc.wait(timeout=20)
        reader.drain()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.consumer.close()
    tester = [m for m in reader.messages if m.key != SELF_DEVICE]
    self_readings = [r for m in reader.messages if m.key == SELF_DEVICE for r in m.readings]
    yield Run(
        tester, self_readings, exposed, log_file.read_text(), returncode, (hang_from, hang_until)
    )


def _final_counts(log: str) -> tuple[int, int]:
    """(messages, readings) delivered according to the last log line; none failed or left."""
    stopped = re.search(
        r"stopped: (\d+) messages queued, (\d+) delivered \((\d+) readings\), "
        r"0 failed, 0 kept in the spool for the next start, 0 dropped",
        log,
    )
    assert stopped, log
    queued, delivered, readings = map(int, stopped.groups())
    assert queued == delivered
    return delivered, readings


def stop_and_drain(proc: subprocess.Popen, log_file: Path, reader: TopicReader) -> None:
    """SIGTERM the producer, which must flush and exit 0; then read what it published."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, log_file.read_text()
    reader.drain()


def close(proc: subprocess.Popen, reader: TopicReader) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    reader.consumer.close()


def assert_tester_values(reader: TopicReader) -> None:
    for message in reader.messages:
        for r in message.readings:
            assert r.value == tester_value(r.device_id, r.metric_id, r.timestamp_us)


def test_sigterm_exits_0_and_every_message_reached_the_topic(run: Run) -> None:
    assert run.returncode == 0, run.log
    self_messages = len({r.timestamp_us for r in run.self_readings})
    assert _final_counts(run.log) == (
        len(run.messages) + self_messages,
        sum(len(m.readings) for m in run.messages) + len(run.self_readings),
    )


def test_collection_health_is_served_on_metrics_and_as_readings(run: Run) -> None:
    """Per plugin and device: polls, errors, timeouts; the gauges of the process."""
    assert 'jobscope_producer_polls_total{device="node-a",plugin="tester"}' in run.exposed
    assert "jobscope_producer_tick_lateness_seconds_bucket" in run.exposed
    assert "jobscope_producer_messages_awaiting_delivery" in run.exposed

    def last(metric: str, device: str) -> float:
        values = [
            r.value
            for r in run.self_readings
            if r.metric_id == metric and r.labels.get("device") == device
        ]
        assert values, (metric, device)
        return values[-1]

    assert last("jobscope_producer_polls_total", "node-b") >= 5
    assert last("jobscope_producer_poll_errors_total", "node-fail") >= 5
    assert last("jobscope_producer_poll_timeouts_total", "node-hang") >= 5
    assert last("jobscope_producer_poll_errors_total", "node-b") == 0
    assert last("jobscope_producer_readings_total", "node-b") >= 10
    gauges = {r.metric_id for r in run.self_readings if not r.labels}
    assert {"jobscope_producer_groups", "jobscope_producer_entries_polled"} <= gauges


def test_each_tick_of_a_device_group_is_one_message_keyed_by_device(run: Run) -> None:
    streams: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for message in run.messages:
        assert {r.device_id for r in message.readings} == {message.key}
        assert {r.timestamp_us for r in message.readings} == {message.timestamp_us}
        metrics = tuple(r.metric_id for r in message.readings)
        streams.setdefault((message.key, metrics), []).append(message.timestamp_us)
    assert set(streams) == {
        ("node-a", ("tester_value_0", "tester_value_1", "tester_value_2", "tester_power_watt")),
        ("node-a", ("tester_temp_celsius_0", "tester_temp_celsius_1")),
        ("node-b", ("tester_value_0", "tester_value_1")),
        ("node-flap", ("tester_value",)),
    }
    for timestamps in streams.values():
        assert len(set(timestamps)) == len(timestamps)  # no tick published twice


def test_values_and_labels_are_exactly_the_testers(run: Run) -> None:
    for message in run.messages:
        for r in message.readings:
            assert r.value == tester_value(r.device_id, r.metric_id, r.timestamp_us)
            expected_labels = LABELS.get(r.metric_id, {}) if r.device_id == "node-a" else {}
            assert r.labels == expected_labels


def _stamps(run: Run, device_id: str, first_metric: str) -> list[int]:
    return sorted(
        m.timestamp_us
        for m in run.messages
        if m.key == device_id and m.readings[0].metric_id == first_metric
    )


@pytest.mark.parametrize(
    ("device_id", "period_us", "first_metric"),
    [
        ("node-a", PERIOD_US, "tester_value_0"),
        ("node-a", 2 * PERIOD_US, "tester_temp_celsius_0"),
        ("node-b", PERIOD_US, "tester_value_0"),
    ],
)
def test_healthy_devices_publish_every_aligned_tick(
    run: Run, device_id: str, period_us: int, first_metric: str
) -> None:
    """Beside a hung, a failing and a flapping device, every tick is published but those
    the producer reported skipped (tests/schedules.py)."""
    stamps = _stamps(run, device_id, first_metric)
    assert len(assert_unbroken(stamps, period_us, run.log, device_id)) >= 5


def test_hung_and_failing_devices_publish_nothing_and_are_logged_once(run: Run) -> None:
    assert not [m for m in run.messages if m.key in ("node-hang", "node-fail")]
    hang = re.findall(
        r"ERROR producers.runtime: poll failed: device_id=node-hang "
        r"url=tester://\?hang=1 name=tester_value: no answer within \d+ ms",
        run.log,
    )
    fail = re.findall(
        r"ERROR producers.runtime: poll failed: device_id=node-fail "
        r"url=tester://\?fail=1 name=tester_value: RuntimeError",
        run.log,
    )
    assert (len(hang), len(fail)) == (1, 1), run.log


def test_flapping_device_misses_only_the_ticks_it_hung(run: Run) -> None:
    """Every tick before the hang and from the first one after it, but those reported
    skipped; none while it hung."""
    hang_from, hang_until = run.flap_hung_us
    stamps = _stamps(run, "node-flap", "tester_value")
    ticks = ticks_of(stamps, PERIOD_US)
    assert not [t for t in ticks if hang_from <= t * PERIOD_US < hang_until - PERIOD_US]
    # the last tick a period before the hang; the second tick after it (the file goes a
    # moment after hang_until)
    before, recovered = (hang_from - PERIOD_US - 1) // PERIOD_US, hang_until // PERIOD_US + 2
    assert ticks[0] <= before and ticks[-1] >= recovered
    skipped = reported_skips(run.log, PERIOD_US).get("node-flap", set())
    spans = [(ticks[0], before), (recovered, ticks[-1])]
    assert_every_tick(stamps, PERIOD_US, spans, skipped, "node-flap")
    assert run.log.count("poll failed: device_id=node-flap") == 1
    assert run.log.count("poll recovered: device_id=node-flap") == 1


def test_stats_line_counts_timeouts_and_errors(run: Run) -> None:
    stats = re.findall(
        r"last 1 s: ([\d.]+) readings/s; .*; (\d+) poll errors, "
        r"(\d+) poll timeouts",
        run.log,
    )
    assert stats, run.log
    assert any(
        float(rate) > 0 and int(errors) > 0 and int(timeouts) > 0
        for rate, errors, timeouts in stats
    )


def test_sigterm_flushes_what_the_client_still_held(kafka: str, tmp_path: Path) -> None:
    """With a 60 s linger nothing leaves the client by itself: only the flush sends it."""
    topic = new_topic(kafka, "test-producers")
    proc, log_file = _start_producers(
        kafka,
        topic,
        tmp_path,
        "- {name: m, device_id: node-s, url: 'tester://?metrics=3', update_every: 200}\n",
        linger_ms="60000",
        stats_interval_s="0.5",
    )
    reader = TopicReader(kafka, topic)
    awaiting = re.compile(r"(\d+) messages awaiting delivery")
    try:
        wait_until(
            lambda: any(int(n) >= 3 for n in awaiting.findall(log_file.read_text())),
            30,
            "3 messages waiting in the client",
        )
        assert reader.of("node-s") == []
        stop_and_drain(proc, log_file, reader)
    finally:
        close(proc, reader)
    log = log_file.read_text()
    flushing = re.search(r"stopping: polling stopped, delivering (\d+) messages", log)
    assert flushing and int(flushing[1]) >= 3, log
    assert _final_counts(log) == (len(reader.messages), 3 * len(reader.messages))
    assert_tester_values(reader)


def test_shards_split_the_devices_between_processes(kafka: str, tmp_path: Path) -> None:
    """Two processes with `--shard 0/2` and `1/2` on one devices file: each device is
    published by exactly one of them, and together they publish them all."""
    expected = {f"shard-{i}" for i in range(12)}
    devices = "".join(
        f"- {{name: m, device_id: {d}, url: 'tester://', update_every: 200}}\n"
        for d in sorted(expected)
    )
    procs = []
    for index in range(2):
        (tmp_path / str(index)).mkdir()
        topic = new_topic(kafka, "test-producers")
        proc, log_file = _start_producers(
            kafka, topic, tmp_path / str(index), devices, shard=f"{index}/2"
        )
        procs.append((proc, log_file, TopicReader(kafka, topic)))

    def every_device_seen() -> bool:
        for _, _, reader in procs:
            reader.fetch()
        return {m.key for _, _, reader in procs for m in reader.messages} == expected

    try:
        wait_until(every_device_seen, 30, "every device published")
        for proc, log_file, reader in procs:
            stop_and_drain(proc, log_file, reader)
    finally:
        for proc, _, reader in procs:
            close(proc, reader)
    owned = [{m.key for m in reader.messages} for _, _, reader in procs]
    assert owned[0] and owned[1] and not owned[0] & owned[1]
    for (_, log_file, _), mine in zip(procs, owned, strict=True):
        assert f"of 12 entries ({len(mine)} of 12 devices)" in log_file.read_text()


@pytest.mark.slow
@pytest.mark.disruptive
def test_broker_restart_loses_no_reading(
    kafka: str, stack_settings: StackSettings, tmp_path: Path
) -> None:
    """Messages produced while the broker is down wait in the client and arrive later:
    the topic holds each message the producer counted delivered, once, and lacks only the
    ticks it reported skipped (the broker's start can starve it on 2 cores).

    Restarts the session's broker: other users of the `kafka` fixture see it come back.
    """
    topic = new_topic(kafka, "test-producers")
    proc, log_file = _start_producers(
        kafka,
        topic,
        tmp_path,
        "- {name: tester_value, device_id: node-r, url: 'tester://?metrics=2', "
        "update_every: 200}\n",
    )
    reader = TopicReader(kafka, topic)
    try:
        wait_until(lambda: len(reader.of("node-r")) >= 3, 30, "the first ticks of node-r")
        services.process(stack_settings, "kafka").stop()
        down_from = now_us()
        services.start_kafka(stack_settings)
        down_until = now_us()
        reader.reopen()
        wait_until(
            lambda: len(reader.of("node-r", after_us=down_until)) >= 3,
            60,
            "node-r after the broker restart",
            transient=KAFKA_STARTING,  # the reader's consumer reports the broker it lost
        )
        stop_and_drain(proc, log_file, reader)
    finally:
        close(proc, reader)
    log = log_file.read_text()
    assert len(reader.messages) == _final_counts(log)[0], log
    stamps = [m.timestamp_us for m in reader.messages]
    ticks = assert_unbroken(stamps, PERIOD_US, log, "node-r")  # none arrived twice either
    assert (down_until - down_from) // PERIOD_US >= 10  # the outage spanned many ticks
    assert ticks[0] * PERIOD_US < down_from and ticks[-1] * PERIOD_US > down_until
    assert_tester_values(reader)
