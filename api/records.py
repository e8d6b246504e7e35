"""Job records: a job's summary (with its energy, footprint and notes) computed once it has
ended and kept for ever in ClickHouse's `job_records` (clickhouse/migrations/0024), so that
the job answers the same after its raw readings expired.

- Computed by a refresher in the API process (`JOBSCOPE_RECORDS_INTERVAL_S`; 0: off) for
  every ended job (terminated or error, with an end time) without a record, again when the
  job was edited after its record (jobs.updated_at) or when readings of its scope were
  stored after it (api/queries/records.py says how that is known).
- Published to the `job-records` topic (the API's ClickHouse user is read-only), which
  ClickHouse consumes; a record over `JOBSCOPE_RECORDS_MAX_BYTES` sheds its per-series rows
  first (`message`), so that no record is refused for ever. A record's version is the
  newest of the job's `updated_at` and of its readings' ingest time: API replicas
  computing the same record write the same version, and `FINAL` keeps one row per job.
- A job that started longer ago than raw retention (`JOBSCOPE_RETENTION_DAYS`) is never
  recomputed from raw readings: an edit of it updates its record's metadata only.
- Served by GET /api/jobs/{id}/summary when the job has ended, the record is current (not
  older than the job's last edit, no reading stored after it, computed under this API's
  JOBSCOPE_ENERGY_SHARING: a site that changed it gets the new attribution from raw
  readings until they expire) and the request is the whole
  summary (no metrics, devices, labels or times asked: those are computed from raw readings).
  A job whose raw readings expired is served from its record whatever it asks.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from api import footprint
from api.infra.clickhouse import ClickHouseProvider
from api.infra.config import ApiSettings
from api.infra.kafka import KafkaPublisher, KafkaUnavailable
from api.infra.params import iso, to_time
from api.jobs import get_job
from api.queries import records as queries
from api.queries.metrics import Selection
from api.schemas import Job, JobState
from api.scope import EVERYTHING, Asked, job_selection, now, with_aliases
from api.sharing import Sharing

log = logging.getLogger("jobscope.api.records")

NOTES_KEPT = timedelta(days=7)
"""How long ClickHouse keeps the ingest notes of readings (rollup_pending's TTL)."""
SEVERITIES = ("", "info", "warning", "alert")
SHED = (("metrics",), ("energy", "energy_total", "energy_nodes", "footprint"))
"""What a record too large for `records_max_bytes` leaves out of its summary, step by step:
its per-series rows, then its per-node ones (the job's energy, notes and metadata stay)."""
_EPOCH = datetime(1970, 1, 1)


def ended(job: Job) -> bool:
    """A job whose record may be computed: over, with its end time known."""
    return job.end is not None and job.state in (JobState.TERMINATED, JobState.ERROR)


def raw_expired(job: Job, settings: ApiSettings) -> bool:
    """Whether some of the job's raw readings are past retention."""
    start = to_time(job.start) if job.start else None
    return start is not None and start < now() - timedelta(days=settings.retention_days)


def annotated(
    client: Client, settings: ApiSettings, job: Job, selection: Selection | None
) -> dict[str, Any]:
    """The summary from raw readings, with footprint and notes (api/footprint.py), a shared
    node's energy attributed by the site's policy (api/sharing.py)."""
    sharing = Sharing(settings.energy_sharing, settings.node_cpus)
    return footprint.annotated(client, job, selection, sharing)


def served(
    client: Client, settings: ApiSettings, job: Job, asked: Asked, selection: Selection | None
) -> dict[str, Any]:
    """The answer of GET /api/jobs/{id}/summary: from the job's record when it may answer
    (see the module's docstring), else from raw readings; `record` says which."""
    expired = raw_expired(job, settings)
    whole = replace(asked, site=None) == EVERYTHING
    if ended(job) and (whole or expired):
        found = queries.select_record(client, job.site, job.job_id)
        if found is not None:
            summary = orjson.loads(found["summary"])
            current = (
                not found["late"]
                and _naive(found["job_updated_at"]) >= to_time(job.updated_at)
                and _policy(summary) in (None, settings.energy_sharing)
            )
            if current or expired:
                summary["record"] = {
                    "computed_at": iso(_naive(found["computed_at"])),
                    "source": "record",
                    "version": found["version"],
                }
                return summary
    summary = annotated(client, settings, job, selection)
    summary["record"] = {"computed_at": None, "source": "raw", "version": None}
    return summary


def _policy(summary: dict[str, Any]) -> str | None:
    """The energy-sharing policy a record was computed under (None: it has no energy)."""
    return (summary.get("energy_job") or {}).get("policy")


def _naive(t: datetime) -> datetime:
    """A time as ClickHouse returns it (maybe with its UTC zone), as naive UTC."""
    return t.replace(tzinfo=None)


def _micros(t: datetime) -> int:
    return (t - _EPOCH) // timedelta(microseconds=1)


def compute(client: Client, settings: ApiSettings, job: Job) -> dict[str, Any]:
    """The record of an ended job: its columns, `summary` the JSON of its whole summary."""
    previous = queries.previous_record(client, job.site, job.job_id)
    selection = with_aliases(client, job_selection(job, EVERYTHING))
    devices = sorted({*job.nodes, *(selection.aliased if selection else ())})
    start, end = to_time(job.start or job.end or ""), to_time(job.end or "")
    updated = to_time(job.updated_at)
    if previous is not None and raw_expired(job, settings):
        summary = orjson.loads(previous["summary"])
        received = _naive(previous["last_received"])
        devices = previous["devices"]
    else:
        received = queries.newest_note(client, devices, start, end) or _EPOCH
        if previous is not None:
            received = max(received, _naive(previous["last_received"]))
        summary = annotated(client, settings, job, selection)
        summary["record"] = None
    energy = summary.get("energy_job") or {}
    notes = summary.get("notes") or []
    severity = max((n.get("severity", "") for n in notes), key=SEVERITIES.index, default="")
    return {
        "site": job.site,
        "job_id": job.job_id,
        "user": job.user or "",
        "project": job.project or "",
        "start_time": iso(start),
        "end_time": iso(end),
        "nodes": job.nodes,
        "devices": devices,
        "version": max(_micros(updated), _micros(received)),
        "job_updated_at": iso(updated),
        "computed_at": iso(now()),
        "last_received": iso(received),
        "energy_j": energy.get("joules") or 0.0,
        "energy_role": energy.get("role") or "",
        "coverage": energy.get("coverage") or 0.0,
        "notes": [n["id"] for n in notes],
        "severity": severity,
        "footprint": {
            f["metric_id"]: f["position"]
            for f in summary.get("footprint") or []
            if f.get("position") is not None
        },
        "summary": orjson.dumps(summary).decode(),
    }


def message(record: dict[str, Any], max_bytes: int) -> bytes:
    """The record as its Kafka message, at most `max_bytes`: a larger one sheds the rows of
    SHED, step by step, its summary's `truncated` naming each list cut and the rows it had
    (a record that cannot be stored would be computed again every round, for ever)."""
    packed = orjson.dumps(record)
    summary = orjson.loads(record["summary"]) if len(packed) > max_bytes else {}
    truncated: dict[str, int] = {}
    for keys in SHED:
        if len(packed) <= max_bytes:
            break
        for key in keys:
            truncated[key] = len(summary.get(key) or [])
            summary[key] = []
        summary["truncated"] = truncated
        packed = orjson.dumps({**record, "summary": orjson.dumps(summary).decode()})
    if len(packed) > max_bytes:
        raise ValueError(f"{len(packed)} bytes even without {', '.join(truncated)}")
    if truncated:
        log.warning(
            "job record of %r %s over %d bytes: stored without %s",
            record["site"],
            record["job_id"],
            max_bytes,
            ", ".join(truncated),
        )
    return packed


class Refresher:
    """Computes the records due, every `records_interval_s`, in a thread of its own."""

    def __init__(
        self, clickhouse: ClickHouseProvider, kafka: KafkaPublisher, settings: ApiSettings
    ) -> None:
        self.clickhouse, self.kafka, self.settings = clickhouse, kafka, settings
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="job-records", daemon=True)
        # published but maybe not stored yet: (site, job_id) -> (version, job_updated_at).
        # Bounded: each round keeps only the jobs still due, at most `most` (a job no longer
        # due has its record stored; one pushed out of the round's `most` by jobs ending
        # earlier may be published once more: the same version, one row after FINAL).
        self.sent: dict[tuple[str, str], tuple[int, str]] = {}

    def start(self) -> None:
        if self.settings.records_interval_s > 0:
            self.thread.start()

    def close(self) -> None:
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join(timeout=30)

    def _run(self) -> None:
        since = now() - NOTES_KEPT
        while not self.stopped.wait(self.settings.records_interval_s):
            began = now()
            try:
                self.refresh(since)
                since = began - timedelta(seconds=self.settings.records_interval_s)
            except Exception:  # the next round tries again
                log.exception("job records: this round failed; the next one tries again")

    def refresh(self, since: datetime, most: int = 100) -> int:
        """Compute and publish the records due; return how many."""
        client = self.clickhouse.get()
        done = 0
        due = queries.due_jobs(client, since, most)
        still_due = set(due)
        self.sent = {key: sent for key, sent in self.sent.items() if key in still_due}
        for site, job_id in due:
            key = (site, job_id)
            try:
                record = compute(client, self.settings, get_job(client, job_id, site))
                if self.sent.get(key) == (record["version"], record["job_updated_at"]):
                    continue  # published already, not stored yet
                packed = message(record, self.settings.records_max_bytes)
            except Exception:  # one job's failure must not hold back the jobs after it
                log.exception("job record of %r %s not computed", site, job_id)
                continue
            try:
                self.kafka.publish(self.settings.records_topic, f"{site}/{job_id}", packed)
            except KafkaUnavailable as exc:
                log.error("job record of %r %s not published: %s", site, job_id, exc)
                continue
            self.sent[key] = (record["version"], record["job_updated_at"])
            log.info("job record: site %r job %s version %d", site, job_id, record["version"])
            done += 1
        return done
