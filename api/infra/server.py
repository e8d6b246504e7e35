"""Serving the API with uvicorn, guarded against slow and idle clients.

uvicorn 0.54 (h11) has no header or body read timeout: a connection that never completes its
request line and headers, or sends them a byte at a time, stays open for good (its
keep-alive timer starts only after a first response, and any byte cancels it). Such clients
hold no thread (the server is asynchronous) but would pile up; `GuardedH11Protocol` closes a
connection whose request head is not complete `header_timeout_s` after it began (408 sent
first), or whose body is not complete `body_timeout_s` after its headers, however slowly
bytes keep coming. `max_connections` bounds open connections (uvicorn's limit_concurrency:
past it a request gets 503).
"""

from __future__ import annotations

import asyncio
import logging

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from api.infra.config import ApiSettings

log = logging.getLogger("jobscope.api")
_REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class GuardedH11Protocol(H11Protocol):
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    _deadline: asyncio.TimerHandle | None = None
    _phase: str = ""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("head", self.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and self._deadline is None:
            self._arm("head", self.header_timeout_s)  # the next request on a kept-alive connection
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._phase != "body":
                self._arm("body", self.body_timeout_s)
        elif state is not h11.IDLE:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, phase: str, timeout_s: float) -> None:
        self._disarm()
        self._phase = phase
        self._deadline = self.loop.call_later(timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._phase = None, ""

    def _expired(self) -> None:
        phase, self._deadline = self._phase, None
        if self.transport.is_closing():
            return
        log.debug("closing %s: request %s not complete in time", self.client, phase)
        if phase == "head":
            self.transport.write(_REQUEST_TIMEOUT)
        self.transport.close()


def guarded_protocol(settings: ApiSettings) -> type[GuardedH11Protocol]:
    """The protocol class with the configured timeouts (uvicorn creates one per connection)."""
    timeouts = {"header_timeout_s": settings.header_timeout_s}
    timeouts["body_timeout_s"] = settings.body_timeout_s
    return type("GuardedH11Protocol", (GuardedH11Protocol,), timeouts)


def serve(app: FastAPI, settings: ApiSettings) -> None:
    """Serve `app` (made by api/main.py, which this module does not import) until stopped."""
    uvicorn.run(
        app,
        host=settings.api_host,
        port=settings.api_port,
        http=guarded_protocol(settings),
        limit_concurrency=settings.max_connections,
        # the client of a proxied request is the one X-Forwarded-For names (throttling)
        proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        log_level="info",
        access_log=False,
        # live streams never end on their own: past this, shutdown closes them
        timeout_graceful_shutdown=settings.shutdown_timeout_s,
    )
