"""Serialisations of a data set that the systems ingest, written once and cached beside it.

All are produced with pyarrow (vectorised, multithreaded), never row by row in Python. Rows
come in poll order (by timestamp); a split into `parts` gives each part the devices whose
index modulo `parts` is the part number, as independent collectors would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from bench.dataset import Dataset

BATCH_POLLS = 10_000  # polls (of `metrics` readings each) per arrow batch


class _Batch:
    """A batch of polls, and its readings (`metrics` per poll, poll by poll)."""

    def __init__(self, data: Dataset, tick: np.ndarray, dev: np.ndarray) -> None:
        m = data.spec.metrics
        self.poll_us = data.poll_us[tick, dev]
        self.poll_dev = dev
        self.per_poll = pa.array(np.repeat(np.arange(len(tick), dtype=np.int32), m))
        self.ts_us = np.repeat(self.poll_us, m)
        self.dev = pa.array(np.repeat(dev, m).astype(np.int32))
        self.met = pa.array(np.tile(np.arange(m, dtype=np.int32), len(tick)))
        self.value = pa.array(data.values[tick, dev].reshape(-1))

    def stamps(self, fmt: str) -> pa.Array:
        """Timestamps as text, formatted once per poll (microsecond precision)."""
        polls = pc.strftime(pa.array(self.poll_us, pa.timestamp("us")), format=fmt)
        return polls.take(self.per_poll)


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


def _write_csv(path: Path, batches: Iterator[pa.RecordBatch]) -> None:
    options = pacsv.WriteOptions(include_header=False, quoting_style="none")
    writer: pacsv.CSVWriter | None = None
    try:
        for batch in batches:
            if writer is None:
                writer = pacsv.CSVWriter(str(path), batch.schema, write_options=options)
            writer.write_batch(batch)
    finally:
        if writer is not None:
            writer.close()


def victoriametrics_csv(data: Dataset, parts: int = 2) -> list[Path]:
    """`unix_ms,device,metric,value` lines: VictoriaMetrics' CSV import (milliseconds)."""
    devices, metrics = _names(data.devices), _names(data.metrics)

    def batches(part: int) -> Iterator[pa.RecordBatch]:
        for b in _poll_batches(data, part, parts):
            yield pa.record_batch(
                {
                    "ms": pa.array(b.ts_us // 1000),
                    "device": devices.take(b.dev),
                    "metric": metrics.take(b.met),
                    "value": b.value,
                }
            )

    return [
        _cached(
            data.folder / f"victoriametrics-{part}-of-{parts}.csv",
            lambda p, part=part: _write_csv(p, batches(part)),
        )  # type: ignore[misc]
        for part in range(parts)
    ]


def postgres_csv(data: Dataset, parts: int = 2) -> list[Path]:
    """`timestamp,device_id,metric_id,value,labels` lines for COPY ... (FORMAT csv)."""
    devices, metrics = _names(data.devices), _names(data.metrics)

    def batches(part: int) -> Iterator[pa.RecordBatch]:
        for b in _poll_batches(data, part, parts):
            yield pa.record_batch(
                {
                    "timestamp": b.stamps("%Y-%m-%d %H:%M:%S+00"),
                    "device_id": devices.take(b.dev),
                    "metric_id": metrics.take(b.met),
                    "value": b.value,
                    "labels": pa.repeat(pa.scalar("{}"), len(b.value)),
                }
            )

    return [
        _cached(
            data.folder / f"postgres-{part}-of-{parts}.csv",
            lambda p, part=part: _write_csv(p, batches(part)),
        )  # type: ignore[misc]
        for part in range(parts)
    ]


def jsoneachrow_lines(data: Dataset, part: int = 0, parts: int = 1) -> Iterator[pa.Array]:
    """One JSON object per reading (ClickHouse JSONEachRow), batch by batch, in poll order:
    {"timestamp":"2026-01-01 00:00:03.123456","device_id":...,"metric_id":...,"value":...,
    "labels":{}}. The lines of one poll (one device, one tick) are consecutive."""
    devices = _names([f'","device_id":"{d}","metric_id":"' for d in data.devices])
    metrics = _names([f'{m}","value":' for m in data.metrics])
    for b in _poll_batches(data, part, parts):
        yield pc.binary_join_element_wise(
            '{"timestamp":"',
            b.stamps("%Y-%m-%d %H:%M:%S"),
            devices.take(b.dev),
            metrics.take(b.met),
            pc.cast(b.value, pa.string()),
            ',"labels":{}}\n',
            "",
        )


def csv_lines(data: Dataset, part: int = 0, parts: int = 1) -> Iterator[pa.Array]:
    """The same readings as ClickHouse CSV rows: timestamp,device_id,metric_id,value,{}."""
    devices = _names([f",{d}," for d in data.devices])
    metrics = _names([f"{m}," for m in data.metrics])
    for b in _poll_batches(data, part, parts):
        yield pc.binary_join_element_wise(
            b.stamps("%Y-%m-%d %H:%M:%S"),
            devices.take(b.dev),
            metrics.take(b.met),
            pc.cast(b.value, pa.string()),
            ",{}\n",
            "",
        )


LINE_FORMATS = {"JSONEachRow": jsoneachrow_lines, "CSV": csv_lines}


class KafkaMessages:
    """The lines (one per reading) of one part of a data set in one file, and where each line and
    each poll starts: messages are slices of whole lines of one poll (one device)."""

    def __init__(
        self, body: Path, line_starts: np.ndarray, poll_devices: np.ndarray, per_poll: int
    ) -> None:
        self.body = body
        self.line_starts = line_starts  # int64, one per line plus the end of the file
        self.poll_devices = poll_devices  # device index of each poll
        self.per_poll = per_poll

    def slices(self, per_message: int) -> Iterator[tuple[int, int, int]]:
        """(device index, start, end) of each message of `per_message` readings (which must
        divide the readings of a poll: a message never mixes two polls)."""
        if self.per_poll % per_message:
            raise ValueError(f"{per_message} readings per message do not divide a poll")
        starts = self.line_starts
        for line in range(0, len(starts) - 1, per_message):
            yield (
                int(self.poll_devices[line // self.per_poll]),
                int(starts[line]),
                int(starts[line + per_message]),
            )


def kafka_messages(
    data: Dataset, part: int = 0, parts: int = 1, fmt: str = "JSONEachRow"
) -> KafkaMessages:
    """The readings of `part`, one line each in `fmt` (JSONEachRow: as jobscope's producers
    put them on the readings topic with producers/message.py `pack`), cached on disk."""
    stem = data.folder / f"{fmt.lower()}-{part}-of-{parts}"
    body, index, devices = (stem.with_suffix(s) for s in (".txt", ".lines.npy", ".polls.npy"))
    if not all(p.exists() for p in (body, index, devices)):
        starts: list[np.ndarray] = []
        polls: list[np.ndarray] = []
        position = 0
        tmp = body.with_name(body.name + ".tmp")
        with open(tmp, "wb") as out:
            for batch, lines in zip(
                _poll_batches(data, part, parts), LINE_FORMATS[fmt](data, part, parts), strict=True
            ):
                offsets = np.frombuffer(lines.buffers()[1], np.int32)[
                    lines.offset : lines.offset + len(lines) + 1
                ].astype(np.int64)
                out.write(memoryview(lines.buffers()[2])[offsets[0] : offsets[-1]])
                starts.append(offsets[:-1] - offsets[0] + position)
                position += int(offsets[-1] - offsets[0])
                polls.append(batch.poll_dev.astype(np.int32))
        tmp.rename(body)
        np.save(index, np.concatenate([*starts, np.array([position], np.int64)]))
        np.save(devices, np.concatenate(polls))
    return KafkaMessages(body, np.load(index), np.load(devices), data.spec.metrics)
