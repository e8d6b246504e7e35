"""What else the machine was doing during the run: load average and CPU use, sampled."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def memory_total_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass
class LoadSampler:
    """Samples the 1-minute load average every `interval` seconds in a background thread."""

    interval: float = 2.0
    samples: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> LoadSampler:
        self.before = loadavg()
        self.cpu_before = _cpu_times()
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(loadavg()[0])

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.after = loadavg()
        busy0, total0 = self.cpu_before
        busy1, total1 = _cpu_times()
        self.cpu_busy = (busy1 - busy0) / max(total1 - total0, 1)
        self.seconds = time.monotonic() - self.started

    def summary(self) -> dict[str, Any]:
        return {
            "cpu_count": os.cpu_count(),
            "memory_total_bytes": memory_total_bytes(),
            "loadavg_before": self.before,
            "loadavg_after": self.after,
            "load1_max_during": max(self.samples, default=self.before[0]),
            "cpu_busy_fraction_during": round(self.cpu_busy, 3),
            "run_seconds": round(self.seconds, 1),
        }
