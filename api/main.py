"""App factory: `create_app(settings)` wires the routers to one ClickHouse client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from anyio import to_thread
from fastapi import Depends, FastAPI
from fastapi.routing import APIRoute

from api import notes, registry
from api.audit import Recorder
from api.infra import auth, errors
from api.infra.broker import BrokerCollector
from api.infra.clickhouse import ClickHouseProvider
from api.infra.config import ApiSettings
from api.infra.kafka import KafkaPublisher
from api.infra.limits import BodyGuard, ExportSlots, FailedLogins
from api.infra.monitoring import ApiMetrics, Instrumented
from api.infra.oidc import OidcVerifier
from api.infra.probes import HealthProbes
from api.infra.push_limits import PushLimits
from api.infra.revocations import Revocations
from api.live.hub import ReadingsHub
from api.live.ingested import IngestWatch
from api.push_devices import PushDevices
from api.records import Refresher
from api.routes import auth as auth_routes
from api.routes import dashboard, devices, health, jobs, kwollect, live, metrics, push, tokens
from api.routes import monitoring as monitoring_routes
from api.routes import registry as registry_routes
from api.routes import report as report_routes


def create_app(settings: ApiSettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # the blocking routes' worker threads (anyio's limiter of this event loop)
        to_thread.current_default_thread_limiter().total_tokens = settings.threads
        app.state.clickhouse = ClickHouseProvider(settings)
        app.state.health = HealthProbes(settings)
        app.state.exports = ExportSlots(
            settings.max_exports,
            settings.export_queue,
            settings.export_wait_s,
            settings.retry_after_s,
        )
        app.state.kafka = KafkaPublisher(settings, app.state.monitoring.publish_failures)
        app.state.audit = Recorder(app.state.kafka, settings.audit_topic)
        app.state.revocations = Revocations(settings.kafka_client(), settings.revocations_topic)
        app.state.revocations.start()
        # signed tokens are refused (503) until the list is read; most starts take < 1 s
        await to_thread.run_sync(
            app.state.revocations.wait_loaded, settings.revocations_load_timeout_s
        )
        security = settings.kafka_security()
        app.state.live_hub = ReadingsHub(
            settings.kafka_bootstrap, settings.readings_topic, security=security
        )
        app.state.live_ingested = IngestWatch(
            settings.kafka_bootstrap, settings.consumer_group, settings.readings_topic, security
        )
        app.state.records = Refresher(app.state.clickhouse, app.state.kafka, settings)
        app.state.records.start()
        yield
        app.state.records.close()
        app.state.live_hub.close()
        app.state.live_ingested.close()
        app.state.revocations.close()
        app.state.kafka.close()
        app.state.clickhouse.close()
        app.state.health.close()

    app = FastAPI(
        title="jobscope",
        summary="Job-scoped metrics of testbed and HPC infrastructure",
        version="0.1.0",
        lifespan=lifespan,
        dependencies=[Depends(auth.reads_guard)],
    )
    app.state.settings = settings
    app.state.registry = registry.use(settings.metric_registry)  # a bad file stops the start
    app.state.note_rules = notes.use(settings.note_rules)  # so does a bad rules file
    app.state.oidc = OidcVerifier(settings) if settings.oidc_issuer else None
    app.state.failed_logins = FailedLogins(
        settings.auth_max_failures, settings.auth_failure_window_s, settings.auth_tracked_clients
    )
    # the push route streams its body under its own cap (JOBSCOPE_PUSH_MAX_BODY_BYTES)
    pushes = [
        (m, r.path)
        for r in (*push.router.routes, *push.otlp_router.routes)
        if isinstance(r, APIRoute)
        for m in r.methods
    ]
    app.add_middleware(BodyGuard, own_cap=pushes)
    # outermost: counts what BodyGuard refuses too (api/infra/monitoring.py)
    app.state.monitoring = ApiMetrics(app.state)
    app.state.monitoring.register(
        BrokerCollector(
            settings.kafka_client(), settings.broker_metrics_cache_s, settings.health_timeout_s
        )
    )
    app.add_middleware(Instrumented, metrics=app.state.monitoring)
    app.state.push_limits = PushLimits(settings)
    app.state.push_devices = PushDevices.load(  # a bad map stops the start
        settings.push_devices, settings.push_device_from_instance
    )
    errors.install(app)
    app.include_router(registry_routes.router)
    app.include_router(metrics.router)
    app.include_router(push.router)
    app.include_router(push.otlp_router)
    app.include_router(tokens.router)
    app.include_router(jobs.router)
    app.include_router(live.router)
    app.include_router(devices.router)
    app.include_router(kwollect.router)
    app.include_router(dashboard.router)
    app.include_router(auth_routes.router)
    app.include_router(report_routes.router)
    app.include_router(health.router)
    app.include_router(monitoring_routes.router)
    return app
