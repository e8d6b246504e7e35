"""POST /api/metrics: readings pushed by users (pusher or admin token), accepted once
Kafka has every one of them; POST /api/v1/write: the same from Prometheus' remote_write
(api/remote_write.py); POST /api/v2/write and /api/write: from Influx line protocol
(api/line_protocol.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from api import line_protocol, push, remote_write
from api.infra.auth import Principal, Role, principal
from api.infra.errors import TooLarge
from api.schemas import ErrorBody, PushAccepted, RemoteWriteAccepted
from kafka.reading import Reading

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


async def _publish(app: Any, who: Principal, readings: list[Reading]) -> int:
    """Within the token's rate (429 beyond), to Kafka, all or nothing (api/push.py)."""
    key = push.limit_key(who)
    if key is not None:
        app.push_limits.admit_rate(key, len(readings))
    return await run_in_threadpool(
        push.push, readings, who, app.clickhouse, app.kafka, app.settings, app.push_limits
    )


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
    count = await _publish(app, who, push.validate(items, settings, who))
    return JSONResponse({"accepted": count}, status_code=202)


@router.post(
    "/v1/write",
    operation_id="prometheus_remote_write",
    response_model=RemoteWriteAccepted,
    responses={
        400: {
            "model": ErrorBody,
            "description": "corrupt snappy or protobuf, a series with no device or a bad "
            "name, label or time: nothing written",
        },
        401: {"model": ErrorBody},
        403: {"model": ErrorBody, "description": "a device the token may not push for"},
        413: {"model": ErrorBody, "description": "too many samples or bytes in one write"},
        415: {"model": ErrorBody, "description": "not remote_write 1.0's content type or encoding"},
        429: {
            "model": ErrorBody,
            "description": "the token's rate or new-series limit is reached (Retry-After)",
        },
        503: {
            "model": ErrorBody,
            "description": "Kafka did not acknowledge every message (Prometheus retries)",
        },
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                remote_write.CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
    summary="Prometheus remote_write 1.0 (agent token: its nodes; pusher: its jobs'; admin: any)",
)
async def post_remote_write(request: Request, who: Pusher) -> JSONResponse:
    """A snappy-compressed protobuf WriteRequest (Content-Encoding: snappy, Content-Type:
    application/x-protobuf), as Prometheus, vmagent or Alloy send it. `__name__` is the metric
    id, `instance` (else `host`) names the device through JOBSCOPE_PUSH_DEVICES (else its host
    name), `job` is dropped, other labels are kept (none starting with `_`: 400). NaN and
    infinite samples (stale markers) are skipped and counted. Authorised and all or nothing as
    POST /api/metrics; 200 once Kafka has acknowledged every message, 503 (retried) if not."""
    app = request.app.state
    settings = app.settings
    remote_write.check_headers(request.headers)
    body = await _body(request, settings.push_max_body_bytes)
    batch = await run_in_threadpool(remote_write.parse, body, settings, who, app.push_devices)
    count = await _publish(app, who, batch.readings) if batch.readings else 0
    skipped = {reason: batch.skipped[reason] for reason in remote_write.SKIPPED}
    return JSONResponse({"accepted": count, "skipped": skipped}, status_code=200)


_LINE_RESPONSES: dict[int | str, dict[str, Any]] = {
    204: {
        "description": "Kafka has every reading (as InfluxDB answers); X-Jobscope-Accepted and "
        "X-Jobscope-Skipped-Strings / -Non-Finite count them"
    },
    400: {"model": ErrorBody, "description": "a line that does not parse or cannot be stored"},
    401: {"model": ErrorBody},
    403: {"model": ErrorBody, "description": "a device the token may not push for"},
    413: {"model": ErrorBody, "description": "too many fields or bytes (gzip: decompressed)"},
    415: {"model": ErrorBody, "description": "a Content-Encoding other than gzip"},
    429: {"model": ErrorBody, "description": "the token's rate or new-series limit (Retry-After)"},
    503: {"model": ErrorBody, "description": "Kafka did not acknowledge every message"},
}
_LINE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "text/plain": {
                "schema": {"type": "string"},
                "example": "cpu,host=node-1,cpu=cpu0 usage_user=12.5,usage_system=3i "
                "1700000000000000000\n",
            }
        },
    }
}
_LINE_DOC = """Influx line protocol, as Telegraf, cc-metric-collector or an InfluxDB client send
    it (`Authorization: Token <token>` or `Bearer <token>`): each numeric field a reading
    `<measurement>_<field>`, its device named by the `host` (or `instance`) tag through
    JOBSCOPE_PUSH_DEVICES, the other tags its labels (none starting with `_`). Authorised and
    all or nothing as POST /api/metrics (docs/jobs.md)."""


async def _line_write(request: Request, who: Principal, precision: str) -> Response:
    app = request.app.state
    settings = app.settings
    body = await _body(request, settings.push_max_body_bytes)
    encoding = request.headers.get("content-encoding", "")
    text = line_protocol.text_of(body, encoding, settings.push_max_body_bytes)
    batch = await run_in_threadpool(
        line_protocol.parse, text, precision, settings, who, app.push_devices
    )
    count = await _publish(app, who, batch.readings) if batch.readings else 0
    headers = {"X-Jobscope-Accepted": str(count)}
    for reason in line_protocol.SKIPPED:  # X-Jobscope-Skipped-Strings, -Non-Finite
        name = "-".join(part.capitalize() for part in reason.split("_"))
        headers[f"X-Jobscope-Skipped-{name}"] = str(batch.skipped[reason])
    return Response(status_code=204, headers=headers)


@router.post(
    "/v2/write",
    operation_id="influx_v2_write",
    status_code=204,
    responses=_LINE_RESPONSES,
    openapi_extra=_LINE_BODY,
    summary="Influx line protocol, InfluxDB 2's path (org and bucket are not used)",
    description=_LINE_DOC,
)
async def post_influx_v2_write(
    request: Request,
    who: Pusher,
    precision: Annotated[str, Query(description="ns (default), us, ms or s")] = "ns",
) -> Response:
    return await _line_write(request, who, precision)


@router.post(
    "/write",
    operation_id="influx_v1_write",
    status_code=204,
    responses=_LINE_RESPONSES,
    openapi_extra=_LINE_BODY,
    summary="Influx line protocol, InfluxDB 1's path (db and rp are not used)",
    description=_LINE_DOC,
)
async def post_influx_v1_write(
    request: Request,
    who: Pusher,
    precision: Annotated[str, Query(description="n (default), u, ms, s, m or h")] = "n",
) -> Response:
    return await _line_write(request, who, precision)
