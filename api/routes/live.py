"""GET /api/jobs/{job_id}/live: a job's readings as they arrive (Server-Sent Events)."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Request

from api.deps import JobId
from api.infra.errors import Busy
from api.infra.params import TIME_HELP, parse_devices, parse_labels, parse_patterns, parse_time
from api.live.sse import MEDIA_TYPE, EventStreamResponse
from api.live.stream import JobStream, LiveRequest
from api.readings import check_devices, check_metrics
from api.scope import Asked
from api.visibility import ViewerDep

router = APIRouter(prefix="/api/jobs", tags=["jobs"])


_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
_EXAMPLE = (
    'event: live\ndata: {"replayed":0}\n\n'
    'event: readings\ndata: [{"timestamp":"2026-11-23T10:00:01.000123+00:00",'
    '"device_id":"node-1","metric_id":"bmc_power_watt","value":138.0,"labels":{}}]\n\n'
    'event: end\ndata: {"job_id":"4242","end":"2026-11-23T12:00:00.000000+00:00"}\n\n'
)


@router.get(
    "/{job_id}/live",
    operation_id="get_job_live",
    status_code=200,
    response_class=EventStreamResponse,
    responses={
        200: {"content": {MEDIA_TYPE: {"example": _EXAMPLE}}, "description": "events"},
        400: {"content": _ERROR, "description": "a bad parameter"},
        404: {"content": _ERROR, "description": "no such job"},
        503: {"content": _ERROR, "description": "Kafka unreachable, or too many live streams"},
    },
    summary="A job's readings as they arrive (Server-Sent Events)",
)
async def get_job_live(
    request: Request,
    viewer: ViewerDep,
    job_id: JobId,
    metrics: Annotated[
        str | None, Query(description="comma-separated metric ids or globs (`wattmetre_*`)")
    ] = None,
    devices: Annotated[
        str | None, Query(description="keep these devices of the scope (nodes or measuring)")
    ] = None,
    label: Annotated[
        list[str] | None, Query(description="key=value, repeatable: readings with this label")
    ] = None,
    since: Annotated[
        str | None,
        Query(description=f"{TIME_HELP}: replay the job's readings from then first; else now"),
    ] = None,
) -> EventStreamResponse:
    """Events `readings` (a JSON array of readings, as `/api/jobs/{id}/metrics` shows them:
    the job's nodes and the devices measuring them, summed under the node too), `live`
    once the replay asked by `since` is over, `end` when the job has ended, `dropped` if
    the client did not keep up, `error`; a `: keepalive` comment when nothing else is sent.
    An `EventSource` should close itself on `end`. Under the `jobs` read policy the job must
    be visible to the caller (404 as an unknown job otherwise); a stream whose job becomes
    invisible to its caller (its user or project changed) sends `error` and ends."""
    asked = Asked(
        devices=parse_devices("devices", devices),
        metrics=parse_patterns("metrics", metrics),
        labels=parse_labels(label),
        start=parse_time("since", since),
        end=None,
    )
    app = request.app.state
    settings = app.settings
    check_devices("devices", asked.devices, settings)
    check_metrics(asked.metrics, settings)
    clickhouse = await asyncio.to_thread(app.clickhouse.get)  # may connect: off the event loop
    job = await asyncio.to_thread(viewer.job, clickhouse, job_id)
    hub = app.live_hub
    if hub.subscribers >= settings.live_max_clients:
        raise Busy(
            f"{settings.live_max_clients} live streams are open (JOBSCOPE_LIVE_MAX_CLIENTS): "
            "try again later",
            settings.retry_after_s,
        )
    live = LiveRequest(job_id, asked, viewer.jobs_condition())
    stream = JobStream(live, clickhouse, hub, app.live_ingested, settings)
    sub = await stream.open(job)
    return EventStreamResponse(
        stream.events(sub),
        settings.live_send_timeout_s,
        f"job {job_id}",
        lambda: hub.unsubscribe(sub),
    )
