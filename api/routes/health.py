"""GET /health: can the API reach Kafka and ClickHouse? It answers within
`health_timeout_s` whatever else is happening (api/infra/probes.py)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.schemas import Health

router = APIRouter(tags=["health"])


@router.get(
    "/health", operation_id="get_health", response_model=Health, responses={503: {"model": Health}}
)
async def get_health(request: Request) -> JSONResponse:
    """200 when Kafka and ClickHouse both answer, 503 otherwise."""
    app = request.app.state
    kafka, clickhouse = await asyncio.gather(app.health.kafka(), app.health.clickhouse())
    health = Health(
        status="ok" if kafka.ok and clickhouse.ok else "degraded",
        kafka=kafka,
        clickhouse=clickhouse,
        live_streams=app.live_hub.subscribers,
        exports_streaming=app.exports.in_use,
        exports_waiting=app.exports.waiting,
    )
    return JSONResponse(health.model_dump(), status_code=200 if health.status == "ok" else 503)
