"""The two sizes of the benchmark and the query shapes measured on every system."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.dataset import DatasetSpec
from bench.systems.base import Selection

US = 1_000_000


@dataclass(frozen=True)
class Profile:
    name: str
    devices: int
    duration_s: int
    repeats: int  # runs of each query; the median is reported

    def spec(self, integer: bool = False) -> DatasetSpec:
        return DatasetSpec(devices=self.devices, duration_s=self.duration_s, integer=integer)


FULL = Profile("full", devices=1000, duration_s=20 * 60, repeats=3)
QUICK = Profile("quick", devices=200, duration_s=10 * 60, repeats=2)

DEVICE_COUNTS = (1, 10, 100)  # Kwollect Fig. 5b: 10-minute window
WINDOWS_S = (60, 300, 600)  # Kwollect Fig. 5c: 10 devices (plus the whole range)
KEY_SELECTION = "devices=100,window=10min"  # the one named in the results' keys


def _window(spec: DatasetSpec, seconds: int) -> tuple[int, int]:
    """A window of `seconds` in the middle of the data, on whole seconds."""
    seconds = min(seconds, spec.duration_s)
    start = spec.start_us + (spec.duration_s - seconds) // 2 * US
    return start, start + seconds * US


def _devices(spec: DatasetSpec, n: int) -> tuple[int, ...]:
    """`n` devices spread evenly over the fleet (a job's nodes are rarely the first ones)."""
    return tuple(int(i) for i in np.linspace(0, spec.devices, n, endpoint=False))


def _minutes(seconds: int) -> str:
    return f"{seconds // 60}min"


def selections(spec: DatasetSpec) -> tuple[list[Selection], list[Selection]]:
    """(by number of devices, by window length) query shapes for data of `spec`."""
    by_devices = [
        Selection(f"devices={n},window=10min", _devices(spec, n), *_window(spec, 600))
        for n in DEVICE_COUNTS
    ]
    by_window = [
        Selection(f"devices=10,window={_minutes(w)}", _devices(spec, 10), *_window(spec, w))
        for w in WINDOWS_S
    ]
    if spec.duration_s not in WINDOWS_S:
        by_window.append(
            Selection("devices=10,window=all", _devices(spec, 10), spec.start_us, spec.end_us)
        )
    return by_devices, by_window
