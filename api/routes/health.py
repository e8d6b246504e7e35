"""GET /health: can the API reach Kafka and ClickHouse?"""

from __future__ import annotations

from confluent_kafka.admin import AdminClient
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.clickhouse import ClickHouseProvider
from api.deps import SettingsDep
from api.schemas import ComponentHealth, Health

router = APIRouter(tags=["health"])


def kafka_health(bootstrap: str, timeout: float) -> ComponentHealth:
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        brokers = admin.list_topics(timeout=timeout).brokers
        return ComponentHealth(ok=bool(brokers), detail=f"{len(brokers)} broker(s) at {bootstrap}")
    except Exception as exc:
        return ComponentHealth(ok=False, detail=f"{bootstrap}: {exc}")


def clickhouse_health(provider: ClickHouseProvider) -> ComponentHealth:
    try:
        version = provider.get().command("SELECT version()")
        return ComponentHealth(ok=True, detail=f"ClickHouse {version}")
    except Exception as exc:
        return ComponentHealth(ok=False, detail=str(exc).splitlines()[0])


@router.get(
    "/health", operation_id="get_health", response_model=Health, responses={503: {"model": Health}}
)
def get_health(request: Request, settings: SettingsDep) -> JSONResponse:
    """200 when Kafka and ClickHouse both answer, 503 otherwise."""
    health = Health(
        status="ok",
        kafka=kafka_health(settings.kafka_bootstrap, settings.health_timeout_s),
        clickhouse=clickhouse_health(request.app.state.clickhouse),
        live_streams=request.app.state.live_hub.subscribers,
    )
    if not (health.kafka.ok and health.clickhouse.ok):
        health.status = "degraded"
    return JSONResponse(health.model_dump(), status_code=200 if health.status == "ok" else 503)
