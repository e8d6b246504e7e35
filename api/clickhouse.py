"""The API's one ClickHouse client, created on first use so the API starts (and reports
itself degraded) while ClickHouse is down, and recreated after a failure."""

from __future__ import annotations

import threading

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from api.config import ApiSettings


class ClickHouseUnavailable(RuntimeError):
    pass


class ClickHouseProvider:
    def __init__(self, settings: ApiSettings) -> None:
        self._settings = settings
        self._client: Client | None = None
        self._lock = threading.Lock()

    def get(self) -> Client:
        with self._lock:
            if self._client is None:
                s = self._settings
                try:
                    # No session: requests from the worker threads stay independent.
                    self._client = clickhouse_connect.get_client(
                        host=s.clickhouse_host,
                        port=s.clickhouse_port,
                        username=s.clickhouse_api_user,
                        password=s.clickhouse_api_password.get_secret_value(),
                        database=s.clickhouse_database,
                        autogenerate_session_id=False,
                        connect_timeout=s.health_timeout_s,
                    )
                except Exception as exc:
                    raise ClickHouseUnavailable(
                        f"ClickHouse at {s.clickhouse_host}:{s.clickhouse_port}: {exc}"
                    ) from exc
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
