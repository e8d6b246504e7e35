"""The asyncio runtime: polls each group of entries on wall-clock-aligned ticks and publishes.

Entries of one plugin with the same batch key (by default the device; for SNMP the agent,
for IPMI the BMC) and the same `update_every` form a group; a group's tick polls all its
plugin instances concurrently and publishes what they returned as one Kafka message per
device. Ticks fall on multiples of `update_every` since the epoch, so every device with the
same period is sampled at the same instants (synchronized sampling, as in DCDB). Each group
has its own loop: a slow, hung or failing device only loses its own readings of that tick.

What is polled follows the on-demand activations (producers/ondemand.py): an `optional`
entry is polled only while activated, an entry with `optional_period` is polled at that
period while activated. When the activations change, the groups whose entries or period
change are rebuilt: the new loop starts at its next aligned tick, the old one finishes the
tick it is in (if any) and stops, so no tick is polled twice or lost in the switch.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field

from kafka.message import pack_by_device
from kafka.reading import Reading
from producers.config import ProducerSettings
from producers.entry import DeviceEntry
from producers.monitoring import Monitor, Probe
from producers.ondemand import ALIAS_LABEL, Activations, Follower
from producers.plugins import plugin_for
from producers.plugins.base import Plugin, Skips
from producers.publisher import Publisher, client_logger
from producers.redact import redact_text, redact_url

log = logging.getLogger(__name__)

_CALLBACK_INTERVAL_S = 0.1
_CLOSE_TIMEOUT_S = 5.0
_ACTIVATIONS_CHECK_S = 0.5


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


GroupKey = tuple[type[Plugin], Hashable, int, tuple[int, ...]]
"""(plugin, batch key, period in ms, positions of the entries in the devices list)."""


def poll_period(
    entry: DeviceEntry, plugin: type[Plugin], activations: Activations, now: int
) -> int | None:
    """The period (ms) `entry` is polled at now; None while it is not polled (an optional
    entry not activated). Streaming plugins apply `optional_period` themselves."""
    if not entry.optional and (entry.optional_period is None or plugin.streams):
        return entry.update_every
    activated = activations.active(entry.device_id, entry.labels.get(ALIAS_LABEL), entry.name, now)
    if not activated:
        return None if entry.optional else entry.update_every
    if entry.optional_period is not None and not plugin.streams:
        return entry.optional_period
    return entry.update_every


Target = tuple[type[Plugin], Hashable]
"""What grouping needs of an entry: its plugin and batch key."""


def targets(entries: Sequence[DeviceEntry]) -> list[Target]:
    """Each entry's plugin and batch key, found once: both parse the entry's URL."""
    found = []
    for entry in entries:
        plugin = plugin_for(entry.url)
        found.append((plugin, plugin.batch_key(entry)))
    return found


def plan(
    entries: Sequence[DeviceEntry],
    activations: Activations,
    now: int,
    found: Sequence[Target] | None = None,
) -> dict[GroupKey, list[DeviceEntry]]:
    """The groups to poll now: entries by (plugin, batch key, period); `found` is
    `targets(entries)` when the caller keeps it."""
    batches: dict[tuple[type[Plugin], Hashable, int], list[tuple[int, DeviceEntry]]] = {}
    for position, (entry, (plugin, batch_key)) in enumerate(
        zip(entries, found or targets(entries), strict=True)
    ):
        period = poll_period(entry, plugin, activations, now)
        if period is not None:
            batches.setdefault((plugin, batch_key, period), []).append((position, entry))
    return {
        (plugin, key, period, tuple(position for position, _ in batch)): [e for _, e in batch]
        for (plugin, key, period), batch in batches.items()
    }


def build_group(key: GroupKey, batch: Sequence[DeviceEntry]) -> Group:
    plugin, batch_key, period, _ = key
    return Group(str(batch_key), period, tuple(plugin.build(batch)))


def build_groups(
    entries: Sequence[DeviceEntry], activations: Activations | None = None
) -> list[Group]:
    """The groups polled now (with no activations: every entry but the optional ones)."""
    planned = plan(entries, activations or Activations(), now_us())
    return [build_group(key, batch) for key, batch in planned.items()]


@dataclass(eq=False)
class _Loop:
    """A group's polling loop while it runs."""

    group: Group
    probes: dict[int, Probe]
    """id() of each member -> its counters."""
    task: asyncio.Task[None] | None = None
    in_tick: bool = False
    retiring: bool = False
    """Stop after the current tick (its entries or period changed)."""


def now_us() -> int:
    return time.time_ns() // 1000


def next_tick_us(now: int, period_us: int) -> int:
    """The first multiple of `period_us` strictly after `now`."""
    return (now // period_us + 1) * period_us


class Runtime:
    """Runs every group's loop, plus the Kafka callbacks and the stats line."""

    def __init__(
        self,
        entries: Sequence[DeviceEntry],
        publisher: Publisher,
        settings: ProducerSettings,
        activations: Activations | None = None,
    ) -> None:
        self.entries = list(entries)
        self._targets = targets(self.entries)
        self.publisher = publisher
        self.settings = settings
        self.activations = activations or Activations()
        self.counters = PollCounters()
        self.skips = Skips(log)
        self._loops: dict[GroupKey, _Loop] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._nonfinite_seen: set[tuple[str, str]] = set()
        self.monitor = Monitor(f"jobscope-producer-{settings.shard.index}", self._gauges)

    @property
    def groups(self) -> list[Group]:
        """The groups polled now."""
        return [loop.group for loop in self._loops.values()]

    async def run(self, stop: asyncio.Event, follower: Follower | None = None) -> None:
        """Poll until `stop` is set or Kafka fails for good; then stop and close the plugins.
        With a `follower`, follow the on-demand topic into `activations` meanwhile."""
        self.reconcile()
        tasks = [
            asyncio.create_task(self._serve_callbacks(stop)),
            asyncio.create_task(self._log_stats()),
            asyncio.create_task(self._follow_activations()),
            asyncio.create_task(self._report_self()),
        ]
        if follower is not None:
            tasks.append(asyncio.create_task(follower.run(), name="on-demand follower"))
        await stop.wait()
        loops = list(self._loops.values())
        self._loops.clear()
        tasks += [loop.task for loop in loops if loop.task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *self._stopping, return_exceptions=True)
        await self._close(loops)

    def reconcile(self) -> None:
        """Start the loops of the groups to poll now; retire those no longer wanted."""
        wanted = plan(self.entries, self.activations, now_us(), self._targets)
        retired = [self._loops.pop(key) for key in self._loops.keys() - wanted.keys()]
        for loop in retired:
            loop.retiring = True
            if loop.task is not None and not loop.in_tick:
                loop.task.cancel()
            for member in loop.group.members:
                self.counters.failing.discard(id(member))
        started = 0
        for key in wanted.keys() - self._loops.keys():
            try:
                group = build_group(key, wanted[key])
            except Exception:  # a bug in one plugin's build must not stop the others
                log.exception("cannot build the plugins of %s", key[1])
                continue
            for member in group.members:
                member.skips = self.skips
                member.activations = self.activations
            loop = _Loop(group, {id(m): self.monitor.probe(m) for m in group.members})
            loop.task = asyncio.create_task(self._group_loop(loop), name=f"group {group.name}")
            self._loops[key] = loop
            started += 1
        for loop in retired:
            if loop.task is not None:
                closing = asyncio.create_task(self._retire(loop))
                self._stopping.add(closing)
                closing.add_done_callback(self._stopping.discard)
        if retired:
            log.info(
                "on-demand: %d groups started, %d retired; polling %d groups",
                started,
                len(retired),
                len(self._loops),
            )

    async def _retire(self, loop: _Loop) -> None:
        assert loop.task is not None
        await asyncio.gather(loop.task, return_exceptions=True)
        await self._close([loop])

    async def _close(self, loops: Sequence[_Loop]) -> None:
        closing = [
            asyncio.create_task(plugin.close()) for loop in loops for plugin in loop.group.members
        ]
        if closing:
            await asyncio.wait(closing, timeout=_CLOSE_TIMEOUT_S)

    async def _follow_activations(self) -> None:
        """Re-plan when the activations change or one of them expires."""
        seen = (self.activations.version, self.activations.active_ids(now_us()))
        while True:
            await asyncio.sleep(_ACTIVATIONS_CHECK_S)
            state = (self.activations.version, self.activations.active_ids(now_us()))
            if state != seen:
                seen = state
                self.reconcile()

    async def _group_loop(self, loop: _Loop) -> None:
        group = loop.group
        period = group.update_every_ms * 1000
        tick = next_tick_us(now_us(), period)
        while not loop.retiring:
            while (delay := tick - now_us()) > 0:
                if delay > period:  # the wall clock stepped back: realign
                    tick = next_tick_us(now_us(), period)
                    continue
                await asyncio.sleep(delay / 1e6)
            timestamp = now_us()
            if (behind := timestamp - tick) >= period:  # woke too late to poll it in its period
                why = f"woke {behind // 1000} ms after its tick, past its period"
                tick = self._skip(loop, tick, behind // period, why)
            loop.in_tick = True
            try:
                await self._tick(loop, tick, period, timestamp)
            except Exception:  # a bug must not end this device's polling for good
                log.exception("tick failed: %s", group.name)
            finally:
                loop.in_tick = False
            following = tick + period
            if (behind := now_us() - following) >= 0:
                why = f"tick took longer than its {group.update_every_ms} ms period"
                following = self._skip(loop, following, behind // period + 1, why)
            tick = following

    def _skip(self, loop: _Loop, first: int, missed: int, why: str) -> int:
        """Count and log `missed` ticks from `first` as not polled; the tick to poll next.

        The log line names the ticks, so that a test can tell a reported skip from a lost
        tick: with it, every tick either has readings stamped within its period or is
        reported here."""
        self.counters.missed_ticks += missed
        for probe in loop.probes.values():
            probe.missed_ticks.inc(missed)
        log.warning("%s: %s: %d tick(s) skipped from %d us", loop.group.name, why, missed, first)
        return first + missed * loop.group.update_every_ms * 1000

    async def _tick(self, loop: _Loop, tick: int, period: int, timestamp: int) -> None:
        """Poll and publish tick `tick`, its readings stamped `timestamp` (within its period)."""
        self.counters.lateness_us.append(timestamp - tick)
        next(iter(loop.probes.values())).lateness.observe((timestamp - tick) / 1e6)
        deadline = tick + int(period * self.settings.poll_timeout_ratio)
        readings = await self._poll(loop, timestamp, max(deadline - timestamp, 0) / 1e6)
        await self._publish(readings)

    async def _publish(self, readings: list[Reading]) -> None:
        """One message per device."""
        for device_id, packed in pack_by_device(readings, bool(self.publisher.json_topic)):
            for reading in packed.skipped:
                self._report_nonfinite(reading)
            if packed.count:
                await self.publisher.publish(device_id, packed.payload, packed.count, packed.json)
                self.counters.readings += packed.count

    async def _poll(self, loop: _Loop, timestamp: int, timeout: float) -> list[Reading]:
        """Poll every member at once; what is not back within `timeout` s is cancelled."""
        group = loop.group
        tasks = [asyncio.create_task(plugin.poll(timestamp)) for plugin in group.members]
        try:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
        except asyncio.CancelledError:  # shutdown: the polls go with their tick
            for task in tasks:
                task.cancel()
            raise
        readings: list[Reading] = []
        for plugin, task in zip(group.members, tasks, strict=True):
            probe = loop.probes[id(plugin)]
            probe.polls.inc()
            if task in pending:
                task.cancel()
                probe.timeouts.inc()
                self.counters.poll_timeouts += 1
                self._failed(plugin, f"no answer within {timeout * 1000:.0f} ms, poll cancelled")
            elif task.cancelled() or task.exception() is not None:
                probe.errors.inc()
                self.counters.poll_errors += 1
                exc = None if task.cancelled() else task.exception()
                self._failed(plugin, f"{type(exc).__name__}: {exc}" if exc else "cancelled")
            else:
                result = task.result()
                probe.readings.inc(len(result))
                readings.extend(result)
                self._recovered(plugin)
        return readings

    def _failed(self, plugin: Plugin, error: str) -> None:
        """Log a failing poll once, when it starts failing; the stats line counts repeats."""
        if id(plugin) not in self.counters.failing:
            self.counters.failing.add(id(plugin))
            log.error(
                "poll failed: %s: %s (no readings until it recovers; repeats are only counted)",
                _describe(plugin),
                redact_text(error, plugin.entries[0].url),
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

    async def _report_self(self) -> None:
        """Publish the self-monitoring figures as readings, every `self_interval_s`."""
        while True:
            await asyncio.sleep(self.settings.self_interval_s)
            await self._publish(self.monitor.readings(now_us()))

    def _gauges(self) -> dict[str, tuple[str, float]]:
        now = now_us()
        return {
            "groups": ("polling loops running", len(self._loops)),
            "entries_polled": (
                "device entries polled now (optional ones only while activated)",
                sum(len(m.entries) for loop in self._loops.values() for m in loop.group.members),
            ),
            "activations": (
                "on-demand activations in force",
                len(self.activations.active_ids(now)),
            ),
            "activations_refused": (
                "on-demand messages refused (malformed; a pattern too long or not RE2's)",
                self.activations.refused,
            ),
            "polls_failing": (
                "plugin instances whose last poll failed",
                len(self.counters.failing),
            ),
            "messages_awaiting_delivery": (
                "messages not yet acknowledged by Kafka (in flight, in memory, spooled)",
                self.publisher.undelivered(),
            ),
            **self.publisher.depth().gauges(),
            "values_skipped": ("values left out by polls (e.g. a missing OID)", self.skips.count),
            "nonfinite_values": ("NaN/inf values not published", self.counters.nonfinite_values),
            "json_copies_delivered": (
                "messages copied to the JSON topic (JOBSCOPE_JSON_TOPIC)",
                self.publisher.counters.json_messages_delivered,
            ),
            "json_copies_lost": (
                "copies the JSON topic did not get (best effort)",
                self.publisher.counters.json_messages_lost,
            ),
        }

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
    return f"device_id={first.device_id} url={redact_url(first.url)} name={first.name}{more}"


async def run_producers(settings: ProducerSettings, entries: Sequence[DeviceEntry]) -> int:
    """Poll and publish until SIGTERM or SIGINT; flush; 0 if every message was delivered.

    Only the entries of the devices this process's shard owns are polled. A fatal Kafka
    client error also stops the process (status 1), so that its supervisor starts a fresh one.
    """
    shard = settings.shard
    mine = [entry for entry in entries if shard.owns(entry.device_id)]
    if shard.count > 1:
        log.info(
            "shard %s: %d of %d entries (%d of %d devices)",
            shard,
            len(mine),
            len(entries),
            len({entry.device_id for entry in mine}),
            len({entry.device_id for entry in entries}),
        )
    publisher = Publisher(settings)
    activations = Activations()
    runtime = Runtime(mine, publisher, settings, activations)
    follower = Follower(
        settings.kafka_client(),
        settings.ondemand_topic,
        activations,
        client_logger(),
        settings.ondemand_max_pattern_chars,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info(
        "polling %d entries of %d devices (%d optional ones only while activated on demand); "
        "publishing to %s on %s",
        len(mine),
        len({entry.device_id for entry in mine}),
        sum(entry.optional for entry in mine),
        settings.readings_topic,
        settings.kafka_bootstrap,
    )
    if settings.metrics_port:
        runtime.monitor.serve(settings.metrics_host, settings.metrics_port + shard.index)
    try:
        await runtime.run(stop, follower)
    finally:
        runtime.monitor.close()
    log.info("stopping: polling stopped, delivering %d messages", publisher.undelivered())
    closed = publisher.close(settings.shutdown_timeout_s)
    sent = publisher.counters
    log.info(
        "stopped: %d messages queued, %d delivered (%d readings), %d failed, %d kept in the "
        "spool for the next start, %d dropped",
        sent.messages_queued,
        sent.messages_delivered,
        sent.readings_delivered,
        sent.messages_failed,
        closed.kept,
        closed.dropped,
    )
    return 0 if closed.dropped == 0 and publisher.fatal_error is None else 1
