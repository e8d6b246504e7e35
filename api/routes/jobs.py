"""Jobs: written by the scheduler (hooks, or the `jobs` topic), read as the read policy allows
(api/visibility.py); each job's readings, summary (with energy) and catalog of metrics."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Literal

import orjson
from clickhouse_connect.driver.client import Client
from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from api import ondemand, records
from api.compare import compared
from api.deps import ClickHouseDep, ExportsDep, JobId, SettingsDep
from api.infra.auth import Principal, Role, principal
from api.infra.config import ApiSettings
from api.infra.errors import Conflict, Forbidden, ParameterError
from api.infra.params import parse_devices, parse_time
from api.jobs import get_job, merged, write_job
from api.notes import SEVERITIES
from api.queries.catalog import select_catalog
from api.queries.jobs import JobFilter, select_jobs
from api.readings import (
    READINGS_RESPONSES,
    AskedDep,
    ReadingsQueryDep,
    SiteQuery,
    check_devices,
    respond,
)
from api.schemas import (
    CatalogEntry,
    ErrorBody,
    Job,
    JobComparison,
    JobCreate,
    JobFields,
    JobListed,
    JobState,
    JobSummary,
    OnDemand,
    OnDemandRemoved,
    OnDemandRequest,
    Reading,
)
from api.scope import EVERYTHING, job_selection, with_aliases
from api.visibility import ViewerDep

router = APIRouter(prefix="/api/jobs", tags=["jobs"])

Severity = Literal["info", "warning", "alert"]
JobSort = Literal["start", "+start", "-start", "energy", "-energy", "efficiency", "-efficiency"]
Writer = Annotated[Principal, Depends(principal(Role.SCHEDULER))]
Activator = Annotated[Principal, Depends(principal(Role.SCHEDULER, Role.PUSHER))]
"""On-demand metrics: the scheduler, or a pusher for the jobs of its own user."""
_WRITE_RESPONSES: dict[int | str, dict[str, Any]] = {
    202: {"model": Job, "description": "accepted (in Kafka), not yet queryable"},
    400: {"model": ErrorBody},
    401: {"model": ErrorBody},
    403: {"model": ErrorBody},
    503: {"model": ErrorBody, "description": "Kafka did not take the write: nothing written"},
}


def _written(request: Request, job: JobCreate, created: int) -> JSONResponse:
    app = request.app.state
    stored, visible = write_job(job, app.kafka, app.clickhouse, app.settings)
    return JSONResponse(stored.model_dump(), status_code=created if visible else 202)


@router.post(
    "",
    operation_id="put_job",
    status_code=201,
    response_model=Job,
    responses=_WRITE_RESPONSES,
    summary="Create or replace a job (scheduler or admin token)",
)
def post_job(
    request: Request,
    _writer: Writer,
    job: Annotated[
        JobCreate,
        Body(
            openapi_examples={
                "slurm": {
                    "summary": "a Slurm job starting (as the prolog hook sends it)",
                    "value": {
                        "job_id": "1234_5",
                        "user": "alice",
                        "queue": "gpu",
                        "nodes": "node-[1-4,7]",
                        "start": "2026-11-23T10:00:00Z",
                        "state": "running",
                        "site": "nancy",
                    },
                },
                "oar": {
                    "summary": "an OAR job, nodes listed, times in Unix seconds",
                    "value": {
                        "job_id": "4242",
                        "user": "bob",
                        "nodes": ["grisou-1.nancy.grid5000.fr", "grisou-2.nancy.grid5000.fr"],
                        "start": 1795424400,
                        "end": 1795428000,
                        "state": "terminated",
                    },
                },
            }
        ),
    ],
) -> JSONResponse:
    """The whole job; a job id already known is replaced (a scheduler's hook may run twice).
    201 once the job is queryable, 202 when Kafka has it but ClickHouse has not shown it yet."""
    return _written(request, job, 201)


@router.patch(
    "/{job_id}",
    operation_id="patch_job",
    response_model=Job,
    responses={**_WRITE_RESPONSES, 404: {"model": ErrorBody}},
    summary="Change some fields of a job (scheduler or admin token)",
)
def patch_job(
    request: Request,
    _writer: Writer,
    clickhouse: ClickHouseDep,
    job_id: JobId,
    patch: Annotated[
        JobFields,
        Body(
            openapi_examples={
                "end": {
                    "summary": "the job ended (as the epilog hook sends it)",
                    "value": {"end": "2026-11-23T12:00:00Z", "state": "terminated"},
                }
            }
        ),
    ],
    site: SiteQuery = None,
) -> JSONResponse:
    """E.g. `{"end": "2026-11-23T12:00:00Z", "state": "terminated"}` when the job ends."""
    job = merged(get_job(clickhouse, job_id, site), patch)
    return _written(request, job, 200)


@router.get(
    "",
    operation_id="list_jobs",
    response_model=list[JobListed],
    responses={400: {"model": ErrorBody}},
    summary="Jobs, filtered and sorted (also by their records' energy, notes and footprint)",
)
def list_jobs(
    clickhouse: ClickHouseDep,
    viewer: ViewerDep,
    user: Annotated[str | None, Query(examples=["alice"])] = None,
    project: Annotated[str | None, Query(description="jobs of this project")] = None,
    site: Annotated[str | None, Query(description="jobs of this site", examples=["nancy"])] = None,
    state: Annotated[JobState | None, Query()] = None,
    node: Annotated[str | None, Query(description="jobs that ran on this node")] = None,
    start_time: Annotated[str | None, Query(description="jobs running at or after this")] = None,
    end_time: Annotated[str | None, Query(description="jobs started at or before this")] = None,
    severity: Annotated[
        Severity | None,
        Query(description="recorded jobs whose worst note is this severity or worse"),
    ] = None,
    note: Annotated[
        str | None,
        Query(description="recorded jobs with a note of this rule", examples=["node-power-idle"]),
    ] = None,
    sort: Annotated[
        JobSort,
        Query(
            description="start (newest first, the default), +start, energy, -energy (most "
            "first), efficiency (least busy first: the footprint's position, 0 idle .. 1 "
            "peak), -efficiency; jobs without a record last"
        ),
    ] = "start",
    position_metric: Annotated[
        str | None,
        Query(
            description="the metric whose footprint position `efficiency` sorts by (default "
            "the mean of the job's positions)",
            examples=["bmc_power_watt"],
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> Response:
    """Newest first; a time range keeps the jobs that ran during some of it. Only the jobs
    the read policy lets the caller see. `severity`, `note` and the energy and efficiency
    sorts read the jobs' records (ended jobs, docs/jobs.md)."""
    node_id = parse_devices("node", node)[0] if node is not None else None
    rows = select_jobs(
        clickhouse,
        JobFilter(
            user=user,
            project=project,
            site=site,
            state=state.value if state else None,
            node=node_id,
            start=parse_time("start_time", start_time),
            end=parse_time("end_time", end_time),
            limit=limit,
            visible=viewer.jobs_condition(),
            severities=SEVERITIES[SEVERITIES.index(severity) :] if severity else None,
            note=note,
            sort=sort,
            position_metric=position_metric,
        ),
    )
    listed = [JobListed(**row).model_dump() for row in rows]
    return Response(orjson.dumps(listed), media_type="application/json")


@router.get(
    "/compare",
    operation_id="compare_jobs",
    response_model=JobComparison,
    responses={400: {"model": ErrorBody}, 404: {"model": ErrorBody}},
    summary="Jobs side by side: energy, footprint, metrics and notes, with differences",
)
def compare_jobs(
    clickhouse: ClickHouseDep,
    settings: SettingsDep,
    viewer: ViewerDep,
    ids: Annotated[
        str,
        Query(description="comma-separated job ids, the first the reference", examples=["41,42"]),
    ],
    site: SiteQuery = None,
) -> Response:
    """Each job as its summary has it (404 for a job unknown or not visible to the caller,
    as for one job), and each figure's difference to the first job's."""
    job_ids = [part.strip() for part in ids.split(",")]
    if len(job_ids) < 2 or "" in job_ids:
        raise ParameterError("ids", "at least two comma-separated job ids, none empty")
    if len(job_ids) > settings.compare_max_jobs:
        raise ParameterError(
            "ids", f"at most {settings.compare_max_jobs} jobs (JOBSCOPE_COMPARE_MAX_JOBS)"
        )
    jobs = [viewer.job(clickhouse, job_id, site) for job_id in job_ids]
    pairs = [(job.model_dump(), _summary(clickhouse, settings, job)) for job in jobs]
    return Response(orjson.dumps(compared(pairs)), media_type="application/json")


def _summary(clickhouse: Client, settings: ApiSettings, job: Job) -> dict[str, Any]:
    """A job's whole summary as GET /api/jobs/{id}/summary answers it (its record once
    ended), with its footprint and notes."""
    selection = with_aliases(clickhouse, job_selection(job, EVERYTHING))
    return records.served(clickhouse, settings, job, EVERYTHING, selection)


@router.get(
    "/{job_id}",
    operation_id="get_job",
    response_model=Job,
    responses={400: {"model": ErrorBody}, 404: {"model": ErrorBody}},
    summary="One job",
)
def read_job(
    clickhouse: ClickHouseDep, viewer: ViewerDep, job_id: JobId, site: SiteQuery = None
) -> Job:
    """400 naming the sites when the id exists at several and `site` is not given."""
    return viewer.job(clickhouse, job_id, site)


@router.get(
    "/{job_id}/metrics",
    operation_id="get_job_metrics",
    response_model=list[Reading],
    responses=READINGS_RESPONSES,
    summary="Every reading of a job's scope",
)
def get_job_metrics(
    clickhouse: ClickHouseDep,
    settings: SettingsDep,
    exports: ExportsDep,
    query: ReadingsQueryDep,
    viewer: ViewerDep,
    job_id: JobId,
    devices: Annotated[
        str | None,
        Query(description="keep these devices of the scope (nodes or measuring devices)"),
    ] = None,
    measuring: Annotated[
        bool,
        Query(
            description="also the measuring devices' own readings (PDU outlets, wattmeters, "
            "switch ports labelled `_device_alias=<node>`) under their own ids; naming one in "
            "`devices` implies it"
        ),
    ] = False,
) -> StreamingResponse:
    """The job's nodes over [start, end] of the job (end = now while it runs), the devices
    labelled `_device_alias=<node>` summed under the node's id (`_device_orig` lists them),
    as Kwollect answers; with `measuring=true` those devices' own readings too. start_time
    and end_time narrow that span, never widen it."""
    asked = replace(query.asked, devices=parse_devices("devices", devices))
    check_devices("devices", asked.devices, settings)
    job = viewer.job(clickhouse, job_id, asked.site)
    selection = job_selection(job, asked)
    if selection is not None and not (measuring or set(asked.devices) - set(job.nodes)):
        selection = replace(selection, measured=False)
    return respond(clickhouse, settings, exports, query, selection, f"job-{job_id}")


@router.get(
    "/{job_id}/summary",
    operation_id="get_job_summary",
    response_model=JobSummary,
    responses={400: {"model": ErrorBody}, 404: {"model": ErrorBody}},
    summary="Per node and metric statistics, and energy, of a job",
)
def get_job_summary(
    clickhouse: ClickHouseDep,
    settings: SettingsDep,
    viewer: ViewerDep,
    asked: AskedDep,
    job_id: JobId,
) -> Response:
    """min, avg, max, last, count and p95 (gauges), or delta and rate (counters, wraps and
    resets read as `as_rate` does) per device and metric of the scope, with the registry's
    unit and kind; for every power metric (unit W) the energy in joules: the trapezoidal
    integral of power over the job, per node and source, not bridging gaps longer than 3
    sampling periods (`covered_s` says how much of the job the integral covers), and energy
    counters' increase; per node its preferred source (the registry's energy_priority) and
    the spread between its sources; the job's energy. An ended job's whole summary comes from
    its record once computed (`record.source`: record or raw; docs/jobs.md), also after its
    raw readings expired."""
    job = viewer.job(clickhouse, job_id, asked.site)
    selection = with_aliases(clickhouse, job_selection(job, asked))
    summary = records.served(clickhouse, settings, job, asked, selection)
    return Response(orjson.dumps(summary), media_type="application/json")


@router.get(
    "/{job_id}/catalog",
    operation_id="get_job_catalog",
    response_model=list[CatalogEntry],
    responses={400: {"model": ErrorBody}, 404: {"model": ErrorBody}},
    summary="The metrics present in a job's scope",
)
def get_job_catalog(
    clickhouse: ClickHouseDep, viewer: ViewerDep, job_id: JobId, site: SiteQuery = None
) -> list[CatalogEntry]:
    """Each device and metric of the scope with its number of readings, first and last
    time (Kwollect's available metrics, with counts)."""
    job = viewer.job(clickhouse, job_id, site)
    selection = with_aliases(clickhouse, job_selection(job, EVERYTHING))
    if selection is None:
        return []
    return [CatalogEntry(**row) for row in select_catalog(clickhouse, selection)]


@router.post(
    "/{job_id}/on-demand",
    operation_id="activate_on_demand",
    status_code=202,
    response_model=OnDemand,
    responses={
        400: {"model": ErrorBody},
        401: {"model": ErrorBody},
        403: {"model": ErrorBody},
        404: {"model": ErrorBody},
        409: {"model": ErrorBody, "description": "the job has ended, or has no nodes yet"},
        503: {"model": ErrorBody, "description": "Kafka did not take the write: nothing changed"},
    },
    summary="Switch on optional metrics for a job's nodes (its user's pusher, scheduler, admin)",
)
def activate_on_demand(
    request: Request,
    who: Activator,
    clickhouse: ClickHouseDep,
    job_id: JobId,
    asked: Annotated[
        OnDemandRequest,
        Body(
            openapi_examples={
                "wattmeters": {
                    "summary": "the 50 Hz wattmeter readings of the job's nodes",
                    "value": {"metrics": "wattmetre_power_watt"},
                },
                "all": {"summary": "every optional metric", "value": {}},
            }
        ),
    ],
) -> OnDemand:
    """The optional metrics matching `metrics` (from the start of their name, as Kwollect's
    `oarsub -t monitor='<regexp>'`) are polled on the job's nodes and the devices measuring
    them (`_device_alias`) until the job ends (or `until`); the producers follow within
    seconds. A new call replaces the job's previous activation."""
    app = request.app.state
    ondemand.check_pattern("metrics", asked.metrics, app.settings)
    job = get_job(clickhouse, job_id)
    _may_activate(who, job)
    if ondemand.ended(job):
        raise Conflict(f"job {job_id} has ended: nothing to activate")
    if not job.nodes:
        raise Conflict(f"job {job_id} has no nodes yet")
    active = ondemand.activation(job, asked.metrics, asked.until)
    ondemand.publish(app.kafka, app.settings, active)
    return active


@router.delete(
    "/{job_id}/on-demand",
    operation_id="deactivate_on_demand",
    response_model=OnDemandRemoved,
    responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 503: {"model": ErrorBody}},
    summary="Switch a job's optional metrics off (its user's pusher token, scheduler or admin)",
)
def deactivate_on_demand(
    request: Request, who: Activator, clickhouse: ClickHouseDep, job_id: JobId
) -> OnDemandRemoved:
    if who.role is Role.PUSHER:
        _may_activate(who, get_job(clickhouse, job_id))
    app = request.app.state
    ondemand.withdraw(app.kafka, app.settings, job_id)
    return OnDemandRemoved(id=ondemand.activation_key(job_id), job_id=job_id)


def _may_activate(who: Principal, job: Job) -> None:
    if who.role is Role.PUSHER and job.user != who.user:
        raise Forbidden(f"job {job.job_id} is not a job of {who.user!r}")
