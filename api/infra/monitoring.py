"""The API's own health for Prometheus (`GET /metrics`): requests by route template and status
class, how long each took to answer, refusals by reason, Kafka writes that failed, and, read
when scraped, the live streams and exports under way and the broker's state (broker.py).

Labels are bounded and name nobody: a route's template (`/api/jobs/{job_id}`), never the path
asked (a path no route matches is `<unmatched>`); no user, token or job. So the page is served
without a token (auth.OPEN_READS), on the API's own port. Names follow the producers'
(`producers/monitoring.py`): `jobscope_<part>_<what>`, counters ending in `_total`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PREFIX = "jobscope_api_"
UNMATCHED = "<unmatched>"
"""The route label of a request no route matches (a 404 or 405 for any path asked)."""
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
REFUSALS = {
    401: "unauthenticated",
    403: "forbidden",
    413: "too_large",
    429: "too_many_failed_logins",
    503: "unavailable",
}
"""Statuses counted as refusals, by reason: 503 is a limit of concurrent work reached (exports,
live streams) or ClickHouse or Kafka not answering. The 408 of a too slow client and the 503
past `JOBSCOPE_MAX_CONNECTIONS` are answered by the server before the app sees the request
(api/infra/server.py), and are not counted here."""

disable_created_metrics()


class _StateGauges(Collector):
    """Gauges read from the app's state when scraped (nothing to update on the hot path)."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def collect(self) -> Iterable[Metric]:
        hub = getattr(self._state, "live_hub", None)
        exports = getattr(self._state, "exports", None)
        if hub is not None:
            yield GaugeMetricFamily(
                PREFIX + "live_streams", "live readings streams open", value=hub.subscribers
            )
        if exports is not None:
            yield GaugeMetricFamily(
                PREFIX + "exports_streaming", "readings answers streaming", value=exports.in_use
            )
            yield GaugeMetricFamily(
                PREFIX + "exports_waiting",
                "readings answers waiting for a slot (JOBSCOPE_EXPORT_QUEUE)",
                value=exports.waiting,
            )


class ApiMetrics:
    """The counters of one app and its registry (one per app: no process-wide state)."""

    def __init__(self, state: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            PREFIX + "requests",
            "requests answered, by method, route template and status class (5xx: errors)",
            ("method", "route", "status"),
            registry=self.registry,
        )
        self.latency = Histogram(
            PREFIX + "request_duration_seconds",
            "from a request's arrival to the start of its answer (a stream's first byte)",
            ("method", "route"),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.refused = Counter(
            PREFIX + "refused_requests",
            "requests refused, by reason (401, 403, 413, 429, 503)",
            ("reason",),
            registry=self.registry,
        )
        self.publish_failures = Counter(
            PREFIX + "kafka_publish_failures",
            "Kafka writes that failed, by topic (the readings topic's: pushed readings refused "
            "with a 503)",
            ("topic",),
            registry=self.registry,
        )
        self.registry.register(_StateGauges(state))
        ProcessCollector(registry=self.registry)  # process_start_time_seconds: restarts

    def register(self, collector: Collector) -> None:
        self.registry.register(collector)

    def exposition(self) -> tuple[bytes, str]:
        """The registry in Prometheus' text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, f"{status // 100}xx").inc()
        self.latency.labels(method, route).observe(seconds)
        reason = REFUSALS.get(status)
        if reason is not None:
            self.refused.labels(reason).inc()


METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Methods counted by name; any other (the HTTP parser takes any token) is `other`, so that
an anonymous client cannot add series to /metrics without end."""


def route_template(scope: Scope) -> str:
    """The template of the route that served (or would serve) `scope`: FastAPI leaves its
    route in the scope; a request refused before routing is matched here."""
    route = scope.get("route")
    if route is not None:
        return str(route.path)
    for candidate in scope["app"].router.routes:
        match, _ = candidate.matches(scope)
        if match is Match.FULL:
            return str(getattr(candidate, "path", UNMATCHED))
    return UNMATCHED


class Instrumented:
    """ASGI middleware outside every other one: counts each HTTP request once its answer
    starts (a stream is counted when it opens, not when it ends); a request whose handler
    raised before answering counts as a 500."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 0

        async def counted_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                self._count(scope, status, began)
            await send(message)

        try:
            await self.app(scope, receive, counted_send)
        except BaseException:
            if not status:
                self._count(scope, 500, began)
            raise

    def _count(self, scope: Scope, status: int, began: float) -> None:
        seconds = time.perf_counter() - began
        method = scope["method"] if scope["method"] in METHODS else "other"
        self.metrics.observe(method, route_template(scope), status, seconds)
