"""The contract every benchmarked system implements, and small helpers they share."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.dataset import Dataset
from bench.polling.cpu import cpu_seconds


@dataclass(frozen=True)
class Selection:
    """A query: every metric of some devices over a time window [start_us, end_us)."""

    name: str
    devices: tuple[int, ...]  # device indexes in the data set
    start_us: int
    end_us: int

    def device_names(self, data: Dataset) -> list[str]:
        names = data.devices
        return [names[i] for i in self.devices]


@dataclass
class Ingest:
    """How long loading took: from the first byte sent until every reading is queryable."""

    readings: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def readings_per_s(self) -> float:
        return self.readings / self.seconds


class System(ABC):
    """One system under test. `start`, then the same phases for every system, in this order
    (bench/runner.py `ingest_phases`): `load` then `settle` (one CPU window, `load` timed),
    `stored` (untimed check), `compact` (timed apart), `storage_bytes`; then `fetch` any
    number of times; `stop` always (it must be safe after a failed or partial `start`)."""

    name: str  # key prefix in bench-results.json
    label: str  # shown in tables and plots
    timestamp_unit_us: int = 1  # 1000 for a system that keeps milliseconds only
    query_layer: str = ""  # how `fetch` reaches the data, shown beside the query figures
    ingest_input: str = ""  # what `load` sends and how, shown beside the ingest figures

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir.resolve()

    @abstractmethod
    def version(self) -> str: ...

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def load(self, data: Dataset) -> Ingest:
        """Phase 1, timed: from the first byte sent until every reading is queryable, told
        by one cheap check of the system's own (what its engine already counts, never a
        scan of the data). The servers' CPU over it is the ingest's."""

    def settle(self, data: Dataset) -> dict[str, Any]:
        """What the deployed system does for the loaded readings once they are queryable
        (jobscope: its rollups), run at once: inside the ingest's CPU window, outside its
        time. Returns its own figures."""
        return {}

    @abstractmethod
    def stored(self, data: Dataset) -> int:
        """Readings stored, counted in full (untimed, after the ingest's CPU window): the
        check that the cheap check of `load` told the truth."""

    @abstractmethod
    def compact(self) -> None:
        """Phase 2, timed apart: the system's compaction (merge, OPTIMIZE, VACUUM) of
        everything stored, as its background work would eventually do it."""

    @abstractmethod
    def storage_bytes(self) -> int:
        """Bytes on disk of everything stored so far (every table), after `compact`."""

    def storage_by_table(self) -> dict[str, int]:
        """The same, per table, where the system has several; empty otherwise."""
        return {}

    @abstractmethod
    def fetch(self, data: Dataset, selection: Selection) -> Any:
        """Retrieve every value of `selection` completely at the system's user layer (what
        `query_layer` says), as its client would, the client kept between calls (timed)."""

    @abstractmethod
    def count(self, fetched: Any) -> int:
        """The number of values in a `fetch` result (untimed, to check it is complete)."""

    def prepare_fetch(
        self, data: Dataset, selection: Selection, quick: bool = False
    ) -> dict[str, Any]:
        """Untimed, before a shape's fetches: what the system's client settles on for it
        (jobscope: the API's fastest format for the shape; `quick`: among fewer). Its figures
        go with the shape's."""
        return {}

    def query_layers(self) -> dict[str, Callable[[Dataset, Selection], Any]]:
        """Other layers the same shapes are timed at, beside the user's (`fetch`), each
        result counted by `count` (jobscope: straight from ClickHouse, the API bypassed)."""
        return {}

    def storage_bytes_of(self, data: Dataset) -> int:
        """Load `data` into a separate, fresh store of the same kind, settle and compact it
        as the main one, and return its size (every table)."""
        raise NotImplementedError

    def warm(self, data: Dataset) -> None:  # noqa: B027 (most systems have nothing to warm)
        """What a running deployment has done before the load is timed."""

    def server_pids(self) -> list[int]:
        """The processes that ingest and store (with their children): the load's CPU is
        theirs (`ingest_cpu_us_per_reading`)."""
        return []

    def servers_cpu_s(self) -> float:
        """CPU seconds the server processes have used so far."""
        return sum(cpu_seconds(pid) for pid in self.server_pids())

    def extra_measurements(
        self, data: Dataset, quick: bool, only: frozenset[str] | None = None
    ) -> dict[str, Any]:
        """System-specific figures beyond the common ones (jobscope: drain, freshness...);
        `only`: just these of them (`python -m bench --only`)."""
        return {}

    @abstractmethod
    def stop(self) -> None: ...


T = TypeVar("T")
# HTTP clients' headers for query answers: on loopback compressing costs more than it saves.
IDENTITY = {"Accept-Encoding": "identity"}


def run_parallel(work: Callable[[int, T], None], items: Sequence[T], timeout: float) -> None:
    """Run `work(i, items[i])` for every item, each in a thread of its own, as parallel clients
    do; wait for all of them; raise the first exception one of them raised."""
    errors: list[BaseException] = []

    def run(i: int, item: T) -> None:
        try:
            work(i, item)
        except BaseException as exc:  # re-raised in the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, x), daemon=True) for i, x in enumerate(items)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for parallel clients")


def dpkg_version(package: str) -> str:
    """The installed version of a Debian package, or "unknown"."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "unknown"


def apparent_size(path: Path) -> int:
    """Sum of file sizes under `path` (what `du -sb` prints)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # removed by a merge meanwhile
                total += os.lstat(os.path.join(root, name)).st_size
    return total


class Server:
    """A server process started by the bench (own session, output to a log file)."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            tail = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.proc.args[0]} exited ({self.proc.returncode}):\n{tail}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the process group, SIGKILL if it has not exited after `timeout`."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
