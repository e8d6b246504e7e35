"""The local ClickHouse server's health for Prometheus (`GET /metrics` on its HTTP port, no
password: counts and sizes, no statement, user or row).

Counted as they happen: queries by outcome, and refusals by reason (the server's own guards:
the SQL policy, read-only users, authentication, concurrency and size limits). Read when
scraped: engine and client connections in use, and, at most once per `metrics_cache_s` (so a
scrape never adds load to queries), the Kafka tables' consumer lag, each refreshable view's
refresh, the data directory's size, the disk's free space and the days it can still hold.

Days left: free bytes over the data directory's net growth per day, measured by this process
over the last day (at least `growth_min_window_s` of watching; before that, no estimate).
Net growth counts what merges and TTL removed: with a TTL that holds the data steady it is
about 0, and the disk never fills (+Inf days).

The same figures, and the server's start time, are written to the table `server_health`
every `health_record_interval_s` (HealthRecorder): what the alert rules watch, for SQL readers
and the Devices dashboard, without a Prometheus.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kafka.topics import consumer_lag
from stack.clickhouse_server import errors
from stack.clickhouse_server.config import ServerSettings
from stack.clickhouse_server.engine import Engine, EngineConnection

log = logging.getLogger("clickhouse.metrics")
PREFIX = "jobscope_clickhouse_"
DAY_S = 86400.0
REFUSALS = {
    errors.ACCESS_DENIED: "access_denied",
    errors.READONLY: "readonly",
    errors.AUTHENTICATION_FAILED: "authentication",
    errors.TOO_MANY_SIMULTANEOUS_QUERIES: "too_many_queries",
    errors.SESSION_IS_LOCKED: "session_locked",
    errors.LIMIT_EXCEEDED: "too_large",
    errors.SERVER_SHUTTING_DOWN: "shutting_down",
}
"""The exception codes of a refusal (not a failure of the statement itself), by reason."""
_SETTING = re.compile(r"(kafka_broker_list|kafka_topic_list|kafka_group_name) = '([^']*)'")

disable_created_metrics()


def _gauge(name: str, documentation: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, documentation, labels=list(labels))


def directory_bytes(path: Path) -> int:
    """Bytes of the files under `path` (links not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:  # a part merged away meanwhile
                continue
    return total


class Growth:
    """The data directory's size over the last day, one sample a minute at most."""

    def __init__(self, min_window_s: float) -> None:
        self.min_window_s = min_window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, at: float, size: int) -> None:
        if not self._samples or at - self._samples[-1][0] >= min(60.0, self.min_window_s):
            self._samples.append((at, size))
        while len(self._samples) > 2 and at - self._samples[1][0] >= DAY_S:
            self._samples.popleft()

    def per_day(self, at: float, size: int) -> float | None:
        """Bytes per day, or None while watched for less than min_window_s."""
        if not self._samples or at - self._samples[0][0] < self.min_window_s:
            return None
        began, then = self._samples[0]
        return (size - then) * DAY_S / (at - began)


class _Expensive:
    """The figures that cost engine queries, Kafka requests or a directory walk."""

    def __init__(self, settings: ServerSettings, engine: Engine) -> None:
        self._settings = settings
        self._engine = engine
        self._growth = Growth(settings.growth_min_window_s)

    def read(self) -> list[Metric]:
        found: list[Metric] = []
        for part in (self._disk, self._write_failures, self._rollups, self._lag):
            try:
                found.extend(part())
            except Exception as exc:  # a figure that fails is left out; the others are served
                log.warning("metrics: %s failed: %s", part.__name__, exc)
        return found

    def _query(self, sql: str) -> list[list[str]]:
        with self._engine.control() as conn:
            return _rows(conn, sql)

    def _disk(self) -> list[Metric]:
        data_dir = self._settings.data_dir
        now, size = time.time(), directory_bytes(data_dir)
        free = shutil.disk_usage(data_dir).free
        self._growth.add(now, size)
        used = _gauge("data_bytes", "bytes of the engine's data directory")
        used.add_metric([], size)
        available = _gauge("disk_free_bytes", "free bytes of the data directory's file system")
        available.add_metric([], free)
        found: list[Metric] = [used, available]
        per_day = self._growth.per_day(now, size)
        if per_day is not None:
            growth = _gauge("data_growth_bytes_per_day", "net growth of the data, last day")
            growth.add_metric([], per_day)
            days = _gauge("disk_days_left", "days the free space holds at that growth")
            days.add_metric([], free / per_day if per_day > 0 else float("inf"))
            found += [growth, days]
        return found

    def _write_failures(self) -> list[Metric]:
        """The engine's refused file writes since it started. chdb 4.1.7 counts a write that
        fails (ENOSPC) and carries on, committing the part it was writing with empty files
        (tests/clickhouse/test_engine_write_errors.py): any increase means stored readings
        were lost, which no query reports."""
        rows = self._query(
            "SELECT value FROM system.events "
            "WHERE event = 'WriteBufferFromFileDescriptorWriteFailed'"
        )
        failed = CounterMetricFamily(
            PREFIX + "file_write_failures",
            "file writes the engine saw fail (a full disk): each may have lost stored data",
        )
        failed.add_metric([], int(rows[0][0]) if rows else 0)
        return [failed]

    def _rollups(self) -> list[Metric]:
        rows = self._query(
            "SELECT database || '.' || view, toUnixTimestamp(last_success_time), "
            "toUnixTimestamp(next_refresh_time), exception != '' FROM system.view_refreshes"
        )
        now = time.time()
        age = _gauge(
            "rollup_refresh_age_seconds", "since a view's last successful refresh", ["view"]
        )
        overdue = _gauge(
            "rollup_refresh_overdue_seconds",
            "how long past its planned time a view's next refresh is (0: on time)",
            ["view"],
        )
        failed = _gauge("rollup_refresh_failed", "1 when a view's last refresh failed", ["view"])
        for view, success, planned, error in rows:
            if int(success) > 0:
                age.add_metric([view], now - int(success))
            if int(planned) > 0:
                overdue.add_metric([view], max(0.0, now - int(planned)))
            failed.add_metric([view], int(error))
        return [age, overdue, failed]

    def _lag(self) -> list[Metric]:
        rows = self._query(
            "SELECT database || '.' || name, engine_full FROM system.tables WHERE engine = 'Kafka'"
        )
        security = self._settings.kafka.kafka_security()
        lag = _gauge(
            "kafka_consumer_lag",
            "messages of its topics a Kafka table's consumer group has not committed",
            ["table", "group"],
        )
        for table, engine_full in rows:
            found = dict(_SETTING.findall(engine_full.replace("\\'", "'")))
            group, topic_list = found.get("kafka_group_name"), found.get("kafka_topic_list", "")
            if not group or "kafka_broker_list" not in found:
                continue
            total = sum(
                consumer_lag(found["kafka_broker_list"], group, topic, 5.0, security)
                for topic in topic_list.split(",")
                if topic
            )
            lag.add_metric([table, group], total)
        return [lag]


def _rows(conn: EngineConnection, sql: str) -> list[list[str]]:
    text = conn.run(sql, None, "TSVRaw").decode()
    return [line.split("\t") for line in text.splitlines()]


class _Gauges(Collector):
    def __init__(
        self,
        settings: ServerSettings,
        engine: Engine,
        open_connections: Callable[[], int],
    ) -> None:
        self._engine = engine
        self._open_connections = open_connections
        self._cache_s = settings.metrics_cache_s
        self._expensive = _Expensive(settings, engine)
        self._lock = threading.Lock()
        self._last: tuple[float, list[Metric]] = (-float("inf"), [])

    def collect(self) -> Iterable[Metric]:
        engine = _gauge("engine_connections", "engine connections in use, by pool", ["pool"])
        for pool, count in self._engine.connections_in_use().items():
            engine.add_metric([pool], count)
        clients = _gauge("client_connections", "client (HTTP) connections open")
        clients.add_metric([], self._open_connections())
        at, cached = self._last
        # a scrape arriving while another reads the figures gets the last ones at once: it
        # holds a connection slot, and must not wait on a slow Kafka or disk walk
        if time.monotonic() - at >= self._cache_s and self._lock.acquire(blocking=False):
            try:
                cached = self._expensive.read()
                self._last = (time.monotonic(), cached)
            finally:
                self._lock.release()
        return [engine, clients, *cached]


class ServerMetrics:
    """The server's counters and the registry /metrics serves."""

    def __init__(
        self, settings: ServerSettings, engine: Engine, open_connections: Callable[[], int]
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._queries = Counter(
            PREFIX + "queries",
            "queries answered, by outcome (ok, error, refused)",
            ("outcome",),
            registry=self.registry,
        )
        self._refused = Counter(
            PREFIX + "refused_queries",
            "queries refused by the server's guards, by reason",
            ("reason",),
            registry=self.registry,
        )
        self._gauges = _Gauges(settings, engine, open_connections)
        self.registry.register(self._gauges)
        # process_start_time_seconds: restarts
        self._process = ProcessCollector(registry=self.registry)

    def answered(self) -> None:
        self._queries.labels("ok").inc()

    def failed(self, code: int) -> None:
        reason = REFUSALS.get(code)
        self._queries.labels("error" if reason is None else "refused").inc()
        if reason is not None:
            self._refused.labels(reason).inc()

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def health(self) -> list[tuple[str, str, float]]:
        """(figure, subject, value) of every gauge (its labels' values joined by `/`; ''
        without) and of the process' start time; what is not finite is left out."""
        started = (f for f in self._process.collect() if f.name == "process_start_time_seconds")
        return [
            (sample.name.removeprefix(PREFIX), "/".join(sample.labels.values()), sample.value)
            for family in (*self._gauges.collect(), *started)
            for sample in family.samples
            if math.isfinite(sample.value)
        ]


RETRY_S = 10.0
"""A failed record is tried again this soon (at most the interval)."""


class HealthRecorder:
    """Writes ServerMetrics.health to `server_health` (clickhouse/migrations/0027) now, then
    every `interval_s` (0: never), on a thread of its own."""

    def __init__(self, metrics: ServerMetrics, engine: Engine, interval_s: float) -> None:
        self._metrics = metrics
        self._engine = engine
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-recorder", daemon=True)

    def start(self) -> None:
        if self._interval_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(10.0)

    def record(self) -> int:
        """Write the figures once; return how many rows."""
        rows = self._metrics.health()
        if not rows:
            return 0
        values = ", ".join(
            f"(now(), {{f{i}:String}}, {{s{i}:String}}, {{v{i}:Float64}})" for i in range(len(rows))
        )
        params: dict[str, str] = {}
        for i, (figure, subject, value) in enumerate(rows):
            params |= {f"f{i}": figure, f"s{i}": subject, f"v{i}": repr(value)}
        with self._engine.control() as conn:
            conn.run(
                f"INSERT INTO server_health (time, figure, subject, value) VALUES {values}", params
            )
        return len(rows)

    def _run(self) -> None:
        while not self._stopping.is_set():
            wait = self._interval_s
            try:
                self.record()
            except Exception as exc:  # no table yet (the migrations run after the start)
                log.warning("health not recorded: %s", exc)
                wait = min(wait, RETRY_S)
            self._stopping.wait(wait)
