"""The machine a run measured: what it is (CPU, memory, system), and what else it was doing
during the run (load average and CPU use, sampled)."""

from __future__ import annotations

import os
import platform
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


def _first_line(path: str, prefix: str = "") -> str | None:
    """The first line of a file starting with `prefix` (its text after the prefix), or None."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line[len(prefix) :].strip()
    except OSError:
        return None
    return None


def cpu_quota_cores() -> float | None:
    """The cgroup's CPU limit in cores (cgroup v2 `cpu.max`), or None when there is none."""
    quota = _first_line("/sys/fs/cgroup/cpu.max")
    if quota is None or quota.startswith("max"):
        return None
    limit, period = quota.split()
    return int(limit) / int(period)


def describe() -> dict[str, Any]:
    """What the machine is, for a result file a reader can weigh: a figure measured on 2
    cores of a shared host is not one measured on 64 idle ones."""
    model = _first_line("/proc/cpuinfo", "model name")
    os_name = _first_line("/etc/os-release", "PRETTY_NAME=")
    return {
        "cpu_model": model.lstrip(": ") if model else platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_quota_cores": cpu_quota_cores(),
        "memory_total_bytes": memory_total_bytes(),
        "kernel": platform.release(),
        "os": os_name.strip('"') if os_name else None,
        "python": platform.python_version(),
    }


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
            **describe(),
            "loadavg_before": self.before,
            "loadavg_after": self.after,
            "load1_max_during": max(self.samples, default=self.before[0]),
            "cpu_busy_fraction_during": round(self.cpu_busy, 3),
            "run_seconds": round(self.seconds, 1),
        }
