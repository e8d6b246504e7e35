"""A job's report (api/report/): HTML, PDF, Markdown or JSON, under the summary's read
policy (api/visibility.py: a job the caller may not see is unknown, 404)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import orjson
from fastapi import APIRouter, Query
from fastapi.responses import Response

from api.deps import ClickHouseDep, JobId, SettingsDep
from api.readings import SiteQuery
from api.report import html, markdown, model, pdf
from api.schemas import ErrorBody
from api.visibility import ViewerDep

router = APIRouter(prefix="/api/jobs", tags=["jobs"])


class ReportFormat(StrEnum):
    HTML = "html"
    PDF = "pdf"
    MD = "md"
    JSON = "json"


MEDIA_TYPES = {
    ReportFormat.HTML: "text/html; charset=utf-8",
    ReportFormat.PDF: "application/pdf",
    ReportFormat.MD: "text/markdown; charset=utf-8",
    ReportFormat.JSON: "application/json",
}


@router.get(
    "/{job_id}/report",
    operation_id="get_job_report",
    responses={
        200: {
            "content": {
                "text/html": {"example": "<!DOCTYPE html><html><head><title>Job 4242</title>"},
                "application/pdf": {"schema": {"type": "string", "format": "binary"}},
                "text/markdown": {"example": "# Job 4242\n\nEnergy: 1.52 MJ (wattmeter)"},
                "application/json": {"example": {"job": {"job_id": "4242"}, "summary": {}}},
            }
        },
        400: {"model": ErrorBody},
        404: {"model": ErrorBody},
    },
    response_class=Response,
    summary="A job's report: metadata, energy, footprint and notes, plots",
)
def get_job_report(
    clickhouse: ClickHouseDep,
    settings: SettingsDep,
    viewer: ViewerDep,
    job_id: JobId,
    format: Annotated[ReportFormat, Query(description="html, pdf, md or json")] = (
        ReportFormat.HTML
    ),
    site: SiteQuery = None,
) -> Response:
    """HTML is one self-contained file (inline CSS and SVG, no script, nothing loaded from
    anywhere); PDF keeps its text as text; JSON is the data the others render (the summary
    and the plots' series)."""
    job = viewer.job(clickhouse, job_id, site)
    report = model.build(clickhouse, settings, job)
    name = f"job-{''.join(c if c.isalnum() or c in '-_.' else '_' for c in job.job_id)}"
    headers = {"Content-Disposition": f'inline; filename="{name}.{format.value}"'}
    if format is ReportFormat.HTML:
        body: bytes = html.render(report).encode()
        headers["Content-Security-Policy"] = html.CSP
    elif format is ReportFormat.PDF:
        body = pdf.render(report)
    elif format is ReportFormat.MD:
        body = markdown.render(report).encode()
    else:
        body = orjson.dumps(report)
    return Response(body, media_type=MEDIA_TYPES[format], headers=headers)
