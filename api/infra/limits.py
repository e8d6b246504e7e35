"""Bounds on what one request may ask (devices, metrics, the size of a JSON answer, the size
of its body), on how many readings answers stream at once and on failed authentications,
each refusal naming the setting behind it.

A JSON answer is one array the client must hold whole, a Parquet or Arrow answer one file
the engine builds whole before the first byte goes out: one spanning more than
`json_max_span_s` is counted first, stopping at `json_max_readings` (JSON) or
`columnar_max_readings` (Parquet, Arrow), and refused (400, pointing to the streamed
formats) past it; a shorter one is bounded by the memory limit of the API's ClickHouse user.
NDJSON and CSV are streamed as they are read."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sized
from datetime import datetime

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.infra.auth import MISSING, authenticate
from api.infra.errors import Busy, ParameterError

STREAMED = "format=ndjson or csv (streamed as they are read)"
BUILT_WHOLE = frozenset({"parquet", "arrow"})
"""Formats the engine builds whole (one file) before sending: counted before they are run."""


def check_count(parameter: str, names: Sized, limit: int, setting: str, hint: str) -> None:
    """At most `limit` names in `parameter` (400 naming it otherwise)."""
    if len(names) > limit:
        raise ParameterError(
            parameter, f"{len(names)} given, at most {limit} per request ({setting}): {hint}"
        )


def span_over(fmt: str, start: datetime, end: datetime, step_s: int | None, limit_s: int) -> bool:
    """Whether an answer held whole (JSON by the client, Parquet or Arrow by the engine)
    spans more than `limit_s` of raw readings, or more than `limit_s` buckets per series with
    a step: then its readings are counted before it is run."""
    if fmt != "json" and fmt not in BUILT_WHOLE:
        return False
    span_s = (end - start).total_seconds()
    return span_s > limit_s if step_s is None else span_s / step_s > limit_s


def json_refused(limit_s: int, max_readings: int) -> ParameterError:
    return ParameterError(
        "format",
        f"a JSON answer over more than {limit_s} s of readings (or buckets; "
        f"JOBSCOPE_JSON_MAX_SPAN_S) holds at most {max_readings} readings "
        f"(JOBSCOPE_JSON_MAX_READINGS), and this one holds more: ask {STREAMED}, a step, "
        "or a shorter time range",
    )


def columnar_refused(fmt: str, max_readings: int) -> ParameterError:
    return ParameterError(
        "format",
        f"a {fmt} answer is built whole before it is sent, so it holds at most {max_readings} "
        f"readings (JOBSCOPE_COLUMNAR_MAX_READINGS), and this one holds more: ask {STREAMED}, "
        "a step, or a shorter time range",
    )


class ExportSlots:
    """At most `limit` readings answers at once: each holds a ClickHouse query while it
    streams. Past the limit a request waits for a slot, at most `wait_s` and behind at most
    `queue` others (a burst of small answers is served in turn); beyond either it is refused
    (503, Retry-After) rather than left hanging."""

    def __init__(self, limit: int, queue: int, wait_s: float, retry_after_s: int) -> None:
        self.limit = limit
        self.queue = queue
        self.wait_s = wait_s
        self.retry_after_s = retry_after_s
        self.in_use = 0
        self.waiting = 0
        self._free = threading.Condition()

    def acquire(self) -> Callable[[], None]:
        """Take a slot (Busy when none frees in time); return its release, which may run
        twice."""
        with self._free:
            if self.in_use >= self.limit:
                if self.waiting >= self.queue:
                    raise self._busy(f"and {self.queue} more wait (JOBSCOPE_EXPORT_QUEUE)")
                self.waiting += 1
                try:
                    freed = self._free.wait_for(lambda: self.in_use < self.limit, self.wait_s)
                finally:
                    self.waiting -= 1
                if not freed:
                    raise self._busy(f"none freed in {self.wait_s:g} s (JOBSCOPE_EXPORT_WAIT_S)")
            self.in_use += 1
        released = threading.Event()

        def release() -> None:
            with self._free:
                if not released.is_set():
                    released.set()
                    self.in_use -= 1
                    self._free.notify()

        return release

    def _busy(self, why: str) -> Busy:
        return Busy(
            f"{self.limit} readings answers are streaming (JOBSCOPE_MAX_EXPORTS), {why}: "
            f"try again in {self.retry_after_s} s",
            self.retry_after_s,
        )


class FailedLogins:
    """Failed authentications per client address, in fixed windows: the `limit`-th failure
    within `window_s` of an address's first one blocks that address (429, Retry-After) until
    the window ends. At most `tracked` addresses are remembered, those that failed least
    recently forgotten first, so memory stays bounded however many addresses try."""

    def __init__(self, limit: int, window_s: float, tracked: int) -> None:
        self.limit = limit
        self.window_s = window_s
        self.tracked = tracked
        self._windows: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, client: str) -> int:
        """Seconds until `client` may try again (0: now)."""
        with self._lock:
            began, count = self._windows.get(client, (0.0, 0))
            left = began + self.window_s - time.monotonic()
            if left <= 0:
                self._windows.pop(client, None)
                return 0
            return math.ceil(left) if count >= self.limit else 0

    def failed(self, client: str) -> None:
        now = time.monotonic()
        with self._lock:
            began, count = self._windows.pop(client, (now, 0))
            if began + self.window_s <= now:
                began, count = now, 0
            self._windows[client] = (began, count + 1)
            while len(self._windows) > self.tracked:
                self._windows.popitem(last=False)

    def refusal(self, retry_after: int) -> str:
        return (
            f"{self.limit} failed authentications from this address within {self.window_s:g} s "
            f"(JOBSCOPE_AUTH_MAX_FAILURES, JOBSCOPE_AUTH_FAILURE_WINDOW_S): "
            f"try again in {retry_after} s"
        )


_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over {limit} bytes (JOBSCOPE_MAX_BODY_BYTES)")


class BodyGuard:
    """In front of every route, before anything reads a body: a write (POST, PUT, PATCH,
    DELETE) is authenticated first (401, 429 or 503 without reading its body; the routes
    check the role), then a body over JOBSCOPE_MAX_BODY_BYTES is refused with 413, by its
    Content-Length or, when streamed (chunked), as soon as the bytes read pass the limit.
    A response given before the body was read whole closes the connection instead of
    draining it. The (method, path) pairs of `own_cap` read their bodies themselves under a
    cap of their own (the push route) and are not counted here."""

    def __init__(self, app: ASGIApp, own_cap: Collection[tuple[str, str]] = ()) -> None:
        self.app = app
        self.own_cap = frozenset(own_cap)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        headers = dict(scope["headers"])
        if scope["method"] in _WRITES:
            try:
                who = authenticate(state, _bearer(headers), _client(scope))
            except HTTPException as exc:
                await _refuse(receive, send, exc)
                return
            scope.setdefault("state", {})["principal"] = who
        limit = (
            None
            if (scope["method"], scope["path"]) in self.own_cap
            else state.settings.max_body_bytes
        )
        length = headers.get(b"content-length", b"")
        if limit is not None and length and (not length.isdigit() or int(length) > limit):
            await _refuse(receive, send, BodyTooLarge(limit))
            return
        counted = _Counted(receive, limit)
        if length in (b"", b"0") and b"transfer-encoding" not in headers:
            counted.complete = True  # no body to leave unread

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not counted.complete:
                message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
            await send(message)

        await self.app(scope, counted, closing_send)


LINGER_BYTES = 64 * 1024
LINGER_S = 0.5


async def _linger(receive: Receive) -> None:
    """Read and drop what of the body has come already, at most LINGER_BYTES within LINGER_S
    (each piece waited for 50 ms at most): a connection closed with bytes unread is reset, and
    a reset can cut the answer under the client's feet. Never more: the body stays unread."""
    loop = asyncio.get_running_loop()
    deadline, dropped = loop.time() + LINGER_S, 0
    while dropped < LINGER_BYTES and (left := deadline - loop.time()) > 0:
        try:
            message = await asyncio.wait_for(receive(), min(0.05, left))
        except TimeoutError:
            return
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        dropped += len(message.get("body", b""))


async def _refuse(receive: Receive, send: Send, exc: HTTPException) -> None:
    """`exc` as the API's JSON error, closing the connection (the body stays unread)."""
    await _linger(receive)
    body = json.dumps({"error": exc.detail}).encode()
    headers = [(k.lower().encode(), v.encode()) for k, v in (exc.headers or {}).items()]
    headers += [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if (b"connection", b"close") not in headers:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": exc.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _bearer(headers: dict[bytes, bytes]) -> str:
    """The token of `Authorization: Bearer <token>`, or of InfluxDB's `Token <token>` (what
    Telegraf's and InfluxDB clients' outputs send): the same token either way."""
    scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    if scheme.lower() not in ("bearer", "token") or not token.strip():
        raise HTTPException(401, MISSING, {"WWW-Authenticate": "Bearer"})
    return token.strip()


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


class _Counted:
    """The request's receive, raising BodyTooLarge once more than `limit` bytes came."""

    def __init__(self, receive: Receive, limit: int | None) -> None:
        self.receive, self.limit, self.size = receive, limit, 0
        self.complete = False

    async def __call__(self) -> Message:
        message = await self.receive()
        if message["type"] == "http.request":
            self.size += len(message.get("body", b""))
            self.complete = not message.get("more_body", False)
            if self.limit is not None and self.size > self.limit:
                raise BodyTooLarge(self.limit)
        return message
