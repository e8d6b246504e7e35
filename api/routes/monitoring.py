"""GET /metrics: the API's own health in Prometheus' text format (api/infra/monitoring.py),
and the Kafka cluster's (api/infra/broker.py). At the root, apart from `/api/metrics` (the
readings): the path every Prometheus scrapes by default."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse

router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    operation_id="get_prometheus_metrics",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
    summary="The API's and the Kafka cluster's health for Prometheus (no token needed)",
)
def get_prometheus_metrics(request: Request) -> Response:
    """A plain (threaded) route: the Kafka figures may wait on the cluster, up to
    JOBSCOPE_HEALTH_TIMEOUT_S per request, once per JOBSCOPE_BROKER_METRICS_CACHE_S."""
    body, content_type = request.app.state.monitoring.exposition()
    return Response(body, media_type=content_type)
