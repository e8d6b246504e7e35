"""The contract between the runtime and a protocol plugin.

A plugin instance polls a batch of device entries: by default one entry (`tester://`), or
every entry one request can serve (all OIDs of one SNMP agent, all sensors of one BMC). The
runtime groups the entries of a devices file by (plugin, `batch_key`, period), builds the
instances of each group once with `build` (which validates without any I/O), calls `poll`
on every instance once per tick with the tick's timestamp, and `close` on shutdown. `poll`
must be cancellable: the runtime cancels a poll that overruns its share of the period.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, ClassVar, Self, TypeVar
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ValidationError

from producers.ondemand import Activations

if TYPE_CHECKING:
    from kafka.reading import Reading
    from producers.entry import DeviceEntry

Options = TypeVar("Options", bound=BaseModel)


class Skips:
    """Counts values a poll had to leave out; logs the first skip of each (device, what)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.count = 0
        self._seen: set[tuple[str, str]] = set()

    def skip(self, device_id: str, what: str, reason: str) -> None:
        self.count += 1
        if (device_id, what) not in self._seen:
            self._seen.add((device_id, what))
            self.logger.warning(
                "device_id=%s %s: %s; skipped (repeats are only counted)", device_id, what, reason
            )


class Plugin(ABC):
    scheme: ClassVar[str]
    """The URL scheme the registry maps to this plugin, e.g. `tester` for `tester://`."""

    entries: tuple[DeviceEntry, ...]
    """The entries this instance polls (the runtime reports failures against them)."""

    streams: ClassVar[bool] = False
    """A streaming plugin reads its devices continuously (from its first poll on) and each
    poll returns what arrived since the previous one, with the devices' own timestamps. The
    runtime polls it every `update_every` whatever is activated: the plugin applies
    `optional_period` itself, per device it serves, by asking `activations`."""

    activations: Activations = Activations()
    """What is switched on now (on-demand metrics); the runtime gives every instance the
    process's live set (this empty one serves plugins used alone, as in tests)."""

    skips: Skips = Skips(logging.getLogger("producers.plugins"))
    """Where a poll reports the values it left out; the runtime gives every instance its own
    counter (this shared one serves plugins used alone, as in tests)."""

    @classmethod
    @abstractmethod
    def check(cls, entry: DeviceEntry) -> None:
        """Raise ValueError naming what is wrong with `entry` (URL, options); no I/O."""

    @classmethod
    def batch_key(cls, entry: DeviceEntry) -> Hashable:
        """Entries with equal keys (and periods) may be polled by one instance."""
        return entry.device_id

    @classmethod
    @abstractmethod
    def build(cls, entries: Sequence[DeviceEntry]) -> list[Self]:
        """The instances polling `entries` (checked entries of one batch key and period)."""

    @abstractmethod
    async def poll(self, timestamp_us: int) -> list[Reading]:
        """Read the device(s) now; every reading carries `timestamp_us` (a streaming
        plugin's carry the device's own timestamps).

        Raise when nothing could be read. Values that could not be read while others
        were (a missing OID, an unreadable sensor) are left out and reported through
        `Skips`."""

    async def close(self) -> None:  # noqa: B027 (optional hook, nothing to release by default)
        """Release connections and sessions."""


class OneRequestPlugin(Plugin):
    """A plugin that reads all the entries of one target (a BMC, a scrape URL, a folder) in
    one request per poll: one instance per batch, built as `cls(entries, target)`."""

    @classmethod
    @abstractmethod
    def parse(cls, entry: DeviceEntry) -> tuple[Hashable, object]:
        """(the entry's target, its own settings); ValueError naming what is wrong. No I/O."""

    @classmethod
    def check(cls, entry: DeviceEntry) -> None:
        cls.parse(entry)

    @classmethod
    def batch_key(cls, entry: DeviceEntry) -> Hashable:
        return cls.parse(entry)[0]

    @classmethod
    def build(cls, entries: Sequence[DeviceEntry]) -> list[Self]:
        return [cls(entries, cls.parse(entries[0])[0])]  # type: ignore[call-arg]


class ProcessLimit:
    """At most `limit` holders at once in the process: a semaphore per event loop (asyncio
    primitives belong to one loop; tests run several, one after the other)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def __call__(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._by_loop:
            self._by_loop[loop] = asyncio.Semaphore(self.limit)
        return self._by_loop[loop]


def url_options(url: str, model: type[Options]) -> Options:
    """Validate the query string of `url` against `model` (one value per key)."""
    pairs = parse_qsl(urlsplit(url).query, keep_blank_values=True, strict_parsing=False)
    options: dict[str, str] = {}
    for key, value in pairs:
        if key in options:
            raise ValueError(f"option {key!r} is given twice")
        options[key] = value
    return validated(options, model)


def validated(options: object, model: type[Options]) -> Options:
    """`options` validated against `model`; ValueError naming each problem."""
    try:
        return model.model_validate(options)
    except ValidationError as exc:
        raise ValueError(validation_message(exc)) from None


def validation_message(exc: ValidationError) -> str:
    """`field: problem` for each error of a pydantic validation, joined by `; `."""
    return "; ".join(
        ": ".join(filter(None, (".".join(str(part) for part in error["loc"]), error["msg"])))
        for error in exc.errors()
    )
