"""The audit of reads: every read of a job by another than its owner (support, admin, a
scheduler, a project's manager) is published as one JSON record to the `audit` topic
(JOBSCOPE_AUDIT_TOPIC), which ClickHouse stores in `audit_log` (clickhouse/migrations/0023),
readable by its admin user only.

A record that Kafka does not take is logged; the read is answered all the same.
"""

from __future__ import annotations

import logging

import orjson

from api.infra.kafka import KafkaPublisher, KafkaUnavailable
from api.infra.params import iso
from api.infra.tokens import Principal
from api.schemas import Job
from api.scope import now

log = logging.getLogger("jobscope.api.audit")


def record_of(who: Principal, route: str, job: Job) -> bytes:
    """Who (user, role) read what (route, job id, site, the job's user and project) when."""
    return orjson.dumps(
        {
            "at": iso(now()),
            "user": who.user,
            "role": who.role.value,
            "route": route,
            "job_id": job.job_id,
            "site": job.site or "",
            "job_user": job.user or "",
            "job_project": job.project or "",
        }
    )


class Recorder:
    def __init__(self, publisher: KafkaPublisher, topic: str) -> None:
        self.publisher = publisher
        self.topic = topic

    def record(self, who: Principal, route: str, job: Job) -> None:
        try:
            self.publisher.publish(self.topic, job.job_id, record_of(who, route, job))
        except KafkaUnavailable as exc:
            log.error(
                "audit: the read of job %s by %s (%s) on %s was not recorded: %s",
                job.job_id,
                who.user,
                who.role.value,
                route,
                exc,
            )
