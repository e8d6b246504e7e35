"""The ClickHouse data disk fills up under load: ingestion stops with a logged error, the
Kafka engine commits no offset of a reading it could not store, and once space returns
every reading Kafka holds is stored, each exactly once for readers and in the rollups.

The test runs a stack of its own (Kafka, and the local ClickHouse server with its data
directory and insert spool on a 64 MiB tmpfs mounted for the test), so that filling the
disk touches nothing else. Mounting needs root: without it the test fails, it does not skip.
"""

from __future__ import annotations

import errno
import math
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from clickhouse.migrate import MigrationSettings
from kafka import topics
from kafka.message import unpack
from stack import services
from stack.config import REPO_ROOT, StackSettings
from stack.processes import wait_until
from stack.transient import CLICKHOUSE_STARTING
from tests import ports

from .conftest import Key, LoadGenerator

pytestmark = pytest.mark.slow

DISK_SIZE = "64m"
GROUP = MigrationSettings.model_fields["consumer_group"].default  # jobscope-clickhouse
# What the engine writes when a part cannot be reserved or written (codes 243 and 75/76).
SPACE_ERRORS = ("Not enough space", "Cannot reserve", "No space left on device")
FILL_INTERVAL_S = 0.02


def _mounted(path: Path) -> bool:
    return any(
        line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines()
    )


def _umount(path: Path) -> None:
    if _mounted(path) and subprocess.run(["umount", str(path)], capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(path)], check=True)  # still busy: detach it


def _settings() -> StackSettings:
    """This test's own stack, beside the session's (tests/ports.py)."""
    return ports.stack_settings("disk-full", kafka_heap="256m")


def _start_clickhouse_on(settings: StackSettings, disk: Path) -> None:
    """The local ClickHouse server with its data directory and spool on `disk`."""
    env = {
        **services.component_env(settings),
        "JOBSCOPE_CLICKHOUSE_DATA_DIR": str(disk / "clickhouse"),
        "JOBSCOPE_CLICKHOUSE_TMP_DIR": str(disk / "clickhouse-tmp"),
    }
    services.process(settings, "clickhouse").start(
        [sys.executable, "-m", "stack.clickhouse_server"],
        env=env,
        cwd=REPO_ROOT,
        ports=[(settings.host, settings.clickhouse_port)],
    )
    wait_until(
        lambda: services.clickhouse_client(settings, "jobscope").command("SELECT 1") == 1,
        60,
        f"ClickHouse on {settings.clickhouse_url}",
        transient=CLICKHOUSE_STARTING,
    )
    services.apply_schema(settings)


@pytest.fixture
def small_disk_stack() -> Iterator[tuple[StackSettings, Path]]:
    """Kafka and ClickHouse, the latter's data on a fresh tmpfs; unmounted afterwards."""
    settings = _settings()
    disk = settings.state_dir / "disk"
    services.stop_all(settings)  # leftovers of a crashed run
    _umount(disk)
    shutil.rmtree(settings.state_dir, ignore_errors=True)
    disk.mkdir(parents=True)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE},mode=0755", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        pytest.fail(
            f"cannot mount a {DISK_SIZE} tmpfs on {disk} for the disk-full test (it needs "
            f"root): {mount.stderr.strip()}"
        )
    try:
        services.start_kafka(settings)
        _start_clickhouse_on(settings, disk)
        yield settings, disk
    finally:
        services.stop_all(settings, drain_timeout=0)
        _umount(disk)


class Filler(threading.Thread):
    """Keeps `disk` full until stopped: space the engine frees (outdated parts removed after
    a merge) is taken again within FILL_INTERVAL_S, so that no insert finds room."""

    def __init__(self, disk: Path) -> None:
        super().__init__(daemon=True)
        self.path = disk / "filler"
        self.stopped = threading.Event()
        self.file = open(self.path, "wb", buffering=0)  # noqa: SIM115 (closed by stop)
        self._fill()

    def _fill(self) -> None:
        for size in (1 << 20, 4096):  # megabytes, then the last partial one
            try:
                while True:
                    self.file.write(b"\0" * size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise

    def run(self) -> None:
        while not self.stopped.wait(FILL_INTERVAL_S):
            self._fill()

    def stop(self) -> None:
        """Stop filling and give the space back."""
        self.stopped.set()
        self.join(10)
        self.file.close()
        self.path.unlink()


def _log_since(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _committed_readings(bootstrap: str, prefix: str) -> tuple[dict[int, int], set[Key]]:
    """The consumer group's committed offsets, and the readings of `prefix` in the messages
    before them (what the engine says it has stored)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"committed-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    group = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "log_level": 0})
    try:
        partitions = consumer.list_topics("readings", timeout=30).topics["readings"].partitions
        committed = {
            tp.partition: max(tp.offset, 0)
            for tp in group.committed([TopicPartition("readings", p) for p in partitions], 30)
        }
        consumer.assign(
            [TopicPartition("readings", p, OFFSET_BEGINNING) for p, end in committed.items() if end]
        )
        positions = dict.fromkeys(committed, 0)
        keys: set[Key] = set()

        def read_to_committed() -> bool:
            for msg in consumer.consume(10_000, timeout=0.5):
                if msg.error() or msg.offset() >= committed[msg.partition()]:
                    continue
                positions[msg.partition()] = msg.offset() + 1
                if (msg.key() or b"").decode().startswith(prefix):
                    keys.update(
                        (r.device_id, r.metric_id, r.timestamp_us) for r in unpack(msg.value())
                    )
            return all(positions[p] >= end for p, end in committed.items())

        wait_until(read_to_committed, 60, "the readings topic read up to the committed offsets")
        return committed, keys
    finally:
        consumer.close()
        group.close()


def _stored_keys(client: Client, prefix: str) -> set[Key]:
    rows = client.query(
        "SELECT device_id, metric_id, toUnixTimestamp64Micro(timestamp) FROM metrics "
        "WHERE startsWith(device_id, {p:String})",
        parameters={"p": prefix},
    ).result_rows
    return {(d, m, t) for d, m, t in rows}


def _count(client: Client, prefix: str, final: bool = True) -> int:
    return int(
        client.command(
            f"SELECT count() FROM metrics {'FINAL' if final else ''} "
            "WHERE startsWith(device_id, {p:String})",
            parameters={"p": prefix},
        )
    )


def _assert_nothing_committed_unstored(client: Client, bootstrap: str, prefix: str) -> int:
    """Every reading in a message before the group's committed offsets is stored (the
    offsets are read first: the engine stores a block before it commits it). Returns how
    many messages the group has not committed."""
    committed, keys = _committed_readings(bootstrap, prefix)
    missing = keys - _stored_keys(client, prefix)
    assert not missing, (
        f"the engine committed offsets of {len(missing)} readings it did not store, e.g. "
        f"{sorted(missing)[:3]}"
    )
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "log_level": 0})
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition("readings", p), timeout=30)[1]
            for p in committed
        }
    finally:
        consumer.close()
    return sum(ends[p] - committed[p] for p in committed)


def test_disk_full_stops_ingestion_loses_nothing_and_resumes(
    small_disk_stack: tuple[StackSettings, Path],
) -> None:
    settings, disk = small_disk_stack
    admin = services.clickhouse_client(settings, "jobscope")
    engine_log = settings.log_dir / "clickhouse-engine.log"
    prefix = f"df-{uuid.uuid4().hex[:8]}"
    gen = LoadGenerator(settings.kafka_bootstrap, prefix, devices=10, ticks=400, interval_s=0.05)
    load_began = time.time()
    gen.start()
    wait_until(lambda: _count(admin, prefix) > 0, 60, "the first readings stored")
    gen.wait_progress(0.25)

    offset = engine_log.stat().st_size if engine_log.exists() else 0
    filler = Filler(disk)
    filler.start()
    try:
        wait_until(
            lambda: any(e in _log_since(engine_log, offset) for e in SPACE_ERRORS),
            60,
            f"the engine to log that the disk is full ({' / '.join(SPACE_ERRORS)}) in {engine_log}",
        )
        stalled = _count(admin, prefix)
        uncommitted = _assert_nothing_committed_unstored(admin, settings.kafka_bootstrap, prefix)
        gen.wait_progress(0.75)  # still publishing while the disk is full
        full_growth = _count(admin, prefix) - stalled
        assert full_growth < gen.metrics * len(gen.devices) * 20, (
            f"ingestion went on with the disk full ({full_growth} readings stored)"
        )
        still = _assert_nothing_committed_unstored(admin, settings.kafka_bootstrap, prefix)
        assert still > uncommitted > 0, "no backlog of uncommitted messages grew while full"
        assert admin.command("SELECT 1") == 1, "the server stopped answering with the disk full"
    finally:
        filler.stop()

    gen.join(120)
    assert not gen.is_alive() and gen.failed == [], gen.failed
    expected = gen.expected
    wait_until(
        lambda: _count(admin, prefix) >= len(expected),
        120,
        f"all {len(expected)} readings stored once space returned",
    )
    wait_until(
        lambda: topics.consumer_lag(settings.kafka_bootstrap, GROUP, "readings") == 0,
        60,
        "the consumer group to commit every message",
    )
    assert _assert_nothing_committed_unstored(admin, settings.kafka_bootstrap, prefix) == 0
    rows = admin.query(
        "SELECT device_id, metric_id, toUnixTimestamp64Micro(timestamp), value FROM metrics "
        "FINAL WHERE startsWith(device_id, {p:String})",
        parameters={"p": prefix},
    ).result_rows
    per_device = Counter(d for d, _m, _t, _v in rows)
    published = Counter(d for d, _m, _t in expected)
    assert per_device == published
    assert {(d, m, t): v for d, m, t, v in rows} == expected
    diverted = admin.command(
        "SELECT count() FROM ingest_errors WHERE startsWith(key, {p:String})",
        parameters={"p": prefix},
    )
    assert diverted == 0, f"{diverted} messages of the load went to ingest_errors"
    _assert_rollups_exact(admin, prefix, expected, hours_closed_before=load_began)
    plain = _count(admin, prefix, final=False)
    print(
        f"disk full: {stalled} readings stored when the error was logged, "
        f"{full_growth} more while full; {uncommitted} then {still} messages uncommitted; "
        f"after: {len(rows)} readings (FINAL), {plain} rows"
    )


Buckets = dict[tuple[str, str, int], tuple[int, float, float, float]]


def _expected_buckets(expected: dict[Key, float], seconds: int, before: float) -> Buckets:
    """(device, metric, bucket start) -> (count, sum, min, max) of the `expected` readings,
    for the buckets of `seconds` that ended at or before the epoch time `before`."""
    values: dict[tuple[str, str, int], list[float]] = {}
    for (device, metric, ts_us), value in expected.items():
        bucket = ts_us // (seconds * 1_000_000) * seconds
        if bucket + seconds <= before:
            values.setdefault((device, metric, bucket), []).append(value)
    return {k: (len(v), sum(v), min(v), max(v)) for k, v in values.items()}


def _rollup_buckets(
    client: Client, table: str, seconds: int, prefix: str, before: float
) -> Buckets:
    """The same from rollup `table` (its rows are per label set: summed over them)."""
    rows = client.query(
        f"SELECT device_id, metric_id, toUnixTimestamp(bucket) AS b, sum(count), sum(sum), "
        f"min(min), max(max) FROM {table} FINAL WHERE startsWith(device_id, {{p:String}}) "
        "GROUP BY device_id, metric_id, b",
        parameters={"p": prefix},
    ).result_rows
    return {(d, m, b): tuple(v) for d, m, b, *v in rows if b + seconds <= before}  # type: ignore[misc]


def _wrong_buckets(got: Buckets, want: Buckets) -> dict[tuple[str, str, int], object]:
    """Buckets missing, unexpected, or whose count, min or max differ (sums to rounding)."""

    def same(a: tuple[int, float, float, float] | None, b: tuple[int, float, float, float]) -> bool:
        return (
            a is not None
            and (a[0], a[2], a[3]) == (b[0], b[2], b[3])
            and math.isclose(a[1], b[1], rel_tol=1e-12)
        )

    wrong: dict[tuple[str, str, int], object] = {
        k: (got.get(k), v) for k, v in want.items() if not same(got.get(k), v)
    }
    wrong.update({k: (v, None) for k, v in got.items() if k not in want})
    return wrong


def _assert_rollups_exact(
    client: Client, prefix: str, expected: dict[Key, float], hours_closed_before: float
) -> None:
    """The 1-minute rollup, and the 1-hour one for the hours closed before the load began,
    hold each expected reading once (docs/data-flow.md: rollups are exact), once their
    refreshes (every 10 s, for notes before the current minute less 10 s) have taken the last
    inserts."""
    rollups = {"metrics_1m": (60, time.time()), "metrics_1h": (3600, hours_closed_before)}
    want = {t: _expected_buckets(expected, s, before) for t, (s, before) in rollups.items()}
    assert all(want.values()), "no closed bucket to compare"
    wrong: dict[str, dict[tuple[str, str, int], object]] = {}

    def exact() -> bool:
        for table, (seconds, before) in rollups.items():
            got = _rollup_buckets(client, table, seconds, prefix, before)
            wrong[table] = _wrong_buckets(got, want[table])
        return not any(wrong.values())

    try:
        wait_until(exact, 180, "the rollups to hold every reading once")
    except TimeoutError as exc:
        detail = {t: (len(w), sorted(w.items())[:3]) for t, w in wrong.items() if w}
        raise AssertionError(f"{exc}: (rollup, expected) of wrong buckets: {detail}") from None
