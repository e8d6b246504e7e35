"""Influx line protocol (`POST /api/v2/write`, `POST /api/write`: InfluxDB 2's and 1's
paths), as Telegraf, cc-metric-collector and InfluxDB clients send it, turned into the
readings of a push (api/push.py).

    cpu,host=node-1,cpu=cpu0 usage_user=12.5,usage_system=3i 1700000000000000000

- A line is `measurement[,tag=value...] field=value[,field=value...] [timestamp]`, with the
  protocol's escapes (`\\,`, `\\ `, `\\=`; `\\"` and `\\\\` in strings). Each numeric field is a
  reading named `<measurement>_<field>` (`<measurement>` alone for a field named `value`,
  as Telegraf's Prometheus output names them), characters outside `[a-zA-Z0-9_:]` as `_`.
  Floats, integers (`3i`), unsigned (`3u`) and booleans (1, 0) are values; string fields are
  skipped and counted, as are non-finite values.
- The `host` tag (Telegraf's), or an `instance` tag, names the device through
  api/push_devices.py, as remote_write's `instance` does; other tags are the readings'
  labels, checked as a push's (none starting with `_`).
- Timestamps in the request's `precision` (v2: ns, us, ms, s; v1: n, u, ms, s, m, h;
  nanoseconds by default); a line without one is stamped with the time it arrived.
- The body is bounded before it is read (JOBSCOPE_PUSH_MAX_BODY_BYTES); a gzip body
  (`Content-Encoding: gzip`) is decompressed to at most that many bytes (a bomb is a 413);
  at most JOBSCOPE_PUSH_MAX_READINGS fields. A line that does not parse is a 400 naming it:
  nothing of the write is kept.
"""

from __future__ import annotations

import math
import re

from api import push
from api.infra.config import ApiSettings
from api.infra.errors import ParameterError, TooLarge
from api.infra.params import to_us
from api.infra.tokens import Principal
from api.push_devices import PushDevices
from api.scope import now
from kafka.reading import Reading

PRECISIONS_US = {
    "ns": 0.001,
    "n": 0.001,
    "us": 1,
    "u": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "h": 3_600_000_000,
}
"""Microseconds per unit of each `precision` (InfluxDB 2's and 1's names)."""
_TRUE = frozenset({"t", "T", "true", "True", "TRUE"})
_FALSE = frozenset({"f", "F", "false", "False", "FALSE"})
_NOT_NAME = re.compile(r"[^a-zA-Z0-9_:]")
_INTEGER = re.compile(r"^[+-]?[0-9]+[iu]$")
_STAMP = re.compile(r"^-?[0-9]{1,19}$")


SKIPPED = ("strings", "non_finite")
"""What a write may carry that is not stored: string fields, non-finite values."""


def text_of(body: bytes, encoding: str, limit: int) -> str:
    """The body as text: gzip decompressed to at most `limit` bytes (413 beyond), else as
    sent; 415 for another encoding, 400 for a truncated gzip or text that is not UTF-8."""
    data = push.decompressed(body, encoding, limit)
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise ParameterError("body", f"not UTF-8 at byte {exc.start}") from None


def parse(
    body: bytes,
    encoding: str,
    precision: str,
    settings: ApiSettings,
    who: Principal,
    devices: PushDevices,
) -> push.Batch:
    """The readings of a line protocol body sent with `Content-Encoding: encoding` (run in a
    worker thread: decompressing and parsing take CPU); 400 naming the first unusable line,
    413 past JOBSCOPE_PUSH_MAX_READINGS fields: nothing of it is kept."""
    text = text_of(body, encoding, settings.push_max_body_bytes)
    if precision not in PRECISIONS_US:
        raise ParameterError("precision", f"{precision!r}: one of {', '.join(PRECISIONS_US)}")
    unit_us = PRECISIONS_US[precision]
    batch = push.Batch()
    window = push.window(settings)
    source = push.source(who)
    arrived_us = to_us(now())
    fields = 0
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"line {number}"
        try:
            measurement, tags, values, stamp = split_line(line)
        except ValueError as exc:
            raise ParameterError(where, f"{exc}: {line[:120]!r}") from None
        fields += len(values)
        if fields > settings.push_max_readings:
            raise TooLarge(
                f"over {settings.push_max_readings} fields (JOBSCOPE_PUSH_MAX_READINGS): "
                "split the write"
            )
        device, labels = devices.place(where, tags, (), settings, source)
        at = arrived_us
        if stamp is not None:
            at = push.check_in_window(where, stamp, _timestamp_us(where, stamp, unit_us), window)
        for name, text_value in values:
            try:
                value = _value(text_value)
            except ValueError:
                shown = f"{text_value[:40]!r} is not a number"
                raise ParameterError(f"{where}.{name}", shown) from None
            if value is None:
                batch.skipped["strings"] += 1
                continue
            if not math.isfinite(value):
                batch.skipped["non_finite"] += 1
                continue
            metric = push.check_metric_id(f"{where}.{name}", metric_id(measurement, name), settings)
            batch.readings.append(Reading(at, device, metric, value, labels))
    return batch


def metric_id(measurement: str, field_key: str) -> str:
    """`<measurement>_<field>` (`<measurement>` for a field named `value`), as a metric
    name: other characters as `_`, a leading digit after one."""
    name = measurement if field_key == "value" else f"{measurement}_{field_key}"
    name = _NOT_NAME.sub("_", name)
    return f"_{name}" if name[:1].isdigit() else name


def split_line(line: str) -> tuple[str, dict[str, str], list[tuple[str, str]], str | None]:
    """(measurement, tags, [(field, raw value)], raw timestamp or None); ValueError saying
    what is wrong. One pass over the line: escapes and quoted strings as the protocol has."""
    head, pos = _token(line, 0, " ", quotes=False)
    body, pos = _token(line, pos + 1, " ", quotes=True)
    stamp = line[pos + 1 :].strip() or None
    parts = _split(head, ",")
    measurement = _unescape(parts[0])
    if not measurement:
        raise ValueError("no measurement")
    tags = {}
    for part in parts[1:]:
        key, value = _pair(part, "tag")
        tags[key] = value
    if not body:
        raise ValueError("no field")
    values = [_pair(part, "field", raw=True) for part in _split(body, ",", quotes=True)]
    return measurement, tags, values, stamp


def _token(line: str, start: int, stop: str, quotes: bool) -> tuple[str, int]:
    """The text from `start` to the first unescaped `stop` (outside quotes), and its index."""
    pos, quoted = start, False
    while pos < len(line):
        c = line[pos]
        if c == "\\":
            pos += 2
            continue
        if quotes and c == '"':
            quoted = not quoted
        elif c == stop and not quoted:
            return line[start:pos], pos
        pos += 1
    if quoted:
        raise ValueError("unterminated string")
    return line[start:], len(line)


def _split(text: str, sep: str, quotes: bool = False) -> list[str]:
    parts, pos = [], 0
    while True:
        part, end = _token(text, pos, sep, quotes)
        parts.append(part)
        if end >= len(text):
            return parts
        pos = end + 1


def _pair(text: str, what: str, raw: bool = False) -> tuple[str, str]:
    key, end = _token(text, 0, "=", quotes=False)
    if end >= len(text) or not key:
        raise ValueError(f"a {what} that is not key=value")
    value = text[end + 1 :]
    return _unescape(key), value if raw else _unescape(value)


def _unescape(text: str) -> str:
    return re.sub(r"\\([,= \\\"])", r"\1", text)


def _value(text: str) -> float | None:
    """A field's number (booleans as 1 and 0); None for a string; ValueError otherwise."""
    if text.startswith('"'):
        return None
    if _INTEGER.match(text):
        return float(int(text[:-1]))
    if text in _TRUE:
        return 1.0
    if text in _FALSE:
        return 0.0
    return float(text)


def _timestamp_us(where: str, stamp: str, unit_us: float) -> int:
    if not _STAMP.match(stamp):
        raise ParameterError(where, f"timestamp {stamp[:40]!r} is not an integer")
    return int(int(stamp) * unit_us) if unit_us >= 1 else int(stamp) // 1000
