"""Serialisations of a data set that the systems ingest, written once and cached beside it.

All are produced vectorised (numpy for RowBinary, pyarrow for the text formats), never row by
row in Python. Rows come in poll order (by timestamp); a split into `parts` gives each part
the devices whose index modulo `parts` is the part number, as independent collectors would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from bench.dataset import Dataset

BATCH_POLLS = 10_000  # polls (of `metrics` readings each) per batch


class _Batch:
    """A batch of polls (tick, device), and its readings (`metrics` per poll, poll by poll)."""

    def __init__(self, data: Dataset, tick: np.ndarray, dev: np.ndarray) -> None:
        self.metrics = data.spec.metrics
        self.tick = tick
        self.poll_dev = dev
        self.poll_us = data.poll_us[tick, dev]  # int64 [poll]
        self.poll_values = data.values[tick, dev]  # float64 [poll, metric]

    @cached_property
    def ts_us(self) -> np.ndarray:
        return np.repeat(self.poll_us, self.metrics)

    @cached_property
    def dev(self) -> pa.Array:
        return pa.array(np.repeat(self.poll_dev, self.metrics).astype(np.int32))

    @cached_property
    def met(self) -> pa.Array:
        return pa.array(np.tile(np.arange(self.metrics, dtype=np.int32), len(self.tick)))

    @cached_property
    def value(self) -> pa.Array:
        return pa.array(self.poll_values.reshape(-1))

    def stamps(self, fmt: str) -> pa.Array:
        """Timestamps as text, formatted once per poll (microsecond precision)."""
        polls = pc.strftime(pa.array(self.poll_us, pa.timestamp("us")), format=fmt)
        per_poll = pa.array(np.repeat(np.arange(len(self.tick), dtype=np.int32), self.metrics))
        return polls.take(per_poll)


def _poll_batches(data: Dataset, part: int, parts: int) -> Iterator[_Batch]:
    """The readings of the devices of `part`, in poll order, one batch of polls at a time."""
    order = data.poll_order()
    order = order[order[:, 1] % parts == part]
    for lo in range(0, len(order), BATCH_POLLS):
        tick, dev = order[lo : lo + BATCH_POLLS].T
        yield _Batch(data, tick, dev)


def _names(names: list[str] | tuple[str, ...]) -> pa.Array:
    return pa.array(list(names), pa.string())


def _cached(path: Path, write: Callable[[Path], None]) -> Path:
    if not path.exists():
        tmp = path.with_name(path.name + ".tmp")
        write(tmp)
        tmp.rename(path)
    return path


def _csv_parts(
    data: Dataset, parts: int, name: str, time: Callable[[_Batch], pa.Array], labels: bool
) -> list[Path]:
    """One headerless CSV file per part, `name-<part>-of-<parts>.csv`: the time column
    `time(batch)`, device, metric, value, and (if `labels`) an empty JSON object."""
    devices, metrics = _names(data.devices), _names(data.metrics)
    options = pacsv.WriteOptions(include_header=False, quoting_style="none")

    def write(path: Path, part: int) -> None:
        writer: pacsv.CSVWriter | None = None
        try:
            for b in _poll_batches(data, part, parts):
                columns = [time(b), devices.take(b.dev), metrics.take(b.met), b.value]
                if labels:
                    columns.append(pa.repeat(pa.scalar("{}"), len(b.value)))
                batch = pa.record_batch(columns, names=[str(i) for i in range(len(columns))])
                if writer is None:
                    writer = pacsv.CSVWriter(str(path), batch.schema, write_options=options)
                writer.write_batch(batch)
        finally:
            if writer is not None:
                writer.close()

    return [
        _cached(
            data.folder / f"{name}-{part}-of-{parts}.csv",
            lambda p, part=part: write(p, part),
        )  # type: ignore[misc]
        for part in range(parts)
    ]


def victoriametrics_csv(data: Dataset, parts: int = 2) -> list[Path]:
    """`unix_ms,device,metric,value` lines: VictoriaMetrics' CSV import (milliseconds)."""
    return _csv_parts(
        data, parts, "victoriametrics", lambda b: pa.array(b.ts_us // 1000), labels=False
    )


def postgres_csv(data: Dataset, parts: int = 2) -> list[Path]:
    """`timestamp,device_id,metric_id,value,labels` lines for COPY ... (FORMAT csv)."""
    return _csv_parts(
        data, parts, "postgres", lambda b: b.stamps("%Y-%m-%d %H:%M:%S+00"), labels=True
    )


# -- the readings topic ---------------------------------------------------------------------

Rows = tuple[memoryview | np.ndarray, np.ndarray]
"""Encoded readings of a batch: the bytes, and where each row starts (plus the end)."""
Encoder = Callable[[_Batch], Rows]


def _varint_prefixed(text: str) -> bytes:
    """RowBinary String: LEB128 length, then the UTF-8 bytes."""
    data = text.encode()
    n, prefix = len(data), bytearray()
    while n > 0x7F:
        prefix.append((n & 0x7F) | 0x80)
        n >>= 7
    prefix.append(n)
    return bytes(prefix) + data


def _byte_columns(starts: np.ndarray, width: int) -> np.ndarray:
    """The byte positions of fields of `width` bytes starting at `starts`, field by field."""
    return (starts[:, None] + np.arange(width)).reshape(-1)


def rowbinary(data: Dataset) -> Encoder:
    """Rows as kafka/message.py `pack` writes each reading (no labels): Int64 LE
    microseconds, device_id and metric_id as varint length + UTF-8, Float64 LE value, 0x00
    (no labels). A production message is `header(count)` followed by such rows.

    Every poll of a device has the same layout (the metrics in catalogue order), so a batch
    is a 2-D array [poll, byte] per device-name length: a template holding the metric names,
    into which the timestamp, device and value bytes are scattered by column."""
    metric_fields = [_varint_prefixed(m) for m in data.metrics]
    metric_len = np.array([len(f) for f in metric_fields])
    metric_bytes = np.frombuffer(b"".join(metric_fields), np.uint8)
    device_fields = [_varint_prefixed(d) for d in data.devices]
    device_len = np.array([len(f) for f in device_fields])
    layouts: dict[int, tuple[np.ndarray, ...]] = {}

    def layout(dev_len: int) -> tuple[np.ndarray, ...]:
        """(template, row starts, columns of timestamp, device, value) of one poll."""
        if dev_len not in layouts:
            row = 8 + dev_len + metric_len + 8 + 1
            starts = np.concatenate([[0], np.cumsum(row)])
            template = np.zeros(starts[-1], np.uint8)
            met = starts[:-1] + 8 + dev_len
            met_cols = [np.arange(a, a + n) for a, n in zip(met, metric_len, strict=True)]
            template[np.concatenate(met_cols)] = metric_bytes
            devices = np.array(
                [np.frombuffer(f, np.uint8) for f in device_fields if len(f) == dev_len]
            )
            layouts[dev_len] = (
                template,
                starts,
                _byte_columns(starts[:-1], 8),
                _byte_columns(starts[:-1] + 8, dev_len),
                _byte_columns(met + metric_len, 8),
                devices,
            )
        return layouts[dev_len]

    index_in_group = np.zeros(len(device_fields), np.int64)  # device -> row of `devices`
    for n in np.unique(device_len):
        index_in_group[device_len == n] = np.arange((device_len == n).sum())

    def encode(b: _Batch) -> Rows:
        polls, m = len(b.poll_dev), b.metrics
        poll_dev_len = device_len[b.poll_dev]
        lengths = np.unique(poll_dev_len)
        poll_size = np.zeros(lengths.max() + 1, np.int64)
        for n in lengths:
            poll_size[n] = len(layout(int(n))[0])
        poll_start = np.concatenate([[0], np.cumsum(poll_size[poll_dev_len])])
        out = np.empty(poll_start[-1], np.uint8)
        row_start = np.empty((polls, m), np.int64)
        for n in lengths:
            template, starts, ts_cols, dev_cols, value_cols, devices = layout(int(n))
            which = np.flatnonzero(poll_dev_len == n)
            block = np.tile(template, (len(which), 1))
            ts = b.poll_us[which].astype("<i8").view(np.uint8).reshape(-1, 8)
            block[:, ts_cols] = np.tile(ts, m)
            block[:, dev_cols] = np.tile(devices[index_in_group[b.poll_dev[which]]], m)
            value = np.ascontiguousarray(b.poll_values[which], "<f8")
            block[:, value_cols] = value.view(np.uint8).reshape(len(which), -1)
            if len(which) == polls:  # the usual case: every device name has the same length
                out = block.reshape(-1)
            else:
                out[_byte_columns(poll_start[which], len(template))] = block.reshape(-1)
            row_start[which] = poll_start[which, None] + starts[None, :-1]
        return out, np.append(row_start.reshape(-1), poll_start[-1])

    return encode


def _text_rows(lines: pa.Array) -> Rows:
    """The bytes of a pyarrow string array and where each string starts (plus the end)."""
    offsets = np.frombuffer(lines.buffers()[1], np.int32)[
        lines.offset : lines.offset + len(lines) + 1
    ].astype(np.int64)
    return memoryview(lines.buffers()[2])[offsets[0] : offsets[-1]], offsets - offsets[0]


def _text(data: Dataset, head: str, device: str, metric: str, tail: str) -> Encoder:
    """Rows of text: `head`, the timestamp (2026-01-01 00:00:03.123456), `device` and
    `metric` with the name in place of {}, the value, `tail`."""
    devices = _names([device.format(d) for d in data.devices])
    metrics = _names([metric.format(m) for m in data.metrics])
    return lambda b: _text_rows(
        pc.binary_join_element_wise(
            head,
            b.stamps("%Y-%m-%d %H:%M:%S"),
            devices.take(b.dev),
            metrics.take(b.met),
            pc.cast(b.value, pa.string()),
            tail,
            "",
        )
    )


def jsoneachrow(data: Dataset) -> Encoder:
    """One JSON object per reading (ClickHouse JSONEachRow): {"timestamp":"...",
    "device_id":...,"metric_id":...,"value":...,"labels":{}}."""
    return _text(
        data,
        '{"timestamp":"',
        '","device_id":"{}","metric_id":"',
        '{}","value":',
        ',"labels":{}}\n',
    )


def csv(data: Dataset) -> Encoder:
    """The same readings as ClickHouse CSV rows: timestamp,device_id,metric_id,value,{}."""
    return _text(data, "", ",{},", "{},", ",{}\n")


PRODUCTION_FORMAT = "RowBinary"
FORMATS: dict[str, Callable[[Dataset], Encoder]] = {
    "RowBinary": rowbinary,  # what the producers put on the readings topic
    "JSONEachRow": jsoneachrow,
    "CSV": csv,
}


class KafkaMessages:
    """The rows (one per reading) of one part of a data set in one file, where each row starts,
    and the polls in order: messages are slices of whole rows of one poll (one device). In
    RowBinary, a production message is kafka/message.py `header` of its count of readings
    followed by such a slice; without it, a slice is a message of a row per reading."""

    def __init__(
        self, body: Path, row_starts: np.ndarray, polls: np.ndarray, per_poll: int
    ) -> None:
        self.body = body
        self.row_starts = row_starts  # int64, one per row plus the end of the file
        self.polls = polls  # int32 [poll, 2]: (tick, device index) of each poll
        self.per_poll = per_poll

    def slices(self, per_message: int) -> Iterator[tuple[int, int, int]]:
        """(device index, start, end) of each message of `per_message` readings (which must
        divide the readings of a poll: a message never mixes two polls)."""
        if self.per_poll % per_message:
            raise ValueError(f"{per_message} readings per message do not divide a poll")
        starts = self.row_starts
        for row in range(0, len(starts) - 1, per_message):
            yield (
                int(self.polls[row // self.per_poll, 1]),
                int(starts[row]),
                int(starts[row + per_message]),
            )


def kafka_messages(
    data: Dataset, part: int = 0, parts: int = 1, fmt: str = PRODUCTION_FORMAT
) -> KafkaMessages:
    """The readings of `part`, one row each in `fmt` (RowBinary: byte for byte the readings'
    rows of kafka/message.py `pack`, without the count that opens a message), cached on
    disk."""
    stem = data.folder / f"{fmt.lower()}-{part}-of-{parts}"
    body, index, polls = (stem.with_suffix(s) for s in (".body", ".rows.npy", ".polls.npy"))
    if not all(p.exists() for p in (body, index, polls)):
        encode = FORMATS[fmt](data)
        starts: list[np.ndarray] = []
        poll_list: list[np.ndarray] = []
        position = 0
        tmp = body.with_name(body.name + ".tmp")
        with open(tmp, "wb") as out:
            for batch in _poll_batches(data, part, parts):
                rows, offsets = encode(batch)
                out.write(rows)
                starts.append(offsets[:-1] + position)
                position += int(offsets[-1])
                poll_list.append(np.stack([batch.tick, batch.poll_dev], axis=1).astype(np.int32))
        np.save(index, np.concatenate([*starts, np.array([position], np.int64)]))
        np.save(polls, np.concatenate(poll_list))
        tmp.rename(body)  # last: the body's presence says the index files are complete
    return KafkaMessages(body, np.load(index), np.load(polls), data.spec.metrics)
