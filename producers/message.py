"""The wire format of the readings topic: newline-delimited JSON, one line per reading.

Every producer, consumer, benchmark and test goes through `pack`/`unpack`, and ClickHouse
parses the same bytes with its Kafka engine (`kafka_format = 'JSONEachRow'`) into the
columns of `READING_STRUCTURE`. A line looks like (one line, wrapped here):

    {"timestamp":"2026-11-21 19:09:18.123456","device_id":"node-1",
     "metric_id":"bmc_power_watt","value":138.5,"labels":{"k":"v"}}

`timestamp` is UTC with exactly six fractional digits, so DateTime64(6, 'UTC') keeps the
microseconds; `value` is the shortest text that reads back as the same float64.

Exactness in ClickHouse (26.1): JSONEachRow parses numbers into a Float64 column with a fast
parser that reads some 16-17 digit values 1-2 ULP off (about 1 in 5,000 tester values;
`precise_float_parsing` does not change it). Reading `value` as String and converting it
with `JSONExtract(value, 'Float64')` is exact; tests/producers/test_message.py checks both.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import orjson

from producers.reading import Reading

READING_STRUCTURE = (
    "timestamp DateTime64(6, 'UTC'), device_id String, metric_id String, "
    "value Float64, labels Map(String, String)"
)
"""The ClickHouse columns a packed line parses into (the Kafka engine table's structure)."""

# orjson writes the rows of a list as `},{"timestamp":`: that byte sequence cannot occur
# inside a row, because quotes inside JSON strings are escaped and labels hold no arrays.
_ROW_SEPARATOR = b'},{"timestamp":'
_LINE_SEPARATOR = b'}\n{"timestamp":'
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class Packed(NamedTuple):
    """One message body and what went into it."""

    payload: bytes
    """The lines of the packed readings; empty when none could be packed."""
    count: int
    """Readings in `payload`."""
    skipped: list[Reading]
    """Readings left out because JSON cannot carry their value (NaN, +inf, -inf)."""


def format_timestamp(timestamp_us: int) -> str:
    """`YYYY-MM-DD HH:MM:SS.ffffff` in UTC, the text ClickHouse reads into DateTime64(6)."""
    seconds, micros = divmod(timestamp_us, 1_000_000)
    t = time.gmtime(seconds)
    return (
        f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{micros:06d}"
    )


def parse_timestamp(text: str) -> int:
    """The inverse of `format_timestamp`: UTC microseconds since the epoch."""
    moment = datetime.fromisoformat(text).replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MICROSECOND


def pack(readings: Iterable[Reading]) -> Packed:
    """Encode readings as one message body, skipping those with a non-finite value.

    Hot path: the timestamp text is formatted once per distinct timestamp (a tick shares
    one) and the rows go through a single orjson call.
    """
    rows: list[dict[str, Any]] = []
    skipped: list[Reading] = []
    isfinite = math.isfinite
    last_us: int | None = None
    timestamp = ""
    for reading in readings:
        if not isfinite(reading.value):
            skipped.append(reading)
            continue
        if reading.timestamp_us != last_us:
            last_us = reading.timestamp_us
            timestamp = format_timestamp(last_us)
        rows.append(
            {
                "timestamp": timestamp,
                "device_id": reading.device_id,
                "metric_id": reading.metric_id,
                "value": reading.value,
                "labels": reading.labels,
            }
        )
    if not rows:
        return Packed(b"", 0, skipped)
    body = orjson.dumps(rows, default=_plain)[1:-1].replace(_ROW_SEPARATOR, _LINE_SEPARATOR)
    return Packed(body + b"\n", len(rows), skipped)


def _plain(obj: Any) -> dict[str, str] | float:
    """What orjson does not encode natively: read-only label mappings, numpy floats."""
    if isinstance(obj, Mapping):
        return dict(obj)
    return float(obj)


def unpack(payload: bytes) -> list[Reading]:
    """Decode a message body written by `pack`."""
    readings = []
    for line in payload.splitlines():
        row = orjson.loads(line)
        readings.append(
            Reading(
                timestamp_us=parse_timestamp(row["timestamp"]),
                device_id=row["device_id"],
                metric_id=row["metric_id"],
                value=float(row["value"]),
                labels=row["labels"],
            )
        )
    return readings
