"""tester://: deterministic values, metric naming, and the failure modes it simulates."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from kafka.reading import Reading
from producers.entry import DeviceEntry
from producers.plugins import plugin_for
from producers.plugins.tester import plugin as tester
from producers.plugins.tester.plugin import metric_ids, tester_counter, tester_value

TIMESTAMP_US = 1_795_288_158_123_456


def build(
    url: str, name: str = "tester_value", labels: dict[str, str] | None = None
) -> tester.TesterPlugin:
    entry = DeviceEntry(
        name=name, device_id="node-7", url=url, update_every=1000, labels=labels or {}
    )
    (plugin,) = plugin_for(url).build([entry])
    assert isinstance(plugin, tester.TesterPlugin)
    return plugin


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        (1, ["m"]),
        (3, ["m_0", "m_1", "m_2"]),
        (11, [f"m_{i:02d}" for i in range(11)]),
        (20, [f"m_{i:02d}" for i in range(20)]),
        (101, [f"m_{i:03d}" for i in range(101)]),
    ],
)
def test_metric_ids(metrics: int, expected: list[str]) -> None:
    assert metric_ids("m", metrics) == expected


def test_poll_returns_the_recomputable_values_with_the_entry_labels() -> None:
    plugin = build("tester://?metrics=20", labels={"source": "tester"})
    readings = asyncio.run(plugin.poll(TIMESTAMP_US))
    assert readings == [
        Reading(
            TIMESTAMP_US,
            "node-7",
            f"tester_value_{i:02d}",
            tester_value("node-7", f"tester_value_{i:02d}", TIMESTAMP_US),
            {"source": "tester"},
        )
        for i in range(20)
    ]


def test_values_are_deterministic_distinct_and_not_round() -> None:
    value = tester_value("node-1", "m", TIMESTAMP_US)
    assert value == tester_value("node-1", "m", TIMESTAMP_US)
    assert 90 <= value <= 210
    assert value != round(value, 6)  # carries full float64 precision
    others = {
        tester_value(device, metric, TIMESTAMP_US)
        for device in ("node-1", "node-2")
        for metric in ("m", "n")
    }
    assert len(others) == 4
    # each microsecond gives a different value: a timestamp stored off by 1 us is caught
    assert tester_value("node-1", "m", TIMESTAMP_US + 1) != value


def test_counter_rises_at_the_rate_of_the_wave() -> None:
    """counter=1: the reading is tester_counter, and its increase over a span is the integral
    of tester_value over it (checked against a fine trapezoidal sum), so a summary's delta
    and rate can be recomputed."""
    (reading,) = asyncio.run(build("tester://?counter=1", name="bytes_total").poll(TIMESTAMP_US))
    assert reading.value == tester_counter("node-7", "bytes_total", TIMESTAMP_US)
    start, span_us, steps = TIMESTAMP_US, 90_000_000, 9000
    values = [
        tester_value("node-7", "bytes_total", start + i * span_us // steps)
        for i in range(steps + 1)
    ]
    integral = sum((a + b) / 2 for a, b in itertools.pairwise(values)) * span_us / steps / 1e6
    increase = tester_counter("node-7", "bytes_total", start + span_us) - tester_counter(
        "node-7", "bytes_total", start
    )
    assert increase == pytest.approx(integral, rel=1e-6)
    assert 100 * 90 <= increase <= 200 * 90  # a rate within the wave's bounds


def test_fail_raises() -> None:
    with pytest.raises(RuntimeError, match="fail=1"):
        asyncio.run(build("tester://?fail=1").poll(TIMESTAMP_US))


def test_hang_never_returns_but_can_be_cancelled() -> None:
    async def scenario() -> None:
        poll = asyncio.create_task(build("tester://?hang=1").poll(TIMESTAMP_US))
        done, _ = await asyncio.wait([poll], timeout=0.2)
        assert not done
        poll.cancel()
        with pytest.raises(asyncio.CancelledError):
            await poll

    asyncio.run(scenario())


def test_hang_file_makes_a_device_hang_and_recover(tmp_path: Path) -> None:
    flag = tmp_path / "hang"
    plugin = build(f"tester://?metrics=2&hang_file={flag}")

    async def scenario() -> None:
        assert len(await plugin.poll(TIMESTAMP_US)) == 2
        flag.touch()
        poll = asyncio.create_task(plugin.poll(TIMESTAMP_US))
        done, _ = await asyncio.wait([poll], timeout=0.2)
        assert not done
        flag.unlink()
        assert len(await asyncio.wait_for(poll, timeout=2)) == 2

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("tester://?metrics=0", "metrics: Input should be greater than or equal to 1"),
        ("tester://?metrics=two", "metrics: Input should be a valid integer"),
        ("tester://?hang=maybe", "hang: Input should be a valid boolean"),
        ("tester://?metrics=1&colour=red", "colour: Extra inputs are not permitted"),
        ("tester://node-7", "tester:// takes no host or path"),
    ],
)
def test_bad_url_is_refused_when_built(url: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        build(url)
