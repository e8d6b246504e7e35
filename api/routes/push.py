"""POST /api/metrics: readings pushed by users (pusher or admin token), accepted once
Kafka has every one of them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from api import push
from api.infra.auth import Principal, Role, principal
from api.infra.errors import TooLarge
from api.schemas import ErrorBody, PushAccepted

router = APIRouter(prefix="/api", tags=["metrics"])

Pusher = Annotated[Principal, Depends(principal(Role.AGENT, Role.PUSHER))]

_EXAMPLE = {
    "timestamp": "2026-11-23T10:00:00Z",
    "device_id": "node-1",
    "metric_id": "app_iterations_total",
    "value": 1234,
    "labels": {"phase": "solve"},
}


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it exceeds `limit` bytes."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(
                f"push body over {limit} bytes (JOBSCOPE_PUSH_MAX_BODY_BYTES): split the batch"
            )
        chunks.append(chunk)
    return b"".join(chunks)


@router.post(
    "/metrics",
    operation_id="push_metrics",
    status_code=202,
    response_model=PushAccepted,
    responses={
        400: {"model": ErrorBody, "description": "a reading is invalid: nothing written"},
        401: {"model": ErrorBody},
        403: {"model": ErrorBody, "description": "a device the token may not push for"},
        413: {"model": ErrorBody, "description": "too many readings or bytes in one push"},
        429: {
            "model": ErrorBody,
            "description": "the token's rate or new-series limit is reached (Retry-After)",
        },
        503: {"model": ErrorBody, "description": "Kafka did not acknowledge every message"},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"examples": {"one": {"value": _EXAMPLE}}},
                push.NDJSON: {"schema": {"type": "string"}},
            },
        }
    },
    summary="Push readings (pusher token: your running jobs' nodes and spans; admin: any)",
)
async def post_metrics(request: Request, who: Pusher) -> JSONResponse:
    """One reading or an array of them in Kwollect's shape (`timestamp` ISO 8601 or Unix
    seconds, `device_id`, `metric_id`, `value`, `labels`), or NDJSON with Content-Type
    application/x-ndjson. Each is labelled `source=user:<token's user>` (a pushed `source`
    label is replaced); labels starting with `_` are reserved (400). A pusher token writes
    only the nodes of its user's running jobs, timed inside them (400 naming the first
    reading outside), within its rate and new-series limits (429). All or nothing: every
    reading is checked first; 202 once Kafka has acknowledged every message."""
    app = request.app.state
    settings = app.settings
    body = await _body(request, settings.push_max_body_bytes)
    items = push.parse_body(body, request.headers.get("content-type", ""))
    readings = push.validate(items, settings, who)
    key = push.limit_key(who)
    if key is not None:
        app.push_limits.admit_rate(key, len(readings))
    count = await run_in_threadpool(
        push.push, readings, who, app.clickhouse, app.kafka, settings, app.push_limits
    )
    return JSONResponse({"accepted": count}, status_code=202)
