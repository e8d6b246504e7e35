"""The API's one ClickHouse client, created on first use so the API starts (and reports
itself degraded) while ClickHouse is down, and recreated after a failure."""

from __future__ import annotations

import math
import threading

import clickhouse_connect
import urllib3.exceptions
from clickhouse_connect.driver.client import Client

from api.infra.config import ApiSettings


class ClickHouseUnavailable(RuntimeError):
    """ClickHouse down, restarting (503) or too slow (504); the message names its URL."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def failure(exc: BaseException, url: str, timeout_s: float) -> tuple[int, str]:
    """The status and message of a ClickHouse connection failure (clickhouse-connect's
    OperationalError or a urllib3 error): 504 when ClickHouse took too long, 503 when it is
    down or restarting (refused, reset, closed mid-answer)."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and cause not in chain:
        chain.append(cause)
        reason = getattr(cause, "reason", None)  # urllib3's MaxRetryError wraps the reason
        cause = reason if isinstance(reason, BaseException) else cause.__cause__
    if any(isinstance(c, urllib3.exceptions.ReadTimeoutError) for c in chain):
        return 504, (
            f"ClickHouse at {url} did not answer within {timeout_s:g} s "
            "(JOBSCOPE_QUERY_TIMEOUT_S): narrow the query or try again later"
        )
    last = chain[-1]
    lines = str(last).splitlines() or [type(last).__name__]
    # urllib3: "HTTPConnection(host=..., port=...): Failed to establish ...: [Errno 111] ..."
    detail = lines[0].rsplit(": ", 1)[-1] if isinstance(last, OSError) else lines[0]
    return 503, f"ClickHouse at {url} is not answering: {detail}"


class ClickHouseProvider:
    def __init__(self, settings: ApiSettings) -> None:
        self._settings = settings
        self._client: Client | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{self._settings.clickhouse_host}:{self._settings.clickhouse_port}"

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
                        connect_timeout=math.ceil(s.health_timeout_s),  # whole seconds only
                        # a query, or the next bytes of a stream, not come by then: 504
                        send_receive_timeout=math.ceil(s.query_timeout_s),
                    )
                except Exception as exc:
                    raise ClickHouseUnavailable(*failure(exc, self.url, s.query_timeout_s)) from exc
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
