"""Runtime behaviour that needs no broker: ticks, grouping, overruns, startup errors."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from producers.config import ProducerSettings
from producers.entry import DeviceEntry
from producers.runtime import Runtime, build_groups, next_tick_us
from tests.producers.conftest import RecordingPublisher
from tests.schedules import assert_unbroken, reported_skips

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_next_tick_is_the_next_multiple_of_the_period() -> None:
    assert next_tick_us(1_000_000, 200_000) == 1_200_000
    assert next_tick_us(1_000_001, 200_000) == 1_200_000
    assert next_tick_us(1_199_999, 200_000) == 1_200_000
    assert next_tick_us(1_795_288_158_123_456, 1_000_000) == 1_795_288_159_000_000


def entry(device_id: str, name: str, update_every: int) -> DeviceEntry:
    return DeviceEntry(name=name, device_id=device_id, url="tester://", update_every=update_every)


def test_entries_are_grouped_by_device_and_period() -> None:
    entries = [
        entry("node-1", "a", 1000),
        entry("node-2", "a", 1000),
        entry("node-1", "b", 1000),
        entry("node-1", "c", 200),
    ]
    groups = build_groups(entries)
    assert [
        (g.name, g.update_every_ms, [e.name for m in g.members for e in m.entries]) for g in groups
    ] == [
        ("node-1", 1000, ["a", "b"]),
        ("node-2", 1000, ["a"]),
        ("node-1", 200, ["c"]),
    ]


def test_optional_entries_are_not_polled() -> None:
    """Kwollect's on-demand metrics wait for a promotion, which nothing sends yet."""
    optional = DeviceEntry(name="o", device_id="node-1", url="tester://", optional=True)
    groups = build_groups([entry("node-1", "a", 1000), optional])
    assert [e.name for g in groups for m in g.members for e in m.entries] == ["a"]


def run_until_sent(
    publisher: RecordingPublisher, count: int, hold_after: int | None = None
) -> Runtime:
    """A runtime polling node-1 every 100 ms into `publisher`, run until it holds `count`
    messages; with `hold_after`, the event loop is held 250 ms once it holds that many, as
    in a process short of CPU."""
    runtime = Runtime([entry("node-1", "a", 100)], publisher, ProducerSettings())  # type: ignore[arg-type]

    async def scenario() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(runtime.run(stop))
        if hold_after is not None:
            while len(publisher.sent) < hold_after:
                await asyncio.sleep(0.005)
            time.sleep(0.25)
        while len(publisher.sent) < count:
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(running, timeout=5)

    asyncio.run(scenario())
    return runtime


def test_an_overrunning_tick_skips_to_the_next_aligned_tick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    publisher = RecordingPublisher(slow_publish=2)
    runtime = run_until_sent(publisher, 5)
    ticks = assert_unbroken([t for _, t in publisher.sent], 100_000, caplog.text, "node-1")
    skipped = reported_skips(caplog.text, 100_000).get("node-1", set())
    overrun = re.search(
        r"node-1: tick took longer than its 100 ms period: (\d+) tick\(s\) skipped from (\d+) us",
        caplog.text,
    )
    assert overrun, caplog.text
    assert int(overrun[1]) >= 2  # the slow publish ended 2.5 periods after its tick
    assert int(overrun[2]) // 100_000 == ticks[1] + 1  # the ticks right after the slow one
    assert runtime.counters.missed_ticks == len(skipped)


def test_a_tick_that_cannot_start_within_its_period_is_skipped_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The event loop held 250 ms (a process short of CPU) wakes a 100 ms tick's loop a
    period late or more: that tick is reported skipped and the current one polled, so each
    reading is stamped within its own tick's period."""
    publisher = RecordingPublisher()
    runtime = run_until_sent(publisher, 5, hold_after=2)
    assert "node-1: woke " in caplog.text and "past its period" in caplog.text, caplog.text
    skipped = reported_skips(caplog.text, 100_000).get("node-1", set())
    assert runtime.counters.missed_ticks == len(skipped) >= 1
    assert_unbroken([t for _, t in publisher.sent], 100_000, caplog.text, "node-1")


def test_invalid_devices_file_exits_2_naming_the_entry(tmp_path: Path) -> None:
    devices = tmp_path / "devices.yaml"
    devices.write_text("- {name: m, device_id: node-1, url: 'tester://', update_every: -5}\n")
    result = subprocess.run(
        [sys.executable, "-m", "producers", "--devices", str(devices)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO_ROOT,
        env={**os.environ, "JOBSCOPE_KAFKA_BOOTSTRAP": "127.0.0.1:1"},
    )
    assert result.returncode == 2
    assert (
        f"{devices} entry 1 (line 1, device_id=node-1): update_every: Input should be "
        "greater than 0"
    ) in result.stdout
