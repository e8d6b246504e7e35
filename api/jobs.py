"""Reading and writing jobs. Writes go through the `jobs` Kafka topic, the one path every
job takes into ClickHouse (the scheduler hooks call the API; other tools may produce to the
topic directly), and wait until the new version is queryable."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from datetime import UTC, datetime

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError as ClickHouseDatabaseError
from clickhouse_connect.driver.exceptions import OperationalError
from pydantic import ValidationError

from api import ondemand
from api.infra.clickhouse import ClickHouseProvider, ClickHouseUnavailable
from api.infra.config import ApiSettings
from api.infra.errors import NotFound, ParameterError, error_parameter
from api.infra.kafka import KafkaPublisher, KafkaUnavailable
from api.infra.params import iso
from api.queries.jobs import ALL_JOBS, Condition, job_version_visible, select_job
from api.schemas import Job, JobCreate, JobFields
from kafka import jobs as jobs_topic
from kafka.jobs import JobMessage

_VISIBLE_POLL_S = 0.05
log = logging.getLogger("jobscope.api")


def get_job(
    client: Client, job_id: str, site: str | None = None, visible: Condition = ALL_JOBS
) -> Job:
    """The job `job_id` at `site`; without a site, the one job of that id, which must be at
    a single site (a central jobscope holds several sites' jobs, whose ids may clash). Only
    the `visible` jobs are looked at: another is not found (api/visibility.py)."""
    jobs = [Job(**row) for row in select_job(client, job_id, site, visible)]
    if not jobs:
        raise NotFound(f"no job {job_id!r}" + ("" if site is None else f" at site {site!r}"))
    if len(jobs) > 1:
        sites = ", ".join(repr(job.site) for job in jobs)
        raise ParameterError("site", f"job {job_id!r} exists at sites {sites}: give one")
    return jobs[0]


def merged(current: Job, patch: JobFields) -> JobCreate:
    """The whole job after a PATCH: the fields it sets replace the stored ones. A result
    that is not a valid job (a required field set to null, end before start) is a 400
    naming the field."""
    fields = {**current.model_dump(exclude={"updated_at"}), **patch.model_dump(exclude_unset=True)}
    try:
        return JobCreate(**fields)
    except ValidationError as exc:
        raise ParameterError(*error_parameter(exc.errors()[0])) from None


def job_message(job: JobCreate, updated_at: datetime) -> JobMessage:
    """The jobs topic's message of `job` as written at `updated_at` (naive UTC): what the
    HTTP side leaves unset is empty."""
    return JobMessage(
        job_id=job.job_id,
        user=job.user or "",
        project=job.project or "",
        queue=job.queue or "",
        nodes=job.nodes or [],
        start=job.start,
        end=job.end,
        state=job.state.value,
        site=job.site or "",
        labels=job.labels or {},
        updated_at=iso(updated_at),
        allocations={
            node: entry.model_dump(exclude_none=True)
            for node, entry in (job.allocations or {}).items()
        },
    )


def write_job(
    job: JobCreate, publisher: KafkaPublisher, clickhouse: ClickHouseProvider, settings: ApiSettings
) -> tuple[Job, bool]:
    """Publish the whole job as its newest version; return it and whether it became
    queryable within `job_visible_timeout_s`. Once Kafka has it, it is accepted even if
    ClickHouse is down: it is ingested when ClickHouse is back."""
    updated_at = datetime.now(UTC).replace(tzinfo=None)
    message = job_message(job, updated_at)
    publisher.publish(settings.jobs_topic, jobs_topic.key(message), jobs_topic.encode(message))
    try:
        ondemand.follow_job(publisher, settings, job)
    except KafkaUnavailable as exc:
        log.error("job %s written; its on-demand activation was not updated: %s", job.job_id, exc)
    deadline = time.monotonic() + settings.job_visible_timeout_s
    try:
        client = clickhouse.get()
        while not job_version_visible(client, job.job_id, message.site, updated_at):
            if time.monotonic() >= deadline:
                return Job(**asdict(message)), False
            time.sleep(_VISIBLE_POLL_S)
        return get_job(client, job.job_id, message.site), True
    except (ClickHouseUnavailable, ClickHouseDatabaseError, OperationalError) as exc:
        log.warning("job %s accepted; ClickHouse cannot show it yet: %s", job.job_id, exc)
        return Job(**asdict(message)), False
