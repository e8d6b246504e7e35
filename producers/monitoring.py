"""Self-monitoring: how collection goes, per plugin and device.

The same figures are served two ways: a Prometheus `/metrics` endpoint of the process
(`JOBSCOPE_METRICS_PORT` + shard index, on `JOBSCOPE_METRICS_HOST`), and readings of the
device `jobscope-producer-<shard>` published with the others every `self_interval_s`, so the
dashboards show collection health next to what is collected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kafka.reading import Reading

if TYPE_CHECKING:
    from producers.plugins.base import Plugin

log = logging.getLogger(__name__)
_PREFIX = "jobscope_producer_"
_LATENESS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)

disable_created_metrics()


def device_label(plugin: Plugin) -> str:
    """The devices a plugin instance polls, as one label value."""
    return ",".join(sorted({entry.device_id for entry in plugin.entries}))


@dataclass(frozen=True)
class Probe:
    """The counters of one plugin instance, bound once (label lookups cost a lock each)."""

    polls: Counter
    errors: Counter
    timeouts: Counter
    readings: Counter
    missed_ticks: Counter
    lateness: Histogram


class _Gauges(Collector):
    """Gauges read when collected (queue and spool depth, what is polled)."""

    def __init__(self, read: Callable[[], dict[str, tuple[str, float]]]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        for name, (documentation, value) in self._read().items():
            yield GaugeMetricFamily(_PREFIX + name, documentation, value=value)


class Monitor:
    """The counters of one producer process and their two outlets."""

    def __init__(self, device_id: str, gauges: Callable[[], dict[str, tuple[str, float]]]):
        self.device_id = device_id
        """The device the process reports as: `jobscope-producer-<shard>`."""
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("plugin", "device")

        def counter(name: str, documentation: str) -> Counter:
            return Counter(_PREFIX + name, documentation, labels, registry=self.registry)

        self._polls = counter("polls", "polls started")
        self._errors = counter("poll_errors", "polls that failed")
        self._timeouts = counter("poll_timeouts", "polls cancelled at their deadline")
        self._readings = counter("readings", "readings published")
        self._missed = counter(
            "missed_ticks", "ticks not polled (an overrun, or too late to start within the period)"
        )
        self._lateness = Histogram(
            _PREFIX + "tick_lateness_seconds",
            "how long after its tick a poll started",
            ("plugin",),
            buckets=_LATENESS_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Gauges(gauges))
        self._server: object | None = None

    def probe(self, plugin: Plugin) -> Probe:
        values = (plugin.scheme, device_label(plugin))
        return Probe(
            self._polls.labels(*values),
            self._errors.labels(*values),
            self._timeouts.labels(*values),
            self._readings.labels(*values),
            self._missed.labels(*values),
            self._lateness.labels(plugin.scheme),
        )

    def serve(self, host: str, port: int) -> None:
        """Start the /metrics endpoint; a port in use is logged, collection goes on."""
        try:
            self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            log.error("no /metrics endpoint: cannot listen on %s:%d: %s", host, port, exc)
            return
        log.info("self-monitoring: http://%s:%d/metrics", host, port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()  # type: ignore[attr-defined]
            self._server = None

    def readings(self, timestamp_us: int) -> list[Reading]:
        """Every sample of the registry as a reading of this process's device (histogram
        buckets left out: `_sum` and `_count` give the mean)."""
        return list(self._readings_at(timestamp_us))

    def _readings_at(self, timestamp_us: int) -> Iterator[Reading]:
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    continue
                yield Reading(
                    timestamp_us, self.device_id, sample.name, float(sample.value), sample.labels
                )
