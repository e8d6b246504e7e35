"""The jobs topic's message: one version of one job, a JSON object keyed by its job id.

The API writes it (`POST/PATCH /api/jobs`) with `encode`; ClickHouse reads it with the
Kafka-engine table `jobs_queue`, whose columns are this model's fields
(tests/kafka/test_job_messages.py); `decode` reads it back. Specified in
kafka/WIRE_FORMAT.md, "The jobs topic", with vectors in `json_vectors.json`.
`allocations` (kafka/allocations.py) is written only when the job has some, so a job
without them is the same bytes as before the field existed, and a message without it is a
whole-node job.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

import orjson

from kafka import allocations as allocation

STATES = ("waiting", "running", "terminated", "error")
"""A job's states, as the API and ClickHouse's `jobs_queue` views accept them."""


@dataclass(frozen=True, slots=True)
class JobMessage:
    """A whole job as its newest version; fields in wire order."""

    job_id: str
    user: str
    project: str
    queue: str
    nodes: list[str]
    start: str | None
    """ISO 8601 with its offset (the API writes `2026-11-23T09:00:00.000000+00:00`); None
    while unknown."""
    end: str | None
    """As `start`; None while the job runs."""
    state: str
    """One of `STATES`."""
    site: str
    labels: dict[str, str]
    updated_at: str
    """When this version was written, as `start`: the newest version of a job wins."""
    allocations: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per node, what the job was given inside it (kafka/allocations.py, canonical form);
    absent or empty: whole nodes."""


FIELDS = tuple(f.name for f in fields(JobMessage))


def key(job: JobMessage) -> str:
    """The message key (its UTF-8 bytes): the job id, so the topic is compacted per job."""
    return job.job_id


def encode(job: JobMessage) -> bytes:
    """The message value: a JSON object of every field, in field order (`allocations` only
    when not empty)."""
    if job.allocations:
        return orjson.dumps(job)
    return orjson.dumps({name: getattr(job, name) for name in FIELDS[:-1]})


def decode(value: bytes) -> JobMessage:
    """The job of a message value written by `encode`; ValueError naming the field if it is
    not one (a missing, unknown or mistyped field, an unknown state, a time that is not
    ISO 8601)."""
    document = _object(value)
    unknown = sorted(set(document) - set(FIELDS))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a field of a job message")
    for name in FIELDS[:-1]:
        if name not in document:
            raise ValueError(f"{name}: missing")
    for name in ("job_id", "user", "project", "queue", "state", "site"):
        _check(name, isinstance(document[name], str), "a string")
    _check("job_id", document["job_id"] != "", "a non-empty string")
    _check("state", document["state"] in STATES, f"one of {', '.join(STATES)}")
    nodes = document["nodes"]
    _check("nodes", isinstance(nodes, list) and all(isinstance(n, str) for n in nodes), "a list")
    labels = document["labels"]
    _check(
        "labels",
        isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values()),
        "an object of strings",
    )
    start, end = (_time(name, document[name], nullable=True) for name in ("start", "end"))
    _check("end", start is None or end is None or start <= end, "a time after start")
    _time("updated_at", document["updated_at"], nullable=False)
    try:
        document["allocations"] = allocation.normalized(document.get("allocations", {}), nodes)
    except ValueError as exc:
        raise ValueError(f"allocations: {exc}") from None
    return JobMessage(**document)


def _object(value: bytes) -> dict[str, Any]:
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    return document


def _check(name: str, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{name}: {what} is required")


def _time(name: str, value: object, nullable: bool) -> datetime | None:
    if value is None and nullable:
        return None
    what = "an ISO 8601 time with its offset" + (" or null" if nullable else "")
    _check(name, isinstance(value, str), what)
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        raise ValueError(f"{name}: {what} is required, not {value!r}") from None
    _check(name, parsed.tzinfo is not None, what)
    return parsed
