"""On-demand metrics of jobs: the activations the API publishes on the on-demand topic.

The topic's message is kafka/ondemand.py's (the producers read it so); a job's activation
is keyed `job/<job_id>`, covers the job's nodes (the producers add the devices that measure
them, `_device_alias`), and lasts until the job ends: every job write that ends the job
publishes a tombstone for it. Two ways in:
- `POST /api/jobs/{id}/on-demand` with a metric pattern;
- Kwollect's way: an OAR job of type `monitor` or `monitor=<regexp>` (the OAR hook sends the
  job types as the label `types`), activated when the job is written as running.
A pattern is RE2's, as the producers run it (kafka/patterns.py: linear in the name):
a longer one than `JOBSCOPE_ONDEMAND_MAX_PATTERN_CHARS`, or one RE2 refuses, is a 400 (a
`monitor=` type: the job is written, not activated, and the API logs why).
"""

from __future__ import annotations

import logging
import re

from api.infra.config import ApiSettings
from api.infra.errors import ParameterError
from api.infra.kafka import KafkaPublisher
from api.infra.params import iso
from api.schemas import Job, JobCreate, JobState, OnDemand
from api.scope import now
from kafka.ondemand import OnDemandMessage, activation_key, encode
from kafka.patterns import PatternError, prefix_matcher

MONITOR_TYPE = re.compile(r"^monitor(?:=(.*))?$")
log = logging.getLogger(__name__)


def monitor_types(labels: dict[str, str] | None) -> tuple[bool, str | None]:
    """Whether the OAR job types in `labels["types"]` ask for on-demand metrics, and which:
    a regexp (the alternatives of several `monitor=` types), or None for every metric
    (`monitor` alone)."""
    types = (labels or {}).get("types", "")
    patterns = [m[1] for t in types.split(",") if (m := MONITOR_TYPE.match(t.strip()))]
    if not patterns or any(not p for p in patterns):
        return bool(patterns), None
    return True, "|".join(f"(?:{p})" for p in patterns)


def check_pattern(parameter: str, pattern: str | None, settings: ApiSettings) -> None:
    """400 naming `parameter` if the producers would refuse `pattern`: too long, or not
    RE2's."""
    if pattern is None:
        return
    most = settings.ondemand_max_pattern_chars
    if len(pattern) > most:
        raise ParameterError(
            parameter,
            f"{len(pattern)} characters, at most {most} (JOBSCOPE_ONDEMAND_MAX_PATTERN_CHARS)",
        )
    try:
        prefix_matcher(pattern, most)
    except PatternError as exc:
        raise ParameterError(parameter, str(exc)) from None


def ended(job: JobCreate | Job) -> bool:
    if job.state in (JobState.TERMINATED, JobState.ERROR):
        return True
    return job.end is not None and job.end <= iso(now())


def activation(job: JobCreate | Job, metrics: str | None, until: str | None) -> OnDemand:
    """The activation of `job`'s nodes: until `until`, or the job's end if it is known."""
    ends = [t for t in (until, job.end) if t is not None]
    return OnDemand(
        id=activation_key(job.job_id),
        job_id=job.job_id,
        devices=list(job.nodes or []),
        metrics=metrics,
        until=min(ends) if ends else None,
    )


def message(active: OnDemand) -> OnDemandMessage:
    """The on-demand topic's message of the activation the HTTP side answers."""
    return OnDemandMessage(**active.model_dump())


def publish(publisher: KafkaPublisher, settings: ApiSettings, active: OnDemand) -> None:
    written = message(active)
    publisher.publish(settings.ondemand_topic, written.id, encode(written))


def withdraw(publisher: KafkaPublisher, settings: ApiSettings, job_id: str) -> None:
    """The tombstone of a job's activation (harmless when it has none)."""
    publisher.publish(settings.ondemand_topic, activation_key(job_id), None)


def follow_job(publisher: KafkaPublisher, settings: ApiSettings, job: JobCreate) -> None:
    """After a job write: switch its activation off when the job ended; switch it on when it
    runs with an OAR `monitor` type."""
    if ended(job):
        withdraw(publisher, settings, job.job_id)
        return
    wanted, pattern = monitor_types(job.labels)
    if wanted and job.state is JobState.RUNNING and job.nodes:
        try:
            check_pattern("labels.types", pattern, settings)
        except ParameterError as exc:
            log.error("job %s written; its monitor= type is not activated: %s", job.job_id, exc)
            return
        publish(publisher, settings, activation(job, pattern, None))
