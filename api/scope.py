"""From request parameters to a Selection: Kwollect's rules for devices and time, a job's
scope (its nodes and the devices that measure them, over [start, end]; end = now while it
runs; bounds inclusive)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import overload

from clickhouse_connect.driver.client import Client

from api.infra.params import NamePatterns, to_time
from api.queries.metrics import Selection, aliased_devices
from api.schemas import Job
from kafka.allocations import Allocated


@dataclass(frozen=True)
class Asked:
    """The selection parameters as the request gave them (parsed, not yet resolved)."""

    devices: tuple[str, ...]
    metrics: NamePatterns
    labels: dict[str, str]
    start: datetime | None
    end: datetime | None
    site: str | None = None


EVERYTHING = Asked(devices=(), metrics=NamePatterns(), labels={}, start=None, end=None)


def now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def device_selection(asked: Asked, window: timedelta) -> Selection:
    """Kwollect's defaults: a missing bound is the other one -/+ the window; neither is the
    window up to now."""
    start, end = asked.start, asked.end
    if end is None:
        end = start + window if start is not None else now()
    if start is None:
        start = end - window
    return Selection(asked.devices, start, end, asked.metrics, asked.labels, site=asked.site)


def job_span(job: Job) -> tuple[datetime, datetime] | None:
    """[start, end] of a job (end = now while it runs); None before it starts."""
    if job.start is None:
        return None
    return to_time(job.start), to_time(job.end) if job.end is not None else now()


def job_selection(job: Job, asked: Asked) -> Selection | None:
    """The job's scope, narrowed by the request's devices, metrics, labels and times (never
    widened: a time outside the job is clamped to it), at the job's site (when it has one),
    per-GPU and per-CPU readings of its nodes kept only for what it was allocated. None when
    nothing can match."""
    span = job_span(job)
    if span is None or not job.nodes:
        return None
    start = max(span[0], asked.start) if asked.start else span[0]
    end = min(span[1], asked.end) if asked.end else span[1]
    if start > end:
        return None
    return Selection(
        tuple(job.nodes),
        start,
        end,
        asked.metrics,
        asked.labels,
        measured=True,
        only=asked.devices,
        site=job.site or None,
        allocated=job_allocated(job),
    )


def job_allocated(job: Job) -> Allocated | None:
    """The GPUs and CPU ids a job holds per node; None for a whole-node job."""
    return Allocated.of(
        {node: entry.model_dump(exclude_none=True) for node, entry in job.allocations.items()}
    )


@overload
def with_aliases(client: Client, selection: Selection) -> Selection: ...
@overload
def with_aliases(client: Client, selection: Selection | None) -> Selection | None: ...
def with_aliases(client: Client, selection: Selection | None) -> Selection | None:
    """The selection with the devices that measure its devices during its span: one small
    query, so that a selection without any reads no alias branch."""
    if selection is None or not selection.devices:
        return selection
    aliased = aliased_devices(client, list(selection.devices), selection.start, selection.end)
    return replace(selection, aliased=aliased)
