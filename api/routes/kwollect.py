"""Kwollect's own API paths (PostgREST's `/rpc/<function>`), so that scripts written against
a Kwollect server work unchanged against jobscope: `GET /rpc/get_metrics` is
`GET /api/metrics`, and `GET /rpc/available_metrics` lists the metrics a device or job
reported in the minute before a time, as Kwollect does."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import orjson
from fastapi import APIRouter, Query

from api.deps import ClickHouseDep, SettingsDep
from api.infra.errors import Forbidden, ParameterError
from api.infra.params import TIME_HELP, device_name, parse_time
from api.queries.catalog import select_catalog
from api.queries.devices import select_recent_metrics
from api.queries.metrics import Selection
from api.readings import READINGS_RESPONSES, check_devices, get_metrics
from api.registry import describe
from api.schemas import AvailableMetric, ErrorBody, Reading
from api.scope import job_span, now, with_aliases
from api.visibility import OUTSIDE_JOBS, ViewerDep

router = APIRouter(prefix="/rpc", tags=["kwollect"])

router.add_api_route(
    "/get_metrics",
    get_metrics,
    methods=["GET"],
    operation_id="kwollect_get_metrics",
    response_model=list[Reading],
    responses=READINGS_RESPONSES,
    summary="Kwollect's get_metrics: the same as GET /api/metrics",
)

AVAILABLE_WINDOW = timedelta(minutes=1)


@router.get(
    "/available_metrics",
    operation_id="kwollect_available_metrics",
    response_model=list[AvailableMetric],
    responses={400: {"model": ErrorBody}, 404: {"model": ErrorBody}},
    summary="Kwollect's available_metrics: what reported in the minute before a time",
)
def available_metrics(
    clickhouse: ClickHouseDep,
    settings: SettingsDep,
    viewer: ViewerDep,
    at: Annotated[str | None, Query(description=f"{TIME_HELP}; default now")] = None,
    params: Annotated[
        str | None,
        Query(
            description='JSON: `{"devices": ["node-1", ...]}` or `{"job_id": 4242}` (a job: its '
            "nodes, at its end if it ended before `at`); every device if absent",
            examples=['{"job_id": 4242}'],
        ),
    ] = None,
) -> list[AvailableMetric]:
    """Each device and metric with a reading in the minute before `at`, aliased devices
    under the node they measure too (Kwollect's `api.available_metrics`). The read policy
    applies as to `get_metrics`; every device at once is for those who read everything."""
    until = parse_time("at", at) or now()
    try:
        given = orjson.loads(params) if params else {}
    except orjson.JSONDecodeError as exc:
        raise ParameterError("params", f"not JSON: {exc}") from exc
    if not isinstance(given, dict):
        raise ParameterError("params", 'expected a JSON object such as {"job_id": 4242}')
    devices: list[str] | None = None
    if given.get("job_id") is not None:
        job = viewer.job(clickhouse, str(given["job_id"]))
        span = job_span(job)
        devices = list(job.nodes)
        if span is not None:
            until = min(until, span[1])
    elif given.get("devices") is not None:
        if not isinstance(given["devices"], list):
            raise ParameterError("params", "devices should be a JSON array")
        devices = [device_name(str(d)) for d in given["devices"]]
        check_devices("params", tuple(devices), settings)
        viewer.check_devices(clickhouse, tuple(devices), until - AVAILABLE_WINDOW, until)
    if devices is None:
        if not viewer.sees_all:
            raise Forbidden(f"every device's metrics: {OUTSIDE_JOBS}")
        # Every device: from the latest values, which know only the present.
        if until < now() - AVAILABLE_WINDOW:
            raise ParameterError("params", "give devices or job_id for a time in the past")
        rows = select_recent_metrics(clickhouse, until - AVAILABLE_WINDOW, until)
    else:
        window = Selection(tuple(devices), until - AVAILABLE_WINDOW, until)
        rows = select_catalog(clickhouse, with_aliases(clickhouse, window))
    return [
        AvailableMetric(
            device_id=r["device_id"], metric_id=r["metric_id"], **describe(r["metric_id"])
        )
        for r in rows
    ]
