"""CPU accounting of the polling benchmarks: CPU seconds of processes (from /proc) and one
measurement window over a collector, its sink, the devices it reads and the machine."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name (field 3 is index 0)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(FileNotFoundError, IndexError, ProcessLookupError):
                tree.setdefault(int(_stat(int(entry.name))[1]), []).append(int(entry.name))
    return tree


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) of `pid`, its live descendants and the
    children they reaped; 0 for a process that is gone."""
    tree = _children()
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(FileNotFoundError, IndexError, ProcessLookupError):
            fields = _stat(p)
            total += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
        todo += tree.get(p, [])
    return total / CLK_TCK


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


@dataclass
class Window:
    """CPU of the collector (one process, or several counted together), its sink, the agents
    (the devices it reads) and the machine over one measurement."""

    collector: int | list[int]
    sink: list[int]
    agents: list[int]
    t0: float = 0.0
    t1: float = 0.0
    cpu: dict[str, Any] = field(default_factory=dict)

    def _sample(self) -> dict[str, Any]:
        collectors = self.collector if isinstance(self.collector, list) else [self.collector]
        return {
            "collector": sum(cpu_seconds(p) for p in collectors),
            "sink": sum(cpu_seconds(p) for p in self.sink),
            "agents": [cpu_seconds(p) for p in self.agents],
            "machine": machine_ticks(),
        }

    def run(self, seconds: float) -> None:
        before = self._sample()
        self.t0 = time.time()
        time.sleep(seconds)
        after = self._sample()
        self.t1 = time.time()
        span = self.t1 - self.t0
        agents = [b - a for a, b in zip(before["agents"], after["agents"], strict=True)]
        busy = after["machine"][0] - before["machine"][0]
        total = after["machine"][1] - before["machine"][1]
        self.cpu = {
            "collector_cpu_s": round(after["collector"] - before["collector"], 2),
            "collector_cpu_cores": round((after["collector"] - before["collector"]) / span, 3),
            "sink_cpu_cores": round((after["sink"] - before["sink"]) / span, 3)
            if self.sink
            else None,
            "agents_cpu_cores": round(sum(agents) / span, 3),
            "agent_max_cpu_cores": round(max(agents) / span, 3),
            "machine_busy_fraction": round(busy / total, 3) if total else None,
            "window_s": round(span, 2),
        }
