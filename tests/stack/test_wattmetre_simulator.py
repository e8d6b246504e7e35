"""The simulated wattmeters (stack/simulators/wattmetre.py): 50 frames per second in the
layouts Kwollect reads, a realistic power signal, the control port and the stdout form."""

from __future__ import annotations

import itertools
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from producers.plugins.wattmeter.frames import parse_v2, parse_v3
from stack.simulators.wattmetre import Channel, MeterSpec, Wattmetres
from tests import ports

CONTROL_PORT, V2_PORT, V3_PORT = ports.ports("wattmetre-simulator")
V2 = MeterSpec("sim-v2", V2_PORT, 2, 24)
V3 = MeterSpec("sim-v3", V3_PORT, 3, 8)


@pytest.fixture(scope="module")
def meters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wattmetres]:
    with Wattmetres(tmp_path_factory.mktemp("wattmetre"), [V2, V3], CONTROL_PORT) as sim:
        yield sim


def record(port: int, seconds: float) -> list[bytes]:
    """The lines one client of the meter receives during `seconds`."""
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                data += sock.recv(65536)
            except TimeoutError:
                break
    return data.split(b"\n")[:-1]


@pytest.mark.parametrize(("spec", "parse"), [(V2, parse_v2), (V3, parse_v3)])
def test_fifty_frames_per_second_in_kwollects_layouts(
    meters: Wattmetres, spec: MeterSpec, parse: object
) -> None:
    """Frames stamped every 20 ms, none left out, sent in real time: never ahead of the
    clock. How many come in 2 s is the machine's speed (a meter more than 1 s behind skips
    ahead), so only half a second's worth is required."""
    lines = record(spec.port, 2.0)
    frames = [parse(line) for line in lines[1:]]  # type: ignore[operator]
    assert len(frames) >= 25
    stamps = [t for t, _ in frames]
    assert all(t % 20_000 == 0 for t in stamps)
    assert all(b - a == 20_000 for a, b in itertools.pairwise(stamps))
    now_us = time.time() * 1e6
    assert stamps[-1] <= now_us, "a frame stamped ahead of the clock"
    assert now_us - stamps[-1] < 5e6  # the wall clock's time, not one since the start
    assert {len(values) for _, values in frames} == {spec.channels}
    assert all(80 <= v <= 320 for _, values in frames for v in values)


def test_channel_idles_and_bursts() -> None:
    """Five simulated minutes of one channel: idle at 90-120 W, bursts to 200-300 W, noise;
    the same values for the same seed."""
    channel, again = Channel(1, "m", 0), Channel(1, "m", 0)
    values = [channel.value(i * 0.02) for i in range(15_000)]
    assert values[:100] == [again.value(i * 0.02) for i in range(100)]
    assert min(values) >= 85 and max(values) <= 310
    idle = sum(v <= 125 for v in values) / len(values)
    busy = sum(v >= 195 for v in values) / len(values)
    assert idle > 0.5 and busy > 0.05 and idle + busy > 0.95  # little time in ramps
    steps = [abs(b - a) for a, b in itertools.pairwise(values[:50])]
    assert 0 < max(steps) < 10  # noise, not steps


def test_every_client_gets_the_same_frames(meters: Wattmetres) -> None:
    with (
        socket.create_connection(("127.0.0.1", V2.port)) as first,
        socket.create_connection(("127.0.0.1", V2.port)) as second,
    ):
        time.sleep(0.5)
        first.settimeout(1)
        second.settimeout(1)
        a, b = first.recv(1 << 20).split(b"\n"), second.recv(1 << 20).split(b"\n")
    common = set(a[1:-1]) & set(b[1:-1])
    assert len(common) >= 15


def test_control_refuses_unknown_commands_and_meters(meters: Wattmetres) -> None:
    meters.control("ping")
    with pytest.raises(RuntimeError, match="unknown command 'explode sim-v2'"):
        meters.control("explode", "sim-v2")
    with pytest.raises(RuntimeError, match="no meter 'nope'"):
        meters.control("stop", "nope")
    with pytest.raises(RuntimeError, match="unknown command"):
        meters.control("malformed", "sim-v2", "2")


def test_stop_and_resume(meters: Wattmetres) -> None:
    meters.control("stop", "sim-v3")
    try:
        assert record(V3.port, 0.5) == []
    finally:
        meters.control("resume", "sim-v3")
    assert len(record(V3.port, 0.5)) >= 5  # frames again (how many: the machine's speed)


def test_stdout_form_writes_frames_and_ends() -> None:
    argv = Wattmetres.stdout_argv(MeterSpec("sim-out", 0, 2, 4), duration_s=0.5)
    done = subprocess.run(argv, capture_output=True, timeout=20, check=True)
    frames = [parse_v2(line) for line in done.stdout.splitlines()]
    assert 20 <= len(frames) <= 27
    assert {len(values) for _, values in frames} == {4}
    assert done.stdout.startswith(b"sim-out,1,")
