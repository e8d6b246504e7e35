"""Jobs as stored (the newest version of each: the reader queries with FINAL)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from api.queries import iso_sql

JOB_COLUMNS = (
    "job_id, user, project, queue, nodes, "
    f"{iso_sql('start_time')} AS start, "
    f"{iso_sql('end_time')} AS end, "
    f"state, site, labels, {iso_sql('updated_at')} AS updated_at, allocations"
)


Condition = tuple[str, dict[str, Any]]
"""A condition on `jobs` and its bound parameters (api/visibility.py: the jobs a reader sees)."""
ALL_JOBS: Condition = ("1", {})


def job_query(
    job_id: str, site: str | None = None, visible: Condition = ALL_JOBS
) -> tuple[str, dict[str, Any]]:
    """The job of this id at `site`, or at every site holding one when `site` is None (job
    ids are unique per site only), among the `visible` jobs."""
    at_site = "" if site is None else " AND site = {site:String}"
    where, params = visible
    return (
        f"SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = {{job_id:String}}{at_site} "
        f"AND {where} ORDER BY site",
        {**params, "job_id": job_id, "site": site},
    )


def job_version_query(job_id: str, site: str, updated_at: datetime) -> tuple[str, dict[str, Any]]:
    """Whether this version of the job, or a newer one, is queryable."""
    return (
        "SELECT count() FROM jobs WHERE job_id = {job_id:String} AND site = {site:String} "
        "AND updated_at >= {updated_at:DateTime64(6, 'UTC')}",
        {"job_id": job_id, "site": site, "updated_at": updated_at},
    )


@dataclass(frozen=True)
class JobFilter:
    user: str | None = None
    site: str | None = None
    state: str | None = None
    node: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    limit: int = 1000
    visible: Condition = ALL_JOBS
    project: str | None = None
    severities: tuple[str, ...] | None = None
    """Jobs whose record's worst note is one of these."""
    note: str | None = None
    """Jobs whose record holds a note of this rule id."""
    sort: str = "start"
    """One of SORTS' keys."""
    position_metric: str | None = None
    """The metric of `position` sorts (else the mean over the record's footprint)."""


# From job_records (FINAL: the current version), joined on (site, job_id); a job without a
# record has null record fields and sorts last.
_RECORD = (
    "SELECT site AS r_site, job_id AS r_job, energy_j AS r_energy, coverage AS r_coverage, "
    "severity AS r_severity, notes AS r_notes, footprint AS r_footprint FROM job_records FINAL"
)
RECORD_COLUMNS = (
    "if(r_job = '', NULL, r_energy) AS energy_j, if(r_job = '', NULL, r_coverage) AS coverage, "
    "if(r_job = '', NULL, r_severity) AS severity, r_notes AS notes, "
    "if(r_job = '' OR empty(r_footprint), NULL, arrayAvg(mapValues(r_footprint))) AS efficiency"
)
_POSITION = (
    "if(r_job = '', NULL, if({position_metric:String} = '', "
    "if(empty(r_footprint), NULL, arrayAvg(mapValues(r_footprint))), "
    "if(mapContains(r_footprint, {position_metric:String}), "
    "r_footprint[{position_metric:String}], NULL)))"
)
SORTS = {
    "start": "start_time DESC NULLS FIRST",
    "-start": "start_time DESC NULLS FIRST",
    "+start": "start_time ASC NULLS LAST",
    "energy": "energy_j ASC NULLS LAST",
    "-energy": "energy_j DESC NULLS LAST",
    "efficiency": f"{_POSITION} ASC NULLS LAST",
    "-efficiency": f"{_POSITION} DESC NULLS LAST",
}
"""`efficiency`: the footprint's position (0 idle .. 1 peak) of `position_metric`, or the
mean of the record's positions: least busy first; `-`: the other way."""


def jobs_query(f: JobFilter) -> tuple[str, dict[str, Any]]:
    """Jobs matching every given filter, newest start first (or as `sort` says). A time
    range selects the jobs that ran during some of it (a running job runs until now)."""
    conditions = {
        "user": (f.user, "user = {user:String}"),
        "project": (f.project, "project = {project:String}"),
        "site": (f.site, "site = {site:String}"),
        "state": (f.state, "state = {state:String}"),
        "node": (f.node, "has(nodes, {node:String})"),
        "start": (f.start, "coalesce(end_time, now64(6)) >= {start:DateTime64(6, 'UTC')}"),
        "end": (f.end, "start_time <= {end:DateTime64(6, 'UTC')}"),
        "severities": (
            list(f.severities) if f.severities is not None else None,
            "r_job != '' AND has({severities:Array(String)}, r_severity)",
        ),
        "note": (f.note, "has(r_notes, {note:String})"),
    }
    where, params = [f.visible[0]], {**f.visible[1], "limit": f.limit}
    params["position_metric"] = f.position_metric or ""
    for name, (value, condition) in conditions.items():
        if value is not None:
            where.append(condition)
            params[name] = value
    sql = (
        f"SELECT {JOB_COLUMNS}, {RECORD_COLUMNS} FROM jobs "
        f"LEFT JOIN ({_RECORD}) AS records ON site = r_site AND job_id = r_job "
        f"WHERE {' AND '.join(where)} "
        f"ORDER BY {SORTS[f.sort]}, job_id LIMIT {{limit:UInt32}}"
    )
    return sql, params


def covering_jobs_query(
    visible: Condition,
    devices: tuple[str, ...],
    start: datetime,
    end: datetime,
    site: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """How many `visible` jobs have every device among their nodes and a span holding
    [start, end] (a running job runs until now)."""
    where, params = visible
    return (
        f"SELECT count() FROM jobs WHERE {where} "
        "AND hasAll(nodes, {devices:Array(String)}) AND start_time IS NOT NULL "
        "AND start_time <= {start:DateTime64(6, 'UTC')} "
        "AND coalesce(end_time, now64(6)) >= {end:DateTime64(6, 'UTC')}"
        + ("" if site is None else " AND site = {site:String}"),
        {**params, "devices": list(devices), "start": start, "end": end, "site": site},
    )


def running_jobs_on_query(visible: Condition, device: str) -> tuple[str, dict[str, Any]]:
    """How many `visible` running jobs have `device` among their nodes."""
    where, params = visible
    return (
        f"SELECT count() FROM jobs WHERE {where} AND state = 'running' "
        "AND has(nodes, {device:String})",
        {**params, "device": device},
    )


def select_job(
    client: Client, job_id: str, site: str | None = None, visible: Condition = ALL_JOBS
) -> list[dict[str, Any]]:
    """The rows of `job_query`: one per site holding a visible job of this id."""
    sql, params = job_query(job_id, site, visible)
    return list(client.query(sql, parameters=params).named_results())


def job_version_visible(client: Client, job_id: str, site: str, updated_at: datetime) -> bool:
    sql, params = job_version_query(job_id, site, updated_at)
    return bool(client.command(sql, parameters=params))


def select_jobs(client: Client, f: JobFilter) -> list[dict[str, Any]]:
    sql, params = jobs_query(f)
    return list(client.query(sql, parameters=params).named_results())


def covering_job_exists(
    client: Client,
    visible: Condition,
    devices: tuple[str, ...],
    start: datetime,
    end: datetime,
    site: str | None = None,
) -> bool:
    sql, params = covering_jobs_query(visible, devices, start, end, site)
    return bool(int(client.command(sql, parameters=params)))  # type: ignore[arg-type]


def running_job_on(client: Client, visible: Condition, device: str) -> bool:
    sql, params = running_jobs_on_query(visible, device)
    return bool(int(client.command(sql, parameters=params)))  # type: ignore[arg-type]
