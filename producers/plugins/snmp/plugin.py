"""`snmp://`: SNMP v2c and v3 agents (PDUs, switches), Kwollect's URL form and more.

One instance polls every entry of one agent with one period: all their OIDs travel in as
few GETs as `max_oids` allows, table columns are walked with GETBULK. What rarely changes
(Kwollect's `{{ prefix == value }}` templates, label columns, decimal digits) is read at the
first poll and again every `refresh_s`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Self

from gufo.snmp.typing import ValueType

from kafka.reading import Reading
from producers.entry import DeviceEntry
from producers.plugins.base import Plugin
from producers.plugins.snmp import options as opts
from producers.plugins.snmp.client import AgentClient, AgentUnavailable

log = logging.getLogger(__name__)
ALIAS = "_device_alias"


@dataclass(frozen=True, slots=True)
class Target:
    """One OID read at every poll, and what its value becomes."""

    oid: str
    entry: DeviceEntry
    labels: Mapping[str, str]
    scale: float
    """Kwollect's scale_factor, multiplied as Kwollect does (same values, to the bit)."""
    divide: float
    """divisor times 10^decimal digits."""


@dataclass(frozen=True, slots=True)
class Walk:
    """One table column walked at every poll, with what its rows' labels and digits are."""

    column: str
    entry: DeviceEntry
    spec: opts.SnmpOptions
    labels: Mapping[str, Mapping[str, str]]
    """label -> row index -> value, from the label columns."""
    digits: Mapping[str, int]
    """row index -> decimal digits, from the decimals column."""


class SnmpPlugin(Plugin):
    scheme = "snmp"

    def __init__(self, entries: Sequence[DeviceEntry], specs: Sequence[opts.EntrySpec]) -> None:
        self.entries = tuple(entries)
        self.specs = specs
        self.client = AgentClient(specs[0].agent, entries[0].update_every / 1000)
        self.refresh_s = min(spec.options.refresh_s for spec in self.specs)
        self._refreshed_at: float | None = None
        self._targets: list[Target] = []
        self._oids: list[str] = []
        self._walks: list[Walk] = []

    @classmethod
    def check(cls, entry: DeviceEntry) -> None:
        opts.parse(entry)

    @classmethod
    def batch_key(cls, entry: DeviceEntry) -> Hashable:
        return opts.parse(entry).agent

    @classmethod
    def build(cls, entries: Sequence[DeviceEntry]) -> list[Self]:
        return [cls(entries, [opts.parse(entry) for entry in entries])]

    async def poll(self, timestamp_us: int) -> list[Reading]:
        if self._refreshed_at is None or time.monotonic() - self._refreshed_at > self.refresh_s:
            await self._refresh()
        readings: list[Reading] = []
        if self._oids:
            values = await self.client.get(self._oids)
            for target in self._targets:
                value = self._number(values.get(target.oid), target.entry, target.oid)
                if value is not None:
                    readings.append(
                        Reading(
                            timestamp_us,
                            target.entry.device_id,
                            target.entry.name,
                            value * target.scale / target.divide,
                            target.labels,
                        )
                    )
        for walk in self._walks:
            rows = await self.client.walk(walk.column)
            readings.extend(self._rows(walk, rows, timestamp_us))
        return readings

    # ---- reading values ---------------------------------------------------------------

    def _number(self, raw: ValueType, entry: DeviceEntry, oid: str) -> float | None:
        """A value as a float (Kwollect's float(value), bytes decoded); None if unusable."""
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        if raw is None:
            self.skips.skip(
                entry.device_id,
                f"{entry.name} ({oid})",
                "noSuchObject/noSuchInstance: the agent has no value for this OID",
            )
            return None
        text = _text(raw)
        try:
            return float(text)
        except ValueError:
            self.skips.skip(
                entry.device_id, f"{entry.name} ({oid})", f"value {text!r} is not a number"
            )
            return None

    def _rows(self, walk: Walk, rows: Mapping[str, ValueType], timestamp_us: int) -> list[Reading]:
        entry, spec = walk.entry, walk.spec
        scale = entry.scale_factor or 1.0
        divisor = spec.divisor or 1.0
        readings = []
        for index, raw in rows.items():
            value = self._number(raw, entry, f"{walk.column}.{index}")
            if value is None:
                continue
            labels = {**entry.labels, spec.index_label: index}
            for label, by_index in walk.labels.items():
                if index in by_index:
                    labels[label] = by_index[index]
            _alias(labels, spec, spec.index_label)
            value = value * scale / (divisor * 10 ** walk.digits.get(index, 0))
            readings.append(Reading(timestamp_us, entry.device_id, entry.name, value, labels))
        return readings

    # ---- what rarely changes ----------------------------------------------------------

    async def _refresh(self) -> None:
        """Resolve templates, read label and digit OIDs and columns: at the first poll (a
        failure then fails the poll) and every refresh_s (a failure keeps the last state)."""
        try:
            targets, walks = await self._resolve()
        except AgentUnavailable as exc:
            if self._refreshed_at is None:
                raise
            log.warning(
                "%s: refresh of templates and labels failed, kept: %s", self.client.agent, exc
            )
            self._refreshed_at = time.monotonic()
            return
        self._targets, self._walks = targets, walks
        self._oids = list(dict.fromkeys(target.oid for target in targets))
        self._refreshed_at = time.monotonic()

    async def _resolve(self) -> tuple[list[Target], list[Walk]]:
        # Kwollect's templates: walk each prefix once.
        prefixes = {t[0] for s in self.specs if (t := opts.kwollect_template(s.oid))}
        walked = {prefix: await self.client.walk(prefix) for prefix in sorted(prefixes)}
        # The OIDs beside each value (labels, digits) of the non-walk entries, in one GET.
        planned: list[tuple[DeviceEntry, opts.SnmpOptions, str, dict[str, str]]] = []
        for entry, spec in zip(self.entries, self.specs, strict=True):
            if spec.options.walk:
                continue
            oid = self._resolved(entry, spec.oid, walked)
            if oid is None:
                continue
            planned.extend(
                (entry, spec.options, opts.substitute(oid, a), a)
                for a in opts.expansions(oid, spec.options.indexes)
            )
        beside = [
            opts.substitute(extra, a)
            for _, o, _, a in planned
            for extra in (*o.label_oids.values(), *filter(None, [o.decimals_oid]))
        ]
        extra_values = await self.client.get(list(dict.fromkeys(beside))) if beside else {}
        targets = [self._target(entry, o, oid, a, extra_values) for entry, o, oid, a in planned]
        walks = [
            await self._walk(entry, spec)
            for entry, spec in zip(self.entries, self.specs, strict=True)
            if spec.options.walk
        ]
        return targets, walks

    def _resolved(
        self, entry: DeviceEntry, oid: str, walked: Mapping[str, Mapping[str, ValueType]]
    ) -> str | None:
        """`oid` with its Kwollect template resolved (the first index whose value matches),
        or None, logged, when no index matches (Kwollect disables the metric likewise)."""
        template = opts.kwollect_template(oid)
        if template is None:
            return oid
        prefix, wanted = template
        for index, value in walked[prefix].items():
            if _text(value) == wanted:
                return opts.with_index(oid, index)
        log.error(
            "device_id=%s name=%s: no index under %s has the value %r: not polled until a "
            "refresh finds one",
            entry.device_id,
            entry.name,
            prefix,
            wanted,
        )
        return None

    def _target(
        self,
        entry: DeviceEntry,
        o: opts.SnmpOptions,
        oid: str,
        assignment: dict[str, str],
        extra: Mapping[str, ValueType],
    ) -> Target:
        labels = {**entry.labels, **assignment}
        for label, label_oid in o.label_oids.items():
            value = extra.get(opts.substitute(label_oid, assignment))
            if value is not None:
                labels[label] = _text(value)
        _alias(labels, o, next(iter(assignment), ""))
        digits = 0.0
        if o.decimals_oid:
            digits_oid = opts.substitute(o.decimals_oid, assignment)
            digits = self._number(extra.get(digits_oid), entry, digits_oid) or 0.0
        return Target(
            oid, entry, labels, entry.scale_factor or 1.0, (o.divisor or 1.0) * 10 ** int(digits)
        )

    async def _walk(self, entry: DeviceEntry, spec: opts.EntrySpec) -> Walk:
        o = spec.options
        labels = {}
        for label, column in o.label_oids.items():
            labels[label] = {i: _text(v) for i, v in (await self.client.walk(column)).items()}
        digits: dict[str, int] = {}
        if o.decimals_oid:
            rows = await self.client.walk(o.decimals_oid)
            digits = {i: int(v) for i, v in rows.items() if isinstance(v, int)}
        return Walk(spec.oid, entry, o, labels, digits)

    async def close(self) -> None:
        self.client.close()


def _text(value: ValueType) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _alias(labels: dict[str, str], o: opts.SnmpOptions, default_key: str) -> None:
    """Set `_device_alias` from `aliases`, keyed by the alias_by label's value."""
    if o.aliases:
        key = labels.get(o.alias_by or default_key)
        if key is not None and key in o.aliases:
            labels[ALIAS] = o.aliases[key]
