"""The benchmark data set: a Kwollect-like fleet of devices polled every few seconds.

Generated once from a fixed seed (vectorised numpy) and cached on disk, keyed by its
parameters, so every system of a run (and every run) loads exactly the same readings.

Readings are laid out as arrays indexed `[tick, device, metric]`: one poll of one device at
one tick yields one reading per metric, all with the poll's timestamp (microseconds). Each
device has its own poll phase within the period and a few milliseconds of jitter per poll.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

GENERATOR_VERSION = 1
START = datetime(2026, 1, 1, tzinfo=UTC)
US = 1_000_000

# The metric catalogue: (kind, Prometheus name). 100 metrics per device.
POWER = [
    "bmc_power_watt",
    "pdu_outlet_power_watt",
    "wattmetre_power_watt",
    "bmc_psu1_power_watt",
    "bmc_psu2_power_watt",
    "rapl_package0_power_watt",
    "rapl_package1_power_watt",
    "rapl_dram_power_watt",
]
VOLTAGE = [  # (name, nominal volts)
    ("bmc_voltage_12v_volt", 12.0),
    ("bmc_voltage_5v_volt", 5.0),
    ("bmc_voltage_3v3_volt", 3.3),
    ("bmc_voltage_vbat_volt", 3.0),
    ("bmc_voltage_cpu0_vcore_volt", 1.8),
    ("bmc_voltage_cpu1_vcore_volt", 1.8),
    ("bmc_voltage_dimm_ab_volt", 1.2),
    ("bmc_voltage_dimm_cd_volt", 1.2),
    ("bmc_voltage_dimm_ef_volt", 1.2),
    ("bmc_voltage_dimm_gh_volt", 1.2),
    ("bmc_psu1_input_volt", 230.0),
    ("bmc_psu2_input_volt", 230.0),
]
TEMPERATURE = (
    [
        "bmc_temp_inlet_celsius",
        "bmc_temp_exhaust_celsius",
        "bmc_temp_pch_celsius",
        "bmc_temp_cpu0_celsius",
        "bmc_temp_cpu1_celsius",
        "bmc_temp_psu1_celsius",
    ]
    + [f"bmc_temp_dimm{i}_celsius" for i in range(8)]
    + [f"node_hwmon_core{i}_temp_celsius" for i in range(16)]
)
FAN = [f"bmc_fan{i}_speed_rpm" for i in range(1, 11)]
COUNTER = (
    [f"network_ifhcinoctets_port{i}_total" for i in range(8)]
    + [f"network_ifhcoutoctets_port{i}_total" for i in range(8)]
    + [f"network_ifhcinucastpkts_port{i}_total" for i in range(8)]
    + [f"network_ifhcoutucastpkts_port{i}_total" for i in range(8)]
    + [
        "network_ifinerrors_port0_total",
        "network_ifinerrors_port1_total",
        "network_ifoutdiscards_port0_total",
        "network_ifoutdiscards_port1_total",
    ]
)
ENERGY = [  # joule counters integrated from the first power metrics
    "bmc_energy_joules_total",
    "pdu_outlet_energy_joules_total",
    "wattmetre_energy_joules_total",
    "bmc_psu1_energy_joules_total",
]
METRIC_NAMES: tuple[str, ...] = tuple(
    POWER + [n for n, _ in VOLTAGE] + TEMPERATURE + FAN + COUNTER + ENERGY
)
assert len(METRIC_NAMES) == 100 and len(set(METRIC_NAMES)) == 100


@dataclass(frozen=True)
class DatasetSpec:
    """What to generate. `integer=True` rounds every value as an SNMP agent delivers it."""

    devices: int
    duration_s: int
    period_s: int = 5
    seed: int = 42
    integer: bool = False
    jitter_ms: float = 2.0

    @property
    def metrics(self) -> int:
        return len(METRIC_NAMES)

    @property
    def ticks(self) -> int:
        return self.duration_s // self.period_s

    @property
    def readings(self) -> int:
        return self.ticks * self.devices * self.metrics

    @property
    def start_us(self) -> int:
        return int(START.timestamp()) * US

    @property
    def end_us(self) -> int:
        """Exclusive end of the data: every timestamp is in [start_us, end_us)."""
        return self.start_us + self.duration_s * US

    def key(self) -> str:
        variant = "int" if self.integer else "float"
        return (
            f"v{GENERATOR_VERSION}-d{self.devices}-m{self.metrics}-p{self.period_s}"
            f"-t{self.duration_s}-seed{self.seed}-j{self.jitter_ms:g}-{variant}"
        )

    def describe(self) -> str:
        return (
            f"{self.devices} devices x {self.metrics} metrics every {self.period_s} s for "
            f"{self.duration_s // 60} min = {self.readings:,} readings"
            f" ({'integer' if self.integer else 'float'} values)"
        )


def utc(epoch_us: int) -> datetime:
    """Microseconds since the epoch as an aware UTC datetime (exact, no float rounding)."""
    return datetime.fromtimestamp(epoch_us // US, UTC).replace(microsecond=epoch_us % US)


def device_names(n: int) -> list[str]:
    return [f"node-{i:04d}" for i in range(1, n + 1)]


@dataclass
class Dataset:
    """The readings of one spec, with the folder where payloads derived from it are cached."""

    spec: DatasetSpec
    folder: Path
    poll_us: np.ndarray  # int64 [tick, device]: poll timestamp, microseconds since the epoch
    values: np.ndarray  # float64 [tick, device, metric]

    @property
    def devices(self) -> list[str]:
        return device_names(self.spec.devices)

    @property
    def metrics(self) -> tuple[str, ...]:
        return METRIC_NAMES

    def count(self, devices: list[int], start_us: int, end_us: int, unit_us: int = 1) -> int:
        """Readings of `devices` with timestamp in [start_us, end_us), timestamps truncated
        to `unit_us` first (1000 for a system that keeps milliseconds)."""
        ts = self.poll_us[:, devices] // unit_us * unit_us
        return int(((ts >= start_us) & (ts < end_us)).sum()) * self.spec.metrics

    def head(self, seconds: int) -> Dataset:
        """The first `seconds` of the data (whole polls), with a cache folder of its own."""
        ticks = min(self.spec.ticks, -(-seconds // self.spec.period_s))
        spec = replace(self.spec, duration_s=ticks * self.spec.period_s)
        folder = self.folder / f"head-{spec.duration_s}s"
        folder.mkdir(exist_ok=True)
        return Dataset(spec, folder, self.poll_us[:ticks], self.values[:ticks])

    def poll_order(self) -> np.ndarray:
        """(tick, device) pairs in the order the polls happen: by timestamp."""
        flat = np.argsort(self.poll_us, axis=None, kind="stable")
        return np.stack(np.unravel_index(flat, self.poll_us.shape), axis=1)


def load_or_generate(spec: DatasetSpec, cache_root: Path) -> Dataset:
    """Return the data set of `spec`, generating and caching it on first use."""
    folder = cache_root / spec.key()
    arrays = folder / "arrays.npz"
    if arrays.exists():
        with np.load(arrays) as npz:
            return Dataset(spec, folder, npz["poll_us"], npz["values"])
    poll_us, values = generate(spec)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.savez(tmp / "arrays.npz", poll_us=poll_us, values=values)
    (tmp / "spec.json").write_text(json.dumps(asdict(spec), indent=2) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return Dataset(spec, folder, poll_us, values)


def generate(spec: DatasetSpec) -> tuple[np.ndarray, np.ndarray]:
    """Poll timestamps [tick, device] and values [tick, device, metric] for `spec`."""
    rng = np.random.default_rng(spec.seed)
    t, d = spec.ticks, spec.devices
    period_us = spec.period_s * US
    jitter_us = spec.jitter_ms * 1000
    margin = int(4 * jitter_us) + 1
    phase = rng.integers(margin, period_us - margin, size=d)
    jitter = np.clip(rng.normal(0, jitter_us, size=(t, d)), -3 * jitter_us, 3 * jitter_us)
    poll_us = (
        spec.start_us
        + np.arange(t)[:, None] * period_us
        + phase[None, :]
        + np.rint(jitter).astype(np.int64)
    )

    def walk(base: np.ndarray, step: float, noise: float, k: int) -> np.ndarray:
        """A random walk around per-device, per-metric `base` plus measurement noise."""
        steps = rng.normal(0, step, size=(t, d, k)).cumsum(axis=0)
        return base[None] + steps + rng.normal(0, noise, size=(t, d, k))

    power = np.maximum(walk(rng.uniform(80, 400, (d, len(POWER))), 2.0, 1.5, len(POWER)), 5.0)
    nominal = np.array([v for _, v in VOLTAGE])
    voltage = nominal[None, None, :] * (
        1 + walk(np.zeros((d, len(VOLTAGE))), 0.0005, 0.004, len(VOLTAGE)).clip(-0.05, 0.05)
    )
    temperature = walk(rng.uniform(25, 65, (d, len(TEMPERATURE))), 0.15, 0.4, len(TEMPERATURE))
    fan = np.maximum(walk(rng.uniform(3000, 12000, (d, len(FAN))), 25.0, 60.0, len(FAN)), 0.0)
    # Counters: non-negative increments per poll at a per-device rate, from a random origin.
    rate = rng.lognormal(mean=np.log(1e6), sigma=2.0, size=(d, len(COUNTER))) * spec.period_s
    increments = np.floor(rate[None] * rng.gamma(4.0, 0.25, size=(t, d, len(COUNTER))))
    origin = np.floor(rng.uniform(0, 1e12, (d, len(COUNTER))))
    counter = origin[None] + increments.cumsum(axis=0)
    energy = rng.uniform(1e6, 1e9, (d, len(ENERGY)))[None] + (
        power[:, :, : len(ENERGY)] * spec.period_s
    ).cumsum(axis=0)
    values = np.concatenate([power, voltage, temperature, fan, counter, energy], axis=2)
    if spec.integer:
        voltage_slice = slice(len(POWER), len(POWER) + len(VOLTAGE))
        values[:, :, voltage_slice] *= 1000  # SNMP agents report millivolts
        values = np.rint(values)
    return poll_us, np.ascontiguousarray(values, dtype=np.float64)
