"""POST /api/metrics: readings pushed by users (pusher or admin token), accepted once
Kafka has every one of them; POST /api/v1/write: the same from Prometheus' remote_write
(api/remote_write.py); POST /api/v2/write and /api/write: from Influx line protocol
(api/line_protocol.py); POST /v1/metrics (and /api/v1/otlp/v1/metrics): OTLP/HTTP metrics
(api/otlp.py), on a router of its own (OTLP's path has no /api prefix; its refusals are
google.rpc.Status bodies)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from api import line_protocol, otlp, push, remote_write
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
    batch = await run_in_threadpool(
        line_protocol.parse, body, encoding, precision, settings, who, app.push_devices
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


class _OtlpRoute(APIRoute):
    """Refusals answered as OTLP/HTTP says: a google.rpc.Status in the request's encoding
    (protobuf or JSON; JSON for a request that is neither), not jobscope's ErrorBody."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
                answer = otlp.refusal(exc, otlp.PROTOBUF if media == otlp.PROTOBUF else otlp.JSON)
                if answer is None:
                    raise
                return answer

        return route


otlp_router = APIRouter(tags=["metrics"], route_class=_OtlpRoute)

_STATUS = {
    "type": "object",
    "description": "google.rpc.Status (OTLP/HTTP's error body), in the request's encoding",
    "properties": {
        "code": {"type": "integer", "description": "google.rpc.Code, e.g. 3 INVALID_ARGUMENT"},
        "message": {"type": "string"},
        "details": {"type": "array", "items": {"type": "object"}},
    },
}
_BINARY = {"schema": {"type": "string", "format": "binary"}}


def _status(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {otlp.JSON: {"schema": _STATUS}, otlp.PROTOBUF: _BINARY},
    }


_OTLP_EXAMPLE = {
    "resourceMetrics": [
        {
            "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "node-1"}}]},
            "scopeMetrics": [
                {
                    "metrics": [
                        {
                            "name": "gpu.power",
                            "unit": "W",
                            "gauge": {
                                "dataPoints": [
                                    {
                                        "timeUnixNano": "1700000000000000000",
                                        "asDouble": 250.5,
                                        "attributes": [
                                            {"key": "gpu", "value": {"stringValue": "0"}}
                                        ],
                                    }
                                ]
                            },
                        }
                    ]
                }
            ],
        }
    ]
}
_OTLP_OK = {
    "type": "object",
    "description": "ExportMetricsServiceResponse; partialSuccess only when points were skipped",
    "properties": {
        "partialSuccess": {
            "type": "object",
            "properties": {
                "rejectedDataPoints": {"type": "string", "pattern": "^[0-9]+$"},
                "errorMessage": {"type": "string"},
            },
        }
    },
}
_OTLP_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Kafka has every reading; X-Jobscope-Accepted counts them",
        "content": {
            otlp.JSON: {
                "schema": _OTLP_OK,
                "example": {
                    "partialSuccess": {
                        "rejectedDataPoints": "2",
                        "errorMessage": "data points not stored: 2 of histograms",
                    }
                },
            },
            otlp.PROTOBUF: _BINARY,
        },
    },
    400: _status(
        "corrupt protobuf or JSON, a resource with no device, a bad name, label or time: "
        "nothing written"
    ),
    401: {"model": ErrorBody},
    403: _status("a device the token may not push for"),
    413: _status("too many data points or bytes (gzip: decompressed)"),
    415: _status("neither application/x-protobuf nor application/json, or not gzip"),
    429: _status("the token's rate or new-series limit is reached (Retry-After)"),
    503: _status("Kafka did not acknowledge every message (the exporter retries)"),
}
_OTLP_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            otlp.PROTOBUF: _BINARY,
            otlp.JSON: {
                "schema": {
                    "type": "object",
                    "properties": {
                        "resourceMetrics": {"type": "array", "items": {"type": "object"}}
                    },
                },
                "example": _OTLP_EXAMPLE,
            },
        },
    }
}
_OTLP_DOC = """An ExportMetricsServiceRequest, protobuf or OTLP's JSON, gzip or not, as an
    OpenTelemetry SDK or Collector (otlphttp exporter) sends it with `Authorization: Bearer
    <token>`. Gauges and cumulative sums become readings, named as Prometheus translates OTLP
    (`gpu.power` in W: `gpu_power_watts`; monotonic sums end in `_total`); the resource's
    `host.name` (else `service.instance.id`) names the device through JOBSCOPE_PUSH_DEVICES,
    the data points' attributes are labels (none starting with `_`). Delta sums, histograms,
    summaries, NaN and infinite values are skipped and counted in `partialSuccess`. Authorised
    and all or nothing as POST /api/metrics (docs/jobs.md); refusals are google.rpc.Status."""


async def _otlp_write(request: Request, who: Principal) -> Response:
    app = request.app.state
    settings = app.settings
    media = otlp.media_type(request.headers)
    body = await _body(request, settings.push_max_body_bytes)
    encoding = request.headers.get("content-encoding", "")
    batch = await run_in_threadpool(
        otlp.parse, body, media, encoding, settings, who, app.push_devices
    )
    count = await _publish(app, who, batch.readings) if batch.readings else 0
    return otlp.answer(batch, count, media)


@otlp_router.post(
    "/v1/metrics",
    operation_id="otlp_metrics",
    responses=_OTLP_RESPONSES,
    openapi_extra=_OTLP_BODY,
    summary="OTLP/HTTP metrics (agent token: its nodes; pusher: its jobs'; admin: any)",
    description=_OTLP_DOC,
)
async def post_otlp_metrics(request: Request, who: Pusher) -> Response:
    return await _otlp_write(request, who)


@otlp_router.post(
    "/api/v1/otlp/v1/metrics",
    operation_id="otlp_metrics_prometheus_path",
    responses=_OTLP_RESPONSES,
    openapi_extra=_OTLP_BODY,
    summary="OTLP/HTTP metrics at Prometheus' path (as POST /v1/metrics)",
    description=_OTLP_DOC,
)
async def post_otlp_metrics_prometheus_path(request: Request, who: Pusher) -> Response:
    return await _otlp_write(request, who)
