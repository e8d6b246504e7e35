"""IPMI polling cost: jobscope's producer (`python -m producers`, as `make up` runs it)
reading simulated BMCs through the `ipmisensor://` plugin and publishing to Kafka, measured
as readings stored per second and producer CPU per reading.

BMCS simulated BMCs (`stack/simulators/ipmi.py`, OpenIPMI's ipmi_sim, 12 readable sensors
each) are polled every PERIOD_MS, all the sensors of a BMC in one `ipmi-sensors` run, by one
producer publishing to the stack's Kafka, whose readings ClickHouse consumes. Readings =
rows of `metrics` with a timestamp in the window (counted once the producer has stored a
tick after it); CPU = utime + stime of the producer process and its children (the
`ipmi-sensors` runs) over the window (bench/polling/cpu.py); Kafka's and ClickHouse's CPU
and the simulators' are printed beside, never counted.

No peer: Kwollect's IPMI path (kwollector's `process_ipmisensor_host`) runs `ipmi-sensors
--sdr-cache-recreate -D LAN_2_0 -h HOST` with neither a port (623 only: one loopback address
per BMC) nor FreeIPMI's `-W opensesspriv`, without which ipmi-sensors cannot open a session
with ipmi_sim; giving it that would take a change of the machine's FreeIPMI configuration.
"""

from __future__ import annotations

import logging
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.polling.cpu import Window
from bench.polling.producer import PollingStack, producer
from stack.processes import free_port, wait_until
from stack.simulators.ipmi import SENSORS, IpmiSim

log = logging.getLogger("bench.ipmi")

BMCS = {True: 10, False: 40}  # keyed by quick (True) or full run (False)
PERIOD_MS = 1000
USER, PASSWORD = "root", "calvin"
PASSWORD_ENV = "JOBSCOPE_BENCH_IPMI_PASSWORD"
WARMUP_S = {True: 2, False: 10}
MEASURE_S = {True: 6, False: 60}
START_TIMEOUT_S = 60.0
CATCH_UP_S = 20.0
PREFIX = "bench-bmc-"
NO_PEER = (
    "kwollector's IPMI path runs ipmi-sensors without a port (623 only) and without "
    "-W opensesspriv, which the simulated BMCs (ipmi_sim) need"
)
SENSORS_READ = [sensor for sensor in SENSORS if sensor.value is not None]


def write_devices_file(path: Path, sims: list[IpmiSim]) -> Path:
    """One entry per readable sensor of each BMC, by record ID, every PERIOD_MS."""
    options = f"{{password_env: {PASSWORD_ENV}, timeout_s: 5, workarounds: [opensesspriv]}}"
    lines = [
        f"- {{name: bmc_sensor_value, device_id: {PREFIX}{i}, "
        f"url: 'ipmisensor://{USER}@127.0.0.1:{sim.port}/{sensor.record_id}', "
        f"update_every: {PERIOD_MS}, labels: {{sensor: '{sensor.name}'}}, options: {options}}}"
        for i, sim in enumerate(sims)
        for sensor in SENSORS_READ
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _start_sims(work: Path, count: int) -> list[IpmiSim]:
    sims = [IpmiSim(work / f"bmc-{i}", free_port(), USER, PASSWORD) for i in range(count)]
    try:
        for sim in sims:
            sim.start()
    except BaseException:
        _stop_sims(sims)
        raise
    return sims


def _stop_sims(sims: list[IpmiSim]) -> None:
    for sim in sims:
        sim.stop()


def measure(state_dir: Path, quick: bool, stack: PollingStack) -> dict[str, Any]:
    """The producer polling BMCS[quick] BMCs for MEASURE_S[quick] s after WARMUP_S[quick],
    publishing to the Kafka of `stack`, consumed by its ClickHouse; keys for the top level of
    bench-results.json."""
    work = state_dir.resolve() / "ipmi"
    shutil.rmtree(work, ignore_errors=True)
    count = BMCS[quick]
    with ThreadPoolExecutor(1) as pool:  # the BMCs start while Kafka and ClickHouse do
        starting = pool.submit(_start_sims, work / "bmcs", count)
        try:
            stack.need("kafka", "clickhouse")
            figures = _measure(stack, starting.result(), work, quick)
        finally:
            if starting.exception() is None:  # waits until they started
                _stop_sims(starting.result())
    per_core = figures["readings"] / figures["collector_cpu_s"]
    out: dict[str, Any] = {
        "ipmi_sensors_per_core_s": per_core,
        "ipmi_producer_cpu_us_per_reading": 1e6 / per_core,
        "ipmi_readings_per_s": figures["readings_per_s"],
        "ipmi_completeness": figures["completeness"],
        "ipmi_bmcs": float(count),
        "ipmi_sensors_per_poll": float(len(SENSORS_READ)),
        "ipmi_polling": {
            **figures,
            "bmcs": count,
            "period_ms": PERIOD_MS,
            "warmup_s": WARMUP_S[quick],
            "measure_s": MEASURE_S[quick],
            "peer": None,
            "no_peer": NO_PEER,
        },
    }
    log.info(
        "ipmi: %s readings/core-s (%.2f µs each; %.0f readings/s stored, completeness %.3f)",
        f"{per_core:,.0f}",
        1e6 / per_core,
        figures["readings_per_s"],
        figures["completeness"],
    )
    return out


def _measure(stack: PollingStack, sims: list[IpmiSim], work: Path, quick: bool) -> dict[str, Any]:
    from stack import services

    settings = stack.settings
    reader = services.clickhouse_client(settings, "reader")

    def stored(since_us: int = 0, until_us: int = 2**62) -> int:
        return int(
            reader.command(
                "SELECT count() FROM metrics WHERE startsWith(device_id, {p:String}) "
                "AND toUnixTimestamp64Micro(timestamp) >= {s:Int64} "
                "AND toUnixTimestamp64Micro(timestamp) < {u:Int64}",
                parameters={"p": PREFIX, "s": since_us, "u": until_us},
            )
        )

    def devices_since(since_us: int) -> int:
        return int(
            reader.command(
                "SELECT uniqExact(device_id) FROM metrics WHERE startsWith(device_id, {p:String}) "
                "AND toUnixTimestamp64Micro(timestamp) >= {s:Int64}",
                parameters={"p": PREFIX, "s": since_us},
            )
        )

    devices = write_devices_file(work / "devices.yaml", sims)
    with producer(
        stack,
        devices,
        lambda: stored() > 0,
        "the first IPMI readings stored",
        START_TIMEOUT_S,
        **{PASSWORD_ENV: PASSWORD},
    ) as proc:
        pid = proc.pid()
        assert pid is not None
        time.sleep(WARMUP_S[quick])
        sink = [
            p for name in ("kafka", "clickhouse") if (p := services.process(settings, name).pid())
        ]
        window = Window(pid, sink, [sim.pid or 0 for sim in sims])
        window.run(MEASURE_S[quick])
        t0_us, t1_us = int(window.t0 * 1e6), int(window.t1 * 1e6)
        # every BMC's readings of the window are stored once one of a later tick is
        caught_up = time.monotonic() + CATCH_UP_S
        wait_until(
            lambda: devices_since(t1_us) >= len(sims) or time.monotonic() > caught_up,
            CATCH_UP_S + 30,
            "readings of every BMC after the window",
        )
    readings = stored(t0_us, t1_us)
    span = window.cpu["window_s"]
    period_us = PERIOD_MS * 1000
    ticks = -(-t1_us // period_us) - -(-t0_us // period_us)  # tick times in [t0, t1)
    asked = len(sims) * len(SENSORS_READ) * ticks
    return {
        "readings": readings,
        "readings_per_s": readings / span,
        "completeness": round(readings / asked, 4),
        **window.cpu,
    }
