"""`tester://`: a simulated device whose values any test can recompute.

Like DCDB's tester plugin it costs nothing to poll, so it drives demos and benchmarks,
and its failure options stand in for dead, hanging and flapping devices.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from kafka.reading import Reading
from producers.plugins.base import Plugin, url_options

if TYPE_CHECKING:
    from producers.entry import DeviceEntry

_WAVE_PERIOD_US = 60_000_000
"""Values follow a sine wave of one minute around a per-metric base."""
_HANG_FILE_CHECK_S = 0.02


class TesterOptions(BaseModel):
    """The query string of a `tester://` URL."""

    model_config = ConfigDict(extra="forbid")

    metrics: int = Field(1, ge=1, description="readings per poll")
    hang: bool = Field(False, description="the poll never returns")
    hang_file: Path | None = Field(None, description="the poll waits while this file exists")
    fail: bool = Field(False, description="the poll raises")
    counter: bool = Field(
        False,
        description="the value is a counter: the integral of the usual wave since the epoch, "
        "in units per second times seconds (a byte counter whose rate is the wave)",
    )


def metric_ids(name: str, metrics: int) -> list[str]:
    """`name` for one metric; `name_0`..`name_{N-1}` zero-padded to one width otherwise."""
    if metrics == 1:
        return [name]
    width = len(str(metrics - 1))
    return [f"{name}_{i:0{width}d}" for i in range(metrics)]


def tester_value(device_id: str, metric_id: str, timestamp_us: int) -> float:
    """The value the tester reports for this metric of this device at this instant."""
    return _value_at(*_shape(device_id, metric_id), timestamp_us)


def tester_counter(device_id: str, metric_id: str, timestamp_us: int) -> float:
    """The value of a `counter=1` entry: the integral of `tester_value` from the epoch, so
    its increase between two instants divided by their distance is the wave's mean rate."""
    return _integral_at(*_shape(device_id, metric_id), timestamp_us)


# Tests import this function; its name must not make pytest collect it as a test.
tester_value.__test__ = False  # type: ignore[attr-defined]
tester_counter.__test__ = False  # type: ignore[attr-defined]


@lru_cache(maxsize=65536)
def _shape(device_id: str, metric_id: str) -> tuple[float, float]:
    """A stable (base, phase) per device and metric: base in [100, 200), phase in [0, 2pi)."""
    digest = hashlib.blake2b(f"{device_id}\0{metric_id}".encode(), digest_size=8).digest()
    number = int.from_bytes(digest, "big")
    base = 100 + (number % 100_000) / 1000
    phase = (number >> 32) % 360_000 / 360_000 * 2 * math.pi
    return base, phase


def _value_at(base: float, phase: float, timestamp_us: int) -> float:
    return base + 10 * math.sin(
        2 * math.pi * (timestamp_us % _WAVE_PERIOD_US) / _WAVE_PERIOD_US + phase
    )


def _integral_at(base: float, phase: float, timestamp_us: int) -> float:
    """base x t - (10 P / 2pi) cos(2pi t / P + phase), shifted so it starts at 0 at the epoch."""
    period_s = _WAVE_PERIOD_US / 1e6
    amplitude = 10 * period_s / (2 * math.pi)
    angle = 2 * math.pi * (timestamp_us % _WAVE_PERIOD_US) / _WAVE_PERIOD_US + phase
    return base * timestamp_us / 1e6 - amplitude * math.cos(angle) + amplitude * math.cos(phase)


class TesterPlugin(Plugin):
    scheme = "tester"

    def __init__(self, entry: DeviceEntry, options: TesterOptions) -> None:
        self.entries = (entry,)
        self.device_id = entry.device_id
        self.labels = dict(entry.labels)
        self.options = options
        self.scale = entry.scale_factor or 1.0
        self._metrics = [
            (metric_id, *_shape(entry.device_id, metric_id))
            for metric_id in metric_ids(entry.name, options.metrics)
        ]

    @classmethod
    def check(cls, entry: DeviceEntry) -> None:
        cls._options(entry)

    @classmethod
    def build(cls, entries: Sequence[DeviceEntry]) -> list[Self]:
        """One instance per entry: a hanging entry never holds up the others."""
        return [cls(entry, cls._options(entry)) for entry in entries]

    @staticmethod
    def _options(entry: DeviceEntry) -> TesterOptions:
        parts = urlsplit(entry.url)
        if parts.netloc or parts.path:
            raise ValueError("tester:// takes no host or path, only ?options")
        return url_options(entry.url, TesterOptions)

    async def poll(self, timestamp_us: int) -> list[Reading]:
        if self.options.fail:
            raise RuntimeError("tester: failing as configured (fail=1)")
        if self.options.hang:
            await asyncio.Future()  # never resolves, until the runtime cancels the poll
        hang_file = self.options.hang_file
        while hang_file is not None and hang_file.exists():
            await asyncio.sleep(_HANG_FILE_CHECK_S)
        value = _integral_at if self.options.counter else _value_at
        return [
            Reading(
                timestamp_us,
                self.device_id,
                metric_id,
                value(base, phase, timestamp_us) * self.scale,
                self.labels,
            )
            for metric_id, base, phase in self._metrics
        ]
