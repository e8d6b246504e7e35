"""Job records' SQL (api/records.py computes and publishes them; ClickHouse stores them in
`job_records`, clickhouse/migrations/0024): the current record of a job, the jobs whose
record is missing or out of date, and the ingest time of a job's readings.

When a reading was stored: every insert into `metrics` notes the (device, minute) buckets it
wrote with the time (`rollup_pending.noted_at`, clickhouse/migrations/0022, kept 7 days);
`metrics` itself has no ingest time. A record keeps the newest note of its scope at the time
it was computed (`last_received`): a newer note of one of its devices in a minute of its span
is a late reading (at a minute's granularity: a reading after the job's end in its last
minute counts too, and costs one more computation).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

_SCOPE_NOTES = (
    "device_id IN {devices:Array(String)} "
    "AND bucket >= toStartOfMinute({start:DateTime64(6, 'UTC')}) "
    "AND bucket <= {end:DateTime64(6, 'UTC')}"
)

_RECORD = """
WITH r AS (
    SELECT summary, version, computed_at, job_updated_at, last_received, devices, start_time,
        end_time
    FROM job_records FINAL WHERE site = {site:String} AND job_id = {job_id:String}
)
SELECT summary, version, computed_at, job_updated_at,
    (SELECT count() FROM rollup_pending
     WHERE noted_at > (SELECT last_received FROM r)
        AND device_id IN (SELECT arrayJoin(devices) FROM r)
        AND bucket >= (SELECT toStartOfMinute(start_time) FROM r)
        AND bucket <= (SELECT end_time FROM r)) > 0 AS late
FROM r
"""

_DUE = """
WITH records AS (
    SELECT site, job_id, job_updated_at, last_received, devices, start_time, end_time
    FROM job_records FINAL
),
late AS (
    SELECT DISTINCT r.site, r.job_id
    FROM (SELECT site, job_id, last_received, start_time, end_time,
              arrayJoin(devices) AS device_id FROM records) AS r
    INNER JOIN (SELECT device_id, bucket, max(noted_at) AS noted FROM rollup_pending
                WHERE noted_at > {since:DateTime64(6, 'UTC')}
                GROUP BY device_id, bucket) AS n ON r.device_id = n.device_id
    WHERE n.noted > r.last_received AND n.bucket >= toStartOfMinute(r.start_time)
        AND n.bucket <= r.end_time
)
SELECT j.site AS site, j.job_id AS job_id
FROM (SELECT site, job_id, updated_at, end_time FROM jobs FINAL
      WHERE end_time IS NOT NULL AND state IN ('terminated', 'error')) AS j
LEFT JOIN records AS r ON j.site = r.site AND j.job_id = r.job_id
WHERE r.job_id = '' OR j.updated_at > r.job_updated_at
    OR (j.site, j.job_id) IN (SELECT site, job_id FROM late)
ORDER BY j.end_time
LIMIT {most:UInt32}
"""


def select_record(client: Client, site: str, job_id: str) -> dict[str, Any] | None:
    """The current record of a job (summary JSON, version, computed_at, job_updated_at, and
    `late`: whether readings of its scope were stored after it was computed), or None."""
    rows = list(client.query(_RECORD, parameters={"site": site, "job_id": job_id}).named_results())
    return rows[0] if rows else None


def previous_record(client: Client, site: str, job_id: str) -> dict[str, Any] | None:
    """The whole current record of a job, every column, or None."""
    rows = list(
        client.query(
            "SELECT * FROM job_records FINAL "
            "WHERE site = {site:String} AND job_id = {job_id:String}",
            parameters={"site": site, "job_id": job_id},
        ).named_results()
    )
    return rows[0] if rows else None


def due_jobs(client: Client, since: datetime, most: int) -> list[tuple[str, str]]:
    """(site, job_id) of ended jobs without a record, edited after it, or whose scope got
    readings after it (notes since `since`), the earliest ended first, at most `most`."""
    params = {"since": since, "most": most}
    return [(r[0], r[1]) for r in client.query(_DUE, parameters=params).result_rows]


def newest_note(
    client: Client, devices: list[str], start: datetime, end: datetime
) -> datetime | None:
    """When readings of the scope were last stored (None: no note kept)."""
    newest = client.query(
        f"SELECT max(noted_at), count() FROM rollup_pending WHERE {_SCOPE_NOTES}",
        parameters={"devices": devices, "start": start, "end": end},
    ).result_rows[0]
    return newest[0] if newest[1] else None
