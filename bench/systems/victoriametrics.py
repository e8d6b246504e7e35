"""VictoriaMetrics (single node, Debian package), fed by Prometheus remote write."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from bench import payloads
from bench.dataset import Dataset
from bench.profiles import KEY_SELECTION, selections
from bench.systems.base import (
    IDENTITY,
    Ingest,
    Selection,
    Server,
    System,
    apparent_size,
    dpkg_version,
    run_parallel,
)
from stack.processes import free_port, wait_until
from stack.transient import STARTING

BINARY = "victoria-metrics"
REMOTE_WRITE_HEADERS = {  # what Prometheus sends with each write (protocol 1.0)
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
TIMEOUT = 600.0  # upper bound of any single wait


class VictoriaMetrics(System):
    name = "peer_victoriametrics"
    label = "VictoriaMetrics"
    timestamp_unit_us = 1000  # it keeps milliseconds only
    clients = 2
    query_layer = "/api/v1/export (JSON lines) over one kept-alive HTTP client"
    ingest_input = (
        f"Prometheus remote write (snappy protobuf, {payloads.SAMPLES_PER_WRITE:,} samples per "
        "write) to /api/v1/write"
    )

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.server: Server | None = None
        self.url = ""
        self.data_dir = self.workdir / "data"
        self.sent = 0
        self.others: list[VictoriaMetrics] = []
        self.http: httpx.Client | None = None  # the querying client's, kept between fetches

    def version(self) -> str:
        return dpkg_version(BINARY)

    def start(self) -> None:
        if shutil.which(BINARY) is None:
            raise RuntimeError(f"{BINARY} is not installed: run bench/install-peers.sh")
        shutil.rmtree(self.workdir, ignore_errors=True)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = Server(
            [
                BINARY,
                f"-storageDataPath={self.data_dir}",
                f"-httpListenAddr=127.0.0.1:{port}",
                "-retentionPeriod=100y",  # the data has past dates: the default 1 month drops it
                "-search.maxUniqueTimeseries=10000000",
                # the full count of the scale profile's week (1.2e9 samples) passes the
                # default 1e9; a query limit, nothing the timed paths reach
                "-search.maxSamplesPerQuery=100000000000",
            ],
            self.workdir / "victoria-metrics.log",
        )
        wait_until(self._healthy, 60, "VictoriaMetrics to answer", transient=STARTING)

    def server_pids(self) -> list[int]:
        return [] if self.server is None else [self.server.proc.pid]

    def _healthy(self) -> bool:
        assert self.server is not None
        self.server.check_alive()
        return httpx.get(f"{self.url}/health", timeout=2).status_code == 200

    def load(self, data: Dataset) -> Ingest:
        """Its remote-write endpoint, fed by `clients` senders posting their part's writes
        back to back, each over its own kept-alive connection, as Prometheus' shards do."""
        parts = payloads.remote_writes(data, self.clients)  # pre-built, untimed

        def post(_client: int, writes: payloads.RemoteWrites) -> None:
            with httpx.Client(timeout=TIMEOUT, headers=REMOTE_WRITE_HEADERS) as http:
                for body in writes:
                    r = http.post(f"{self.url}/api/v1/write", content=body)
                    if r.status_code != 204:
                        raise RuntimeError(f"remote write answered {r.status_code}: {r.text}")

        start = time.monotonic()
        run_parallel(post, parts, TIMEOUT)
        sent_s = time.monotonic() - start
        self.sent += data.spec.readings
        wait_until(
            lambda: self._searchable() >= self.sent,
            TIMEOUT,
            "VictoriaMetrics to make every reading queryable",
            interval=0.05,
        )
        seconds = time.monotonic() - start
        writes = sum(len(w) for w in parts)
        return Ingest(data.spec.readings, seconds, {"send_s": round(sent_s, 3), "writes": writes})

    def _searchable(self) -> int:
        """Rows in the storage's parts, once the index holds every series: counters of its
        own `/metrics`, as ClickHouse's `count()` reads its parts' row counts. Its
        `vm_rows{type="storage/..."}` include the rows still buffered (not searchable until
        its own periodic flush, as deployed), given apart as `vm_pending_rows`."""
        metrics = self._metrics()
        if metrics.get('vm_pending_rows{type="indexdb"}', 0.0):
            return 0
        rows = sum(v for k, v in metrics.items() if k.startswith('vm_rows{type="storage/'))
        return int(rows - metrics['vm_pending_rows{type="storage"}'])

    def stored(self, data: Dataset) -> int:
        """Samples a query counts over the whole data range (the full check)."""
        span = data.spec.duration_s + 60
        r = httpx.get(
            f"{self.url}/api/v1/query",
            timeout=60,
            params={
                "query": f'sum(count_over_time({{__name__=~".+"}}[{span}s]))',
                "time": str(data.spec.end_us // 1_000_000 + 30),
                "nocache": "1",
            },
        )
        r.raise_for_status()
        result = r.json()["data"]["result"]
        return int(float(result[0]["value"][1])) if result else 0

    def compact(self) -> None:
        """Flush what is buffered, then a forced merge of every partition, until done."""
        httpx.get(f"{self.url}/internal/force_flush", timeout=60).raise_for_status()
        httpx.get(f"{self.url}/internal/force_merge", timeout=TIMEOUT).raise_for_status()
        wait_until(
            lambda: self._metrics()["vm_active_force_merges"] == 0,
            TIMEOUT,
            "VictoriaMetrics' forced merge",
            interval=0.2,
        )

    def storage_bytes(self) -> int:
        """Its whole data directory (data, index, metadata)."""
        return _stable_size(self.data_dir)

    def _metrics(self) -> dict[str, float]:
        """Its own `/metrics`: series (name and labels as written) -> value."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {
            series: float(value)
            for series, value in (line.rsplit(" ", 1) for line in text.splitlines() if line)
            if not series.startswith("#")
        }

    def fetch(self, data: Dataset, selection: Selection) -> bytes:
        regex = "|".join(selection.device_names(data))
        if self.http is None:
            self.http = httpx.Client(timeout=TIMEOUT, headers=IDENTITY)
        r = self.http.get(
            f"{self.url}/api/v1/export",
            params={
                "match[]": f'{{device=~"{regex}"}}',
                "start": f"{selection.start_us / 1e6:.3f}",
                "end": f"{(selection.end_us - 1000) / 1e6:.3f}",  # inclusive end, in ms
            },
        )
        r.raise_for_status()
        return r.content

    def count(self, fetched: bytes) -> int:
        return sum(len(orjson.loads(line)["values"]) for line in fetched.splitlines() if line)

    def extra_measurements(
        self, data: Dataset, quick: bool, only: frozenset[str] | None = None
    ) -> dict[str, Any]:
        """How exactly the float values come back: VictoriaMetrics keeps a decimal mantissa
        of about 12 significant digits, fewer bits to store than float64 (which jobscope and
        PostgreSQL keep), so its bytes per reading are not for the same information.
        Not with `only` (which names jobscope's steps)."""
        if only is not None:
            return {}
        selection = next(s for s in selections(data.spec)[0] if s.name == KEY_SELECTION)
        devices = {name: i for i, name in enumerate(data.devices)}
        metrics = {name: i for i, name in enumerate(data.metrics)}
        received = exact = 0
        worst = 0.0
        for line in self.fetch(data, selection).splitlines():
            series = orjson.loads(line)
            d = devices[series["metric"]["device"]]
            m = metrics[series["metric"]["__name__"]]
            ms = data.poll_us[:, d] // 1000
            ticks = np.searchsorted(ms, np.asarray(series["timestamps"], dtype=np.int64))
            ours = data.values[ticks, d, m]
            theirs = np.asarray(series["values"], dtype=np.float64)
            received += len(theirs)
            exact += int((ours.view(np.int64) == theirs.view(np.int64)).sum())
            nonzero = ours != 0
            if nonzero.any():
                error = np.abs(theirs - ours)[nonzero] / np.abs(ours[nonzero])
                worst = max(worst, float(error.max()))
        return {
            "values_bit_exact_fraction": exact / received if received else None,
            "values_max_relative_error": worst,
            "values_checked": received,
        }

    def storage_bytes_of(self, data: Dataset) -> int:
        other = VictoriaMetrics(self.workdir.with_name(self.workdir.name + "-" + data.spec.key()))
        self.others.append(other)
        try:
            other.start()
            other.load(data)
            other.compact()
            return other.storage_bytes()
        finally:
            other.stop()

    def stop(self) -> None:
        if self.http is not None:
            self.http.close()
            self.http = None
        for other in self.others:
            other.stop()
        if self.server is not None:
            self.server.stop()
            self.server = None


def _stable_size(path: Path, settle: float = 1.0, timeout: float = 120.0) -> int:
    """The size of `path` once it stopped changing for `settle` seconds (old parts removed)."""
    deadline = time.monotonic() + timeout
    last = apparent_size(path)
    while time.monotonic() < deadline:
        time.sleep(settle)
        now = apparent_size(path)
        if now == last:
            return now
        last = now
    return last
