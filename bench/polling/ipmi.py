"""IPMI polling cost: sensors read per CPU-second through the `ipmisensor://` plugin.

Several simulated BMCs (`stack/simulators/ipmi.py`, 13 readable sensors each) are polled
back to back, all at once, for a fixed time; the CPU of this process and of its children
(the `ipmi-sensors` runs, not the simulators, which are reaped only after the measurement)
is divided among the sensors read.
"""

from __future__ import annotations

import asyncio
import resource
import statistics
import time
from pathlib import Path

from producers.entry import DeviceEntry
from producers.plugins.ipmisensor.plugin import IpmiSensorPlugin
from stack.processes import free_port
from stack.simulators.ipmi import SENSORS, IpmiSim

BMCS = 4
USER, PASSWORD = "root", "calvin"
OPTIONS = {"workarounds": ["opensesspriv"], "timeout_s": 5}


def _cpu_s() -> float:
    """User + system CPU of this process and of its reaped children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _plugin(port: int) -> IpmiSensorPlugin:
    entries = [
        DeviceEntry(
            name="bmc_sensor",
            device_id=f"bmc-{port}",
            url=f"ipmisensor://{USER}:{PASSWORD}@127.0.0.1:{port}/{sensor.record_id}",
            labels={"sensor": sensor.name},
            options=OPTIONS,
        )
        for sensor in SENSORS
        if sensor.value is not None
    ]
    (plugin,) = IpmiSensorPlugin.build(entries)
    return plugin


async def _poll_for(plugins: list[IpmiSensorPlugin], seconds: float) -> tuple[int, list[float]]:
    """Poll every plugin back to back for `seconds`; (sensors read, wall time of each poll)."""
    walls: list[float] = []
    sensors = 0
    end = time.monotonic() + seconds

    async def loop(plugin: IpmiSensorPlugin) -> None:
        nonlocal sensors
        while time.monotonic() < end:
            start = time.monotonic()
            readings = await plugin.poll(time.time_ns() // 1000)
            walls.append(time.monotonic() - start)
            if len(readings) != len(plugin.entries):
                raise RuntimeError(f"{len(readings)} of {len(plugin.entries)} sensors read")
            sensors += len(readings)

    await asyncio.gather(*(loop(plugin) for plugin in plugins))
    return sensors, walls


def measure(state_dir: Path, quick: bool) -> dict[str, float]:
    """Poll `BMCS` simulated BMCs for 10 s (quick) or 60 s; sensors per CPU-second and the
    wall time per poll (p50, p99)."""
    sims = [
        IpmiSim(state_dir / "ipmi" / f"bmc-{i}", free_port(), USER, PASSWORD) for i in range(BMCS)
    ]
    try:
        for sim in sims:
            sim.start()
        plugins = [_plugin(sim.port) for sim in sims]
        for plugin in plugins:  # warm up: fills the SDR caches
            asyncio.run(plugin.poll(0))
        cpu = _cpu_s()
        sensors, walls = asyncio.run(_poll_for(plugins, 10.0 if quick else 60.0))
        cpu = _cpu_s() - cpu
    finally:
        for sim in sims:
            sim.stop()
    walls.sort()
    return {
        "ipmi_sensors_per_core_s": sensors / cpu,
        "ipmi_poll_wall_p50_ms": statistics.median(walls) * 1000,
        "ipmi_poll_wall_p99_ms": walls[min(len(walls) - 1, int(len(walls) * 0.99))] * 1000,
        "ipmi_bmcs": float(BMCS),
        "ipmi_sensors_per_poll": float(len(plugins[0].entries)),
    }
