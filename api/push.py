"""Readings pushed by users (`POST /api/metrics`): parsed, validated as a whole, authorised
per device and time, then published to the readings topic in the producers' wire format.

What a pusher may write: readings of the nodes of its own running jobs, timed inside those
jobs (from their start to their end, or to now + `push_max_ahead_s` while they run), never a
label starting with `_` (reserved: `_device_alias` would sum the values into the power and
energy of every job on the aliased node; the others are jobscope's own). An agent token
pushes for the nodes its token declares at any time within the global window; an admin token
for any device and time within it; neither a reserved label.

A batch is all-or-nothing up to Kafka: every reading is checked before the first message
is sent. Kafka has no transaction here, so if it fails half-way the messages it had
acknowledged are in (the 503 says how many).
"""

from __future__ import annotations

import logging
import math
import re
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson
from starlette.exceptions import HTTPException

from api.infra.clickhouse import ClickHouseProvider
from api.infra.config import ApiSettings
from api.infra.errors import Forbidden, ParameterError, TooLarge
from api.infra.kafka import KafkaPublisher, KafkaUnavailable
from api.infra.params import TIME_HELP, device_name, iso, to_time, to_us
from api.infra.push_limits import PushLimits
from api.infra.tokens import Principal, Role
from api.queries.push import running_job_spans
from api.scope import now
from kafka.message import pack_by_device
from kafka.reading import Reading

NDJSON = "application/x-ndjson"
SOURCE_LABEL = "source"
RESERVED_PREFIX = "_"
"""Labels starting with it are jobscope's and the operator's: refused in a push."""
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
log = logging.getLogger("jobscope.api")


def parse_body(body: bytes, content_type: str) -> list[Any]:
    """The items of a push: a JSON object or array, or NDJSON (one object per line)."""
    if content_type.split(";", 1)[0].strip().lower() == NDJSON:
        items = []
        for number, line in enumerate(body.splitlines(), 1):
            if line.strip():
                try:
                    items.append(orjson.loads(line))
                except orjson.JSONDecodeError as exc:
                    raise ParameterError("body", f"line {number} is not JSON ({exc})") from None
        return items
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ParameterError(
            "body", f"expected a reading or an array of readings in JSON, or NDJSON ({exc})"
        ) from None
    return data if isinstance(data, list) else [data]


def decompressed(body: bytes, encoding: str, limit: int) -> bytes:
    """A body as sent with `Content-Encoding: encoding`: gzip decompressed to at most `limit`
    bytes (413 beyond, however small it was on the wire), else as it came; 415 for another
    encoding, 400 for corrupt or truncated gzip. For the standard protocols that may send gzip
    (line protocol, OTLP)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "gzip":
        raise HTTPException(415, f"Content-Encoding {encoding!r}: gzip or none")
    inflater = zlib.decompressobj(wbits=31)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ParameterError("body", f"corrupt gzip: {exc}") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise TooLarge(f"gzip body over {limit} bytes once decompressed")
    if not inflater.eof:
        raise ParameterError("body", "truncated gzip")
    return data


@dataclass(frozen=True)
class Window:
    """The times a push may carry (JOBSCOPE_PUSH_MAX_AGE_S, JOBSCOPE_PUSH_MAX_AHEAD_S)."""

    earliest: datetime
    latest: datetime


def validate(items: list[Any], settings: ApiSettings, who: Principal) -> list[Reading]:
    """Every item as a Reading labelled `source` (`source(who)`), its device id without domain
    suffix (as jobs and queries name nodes); the first bad one is a
    ParameterError naming it (`readings[3].value`), a batch too large is TooLarge."""
    if len(items) > settings.push_max_readings:
        raise TooLarge(
            f"{len(items)} readings in one push; at most {settings.push_max_readings} "
            "(JOBSCOPE_PUSH_MAX_READINGS): split the batch"
        )
    if not items:
        raise ParameterError("body", "no readings")
    accepted = window(settings)
    label = source(who)
    return [
        _reading(f"readings[{i}]", item, settings, accepted, label) for i, item in enumerate(items)
    ]


@dataclass
class Batch:
    """The readings of a write in a standard protocol (remote_write, line protocol), and what
    it carried that is not stored, counted by reason (`SKIPPED` of its protocol's module)."""

    readings: list[Reading] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)


def window(settings: ApiSettings) -> Window:
    """The times a push may carry, from now."""
    received = now()
    return Window(
        received - timedelta(seconds=settings.push_max_age_s),
        received + timedelta(seconds=settings.push_max_ahead_s),
    )


def source(who: Principal) -> str:
    """The `source` label of what `who` pushes, whatever the protocol: `agent:<name>` for a
    site's agent (measurements, as a producer's: summaries and footprints count them), else
    `user:<name>` (a user's own values, kept apart: api/queries/metrics.py PUSHED)."""
    return f"{'agent' if who.role is Role.AGENT else 'user'}:{who.user}"


def _reading(where: str, item: Any, settings: ApiSettings, window: Window, source: str) -> Reading:
    if not isinstance(item, dict):
        raise ParameterError(
            where, "expected an object with timestamp, device_id, metric_id, value"
        )
    missing = [k for k in ("timestamp", "device_id", "metric_id", "value") if k not in item]
    if missing:
        raise ParameterError(f"{where}.{missing[0]}", "missing")
    value = item["value"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ParameterError(f"{where}.value", f"{value!r} is not a finite number")
    return Reading(
        _timestamp_us(f"{where}.timestamp", item["timestamp"], window),
        check_device_id(f"{where}.device_id", item["device_id"], settings),
        check_metric_id(f"{where}.metric_id", item["metric_id"], settings),
        float(value),
        check_labels(f"{where}.labels", item.get("labels"), settings, source),
    )


def check_device_id(where: str, device_id: Any, settings: ApiSettings) -> str:
    """A pushed device id, without its domain suffix (as jobs and queries name nodes)."""
    if not isinstance(device_id, str) or not device_id.strip():
        raise ParameterError(where, "expected a non-empty string")
    _check_length(where, device_id, settings.push_max_device_id_chars, "DEVICE")
    return device_name(device_id.strip())


def check_metric_id(where: str, metric_id: Any, settings: ApiSettings) -> str:
    """A pushed metric name: Prometheus' convention, at most push_max_metric_id_chars."""
    if isinstance(metric_id, str):
        _check_length(where, metric_id, settings.push_max_metric_id_chars, "METRIC")
    if not isinstance(metric_id, str) or not _METRIC_NAME.match(metric_id):
        raise ParameterError(
            where, f"{metric_id!r} is not a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)"
        )
    return metric_id


def _check_length(where: str, text: str, limit: int, name: str) -> None:
    if len(text) > limit:
        raise ParameterError(
            where, f"{len(text)} characters; at most {limit} (JOBSCOPE_PUSH_MAX_{name}_ID_CHARS)"
        )


def _timestamp_us(where: str, value: Any, window: Window) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ParameterError(where, f"{value!r} is not {TIME_HELP}")
    try:
        t = to_time(value)
    except (ValueError, OverflowError, OSError):
        raise ParameterError(where, f"{value!r} is not {TIME_HELP}") from None
    return check_in_window(where, repr(value), to_us(t), window)


def check_in_window(where: str, shown: str, timestamp_us: int, window: Window) -> int:
    """`timestamp_us` if it lies in the window; a ParameterError showing `shown` otherwise."""
    if not to_us(window.earliest) <= timestamp_us <= to_us(window.latest):
        raise ParameterError(
            where,
            f"{shown} is outside the accepted window {window.earliest.isoformat()}Z .. "
            f"{window.latest.isoformat()}Z (JOBSCOPE_PUSH_MAX_AGE_S, JOBSCOPE_PUSH_MAX_AHEAD_S)",
        )
    return timestamp_us


def check_labels(where: str, labels: Any, settings: ApiSettings, source: str) -> dict[str, str]:
    """A pushed reading's labels, checked (none reserved), with `source` set."""
    if labels is None:
        labels = {}
    if not isinstance(labels, dict):
        raise ParameterError(where, "expected an object of string values")
    kept = {k: v for k, v in labels.items() if k != SOURCE_LABEL}
    if len(kept) > settings.push_max_labels:
        raise ParameterError(
            where,
            f"{len(kept)} labels; at most {settings.push_max_labels} (JOBSCOPE_PUSH_MAX_LABELS)",
        )
    limit = settings.push_max_label_chars
    for key, value in kept.items():
        if isinstance(key, str) and key.startswith(RESERVED_PREFIX):
            raise ParameterError(
                f"{where}.{key[:limit]}",
                f"labels starting with {RESERVED_PREFIX!r} are reserved (set by jobscope and "
                "the operator's device entries, never by a push)",
            )
        if not _LABEL_NAME.match(key) or len(key) > limit:
            raise ParameterError(
                f"{where}.{key}", f"not a label name ([a-zA-Z_][a-zA-Z0-9_]*, {limit} characters)"
            )
        if not isinstance(value, str) or len(value) > limit:
            raise ParameterError(
                f"{where}.{key}", f"expected a string of at most {limit} characters"
            )
    return {**kept, SOURCE_LABEL: source}


def _spans(
    clickhouse: ClickHouseProvider, user: str, ahead_s: float
) -> dict[str, list[tuple[int, int]]]:
    """Node -> [start, end] (µs) of each running job of `user` on it: end is the job's, or
    now + `ahead_s` while it has none (the earlier of both: nothing lands ahead of that)."""
    latest = to_us(now() + timedelta(seconds=ahead_s))
    spans: dict[str, list[tuple[int, int]]] = {}
    rows = running_job_spans(clickhouse.get(), user)
    for node, start, end in rows:
        if start is not None:
            stop = latest if end is None else min(latest, end)
            spans.setdefault(device_name(node), []).append((start, stop))
    return spans


def authorise(
    clickhouse: ClickHouseProvider,
    who: Principal,
    readings: Sequence[Reading],
    settings: ApiSettings,
) -> None:
    """Admin: any device and time (the global window, checked before). Agent: the nodes its
    token declares (`nodes`), at any time of that window. Pusher: only the nodes of the user's
    own running jobs (Forbidden names the first other device), and only inside those jobs'
    spans (ParameterError names the first reading outside)."""
    if who.role is Role.ADMIN:
        return
    if who.role is Role.AGENT:
        _agent_devices(who, readings)
        return
    if who.role is not Role.PUSHER:
        raise Forbidden(
            f"a token with role pusher, agent or admin is required, not {who.role.value}"
        )
    spans = _spans(clickhouse, who.user, settings.push_max_ahead_s)
    for device in dict.fromkeys(r.device_id for r in readings):
        if device not in spans:
            raise Forbidden(f"device {device!r} is not a node of a running job of {who.user!r}")
    for i, r in enumerate(readings):
        if not any(start <= r.timestamp_us <= end for start, end in spans[r.device_id]):
            raise ParameterError(f"readings[{i}].timestamp", _outside(r, who.user, spans))


def _agent_devices(who: Principal, readings: Sequence[Reading]) -> None:
    """An agent pushes for the nodes its token declares, at any time of the push window."""
    declared = {device_name(node) for node in who.nodes}
    for device in dict.fromkeys(r.device_id for r in readings):
        if device not in declared:
            raise Forbidden(f"device {device!r} is not a node of agent {who.user!r}'s token")


def _outside(reading: Reading, user: str, spans: dict[str, list[tuple[int, int]]]) -> str:
    def at(us: int) -> str:
        return iso(datetime(1970, 1, 1) + timedelta(microseconds=us))

    jobs = ", ".join(f"{at(s)} .. {at(e)}" for s, e in sorted(spans[reading.device_id]))
    return (
        f"{at(reading.timestamp_us)} is outside the running jobs of {user!r} on "
        f"{reading.device_id!r} ({jobs}; JOBSCOPE_PUSH_MAX_AHEAD_S): a pusher writes only "
        "inside its own jobs"
    )


def limit_key(who: Principal) -> tuple[str, str] | None:
    """Whose limits a push counts against: a pusher token's (user, jti); None for an admin
    (unlimited, as its rights are)."""
    return None if who.role is Role.ADMIN else (who.user, who.jti)


def push(
    readings: list[Reading],
    who: Principal,
    clickhouse: ClickHouseProvider,
    publisher: KafkaPublisher,
    settings: ApiSettings,
    limits: PushLimits,
) -> int:
    """Authorise, count the new series against the token's limit, then publish (one message
    per device, keyed by its id, as the producers send them) and wait for Kafka's
    acknowledgement of every message. The JSON topic's copy, if any, follows: best effort,
    a failure is logged, the push stays accepted."""
    authorise(clickhouse, who, readings, settings)
    key = limit_key(who)
    if key is not None:
        limits.admit_series(key, readings)
    packed = pack_by_device(readings, bool(settings.json_topic))
    publisher.publish_batch(settings.readings_topic, [(d, p.payload) for d, p in packed])
    if settings.json_topic:
        try:
            publisher.publish_batch(settings.json_topic, [(d, p.json) for d, p in packed])
        except KafkaUnavailable as exc:
            log.warning("pushed readings accepted; their JSON topic copy was lost: %s", exc)
    return len(readings)
