"""The on-demand topic's message: an activation of optional metrics on some devices.

Keyed by the activation's id (`job/<job_id>` for a job's), a JSON object; an empty value
(a tombstone) removes the activation. The API writes it with `encode`; the producers read it
with `decode` (producers/ondemand.py), as they read what any other Kafka client writes.
Specified in kafka/WIRE_FORMAT.md, "The on-demand topic", with vectors in
`json_vectors.json`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class OnDemandMessage:
    """One activation; fields in wire order."""

    id: str
    """The activation's id, also the message key."""
    job_id: str | None
    devices: list[str]
    """Device ids, a job's nodes: the devices measuring them (`_device_alias`) follow."""
    metrics: str | None
    """An RE2 regular expression matched from the start of a metric name; None: every
    optional metric."""
    until: str | float | None
    """When it ends: ISO 8601 with an offset (what the API writes) or Unix seconds; None:
    until removed."""

    def until_us(self) -> int | None:
        """`until` in UTC microseconds since the epoch."""
        if self.until is None:
            return None
        if isinstance(self.until, int | float):
            return int(self.until * 1_000_000)
        return int(_aware(self.until).timestamp() * 1_000_000)


def activation_key(job_id: str) -> str:
    """The id, and key, of a job's activation."""
    return f"job/{job_id}"


def encode(active: OnDemandMessage) -> bytes:
    """The message value (keyed by `active.id`): a JSON object of every field."""
    return orjson.dumps(active)


def decode(key: str, value: bytes) -> OnDemandMessage:
    """The activation of a message (not a tombstone) of key `key`, its id; ValueError naming
    the field if malformed. Only `devices` is required; other keys are ignored, and so is
    `id` (the key is the id)."""
    try:
        document: Any = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    devices = document.get("devices")
    if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        raise ValueError("devices: a list of device ids is required")
    metrics = document.get("metrics")
    if metrics is not None and not isinstance(metrics, str):
        raise ValueError("metrics: a regular expression or null")
    job_id, until = document.get("job_id"), document.get("until")
    active = OnDemandMessage(key, None if job_id is None else str(job_id), devices, metrics, until)
    try:
        if not isinstance(until, str | int | float | None):
            raise TypeError(until)
        active.until_us()
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"until: not a time: {until!r}") from None
    return active


def _aware(text: str) -> datetime:
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError("a time zone is required")
    return parsed
