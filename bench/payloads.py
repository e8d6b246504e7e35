"""Serialisations of a data set that the systems ingest, written once and cached beside it.

All are produced vectorised (numpy for the binary ones, pyarrow for the text formats), never
row by row in Python. Rows come in poll order (by timestamp); a split into `parts` gives each part
the devices whose index modulo `parts` is the part number, as independent collectors would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.dataset import Dataset
from kafka.message import varint

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


# -- the peers' inputs: rows of fixed layout, built from per-device templates ----------------

Template = list[bytes | str]
"""One row: constant bytes (the device and metric names among them) and the fields `TS` and
`VALUE`, filled per poll."""
TS, VALUE = "ts", "value"


class _Templates:
    """Every device's poll (its `metrics` rows back to back) as a byte template, the columns
    where each poll's timestamp and values go, devices grouped by template length."""

    def __init__(self, data: Dataset, row: Callable[[str, str], Template], ts_width: int) -> None:
        widths = {TS: ts_width, VALUE: 8}
        polls: list[np.ndarray] = []
        self.columns: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for device in data.devices:
            out, ts_cols, value_cols = bytearray(), [], []
            for metric in data.metrics:
                for part in row(device, metric):
                    if isinstance(part, bytes):
                        out += part
                        continue
                    (ts_cols if part == TS else value_cols).append(len(out))
                    out += bytes(widths[part])
            poll = np.frombuffer(bytes(out), np.uint8)
            columns = (
                _byte_columns(np.array(ts_cols), ts_width),
                _byte_columns(np.array(value_cols), 8),
            )
            if self.columns.setdefault(len(poll), columns)[0].tolist() != columns[0].tolist():
                raise ValueError("polls of equal length must share their layout")
            polls.append(poll)
        self.length = np.array([len(p) for p in polls])
        self.groups = {n: np.array([p for p in polls if len(p) == n]) for n in set(self.length)}
        self.in_group = np.zeros(len(polls), np.int64)  # device -> its row in its group
        for n in self.groups:
            self.in_group[self.length == n] = np.arange((self.length == n).sum())

    def encode(
        self, b: _Batch, ts: np.ndarray, values: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The polls of `b` (`ts`: [poll, ts_width] bytes, `values`: [poll, metric * 8]
        bytes) back to back, and where each poll starts (plus the end)."""
        length = self.length[b.poll_dev]
        starts = np.concatenate([[0], np.cumsum(length)])
        out = np.empty(starts[-1], np.uint8)
        for n, templates in self.groups.items():
            which = np.flatnonzero(length == n)
            ts_cols, value_cols = self.columns[n]
            block = templates[self.in_group[b.poll_dev[which]]]
            block[:, ts_cols] = np.tile(ts[which], len(ts_cols) // ts.shape[1])
            block[:, value_cols] = values[which]
            out[_byte_columns(starts[which], n)] = block.reshape(-1)
        return out, starts


def _value_bytes(b: _Batch, dtype: str) -> np.ndarray:
    return np.ascontiguousarray(b.poll_values, dtype).view(np.uint8).reshape(len(b.tick), -1)


PG_EPOCH_US = 946_684_800 * 1_000_000  # PostgreSQL counts timestamps from 2000-01-01
PGCOPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature, flags, no extension
PGCOPY_TRAILER = b"\xff\xff"


def _pg_field(value: bytes) -> bytes:
    return len(value).to_bytes(4, "big") + value


def _pg_row(device: str, metric: str) -> Template:
    """A COPY BINARY tuple of Kwollect's columns (timestamp, device_id, metric_id, value,
    labels): timestamptz as int64 µs since 2000, text, float8, jsonb (version 1, `{}`)."""
    return [
        (5).to_bytes(2, "big") + (8).to_bytes(4, "big"),
        TS,
        _pg_field(device.encode()) + _pg_field(metric.encode()) + (8).to_bytes(4, "big"),
        VALUE,
        _pg_field(b"\x01{}"),
    ]


def postgres_binary(data: Dataset, parts: int = 2) -> list[Path]:
    """`COPY metrics (timestamp, device_id, metric_id, value, labels) FROM STDIN (FORMAT
    binary)` input, one file per part (`postgres-<part>-of-<parts>.pgcopy`): psycopg's binary
    copy, the fastest way into PostgreSQL, pre-built as jobscope's RowBinary is."""
    templates = _Templates(data, _pg_row, 8)

    def write(path: Path, part: int) -> None:
        with open(path, "wb") as out:
            out.write(PGCOPY_HEADER)
            for b in _poll_batches(data, part, parts):
                ts = (b.poll_us - PG_EPOCH_US).astype(">i8").view(np.uint8).reshape(-1, 8)
                out.write(templates.encode(b, ts, _value_bytes(b, ">f8"))[0])
            out.write(PGCOPY_TRAILER)

    return [
        _cached(
            data.folder / f"postgres-{part}-of-{parts}.pgcopy", lambda p, part=part: write(p, part)
        )  # type: ignore[misc]
        for part in range(parts)
    ]


SAMPLES_PER_WRITE = 2000
"""Prometheus' `max_samples_per_send`: the samples of one remote write."""
MS_VARINT_BYTES = 6
"""Every millisecond timestamp of 2^35 to 2^42 (2001 to 2109) is a 6-byte varint."""


def _proto(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _remote_write_series(device: str, metric: str) -> Template:
    """A `prometheus.TimeSeries` field of a WriteRequest: labels `__name__` and `device`
    (sorted, as Prometheus sends them), one sample (double value, int64 ms timestamp)."""
    labels = b"".join(
        _proto(1, _proto(1, k.encode()) + _proto(2, v.encode()))
        for k, v in (("__name__", metric), ("device", device))
    )
    sample = 1 + 8 + 1 + MS_VARINT_BYTES
    series = len(labels) + 2 + sample
    return [
        varint(1 << 3 | 2)
        + varint(series)
        + labels
        + varint(2 << 3 | 2)
        + varint(sample)
        + b"\x09",
        VALUE,
        b"\x10",
        TS,
    ]


def _ms_varints(us: np.ndarray) -> np.ndarray:
    """[n, 6] bytes: each timestamp in milliseconds as a protobuf varint."""
    ms = us // 1000
    if ms.min() < 1 << 35 or ms.max() >= 1 << 42:
        raise ValueError("timestamps outside 2001-2109 are not 6-byte varints")
    shifts = np.arange(MS_VARINT_BYTES, dtype=np.int64) * 7
    out = ((ms[:, None] >> shifts) & 0x7F).astype(np.uint8)
    out[:, :-1] |= 0x80
    return out


class RemoteWrites:
    """The remote writes of one part: snappy-compressed `WriteRequest`s back to back in one
    file, and where each starts (plus the end)."""

    def __init__(self, body: Path, starts: np.ndarray) -> None:
        self.body = body
        self.starts = starts

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __iter__(self) -> Iterator[bytes]:
        with open(self.body, "rb") as f:
            for size in np.diff(self.starts):
                yield f.read(int(size))


def remote_writes(data: Dataset, parts: int = 2) -> list[RemoteWrites]:
    """Prometheus remote write (protocol 1.0) of each part's readings, as Prometheus sends
    them: `SAMPLES_PER_WRITE` samples per write (whole polls, in poll order), a series per
    sample, snappy block format; cached beside the data as `victoriametrics-<part>-of-
    <parts>.rw` and its `.rw.npy` index."""
    import cramjam

    polls_per_write = SAMPLES_PER_WRITE // data.spec.metrics
    if SAMPLES_PER_WRITE % data.spec.metrics or BATCH_POLLS % polls_per_write:
        raise ValueError("a write must hold whole polls and a batch whole writes")
    templates = _Templates(data, _remote_write_series, MS_VARINT_BYTES)
    out: list[RemoteWrites] = []
    for part in range(parts):
        body = data.folder / f"victoriametrics-{part}-of-{parts}.rw"
        index = body.with_name(body.name + ".npy")
        if not body.exists():
            sizes: list[int] = []
            tmp = body.with_name(body.name + ".tmp")
            with open(tmp, "wb") as f:
                for b in _poll_batches(data, part, parts):
                    rows, starts = templates.encode(
                        b, _ms_varints(b.poll_us), _value_bytes(b, "<f8")
                    )
                    for lo in range(0, len(b.tick), polls_per_write):
                        hi = min(lo + polls_per_write, len(b.tick))
                        write = cramjam.snappy.compress_raw(rows[starts[lo] : starts[hi]].tobytes())
                        f.write(write)
                        sizes.append(len(write))
            np.save(index, np.concatenate([[0], np.cumsum(sizes)]))
            tmp.rename(body)  # last: the body's presence says the index is complete
        out.append(RemoteWrites(body, np.load(index)))
    return out


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
