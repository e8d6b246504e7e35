"""GET /metrics: the API's own health in Prometheus' text format (api/infra/monitoring.py),
and the Kafka cluster's (api/infra/broker.py). At the root, apart from `/api/metrics` (the
readings): the path every Prometheus scrapes by default."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse

router = APIRouter(tags=["health"])
EXAMPLE = (
    "# HELP jobscope_api_requests_total requests answered, by method, route template and status "
    "class (5xx: errors)\n"
    "# TYPE jobscope_api_requests_total counter\n"
    'jobscope_api_requests_total{method="GET",route="/api/jobs/{job_id}/summary",'
    'status="2xx"} 42.0\n'
)


@router.get(
    "/metrics",
    operation_id="get_prometheus_metrics",
    response_class=PlainTextResponse,
    responses={
        200: {
            "content": {"text/plain": {"example": EXAMPLE}},
            "description": "Prometheus text format",
        }
    },
    summary="The API's and the Kafka cluster's health for Prometheus (no token needed)",
)
def get_prometheus_metrics(request: Request) -> Response:
    """A plain (threaded) route: the Kafka figures may wait on the cluster, up to
    JOBSCOPE_HEALTH_TIMEOUT_S per request, once per JOBSCOPE_BROKER_METRICS_CACHE_S."""
    body, content_type = request.app.state.monitoring.exposition()
    return Response(body, media_type=content_type)
