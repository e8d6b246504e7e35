"""GET /api/metrics: Kwollect's readings query (devices or a job, metrics, time range,
summary, as_rate), with jobscope's steps, aggregates, label filters and formats
(api/readings.py)."""

from __future__ import annotations

from fastapi import APIRouter

from api.readings import READINGS_RESPONSES, get_metrics
from api.schemas import Reading

router = APIRouter(prefix="/api", tags=["metrics"])

router.add_api_route(
    "/metrics",
    get_metrics,
    methods=["GET"],
    operation_id="get_metrics",
    response_model=list[Reading],
    responses=READINGS_RESPONSES,
    summary="Readings of devices or of a job over a time range",
)
