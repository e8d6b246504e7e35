"""The checks behind /health, built so that it answers within `health_timeout_s` whatever
else the API is doing: they run on the event loop or on a thread of their own (never on the
worker threads that user queries may all hold), ClickHouse is asked `/ping` over a
connection of its own (not the shared client, whose connections queries may all hold), and
each check runs once at a time, however many callers wait for it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka.admin import AdminClient
from pydantic import BaseModel

from api.infra.config import ApiSettings


class ComponentHealth(BaseModel):
    """What a probe found (a part of the /health answer, api/schemas.py: Health)."""

    ok: bool
    detail: str


class Probe:
    """A check run at most once at a time, for at most `timeout_s`."""

    def __init__(
        self, what: str, check: Callable[[], Awaitable[ComponentHealth]], timeout_s: float
    ) -> None:
        self.what, self.check, self.timeout_s = what, check, timeout_s
        self._running: asyncio.Future[ComponentHealth] | None = None

    async def __call__(self) -> ComponentHealth:
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._bounded())
        # shielded: a caller that goes away does not cancel the check the others wait for
        return await asyncio.shield(self._running)

    async def _bounded(self) -> ComponentHealth:
        try:
            return await asyncio.wait_for(self.check(), self.timeout_s)
        except TimeoutError:
            return ComponentHealth(
                ok=False, detail=f"{self.what}: no answer within {self.timeout_s:g} s"
            )
        except Exception as exc:
            return ComponentHealth(ok=False, detail=f"{self.what}: {exc}".splitlines()[0])


class HealthProbes:
    def __init__(self, settings: ApiSettings) -> None:
        self._settings = settings
        self._kafka_thread = ThreadPoolExecutor(1, thread_name_prefix="health-kafka")
        self._admin: AdminClient | None = None
        timeout_s = settings.health_timeout_s
        clickhouse_url = f"http://{settings.clickhouse_host}:{settings.clickhouse_port}"
        self.clickhouse = Probe(f"ClickHouse at {clickhouse_url}", self._ping, timeout_s)
        self.kafka = Probe(f"Kafka at {settings.kafka_bootstrap}", self._brokers, timeout_s)

    async def _ping(self) -> ComponentHealth:
        """`GET /ping` on a connection of its own (the shared client's may all be busy)."""
        s = self._settings
        reader, writer = await asyncio.open_connection(s.clickhouse_host, s.clickhouse_port)
        try:
            writer.write(f"GET /ping HTTP/1.0\r\nHost: {s.clickhouse_host}\r\n\r\n".encode())
            await writer.drain()
            status_line = (await reader.readline()).decode(errors="replace").strip()
        finally:
            writer.close()
        ok = status_line.split(" ")[1:2] == ["200"]
        return ComponentHealth(ok=ok, detail=f"{self.clickhouse.what}: /ping {status_line!r}")

    async def _brokers(self) -> ComponentHealth:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._kafka_thread, self._list_brokers)

    def _list_brokers(self) -> ComponentHealth:
        bootstrap = self._settings.kafka_bootstrap
        if self._admin is None:
            self._admin = AdminClient({**self._settings.kafka_client(), "log_level": 0})
        brokers = self._admin.list_topics(timeout=self._settings.health_timeout_s).brokers
        return ComponentHealth(ok=bool(brokers), detail=f"{len(brokers)} broker(s) at {bootstrap}")

    def close(self) -> None:
        self._kafka_thread.shutdown(wait=False, cancel_futures=True)
