"""GET /api/metrics/dashboard?job_id=: Kwollect's dashboard address, here the Superset Job
dashboard (superset/bundle/) with its job filter set to that job."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from clickhouse_connect.driver.client import Client
from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse

from api.deps import SettingsDep
from api.infra.errors import NotFound
from api.queries.jobs import JobFilter, select_jobs
from api.visibility import Viewer, ViewerDep

router = APIRouter(tags=["dashboard"])

JOB_DASHBOARD = "/superset/dashboard/jobscope-job/"
JOB_FILTER = "NATIVE_FILTER-jobscope-job-id"


def _rison_string(value: str) -> str:
    """A string in Rison (the notation of Superset's URL state): quoted, ! and ' escaped."""
    return "'" + value.replace("!", "!!").replace("'", "!'") + "'"


def job_dashboard_path(job_id: str | None) -> str:
    """The Job dashboard's path, its job filter set to `job_id` (none: the newest job)."""
    if not job_id:
        return JOB_DASHBOARD
    job = _rison_string(job_id)
    state = (
        f"({JOB_FILTER}:(id:{JOB_FILTER},"
        f"extraFormData:(filters:!((col:job_id,op:IN,val:!({job})))),"
        f"filterState:(label:{job},value:!({job})),ownState:()))"
    )
    return f"{JOB_DASHBOARD}?native_filters={quote(state, safe='')}"


def _newest_job(clickhouse: Client, viewer: Viewer) -> str:
    for job in select_jobs(clickhouse, JobFilter(limit=1, visible=viewer.jobs_condition())):
        return str(job["job_id"])
    raise NotFound("no job of yours to show")


@router.get(
    "/api/metrics/dashboard",
    operation_id="get_dashboard",
    status_code=307,
    response_class=RedirectResponse,
    responses={
        307: {
            "description": "to the Superset Job dashboard filtered on the job",
            "headers": {
                "Location": {
                    "description": "the dashboard's address",
                    "schema": {"type": "string"},
                    "example": "http://127.0.0.1:8088/superset/dashboard/job/?native_filters=...",
                }
            },
        }
    },
)
def get_dashboard(
    request: Request,
    settings: SettingsDep,
    viewer: ViewerDep,
    job_id: Annotated[str | None, Query(description="the job to show; none: the newest")] = None,
) -> RedirectResponse:
    """Redirect to the Job dashboard of Superset (`JOBSCOPE_SUPERSET_URL`) for the job. Under
    the `jobs` read policy, a job a user may not see is unknown (404), and without `job_id`
    a user gets the dashboard of their newest job."""
    if not viewer.sees_all:
        clickhouse = request.app.state.clickhouse.get()
        if job_id:
            viewer.job(clickhouse, job_id)
        else:
            job_id = _newest_job(clickhouse, viewer)
    return RedirectResponse(settings.superset_url.rstrip("/") + job_dashboard_path(job_id), 307)
