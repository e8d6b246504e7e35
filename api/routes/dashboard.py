"""GET /api/metrics/dashboard?job_id=: Kwollect's dashboard address, here the Superset Job
dashboard (superset/bundle/) with its job filter set to that job."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Query
from fastapi.responses import RedirectResponse

from api.deps import SettingsDep

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
    settings: SettingsDep,
    job_id: Annotated[str | None, Query(description="the job to show; none: the newest")] = None,
) -> RedirectResponse:
    """Redirect to the Job dashboard of Superset (`JOBSCOPE_SUPERSET_URL`) for the job."""
    return RedirectResponse(settings.superset_url.rstrip("/") + job_dashboard_path(job_id), 307)
