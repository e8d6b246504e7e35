"""The IPMI polling benchmark's devices file (bench/polling/ipmi.py), read by the producer's
own config loader and run by its runtime against real simulated BMCs (OpenIPMI's ipmi_sim,
read by FreeIPMI's ipmi-sensors): every readable sensor of each BMC, all of a BMC's in one
ipmi-sensors run per poll, with the values the simulator serves."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.polling import ipmi as bench_ipmi
from producers.config import load_devices
from producers.plugins.ipmisensor import plugin as ipmi
from producers.runtime import build_groups
from stack.simulators.ipmi import IPMI_SIM, IpmiSim


@pytest.fixture
def bmcs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[IpmiSim]]:
    for tool, package in ((IPMI_SIM, "openipmi"), (ipmi.IPMI_SENSORS, "freeipmi-tools")):
        assert Path(tool).exists(), f"{tool} is missing: apt-get install {package}"
    monkeypatch.setattr(ipmi, "SDR_CACHE_DIR", tmp_path / "sdr-cache")
    monkeypatch.setenv(bench_ipmi.PASSWORD_ENV, bench_ipmi.PASSWORD)
    sims = bench_ipmi._start_sims(tmp_path / "bmcs", 2)
    try:
        yield sims
    finally:
        bench_ipmi._stop_sims(sims)


def test_each_bmc_read_whole_in_one_run(bmcs: list[IpmiSim], tmp_path: Path) -> None:
    devices = bench_ipmi.write_devices_file(tmp_path / "devices.yaml", bmcs)
    entries = load_devices(devices)
    assert all(e.update_every == bench_ipmi.PERIOD_MS for e in entries)
    plugins = [member for group in build_groups(entries) for member in group.members]

    assert len(plugins) == len(bmcs)
    for i, plugin in enumerate(plugins):
        assert isinstance(plugin, ipmi.IpmiSensorPlugin)
        readings = asyncio.run(plugin.poll(1_795_288_158_123_456))
        assert plugin.runs == 1
        assert {r.device_id for r in readings} == {f"{bench_ipmi.PREFIX}{i}"}
        assert sorted((r.labels["sensor"], r.value) for r in readings) == sorted(
            (s.name, s.value) for s in bench_ipmi.SENSORS_READ
        )
