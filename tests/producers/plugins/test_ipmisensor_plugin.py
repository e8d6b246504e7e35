"""ipmisensor:// against real BMCs: OpenIPMI's ipmi_sim, read by FreeIPMI's ipmi-sensors."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from producers.config import load_devices
from producers.entry import DeviceEntry
from producers.plugins import plugin_for
from producers.plugins.base import Skips
from producers.plugins.ipmisensor import plugin as ipmi
from producers.runtime import build_groups
from stack.processes import free_port
from stack.simulators.ipmi import IPMI_SIM, SENSORS, IpmiSim

SAMPLE = Path(ipmi.__file__).parent / "sample.yaml"
PASSWORD = "s3cret-pw"
OPTIONS = {"workarounds": ["opensesspriv"], "timeout_s": 2}
VALUES = {sensor.name: sensor.value for sensor in SENSORS}


@pytest.fixture(scope="module")
def bmcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[IpmiSim, IpmiSim]]:
    """Two simulated BMCs at once, each on its own port; fails (never skips) without the tools."""
    for tool, package in ((IPMI_SIM, "openipmi"), (ipmi.IPMI_SENSORS, "freeipmi-tools")):
        assert Path(tool).exists(), f"{tool} is missing: apt-get install {package}"
    state = tmp_path_factory.mktemp("ipmi")
    sims = (
        IpmiSim(state / "bmc-a", free_port(), "root", PASSWORD),
        IpmiSim(state / "bmc-b", free_port(), "admin", "other-pw"),
    )
    try:
        for sim in sims:
            sim.start()
        yield sims
    finally:
        for sim in sims:
            sim.stop()


@pytest.fixture(autouse=True)
def sdr_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ipmi, "SDR_CACHE_DIR", tmp_path / "sdr-cache")
    monkeypatch.setenv("JOBSCOPE_IPMI_PASSWORD", PASSWORD)


def entry(
    sim: IpmiSim, sensor: str, name: str = "bmc_value", password: str | None = None, **extra: object
) -> DeviceEntry:
    secret = password if password is not None else sim.password
    return DeviceEntry(
        name=name,
        device_id=f"node-{sim.port}",
        url=f"ipmisensor://{sim.user}:{secret}@127.0.0.1:{sim.port}/{sensor}",
        options=OPTIONS,
        **extra,  # type: ignore[arg-type]
    )


def build(entries: list[DeviceEntry]) -> ipmi.IpmiSensorPlugin:
    (plugin,) = plugin_for(entries[0].url).build(entries)
    assert isinstance(plugin, ipmi.IpmiSensorPlugin)
    plugin.skips = Skips(logging.getLogger("test"))
    return plugin


def test_sample_reads_values_names_labels_and_scale(bmcs: tuple[IpmiSim, IpmiSim]) -> None:
    """The sample (pointed at the simulated BMC's port): one instance reads all 9 entries
    of the BMC in one ipmi-sensors run; Kwollect's form (password in the URL) too."""
    port = bmcs[0].port
    text = SAMPLE.read_text().replace("127.0.0.1:9001", f"127.0.0.1:{port}")
    (bmcs[0].state_dir / "devices.yaml").write_text(text)
    groups = build_groups(load_devices(bmcs[0].state_dir / "devices.yaml"))
    assert [len(group.members) for group in groups] == [1]
    assert [len(group.members[0].entries) for group in groups] == [9]
    assert "s3cret" not in groups[0].name  # the log's name for the group
    plugin = groups[0].members[0]
    readings = asyncio.run(plugin.poll(1_795_288_158_123_456))
    assert isinstance(plugin, ipmi.IpmiSensorPlugin) and plugin.runs == 1
    got = [(r.device_id, r.metric_id, r.value, r.labels, r.timestamp_us) for r in readings]
    ts = 1_795_288_158_123_456
    assert got == [
        ("node-1", "bmc_node_power_watt", 280.0, {}, ts),
        ("node-1", "bmc_ambient_temp_celsius", 23.0, {}, ts),
        ("node-1", "bmc_exhaust_temp_celsius", 38.0, {}, ts),
        ("node-1", "bmc_cpu_temp_celsius", 55.0, {"cpu": "1"}, ts),
        ("node-1", "bmc_cpu_temp_celsius", 58.0, {"cpu": "2"}, ts),
        ("node-1", "bmc_fan_speed_rpm", 7200.0, {"fan": "Fan1"}, ts),
        ("node-1", "bmc_fan_speed_rpm", 7320.0, {"fan": "Fan2"}, ts),
        ("node-1", "bmc_psu_current_milliamp", 1200.0, {"psu": "1"}, ts),
        ("node-1", "bmc_psu_voltage_volt", 230.0, {"psu": "1"}, ts),
    ]
    kwollect_form = DeviceEntry(
        name="bmc_psu_voltage_volt",
        device_id="node-1",
        url=f"ipmisensor://root:{PASSWORD}@127.0.0.1:{port}/Voltage 1",
        options={"workarounds": ["opensesspriv"]},
    )
    ((plugin,),) = [group.members for group in build_groups([kwollect_form])]
    (volt,) = asyncio.run(plugin.poll(ts))
    assert volt.value == 230.0


def test_every_sensor_by_name_and_by_id_in_one_run(bmcs: tuple[IpmiSim, IpmiSim]) -> None:
    sim = bmcs[1]
    readable = [s for s in SENSORS if s.value is not None]
    entries = [entry(sim, s.name.replace(" ", "%20"), labels={"by": "name"}) for s in readable]
    entries += [entry(sim, str(s.record_id), labels={"by": "id"}) for s in readable]
    plugin = build(entries)
    readings = asyncio.run(plugin.poll(1))
    assert plugin.runs == 1
    expected = [s.value for s in readable]
    assert [r.value for r in readings] == pytest.approx(expected + expected)
    assert [r.labels["by"] for r in readings] == ["name"] * 13 + ["id"] * 13
    assert plugin.skips.count == 0


def test_missing_and_unavailable_sensors_are_skipped_and_counted(
    bmcs: tuple[IpmiSim, IpmiSim], caplog: pytest.LogCaptureFixture
) -> None:
    sim = bmcs[0]
    plugin = build(
        [
            entry(sim, "Inlet Temp", "bmc_ambient_temp_celsius"),
            entry(sim, "No Such Sensor", "bmc_missing"),
            entry(sim, "PS2 Pwr", "bmc_psu2_power_watt"),  # reads N/A
            entry(sim, "Fan3", "bmc_fan_speed_rpm"),
        ]
    )
    for _ in range(2):
        readings = asyncio.run(plugin.poll(1))
        assert [(r.metric_id, r.value) for r in readings] == [
            ("bmc_ambient_temp_celsius", 23.0),
            ("bmc_fan_speed_rpm", 7440.0),
        ]
    assert plugin.skips.count == 4
    warnings = [r.getMessage() for r in caplog.records if r.name == "test"]
    assert len(warnings) == 2  # logged once each
    assert "bmc_missing (sensor 'No Such Sensor'): no such sensor name or ID" in warnings[0]
    assert "bmc_psu2_power_watt (sensor 'PS2 Pwr'): reading 'N/A'" in warnings[1]


def test_password_from_the_environment(bmcs: tuple[IpmiSim, IpmiSim]) -> None:
    sim = bmcs[0]
    url = f"ipmisensor://root@127.0.0.1:{sim.port}/Pwr%20Consumption"
    options = {**OPTIONS, "password_env": "JOBSCOPE_IPMI_PASSWORD"}
    plugin = build(
        [DeviceEntry(name="bmc_node_power_watt", device_id="n", url=url, options=options)]
    )
    assert [r.value for r in asyncio.run(plugin.poll(1))] == [280.0]
    os.environ.pop("JOBSCOPE_IPMI_PASSWORD")
    with pytest.raises(ValueError, match=r"JOBSCOPE_IPMI_PASSWORD .* is not set"):
        ipmi.IpmiSensorPlugin.check(plugin.entries[0])


def test_changed_values_are_read_at_the_next_poll(bmcs: tuple[IpmiSim, IpmiSim]) -> None:
    sim = bmcs[1]
    plugin = build([entry(sim, "Inlet Temp"), entry(sim, "Fan6")])
    sim.set_value("Inlet Temp", 31)
    sim.set_value("Fan6", 3000)
    try:
        assert [r.value for r in asyncio.run(plugin.poll(1))] == [31.0, 3000.0]
    finally:
        sim.set_value("Inlet Temp", VALUES["Inlet Temp"] or 0)
        sim.set_value("Fan6", VALUES["Fan6"] or 0)


def test_wrong_password_is_a_clear_error(bmcs: tuple[IpmiSim, IpmiSim]) -> None:
    plugin = build([entry(bmcs[0], "Inlet Temp", password="wrong")])
    start = time.monotonic()
    with pytest.raises(
        RuntimeError, match=r"^ipmi-sensors on root@127\.0\.0\.1:\d+: password invalid$"
    ):
        asyncio.run(plugin.poll(1))
    assert time.monotonic() - start < 2


def test_dead_bmc_times_out_without_delaying_a_live_one(bmcs: tuple[IpmiSim, IpmiSim]) -> None:
    """The live BMC answers while the dead one is still awaited (order, not a time: a busy
    machine makes both slower); the dead one waits its timeout_s, then is given up."""
    dead = build(
        [
            DeviceEntry(
                name="bmc_value",
                device_id="dead",
                url=f"ipmisensor://root:pw@127.0.0.1:{free_port()}/1",
                options={**OPTIONS, "timeout_s": 2},
            )
        ]
    )
    live = build([entry(bmcs[0], "Inlet Temp")])

    async def both() -> tuple[bool, float, BaseException | None]:
        start = time.monotonic()
        dead_task = asyncio.create_task(dead.poll(1))
        await live.poll(1)
        dead_pending = not dead_task.done()
        error = None
        try:
            await dead_task
        except RuntimeError as exc:
            error = exc
        return dead_pending, time.monotonic() - start, error

    dead_pending, dead_s, error = asyncio.run(both())
    assert dead_pending, "the live BMC's answer came after the dead one was given up"
    assert dead_s > 1.9  # its timeout_s (2 s); then killed after a grace (1 s), not awaited
    assert dead_s < 30, f"the dead BMC's run was awaited {dead_s:.1f} s"
    assert error is not None
    assert "connection timeout" in str(error) or "no answer within 2 s" in str(error)


def test_cancelled_poll_kills_its_process(bmcs: tuple[IpmiSim, IpmiSim]) -> None:
    """The runtime cancels a poll at its deadline: the ipmi-sensors run goes with it."""
    sim = bmcs[1]
    plugin = build([entry(sim, "Inlet Temp")])

    async def cancel_after(seconds: float) -> None:
        task = asyncio.create_task(plugin.poll(1))
        await asyncio.sleep(seconds)
        assert _children("ipmi-sensors"), "the poll should be running ipmi-sensors"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    sim.pause()
    try:
        asyncio.run(cancel_after(0.3))
    finally:
        sim.resume()
    assert _children("ipmi-sensors") == []
    assert [r.value for r in asyncio.run(plugin.poll(1))] == [23.0]


def test_stale_sdr_cache_is_rebuilt(bmcs: tuple[IpmiSim, IpmiSim]) -> None:
    """A restarted BMC has a new SDR: the cached one is out of date, rebuilt, and read."""
    sim = bmcs[1]
    plugin = build([entry(sim, "CPU2 Temp")])
    assert [r.value for r in asyncio.run(plugin.poll(1))] == [58.0]
    sim.stop()
    sim.start()
    assert [r.value for r in asyncio.run(plugin.poll(1))] == [58.0]
    assert plugin.runs == 3  # the out-of-date run, then the one rebuilding the cache


@pytest.mark.parametrize(
    ("url", "options", "error"),
    [
        ("ipmisensor:///Fan1", {}, "needs a host"),
        ("ipmisensor://root@bmc", {}, "needs a sensor name or record ID"),
        ("ipmisensor://root@bmc/Fan1?timeout=1", {}, "takes no ?query"),
        ("ipmisensor://root:pw@bmc/Fan1", {"password_env": "HOME"}, "not both"),
        ("ipmisensor://root@bmc/Fan1", {"timeout_s": 0}, "timeout_s"),
        ("ipmisensor://root@bmc/Fan1", {"bogus": 1}, "bogus"),
        ("ipmisensor://root:a%20b@bmc/Fan1", {}, "no spaces"),
    ],
)
def test_bad_entries_are_rejected(url: str, options: dict[str, object], error: str) -> None:
    bad = DeviceEntry(name="m", device_id="n", url=url, options=options)
    with pytest.raises(ValueError, match=error.replace("?", r"\?")):
        ipmi.IpmiSensorPlugin.check(bad)


def _children(name: str) -> list[int]:
    """PIDs of this process's live children running `name`."""
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in _read(task / "children").split():
            if _read(Path(f"/proc/{pid}/comm")).strip() == name:
                pids.append(int(pid))
    return pids


def _read(path: Path) -> str:
    """A /proc file's text, or "" when its thread or process ended while being listed."""
    try:
        return path.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return ""
