"""The asyncio runtime: polls each group of entries on wall-clock-aligned ticks and publishes.

Entries of one plugin with the same batch key (by default the device; for SNMP the agent,
for IPMI the BMC) and the same `update_every` form a group; a group's tick polls all its
plugin instances concurrently and publishes what they returned as one Kafka message per
device. Ticks fall on multiples of `update_every` since the epoch, so every device with the
same period is sampled at the same instants (synchronized sampling, as in DCDB). Each group
has its own loop: a slow, hung or failing device only loses its own readings of that tick.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field

from producers.config import ProducerSettings
from producers.entry import DeviceEntry
from producers.message import pack
from producers.plugins import plugin_for
from producers.plugins.base import Plugin, Skips
from producers.publisher import Publisher
from producers.reading import Reading

log = logging.getLogger(__name__)

_CALLBACK_INTERVAL_S = 0.1
_CLOSE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Group:
    """Entries polled together: one tick, one timestamp, one message per device."""

    name: str
    """For the log: the device, or the agent an SNMP group asks."""
    update_every_ms: int
    members: tuple[Plugin, ...]


@dataclass
class PollCounters:
    """Running totals since start, read by the stats log line."""

    readings: int = 0
    poll_errors: int = 0
    poll_timeouts: int = 0
    missed_ticks: int = 0
    nonfinite_values: int = 0
    failing: set[int] = field(default_factory=set)
    """id() of the plugin instances whose last poll failed or timed out."""
    lateness_us: list[int] = field(default_factory=list)
    """How late each tick's poll started since the last stats line (reset by it)."""


def build_groups(entries: Sequence[DeviceEntry]) -> list[Group]:
    """Group the entries by (plugin, batch key, update_every) and build their plugins.

    Optional entries (Kwollect's on-demand metrics) are left out: nothing promotes them yet.
    """
    batches: dict[tuple[type[Plugin], Hashable, int], list[DeviceEntry]] = {}
    for entry in entries:
        if entry.optional:
            continue
        plugin = plugin_for(entry.url)
        batches.setdefault((plugin, plugin.batch_key(entry), entry.update_every), []).append(entry)
    return [
        Group(str(key), period, tuple(plugin.build(batch)))
        for (plugin, key, period), batch in batches.items()
    ]


def now_us() -> int:
    return time.time_ns() // 1000


def next_tick_us(now: int, period_us: int) -> int:
    """The first multiple of `period_us` strictly after `now`."""
    return (now // period_us + 1) * period_us


class Runtime:
    """Runs every group's loop, plus the Kafka callbacks and the stats line."""

    def __init__(
        self, groups: Sequence[Group], publisher: Publisher, settings: ProducerSettings
    ) -> None:
        self.groups = groups
        self.publisher = publisher
        self.settings = settings
        self.counters = PollCounters()
        self.skips = Skips(log)
        for group in groups:
            for member in group.members:
                member.skips = self.skips
        self._nonfinite_seen: set[tuple[str, str]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until `stop` is set or Kafka fails for good; then stop and close the plugins."""
        tasks = [
            asyncio.create_task(self._group_loop(group), name=f"group {group.name}")
            for group in self.groups
        ]
        tasks.append(asyncio.create_task(self._serve_callbacks(stop)))
        tasks.append(asyncio.create_task(self._log_stats()))
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        closing = [
            asyncio.create_task(plugin.close()) for group in self.groups for plugin in group.members
        ]
        if closing:
            await asyncio.wait(closing, timeout=_CLOSE_TIMEOUT_S)

    async def _group_loop(self, group: Group) -> None:
        period = group.update_every_ms * 1000
        tick = next_tick_us(now_us(), period)
        while True:
            while (delay := tick - now_us()) > 0:
                if delay > period:  # the wall clock stepped back: realign
                    tick = next_tick_us(now_us(), period)
                    continue
                await asyncio.sleep(delay / 1e6)
            try:
                await self._tick(group, tick, period)
            except Exception:  # a bug must not end this device's polling for good
                log.exception("tick failed: %s", group.name)
            following = tick + period
            if (behind := now_us() - following) >= 0:
                missed = behind // period + 1
                self.counters.missed_ticks += missed
                log.warning(
                    "%s: tick took longer than its %d ms period: %d tick(s) skipped",
                    group.name,
                    group.update_every_ms,
                    missed,
                )
                following += missed * period
            tick = following

    async def _tick(self, group: Group, tick: int, period: int) -> None:
        timestamp = now_us()
        self.counters.lateness_us.append(timestamp - tick)
        deadline = tick + int(period * self.settings.poll_timeout_ratio)
        readings = await self._poll(group, timestamp, max(deadline - timestamp, 0) / 1e6)
        by_device: dict[str, list[Reading]] = {}
        for reading in readings:
            by_device.setdefault(reading.device_id, []).append(reading)
        for device_id, device_readings in by_device.items():
            packed = pack(device_readings)
            for reading in packed.skipped:
                self._report_nonfinite(reading)
            if packed.count:
                await self.publisher.publish(device_id, packed.payload, packed.count)
                self.counters.readings += packed.count

    async def _poll(self, group: Group, timestamp: int, timeout: float) -> list[Reading]:
        """Poll every member at once; what is not back within `timeout` s is cancelled."""
        tasks = [asyncio.create_task(plugin.poll(timestamp)) for plugin in group.members]
        try:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
        except asyncio.CancelledError:  # shutdown: the polls go with their tick
            for task in tasks:
                task.cancel()
            raise
        readings: list[Reading] = []
        for plugin, task in zip(group.members, tasks, strict=True):
            if task in pending:
                task.cancel()
                self.counters.poll_timeouts += 1
                self._failed(plugin, f"no answer within {timeout * 1000:.0f} ms, poll cancelled")
            elif task.cancelled() or task.exception() is not None:
                self.counters.poll_errors += 1
                exc = None if task.cancelled() else task.exception()
                self._failed(plugin, f"{type(exc).__name__}: {exc}" if exc else "cancelled")
            else:
                readings.extend(task.result())
                self._recovered(plugin)
        return readings

    def _failed(self, plugin: Plugin, error: str) -> None:
        """Log a failing poll once, when it starts failing; the stats line counts repeats."""
        if id(plugin) not in self.counters.failing:
            self.counters.failing.add(id(plugin))
            log.error(
                "poll failed: %s: %s (no readings until it recovers; repeats are only counted)",
                _describe(plugin),
                error,
            )

    def _recovered(self, plugin: Plugin) -> None:
        if id(plugin) in self.counters.failing:
            self.counters.failing.discard(id(plugin))
            log.info("poll recovered: %s", _describe(plugin))

    def _report_nonfinite(self, reading: Reading) -> None:
        """Count every non-finite value; log the first one of each metric."""
        self.counters.nonfinite_values += 1
        key = (reading.device_id, reading.metric_id)
        if key not in self._nonfinite_seen:
            self._nonfinite_seen.add(key)
            log.warning(
                "device_id=%s metric_id=%s: value %r cannot be published (JSON has "
                "no NaN/inf); such values are skipped and counted",
                reading.device_id,
                reading.metric_id,
                reading.value,
            )

    async def _serve_callbacks(self, stop: asyncio.Event) -> None:
        """Serve delivery callbacks; stop everything if the Kafka client broke for good."""
        while self.publisher.fatal_error is None:
            self.publisher.serve_callbacks()
            await asyncio.sleep(_CALLBACK_INTERVAL_S)
        stop.set()

    async def _log_stats(self) -> None:
        """Every `stats_interval_s`: what happened since the previous line."""
        interval = self.settings.stats_interval_s
        before = self._totals()
        while True:
            await asyncio.sleep(interval)
            totals = self._totals()
            delta = {key: totals[key] - before[key] for key in totals}
            before = totals
            lateness = sorted(self.counters.lateness_us)
            self.counters.lateness_us.clear()
            p99 = lateness[int(len(lateness) * 0.99)] / 1000 if lateness else 0.0
            log.info(
                "last %.0f s: %.1f readings/s; %d messages delivered, %d delivery failures "
                "(%d readings lost), %d queue-full waits; %d poll errors, %d poll timeouts, "
                "%d missed ticks, %d values skipped, %d non-finite values; tick lateness "
                "p99 %.1f ms; now %d polls failing, %d messages awaiting delivery",
                interval,
                delta["readings"] / interval,
                delta["messages_delivered"],
                delta["messages_failed"],
                delta["readings_failed"],
                delta["queue_full_waits"],
                delta["poll_errors"],
                delta["poll_timeouts"],
                delta["missed_ticks"],
                delta["skipped_values"],
                delta["nonfinite_values"],
                p99,
                len(self.counters.failing),
                self.publisher.undelivered(),
            )

    def _totals(self) -> dict[str, int]:
        counters = asdict(self.counters)
        del counters["failing"], counters["lateness_us"]
        counters["skipped_values"] = self.skips.count
        return {**counters, **asdict(self.publisher.counters)}


def _describe(plugin: Plugin) -> str:
    """How the log names a plugin instance: its device(s), URL and metric name(s)."""
    first = plugin.entries[0]
    more = f" and {len(plugin.entries) - 1} more entries" if len(plugin.entries) > 1 else ""
    return f"device_id={first.device_id} url={first.url} name={first.name}{more}"


async def run_producers(settings: ProducerSettings, entries: Sequence[DeviceEntry]) -> int:
    """Poll and publish until SIGTERM or SIGINT; flush; 0 if every message was delivered.

    A fatal Kafka client error also stops the process (status 1), so that its supervisor
    starts a fresh one.
    """
    groups = build_groups(entries)
    optional = sum(entry.optional for entry in entries)
    if optional:
        log.info("%d optional entries are not polled (on-demand metrics)", optional)
    publisher = Publisher(settings)
    runtime = Runtime(groups, publisher, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info(
        "polling %d entries of %d devices in %d groups; publishing to %s on %s",
        len(entries),
        len({entry.device_id for entry in entries}),
        len(groups),
        settings.readings_topic,
        settings.kafka_bootstrap,
    )
    await runtime.run(stop)
    log.info("stopping: polling stopped, flushing %d messages", publisher.undelivered())
    left = publisher.flush(settings.shutdown_timeout_s)
    sent = publisher.counters
    log.info(
        "stopped: %d messages queued, %d delivered (%d readings), %d failed, %d undelivered",
        sent.messages_queued,
        sent.messages_delivered,
        sent.readings_delivered,
        sent.messages_failed,
        left,
    )
    return 0 if left == 0 and publisher.fatal_error is None else 1
