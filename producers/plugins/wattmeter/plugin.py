"""`wattmeter://`: Omegawatt wattmeters ("wattmetre"), 50 frames per second, every port in
each frame, read as Kwollect's `kwollector_wattmetre` reads them (see README.md).

A streaming plugin: the first poll starts a background reader (TCP, or a command's standard
output); every poll turns what arrived since the previous one into readings with the meter's
own timestamps: per port (device `<meter>-port<N>`), the mean of each `update_every`, or
every frame while the port is activated on demand with an `optional_period` of 20 ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Self

from kafka.reading import Reading
from producers.ondemand import ALIAS_LABEL
from producers.plugins.base import Plugin
from producers.plugins.wattmeter.frames import NAN, PARSERS, FrameError
from producers.plugins.wattmeter.options import Meter, parse, port_device
from producers.plugins.wattmeter.series import Batch, PortSeries
from producers.plugins.wattmeter.stream import Buffer, Stream

if TYPE_CHECKING:
    from producers.entry import DeviceEntry

MAX_LINE_BYTES = 64 << 10
"""A line still unfinished at this length is not a frame (garbage without newlines)."""


class WattmeterPlugin(Plugin):
    scheme = "wattmeter"
    streams = True

    def __init__(self, entry: DeviceEntry, meter: Meter) -> None:
        self.entries = (entry,)
        self.entry = entry
        self.meter = meter
        self._parse = PARSERS[meter.version]
        self.buffer = Buffer(meter.options.buffer_bytes)
        self.stream = Stream(
            meter.source, self.buffer, meter.options.timeout_s, meter.options.retry_max_s
        )
        self.ports: list[PortSeries] = []
        self._tail = b""
        self._periods_key: object = None
        self._periods: list[int] = []

    @classmethod
    def check(cls, entry: DeviceEntry) -> None:
        parse(entry)

    @classmethod
    def build(cls, entries: Sequence[DeviceEntry]) -> list[Self]:
        """One instance (one stream) per meter entry."""
        return [cls(entry, parse(entry)) for entry in entries]

    async def poll(self, timestamp_us: int) -> list[Reading]:
        self.stream.start()
        taken = self.buffer.take()
        for _ in range(taken.dropped_lines):
            self._skip(
                "frames dropped",
                f"more than {self.buffer.limit} bytes arrived between two polls; the oldest "
                "frames were dropped",
            )
        if taken.tail_lost:
            self._tail = b""
        batch = self._batch(taken.items)
        periods = self._periods_at(timestamp_us)
        readings: list[Reading] = []
        for index, series in enumerate(self.ports):
            series.add(batch, index, periods[index], readings)
        problem = self.stream.problem
        if problem is not None:
            for series in self.ports:  # no frame will complete their periods soon
                series.flush(readings)
            if not readings and not batch.timestamps:
                raise RuntimeError(f"wattmeter {self.meter.source}: {problem}")
        return readings

    async def close(self) -> None:
        await self.stream.close()

    def _batch(self, items: list[bytes | None]) -> Batch:
        """The frames of the buffered bytes; lines that are not frames are skipped."""
        timestamps: list[int] = []
        rows: list[list[float]] = []
        parse = self._parse
        for line in self._lines(items):
            line = line.strip()
            if not line:
                continue
            try:
                timestamp, values = parse(line)
            except FrameError as exc:
                self._skip(exc.what, str(exc))
                continue
            timestamps.append(timestamp)
            rows.append(values)
        if not rows:
            return Batch(timestamps, [])
        width = max(map(len, rows))
        for row in rows:
            if len(row) < width:
                row.extend([NAN] * (width - len(row)))
        self._grow(width)
        return Batch(timestamps, list(zip(*rows, strict=True)))

    def _lines(self, items: list[bytes | None]) -> list[bytes]:
        """The complete lines of the chunks, after the one the previous poll left unfinished;
        the unfinished line of a session that ended (None) is dropped, reported."""
        lines: list[bytes] = []
        run = [self._tail]
        for item in items:
            if item is not None:
                run.append(item)
                continue
            lines += b"".join(run).split(b"\n")
            if lines.pop().strip():
                self._skip("incomplete frame", "the stream was cut in the middle of a line")
            run = []
        lines += b"".join(run).split(b"\n")
        self._tail = lines.pop()
        if len(self._tail) > MAX_LINE_BYTES:
            self._skip("malformed frame", f"no end of line within {MAX_LINE_BYTES} bytes")
            self._tail = b""
        return lines

    def _grow(self, width: int) -> None:
        """One series per port the meter has shown so far."""
        entry = self.entry
        while len(self.ports) < width:
            device_id = port_device(entry.device_id, len(self.ports))
            alias = self.meter.aliases.get(device_id)
            labels = {**entry.labels, ALIAS_LABEL: alias} if alias else dict(entry.labels)
            self.ports.append(
                PortSeries(device_id, entry.name, labels, alias, entry.scale_factor or 1.0)
            )

    def _periods_at(self, now_us: int) -> list[int]:
        """Each port's period now (ms): `optional_period` while it is activated on demand,
        `update_every` otherwise. Asked again only when the active set changed."""
        entry = self.entry
        if entry.optional_period is None:
            return [entry.update_every] * len(self.ports)
        activations = self.activations
        key = (
            id(activations),
            activations.version,
            activations.active_ids(now_us),
            len(self.ports),
        )
        if key != self._periods_key:
            self._periods_key = key
            self._periods = [
                entry.optional_period
                if activations.active(series.device_id, series.alias, entry.name, now_us)
                else entry.update_every
                for series in self.ports
            ]
        return self._periods

    def _skip(self, what: str, reason: str) -> None:
        self.skips.skip(self.entry.device_id, what, f"{reason} ({self.meter.source})")
