"""wattmeter:// against simulated Omegawatt meters (stack/simulators/wattmetre.py): real TCP
streams and real commands, 50 frames per second; on-demand activations set by hand."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka.message import unpack
from kafka.patterns import prefix_matcher
from kafka.reading import Reading
from producers.config import load_devices
from producers.entry import DeviceEntry
from producers.ondemand import Activation, Activations
from producers.plugins import plugin_for
from producers.plugins.base import Skips
from producers.plugins.wattmeter import plugin as wattmeter
from producers.plugins.wattmeter.frames import FrameError, parse_v2, parse_v3
from producers.plugins.wattmeter.options import load_mapping
from producers.plugins.wattmeter.stream import Buffer
from stack.config import REPO_ROOT
from stack.processes import wait_until
from stack.simulators.wattmetre import MeterSpec, Wattmetres
from tests import ports

PORTS = ports.ports("wattmeter-plugin")
CONTROL_PORT = PORTS[0]
METERS = {  # one meter per test that breaks it
    "wm-v2": MeterSpec("wm-v2", PORTS[1], 2, 24),
    "wm-v3": MeterSpec("wm-v3", PORTS[2], 3, 8),
    "wm-stop": MeterSpec("wm-stop", PORTS[3], 2, 4),
    "wm-close": MeterSpec("wm-close", PORTS[4], 2, 4),
    "wm-bad": MeterSpec("wm-bad", PORTS[5], 3, 4),
}
CLOSED_PORT = PORTS[-1]  # nothing listens there
SAMPLE = Path(wattmeter.__file__).parent / "sample.yaml"
METRIC = "wattmetre_power_watt"


@pytest.fixture(scope="module")
def meters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wattmetres]:
    with Wattmetres(
        tmp_path_factory.mktemp("wattmetre"), list(METERS.values()), CONTROL_PORT
    ) as sim:
        yield sim


def entry(
    meter: str, url: str | None = None, optional_period: int | None = 20, **extra: object
) -> DeviceEntry:
    spec = METERS.get(meter)
    return DeviceEntry(
        name=METRIC,
        device_id=meter,
        url=url
        or f"wattmeter://127.0.0.1:{spec.port if spec else CLOSED_PORT}/?version="
        f"{spec.version if spec else 2}",
        update_every=1000,
        optional_period=optional_period,
        **extra,  # type: ignore[arg-type]
    )


def build(item: DeviceEntry, activations: Activations | None = None) -> wattmeter.WattmeterPlugin:
    (plugin,) = plugin_for(item.url).build([item])
    assert isinstance(plugin, wattmeter.WattmeterPlugin)
    plugin.skips = Skips(logging.getLogger("test.wattmeter"))
    plugin.activations = activations or Activations()
    return plugin


def now_us() -> int:
    return time.time_ns() // 1000


async def poll_until(
    plugin: wattmeter.WattmeterPlugin,
    done: Callable[[list[Reading]], bool],
    timeout: float,
    what: str,
    errors: list[str] | None = None,
) -> list[Reading]:
    """Poll every 0.2 s, gathering readings (and poll errors into `errors`), until `done`."""
    readings: list[Reading] = []
    deadline = time.monotonic() + timeout
    while not done(readings):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.2)
        try:
            readings += await plugin.poll(now_us())
        except RuntimeError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
    return readings


async def record(port: int, seconds: float) -> list[bytes]:
    """The raw lines a meter sends to a client of its own during `seconds`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = b""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            data += await asyncio.wait_for(reader.read(65536), left)
        except TimeoutError:
            break
    writer.close()
    return data.split(b"\n")[:-1]


def by_device(readings: list[Reading]) -> dict[str, list[Reading]]:
    out: dict[str, list[Reading]] = {}
    for reading in readings:
        out.setdefault(reading.device_id, []).append(reading)
    return out


# -- frames and configuration ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "parse", "expected"),
    [
        (b"wm,1,1700000000.020,OK,101.5,99,7", parse_v2, (1700000000020000, [101.5, 99.0, 7.0])),
        (b"wm,1,1700000000.5,OK,1.5,,nan,2", parse_v2, (1700000000500000, [1.5, None, None, 2.0])),
        (
            b"1700000000.040,true,9,230.1,50.00,0,120.5,0.52,80.25,0.35,200.75,0.87,0,0,0",
            parse_v3,
            (1700000000040000, [120.5, 80.25]),
        ),
        (
            b"1700000001,true,9,230,50,0,nan,0,5,0,5,0,0,0,0",
            parse_v3,
            (1700000001000000, [None, 5.0]),
        ),
    ],
)
def test_frame_layouts_read_as_kwollect(
    line: bytes, parse: Callable[[bytes], tuple[int, list[float]]], expected: tuple
) -> None:
    """Timestamps to the microsecond; a port that is empty or `nan` has no value (None here)."""
    timestamp, values = parse(line)
    assert timestamp == expected[0]
    assert [None if math.isnan(v) else v for v in values] == expected[1]


@pytest.mark.parametrize(
    ("line", "parse", "what", "reason"),
    [
        (b"wm,1,1700000000.02,OK", parse_v2, "malformed frame", "4 fields"),
        (b"wm,1,1700000000.02,KO,5", parse_v2, "frame not OK", "'KO', not OK"),
        (b"wm,1,yesterday,OK,5", parse_v2, "malformed frame", "timestamp 'yesterday'"),
        (b"wm,1,17,OK,5", parse_v2, "malformed frame", "not in 2000-2100"),
        (b"wm,1,1700000000,OK,5,12x.4", parse_v2, "malformed frame", "power '12x.4'"),
        (b"wm,1,1700000000,OK,5,inf", parse_v2, "malformed frame", "infinite"),
        (b"1700000000,false,1,2,3,4,5,6,7,8,9,10,11", parse_v3, "frame not OK", "'false'"),
        (b"1700000000,true,1,2,3,4,5,6,7,8,9,10", parse_v3, "malformed frame", "12 fields"),
        (b"\xff\xfe\x00garbage", parse_v3, "malformed frame", "1 field"),
    ],
)
def test_bad_frames_say_what_is_wrong(
    line: bytes, parse: Callable[[bytes], object], what: str, reason: str
) -> None:
    with pytest.raises(FrameError, match=re.escape(reason)) as caught:
        parse(line)
    assert caught.value.what == what


@pytest.mark.parametrize(
    ("url", "options", "error"),
    [
        ("wattmeter://127.0.0.1/", {}, "needs host and port"),
        ("wattmeter:///?version=2", {}, "needs a host"),
        ("wattmeter://127.0.0.1:5000/?version=4", {}, "version: Value error, 2 or 3"),
        ("wattmeter://127.0.0.1:5000/?speed=1", {}, "speed: Extra inputs"),
        ("wattmeter://127.0.0.1:5000/path", {}, "host:port and ?version=&mapping= only"),
        ("wattmeter://u:p@127.0.0.1:5000/", {}, "no user or password"),
        ("wattmeter://127.0.0.1:5000/", {"command": ["nc"]}, "not both"),
        ("wattmeter:///", {"command": []}, "command: Tuple should have at least 1 item"),
        ("wattmeter://127.0.0.1:5000/", {"buffer_bytes": 10}, "buffer_bytes"),
        ("wattmeter://127.0.0.1:5000/?mapping=/nonexistent.yaml", {}, "cannot read"),
    ],
)
def test_bad_entries_are_refused_when_the_file_loads(url: str, options: dict, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        wattmeter.WattmeterPlugin.check(entry("wm-v2", url=url, options=options))


def test_mapping_file_is_kwollects(tmp_path: Path) -> None:
    """node -> list of ports (or one port); a port mapped twice is an error."""
    good = tmp_path / "mapping.yaml"
    good.write_text("node-1: [wm-v2-port0, wm-v2-port1]\nnode-2: wm-v2-port2\n")
    assert load_mapping(good) == {
        "wm-v2-port0": "node-1",
        "wm-v2-port1": "node-1",
        "wm-v2-port2": "node-2",
    }
    for text, error in (
        ("node-1: [wm-port0]\nnode-2: [wm-port0]\n", "mapped to both node-1 and node-2"),
        ("node-1: [outlet-3]\n", "'outlet-3' is not <meter>-port<N>"),
        ("- wm-port0\n", "must map each node to its ports"),
        ("node-1: {a: b}\n", "a port or a list of ports"),
        ("node-1: [\n", "is not YAML"),
    ):
        (tmp_path / "bad.yaml").write_text(text)
        with pytest.raises(ValueError, match=re.escape(error)):
            load_mapping(tmp_path / "bad.yaml")


def test_buffer_is_bounded_and_drops_whole_lines() -> None:
    """Beyond its limit the oldest lines go, whole and counted; what is left starts a line."""
    buffer = Buffer(limit=100)
    lines = [b"line-%03d\n" % i for i in range(200)]  # 9 bytes each
    data = b"".join(lines)
    for i in range(0, len(data), 7):  # chunks that cut lines anywhere
        buffer.add(data[i : i + 7])
    taken = buffer.take()
    kept = b"".join(item for item in taken.items if item)
    assert len(kept) <= 100
    assert taken.tail_lost
    assert kept.split(b"\n")[0] in {line.strip() for line in lines}  # starts on a line
    assert taken.dropped_lines + kept.count(b"\n") == 200
    assert buffer.take() == ([], 0, False)


# -- against the simulated meters ------------------------------------------------------------


def test_means_per_second_are_kwollects(meters: Wattmetres) -> None:
    """Per port, one reading per second: the mean of that second's frames (checked against
    the frames another client of the same meter received), stamped with the second."""
    plugin = build(entry("wm-v2"))

    async def scenario() -> tuple[list[Reading], list[bytes]]:
        recording = asyncio.create_task(record(METERS["wm-v2"].port, 4.0))
        await asyncio.sleep(0.1)
        readings = await poll_until(
            plugin, lambda r: len({x.timestamp_us for x in r}) >= 3, 10, "3 seconds of means"
        )
        await plugin.close()
        return readings, await recording

    readings, lines = asyncio.run(scenario())
    frames = [parse_v2(line) for line in lines]
    assert 150 <= len(frames) <= 210  # 50 frames per second
    devices = by_device(readings)
    assert sorted(devices) == sorted(f"wm-v2-port{i}" for i in range(24))
    first = min(r.timestamp_us for r in readings)
    for device, series in devices.items():
        port = int(device.rsplit("port", 1)[1])
        for reading in series:
            assert reading.timestamp_us % 1_000_000 == 0
            assert reading.metric_id == METRIC
            assert reading.labels == {}
            if reading.timestamp_us == first:
                continue  # the plugin connected during that second: a mean of part of it
            second = [
                v[port] for t, v in frames if t // 1_000_000 * 1_000_000 == reading.timestamp_us
            ]
            assert len(second) == 50
            assert reading.value == pytest.approx(sum(second) / len(second), rel=1e-12)
            assert 85 <= reading.value <= 310


def test_activated_port_gets_every_frame_and_back(meters: Wattmetres) -> None:
    """Activating one port (by its device id) gives it every frame, with the meter's own
    timestamps and values; the other ports keep their means; removing it brings means back."""
    activations = Activations()
    plugin = build(entry("wm-v2"), activations)
    full = "wm-v2-port3"

    async def scenario() -> None:
        await poll_until(plugin, lambda r: len(r) >= 24, 10, "the first means")
        activations.put(Activation("job/1", frozenset({full}), None, None))
        await plugin.poll(now_us())  # the frames of the switch (and the unfinished mean)
        recording = asyncio.create_task(record(METERS["wm-v2"].port, 2.5))
        readings = await poll_until(
            plugin, lambda r: sum(x.device_id == full for x in r) >= 150, 10, "3 s of frames"
        )
        lines = await recording
        devices = by_device(readings)
        assert len(devices[full]) >= 150
        assert all(len(s) <= 5 for d, s in devices.items() if d != full)  # still 1 per second
        sent = {t: v[3] for t, v in map(parse_v2, lines)}
        raw = [r for r in devices[full] if r.timestamp_us % 20_000 == 0]
        got = {r.timestamp_us: r.value for r in raw}
        common = sorted(set(got) & set(sent))
        assert len(common) >= 100
        assert all(got[t] == sent[t] for t in common)
        stamps = [r.timestamp_us for r in raw]
        assert stamps == sorted(stamps)
        assert all(b - a == 20_000 for a, b in itertools.pairwise(stamps))
        activations.remove("job/1")
        await plugin.poll(now_us())  # the frames of the switch
        readings = await poll_until(plugin, lambda r: len(r) >= 48, 10, "means again")
        assert max(len(s) for s in by_device(readings).values()) <= 3
        await plugin.close()

    asyncio.run(scenario())


def test_version_3_with_mapping_aliases_and_activation_by_node(
    meters: Wattmetres, tmp_path: Path
) -> None:
    """Version 3 frames; the mapping gives `_device_alias`; activating a node (as a job's
    activation does) gives every frame of its ports only; labels and scale_factor apply."""
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("node-7: [wm-v3-port1, wm-v3-port2]\nnode-8: other-meter-port0\n")
    activations = Activations()
    watts = prefix_matcher("wattmetre_", max_chars=100)
    activations.put(Activation("job/7", frozenset({"node-7"}), watts, None))
    item = entry(
        "wm-v3",
        url=f"wattmeter://127.0.0.1:{METERS['wm-v3'].port}/?version=3&mapping={mapping}",
        labels={"room": "b104"},
        scale_factor=0.5,
    )
    plugin = build(item, activations)
    readings = asyncio.run(
        poll_until(
            plugin,
            lambda r: sum(x.device_id == "wm-v3-port1" for x in r) >= 100,
            10,
            "2 s of node-7's frames",
        )
    )
    asyncio.run(plugin.close())
    devices = by_device(readings)
    assert sorted(devices) == sorted(f"wm-v3-port{i}" for i in range(8))
    for device, series in devices.items():
        if device in ("wm-v3-port1", "wm-v3-port2"):
            assert len(series) >= 100
            assert all(r.labels == {"room": "b104", "_device_alias": "node-7"} for r in series)
        else:
            assert len(series) <= 4
            assert all(r.labels == {"room": "b104"} for r in series)
        assert all(40 <= r.value <= 160 for r in series)  # 90-300 W, halved


def test_command_form_reads_stdout_and_restarts_it(meters: Wattmetres) -> None:
    """Frames from a command's standard output (the simulator's --stdout); when it exits, the
    poll says so (exit status and its last words) and the command is started again."""
    spec = MeterSpec("wm-cmd", 0, 3, 4)
    argv = Wattmetres.stdout_argv(spec, duration_s=1.5)
    plugin = build(
        entry("wm-cmd", url="wattmeter:///?version=3", options={"command": argv, "retry_max_s": 1})
    )
    errors: list[str] = []

    async def two_runs() -> list[Reading]:
        try:
            return await poll_until(
                plugin,
                lambda r: bool(errors) and plugin.stream.sessions >= 2 and len(r) >= 8,
                45,  # two starts of a Python simulator and a retry: 15 s was short on a loaded run
                f"two runs of the command (sessions {plugin.stream.sessions}, errors {errors})",
                errors,
            )
        finally:
            await plugin.close()

    # Not asyncio.run: should the reader not stop (close() logs it), the test fails at once
    # instead of waiting on it for ever.
    loop = asyncio.new_event_loop()
    try:
        readings = loop.run_until_complete(two_runs())
    finally:
        loop.close()
    assert sorted(by_device(readings)) == [f"wm-cmd-port{i}" for i in range(4)]
    assert errors[0] == f"wattmeter command {' '.join(argv)}: command exited with status 0"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["/nonexistent/meter-reader"], "cannot run /nonexistent/meter-reader: No such file"),
        (
            [sys.executable, "-c", "import sys; sys.exit('wattmetre unplugged')"],
            "command exited with status 1: wattmetre unplugged",
        ),
    ],
)
def test_failing_command_is_reported(argv: list[str], error: str) -> None:
    plugin = build(entry("wm-x", url="wattmeter:///", options={"command": argv}))
    errors: list[str] = []
    asyncio.run(poll_until(plugin, lambda _: bool(errors), 10, "the error", errors))
    asyncio.run(plugin.close())
    assert error in errors[0]


def test_unreachable_meter_raises_until_it_answers() -> None:
    plugin = build(entry("wm-none", options={"retry_max_s": 1}))
    errors: list[str] = []
    asyncio.run(poll_until(plugin, lambda _: bool(errors), 10, "the error", errors))
    asyncio.run(plugin.close())
    assert errors[0] == f"wattmeter 127.0.0.1:{CLOSED_PORT}: Connection refused"


def test_hung_meter_is_reported_and_recovers(meters: Wattmetres) -> None:
    """A meter that stays connected but silent: the poll publishes the unfinished seconds,
    then raises ("no data") until frames flow again after `resume`."""
    plugin = build(entry("wm-stop", options={"timeout_s": 1, "retry_max_s": 0.5}))
    errors: list[str] = []

    async def scenario() -> None:
        await poll_until(plugin, lambda r: len(r) >= 4, 10, "the first means")
        meters.control("stop", "wm-stop")
        stopped = now_us()
        flushed = await poll_until(plugin, lambda _: bool(errors), 10, "the error", errors)
        assert "no data for" in errors[0]
        assert sorted({r.device_id for r in flushed}) == [f"wm-stop-port{i}" for i in range(4)]
        assert all(r.timestamp_us <= stopped for r in flushed)
        meters.control("resume", "wm-stop")
        await poll_until(plugin, lambda r: len(r) >= 4, 10, "means after resume", errors)
        await plugin.close()

    try:
        asyncio.run(scenario())
    finally:
        meters.control("resume", "wm-stop")


def test_closed_and_reset_meter_reconnects(meters: Wattmetres) -> None:
    """A meter that closes its port (refused), then one that resets the connection: the poll
    raises while it is gone, and the stream reconnects by itself."""
    plugin = build(entry("wm-close", options={"timeout_s": 1, "retry_max_s": 0.5}))
    errors: list[str] = []

    async def scenario() -> None:
        await poll_until(plugin, lambda r: len(r) >= 4, 10, "the first means")
        meters.control("close", "wm-close")
        await poll_until(
            plugin, lambda _: any("refused" in e for e in errors), 10, "refusals", errors
        )
        where = f"wattmeter 127.0.0.1:{METERS['wm-close'].port}"
        assert errors[0] in {
            f"{where}: connection closed by the meter",
            f"{where}: Connection refused",
        }
        meters.control("resume", "wm-close")
        await poll_until(plugin, lambda r: len(r) >= 4, 10, "means after resume", errors)
        sessions = plugin.stream.sessions
        meters.control("reset", "wm-close")
        await poll_until(
            plugin,
            lambda r: plugin.stream.sessions > sessions and len(r) >= 8,
            10,
            "means after the reset",
            errors,
        )
        await plugin.close()

    try:
        asyncio.run(scenario())
    finally:
        meters.control("resume", "wm-close")


def test_malformed_frames_and_garbage_are_counted_and_skipped(
    meters: Wattmetres, caplog: pytest.LogCaptureFixture
) -> None:
    """A meter sending 30 % bad frames and binary junk: those are counted (Skips) and logged
    once per kind; every good frame still makes readings."""
    activations = Activations()
    activations.put(Activation("all", frozenset({f"wm-bad-port{i}" for i in range(4)}), None, None))
    plugin = build(entry("wm-bad"), activations)

    async def scenario() -> list[Reading]:
        await poll_until(plugin, lambda r: len(r) >= 40, 10, "frames")
        meters.control("malformed", "wm-bad", "0.3")
        meters.control("garbage", "wm-bad")
        readings = await poll_until(
            plugin, lambda _: plugin.skips.count >= 30, 10, "30 skipped frames"
        )
        meters.control("malformed", "wm-bad", "0")
        await plugin.close()
        return readings

    with caplog.at_level(logging.WARNING, logger="test.wattmeter"):
        try:
            readings = asyncio.run(scenario())
        finally:
            meters.control("malformed", "wm-bad", "0")
    assert len(readings) >= 4 * 40
    messages = [r.getMessage() for r in caplog.records]
    assert all(m.startswith("device_id=wm-bad ") for m in messages)
    kinds = [m.removeprefix("device_id=wm-bad ").split(": ")[0] for m in messages]
    assert len(kinds) == len(set(kinds))  # each kind logged once
    assert set(kinds) <= {"malformed frame", "frame not OK"}
    assert plugin.skips.count >= 30


def test_unpolled_frames_are_bounded_and_counted() -> None:
    """20,000 frames arrive at once while nobody polls: at most `buffer_bytes` are kept, the
    oldest frames are dropped whole and counted, the rest is read."""
    program = (
        "import sys\n"
        "for i in range(20000):\n"
        "    sys.stdout.write(f'wm,{i},{1700000000 + i * 0.02:.3f},OK,{100 + i % 7}\\n')\n"
    )
    activations = Activations()
    activations.put(Activation("all", frozenset({"wm-flood-port0"}), None, None))
    plugin = build(
        entry(
            "wm-flood",
            url="wattmeter:///?version=2",
            options={"command": [sys.executable, "-c", program], "buffer_bytes": 65536},
        ),
        activations,
    )

    async def scenario() -> list[Reading]:
        assert await plugin.poll(now_us()) == []  # starts the command
        deadline = time.monotonic() + 10
        while plugin.stream.problem is None:  # exited: everything was sent
            assert time.monotonic() < deadline, "the command did not finish"
            await asyncio.sleep(0.05)
        readings = await plugin.poll(now_us())
        await plugin.close()
        return readings

    readings = asyncio.run(scenario())
    assert 1000 < len(readings) < 20000 * 65536 / 600_000 * 2
    assert len(readings) + plugin.skips.count == 20000
    assert readings[-1].timestamp_us == 1700000000_000000 + 19999 * 20_000
    stamps = [r.timestamp_us for r in readings]
    assert all(b - a == 20_000 for a, b in itertools.pairwise(stamps))


def test_sample_reads_its_three_meters(meters: Wattmetres, tmp_path: Path) -> None:
    """The sample (its TCP meters pointed at the test's) loads and reads, the command form too."""
    text = SAMPLE.read_text()
    text = text.replace("127.0.0.1:12001", f"127.0.0.1:{METERS['wm-v2'].port}")
    text = text.replace("127.0.0.1:12002", f"127.0.0.1:{METERS['wm-v3'].port}")
    (tmp_path / "devices.yaml").write_text(text)
    cwd = Path.cwd()
    os.chdir(REPO_ROOT)  # the sample's relative paths (mapping, .venv/bin/python)
    try:
        entries = load_devices(tmp_path / "devices.yaml")
        plugins = [build(item) for item in entries]

        async def scenario() -> list[list[Reading]]:
            got = await asyncio.gather(
                *(poll_until(p, lambda r: len(r) >= 8, 15, f"{p.entry.device_id}") for p in plugins)
            )
            for plugin in plugins:
                await plugin.close()
            return list(got)

        results = asyncio.run(scenario())
    finally:
        os.chdir(cwd)
    first = by_device(results[0])
    assert first["wattmetre1-port0"][0].labels == {"_device_alias": "node-1"}
    assert first["wattmetre1-port23"][0].labels == {}
    assert by_device(results[1])["wattmetre2-port0"][0].labels == {
        "room": "b104",
        "_device_alias": "node-11",
    }
    assert {r.labels["_device_alias"] for r in results[2]} <= {"node-19", "node-20"}


# -- through the runtime, to Kafka ----------------------------------------------------------


def _command_running(marker: str) -> bool:
    """Whether a process whose command line holds `marker` runs (the command form's reader)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    return True
            except OSError:
                continue
    return False


def test_producer_publishes_one_message_per_port_and_tick(
    kafka: str, meters: Wattmetres, tmp_path: Path
) -> None:
    """`python -m producers` against the real broker: each port is a device with one message
    per tick; a job's activation of node-9 (two ports, through the mapping) makes each of
    their messages hold every frame of its second; SIGTERM stops the command of the meter read
    from a command's standard output."""
    admin = AdminClient({"bootstrap.servers": kafka})
    suffix = uuid.uuid4().hex[:8]
    readings_topic, ondemand_topic = f"test-wattmeter-{suffix}", f"test-ondemand-{suffix}"
    created = admin.create_topics(
        [
            NewTopic(readings_topic, 3, replication_factor=1),
            NewTopic(ondemand_topic, 1, replication_factor=1, config={"cleanup.policy": "compact"}),
        ]
    )
    for future in created.values():
        future.result()
    producer = Producer({"bootstrap.servers": kafka})
    activation = {"id": "job/9", "job_id": "9", "devices": ["node-9"], "metrics": "wattmetre_"}
    producer.produce(ondemand_topic, key=b"job/9", value=json.dumps(activation).encode())
    assert producer.flush(10) == 0
    marker = f"wm-cmd-{suffix}"
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("node-9: [wm-v3-port1, wm-v3-port2]\n")
    command = Wattmetres.stdout_argv(MeterSpec(marker, 0, 2, 4))
    devices = tmp_path / "devices.yaml"
    devices.write_text(
        f"- {{name: {METRIC}, device_id: wm-v3, update_every: 1000, optional_period: 20,\n"
        f"   url: 'wattmeter://127.0.0.1:{METERS['wm-v3'].port}/?version=3&mapping={mapping}'}}\n"
        f"- {{name: {METRIC}, device_id: wm-cmd, update_every: 1000, optional_period: 20,\n"
        f"   url: 'wattmeter:///?version=2', options: {{command: {json.dumps(command)}}}}}\n"
    )
    env = {
        **os.environ,
        "JOBSCOPE_KAFKA_BOOTSTRAP": kafka,
        "JOBSCOPE_READINGS_TOPIC": readings_topic,
        "JOBSCOPE_ONDEMAND_TOPIC": ondemand_topic,
        "JOBSCOPE_METRICS_PORT": "0",
        "JOBSCOPE_SELF_INTERVAL_S": "3600",
    }
    with open(tmp_path / "producers.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "producers", "--devices", str(devices)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO_ROOT,
        )
    consumer = Consumer({"bootstrap.servers": kafka, "group.id": readings_topic})
    consumer.assign([TopicPartition(readings_topic, p, OFFSET_BEGINNING) for p in range(3)])
    messages: list[tuple[str, list[Reading]]] = []

    def full_seconds() -> int:
        for msg in consumer.consume(1000, timeout=0.2):
            assert msg.error() is None, msg.error()
            messages.append((msg.key().decode(), unpack(msg.value())))
        return sum(key == "wm-v3-port1" and len(r) >= 40 for key, r in messages)

    try:
        wait_until(lambda: full_seconds() >= 3, 30, "3 messages of every frame of wm-v3-port1")
        assert _command_running(marker)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        consumer.close()
    wait_until(lambda: not _command_running(marker), 5, "the command to stop")
    keys = {key for key, _ in messages}
    assert keys == {f"wm-v3-port{i}" for i in range(8)} | {f"wm-cmd-port{i}" for i in range(4)}
    for key, readings in messages:
        assert {r.device_id for r in readings} == {key}
        if key in ("wm-v3-port1", "wm-v3-port2"):
            assert all(r.labels == {"_device_alias": "node-9"} for r in readings)
            stamps = [r.timestamp_us for r in readings]
            assert all(b - a == 20_000 for a, b in itertools.pairwise(stamps))
        else:
            assert len(readings) <= 2  # one mean per second (two if a frame came late)
            assert all(r.timestamp_us % 1_000_000 == 0 for r in readings)
    log_text = (tmp_path / "producers.log").read_text()
    assert "poll failed" not in log_text
