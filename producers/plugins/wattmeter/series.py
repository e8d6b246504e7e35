"""From frames to readings, port by port: every frame, or the mean of each period's frames.

A port polled at a period of at most FRAME_PERIOD_MS (full monitoring: `optional_period: 20`)
gets one reading per frame, with the frame's timestamp. Otherwise its frames are averaged
per period aligned on the epoch (1 s: per second, as Kwollect stores by default), stamped
with the period's start (Kwollect: the frame's second). A period's mean is published once a
frame of a later period arrives (its frames may span two polls), or when the stream stops
(then with the frames it had).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kafka.reading import Reading

FRAME_PERIOD_MS = 20
"""A meter sends 50 frames per second: a period of at most this keeps every frame."""


class Batch:
    """The frames of one poll, column-wise: `columns[i]` holds port i's power in each frame
    (NaN: no value), `timestamps` the frames' times (µs)."""

    def __init__(self, timestamps: list[int], columns: Sequence[Sequence[float]]) -> None:
        self.timestamps = timestamps
        self.columns = columns
        self._segments: dict[int, list[tuple[int, int, int]]] = {}

    def segments(self, period_us: int) -> list[tuple[int, int, int]]:
        """(period index since the epoch, first frame, end frame) of each run of frames that
        fall in one period; computed once per period length and poll."""
        if period_us not in self._segments:
            runs: list[tuple[int, int, int]] = []
            start, current = 0, None
            for i, timestamp in enumerate(self.timestamps):
                bucket = timestamp // period_us
                if bucket != current:
                    if current is not None:
                        runs.append((current, start, i))
                    start, current = i, bucket
            if current is not None:
                runs.append((current, start, len(self.timestamps)))
            self._segments[period_us] = runs
        return self._segments[period_us]


class PortSeries:
    """The readings of one port (one device: `<meter>-port<N>`) and its unfinished mean."""

    __slots__ = (
        "alias",
        "bucket",
        "count",
        "device_id",
        "labels",
        "metric",
        "period_us",
        "scale",
        "total",
    )

    def __init__(
        self,
        device_id: str,
        metric: str,
        labels: Mapping[str, str],
        alias: str | None,
        scale: float,
    ) -> None:
        self.device_id = device_id
        self.metric = metric
        self.labels = labels
        self.alias = alias
        self.scale = scale
        self.period_us = 0
        self.bucket: int | None = None
        self.total = 0.0
        self.count = 0

    def add(self, batch: Batch, index: int, period_ms: int, out: list[Reading]) -> None:
        """Append to `out` the readings of column `index` of `batch` at `period_ms`."""
        column = batch.columns[index] if index < len(batch.columns) else None
        if period_ms <= FRAME_PERIOD_MS:
            self.flush(out)
            self.period_us = 0
            if column is not None:
                self._every_frame(batch.timestamps, column, out)
            return
        period_us = period_ms * 1000
        if period_us != self.period_us:
            self.flush(out)
            self.period_us = period_us
        if column is None:
            return
        for bucket, start, end in batch.segments(period_us):
            values = column[start:end]
            total = sum(values)
            if total == total:
                count = end - start
            else:  # some frames have no value for this port
                present = [v for v in values if v == v]
                total, count = sum(present), len(present)
            if bucket != self.bucket:
                self.flush(out)
                self.bucket = bucket
            self.total += total
            self.count += count

    def flush(self, out: list[Reading]) -> None:
        """Publish the unfinished period's mean, if it has frames."""
        if self.count:
            assert self.bucket is not None
            out.append(
                Reading(
                    self.bucket * self.period_us,
                    self.device_id,
                    self.metric,
                    self.total / self.count * self.scale,
                    self.labels,
                )
            )
        self.bucket = None
        self.total = 0.0
        self.count = 0

    def _every_frame(
        self, timestamps: list[int], column: Sequence[float], out: list[Reading]
    ) -> None:
        device, metric, labels, scale = self.device_id, self.metric, self.labels, self.scale
        if scale == 1.0:
            out += [
                Reading(t, device, metric, v, labels)
                for t, v in zip(timestamps, column, strict=True)
                if v == v
            ]
        else:
            out += [
                Reading(t, device, metric, v * scale, labels)
                for t, v in zip(timestamps, column, strict=True)
                if v == v
            ]
