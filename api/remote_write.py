"""Prometheus remote_write 1.0 (`POST /api/v1/write`): a snappy-compressed (block format)
protobuf `prometheus.WriteRequest`, turned into the readings of a push (api/push.py).

Decoding is bounded before it starts: the snappy header's uncompressed length is checked
against JOBSCOPE_PUSH_MAX_BODY_BYTES before a byte is decompressed (a small body announcing
gigabytes is a 413), and the protobuf decoder checks every length against what is left of its
buffer. It reads only what jobscope stores (`WriteRequest.timeseries`: `TimeSeries.labels`,
`TimeSeries.samples`) and skips every other field by its wire type (metadata, exemplars,
native histograms: counted).

A series becomes readings as documented in docs/jobs.md: `__name__` is the metric id; the
`instance` (else `host`) label names the device through api/push_devices.py and is dropped, as
is `job` (Prometheus' scrape job, not a jobscope job); the other labels are the readings'
labels, checked as a push's (none starting with `_`), plus `source` and the map's
`_device_alias`. NaN and infinite samples, Prometheus' stale markers among them, are skipped
and counted in the answer.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import cramjam
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

from api import push
from api.infra.config import ApiSettings
from api.infra.errors import ParameterError, TooLarge
from api.infra.tokens import Principal
from api.push_devices import PushDevices
from kafka.reading import Reading

CONTENT_TYPE = "application/x-protobuf"
VERSION = "0.1.0"
STALE_NAN = 0x7FF0000000000002
"""The bits of Prometheus' stale marker (a NaN)."""
DROPPED_LABELS = ("__name__", "job")
"""Besides the label naming the device: not stored as reading labels."""
_DOUBLE = struct.Struct("<d")
_BITS = struct.Struct("<Q")


class Malformed(ValueError):
    """A body that is not a snappy-compressed WriteRequest; the message says where."""


@dataclass
class Series:
    labels: list[tuple[str, str]]
    samples: list[tuple[float, int]]
    """(value, timestamp in ms)"""


SKIPPED = ("stale", "non_finite", "histograms")
"""What a write may carry that is not stored: Prometheus' stale markers (a series gone from
its target), other NaN and infinite samples, native histogram samples."""


def parse(body: bytes, settings: ApiSettings, who: Principal, devices: PushDevices) -> push.Batch:
    """The readings of a remote_write body (its headers checked before); 400 naming what is
    malformed or unusable, 413 over the limits: nothing of it is kept."""
    try:
        series, histograms = decode(
            decompress(body, settings.push_max_body_bytes), settings.push_max_readings
        )
    except Malformed as exc:
        raise ParameterError("body", str(exc)) from None
    batch = readings(series, settings, who, devices)
    batch.skipped["histograms"] = histograms
    return batch


def check_headers(headers: Headers) -> None:
    """415 unless the request says what remote_write 1.0 sends."""
    content_type = headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() != CONTENT_TYPE or ";" in content_type:
        raise HTTPException(
            415,
            f"Content-Type {content_type!r}: remote_write 1.0 sends {CONTENT_TYPE!r} "
            "(protocol 2.0's io.prometheus.write.v2.Request is not served)",
        )
    encoding = headers.get("content-encoding", "")
    if encoding.strip().lower() != "snappy":
        raise HTTPException(
            415, f"Content-Encoding {encoding!r}: remote_write sends snappy (block format)"
        )


def decompress(body: bytes, limit: int) -> bytes:
    """The snappy block `body` decompressed, refused (413) before decompressing if its
    header announces more than `limit` bytes."""
    size, _ = _varint(body, 0, min(len(body), 5), "the snappy header")
    if size > limit:
        raise TooLarge(
            f"the snappy body announces {size} bytes once decompressed; at most {limit} "
            "(JOBSCOPE_PUSH_MAX_BODY_BYTES): lower max_samples_per_send"
        )
    out = bytearray(size)
    try:
        written = cramjam.snappy.decompress_raw_into(body, out)
    except cramjam.DecompressionError as exc:
        raise Malformed(f"corrupt snappy ({exc})") from None
    if written != size:
        raise Malformed(f"corrupt snappy: {written} bytes where the header announced {size}")
    return bytes(out)


def decode(data: bytes, max_samples: int) -> tuple[list[Series], int]:
    """The series of a WriteRequest and its native histogram samples (skipped); TooLarge once
    it holds more than `max_samples` samples, Malformed if it is not a WriteRequest."""
    series: list[Series] = []
    samples = histograms = 0
    for number, wire, start, stop in _fields(data, 0, len(data), "WriteRequest"):
        if number != 1:
            continue  # metadata (3)
        _expect(wire, 2, f"timeseries[{len(series)}]")
        one, skipped = _series(data, start, stop, f"timeseries[{len(series)}]")
        series.append(one)
        histograms += skipped
        samples += len(one.samples) + skipped
        if samples > max_samples:
            raise TooLarge(
                f"more than {max_samples} samples in one write (JOBSCOPE_PUSH_MAX_READINGS): "
                "lower max_samples_per_send"
            )
    return series, histograms


def _series(data: bytes, start: int, stop: int, where: str) -> tuple[Series, int]:
    labels: list[tuple[str, str]] = []
    samples: list[tuple[float, int]] = []
    histograms = 0
    for number, wire, begin, end in _fields(data, start, stop, where):
        if number == 1:
            _expect(wire, 2, f"{where}.labels[{len(labels)}]")
            labels.append(_label(data, begin, end, f"{where}.labels[{len(labels)}]"))
        elif number == 2:
            _expect(wire, 2, f"{where}.samples[{len(samples)}]")
            samples.append(_sample(data, begin, end, f"{where}.samples[{len(samples)}]"))
        elif number == 4:
            histograms += 1
    return Series(labels, samples), histograms


def _label(data: bytes, start: int, stop: int, where: str) -> tuple[str, str]:
    name = value = ""
    for number, wire, begin, end in _fields(data, start, stop, where):
        if number in (1, 2):
            _expect(wire, 2, where)
            try:
                text = data[begin:end].decode()
            except UnicodeDecodeError:
                raise Malformed(f"{where}: not UTF-8") from None
            if number == 1:
                name = text
            else:
                value = text
    return name, value


def _sample(data: bytes, start: int, stop: int, where: str) -> tuple[float, int]:
    value, timestamp = 0.0, 0
    for number, wire, begin, _ in _fields(data, start, stop, where):
        if number == 1:
            _expect(wire, 1, f"{where}.value")
            (value,) = _DOUBLE.unpack_from(data, begin)
        elif number == 2:
            _expect(wire, 0, f"{where}.timestamp")
            timestamp = begin - (1 << 64) if begin >= 1 << 63 else begin  # int64
    return value, timestamp


def _expect(wire: int, expected: int, where: str) -> None:
    if wire != expected:
        raise Malformed(f"{where}: wire type {wire} where the schema has {expected}")


def _fields(data: bytes, pos: int, stop: int, where: str) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, a, b) of each field of the message in data[pos:stop]: a varint
    has its value in a, a fixed64 or fixed32 its offset, a length-delimited field its span
    [a, b)."""
    while pos < stop:
        key, pos = _varint(data, pos, stop, where)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise Malformed(f"{where}: field number 0")
        if wire == 0:
            value, pos = _varint(data, pos, stop, where)
            yield number, wire, value, pos
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if stop - pos < size:
                raise Malformed(f"{where}: truncated ({size}-byte field {number})")
            yield number, wire, pos, pos + size
            pos += size
        elif wire == 2:
            size, pos = _varint(data, pos, stop, where)
            if size > stop - pos:
                raise Malformed(
                    f"{where}: truncated (field {number} of {size} bytes, {stop - pos} left)"
                )
            yield number, wire, pos, pos + size
            pos += size
        else:
            raise Malformed(f"{where}: wire type {wire} (groups are not used by remote_write)")


def _varint(data: bytes, pos: int, stop: int, where: str) -> tuple[int, int]:
    result = shift = 0
    while pos < stop:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            break
    raise Malformed(f"{where}: truncated or overlong varint")


def readings(
    series: list[Series], settings: ApiSettings, who: Principal, devices: PushDevices
) -> push.Batch:
    """The readings of decoded series: the first unusable series is a ParameterError naming
    it (nothing of the write is kept), its NaN and infinite samples are skipped."""
    batch = push.Batch()
    window = push.window(settings)
    source = push.source(who)
    for i, one in enumerate(series):
        where = f"timeseries[{i}]"
        labels = dict(one.labels)
        if len(labels) != len(one.labels):
            raise ParameterError(where, "a label name given twice")
        name = labels.get("__name__", "")
        if name:
            where = f"{where} ({name}{_shown(labels)})"
        metric = push.check_metric_id(f"{where}.__name__", name, settings)
        device, kept = devices.place(where, labels, DROPPED_LABELS, settings, source)
        for value, ms in one.samples:
            if not math.isfinite(value):
                if _BITS.unpack(_DOUBLE.pack(value))[0] == STALE_NAN:
                    batch.skipped["stale"] += 1
                else:
                    batch.skipped["non_finite"] += 1
                continue
            at = push.check_in_window(f"{where}.timestamp", f"{ms} ms", ms * 1000, window)
            batch.readings.append(Reading(at, device, metric, value, kept))
    return batch


def _shown(labels: dict[str, str]) -> str:
    """`, instance=...` where the series has one: errors name the sender."""
    return "".join(f", {k}={labels[k]!r}" for k in ("instance", "host") if k in labels)
