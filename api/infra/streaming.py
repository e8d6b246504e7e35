"""Streamed answers that never let one client hold the server (readings exports here, live
streams in api/live/sse.py): a client that takes no bytes for `send_timeout_s` is
disconnected, one that goes away is noticed at once, and what the answer holds (its ClickHouse
query, its export slot) is released however it ends."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping

import urllib3.exceptions
from clickhouse_connect.driver.exceptions import OperationalError
from fastapi.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

log = logging.getLogger("jobscope.api")


class GuardedStreamingResponse(StreamingResponse):
    """A streamed answer that never lets one client hold the server: a client that takes no
    bytes for `send_timeout_s` is disconnected, one that goes away is noticed at once (not at
    the next chunk), and `closed` runs once the answer ends, however it ends."""

    send_timeout_s: float
    closed: Callable[[], None]
    sent: int = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.create_task(self._stream(send))
        listening = asyncio.create_task(self._disconnected(receive))
        try:
            await asyncio.wait({streaming, listening}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (streaming, listening):
                task.cancel()
            await asyncio.gather(streaming, listening, return_exceptions=True)
            self.closed()

    async def _stream(self, send: Send) -> None:
        async def timed(message: Message) -> None:
            await asyncio.wait_for(send(message), self.send_timeout_s)

        try:
            await timed({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                await timed({"type": "http.response.body", "body": chunk, "more_body": True})
                self.sent += len(chunk)
            await timed({"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:
            self.timed_out()
        except OSError:  # the client went away
            pass
        except Exception as exc:
            if not self.failed(exc):
                raise
        finally:
            await self.finish()

    def timed_out(self) -> None:
        """The client took nothing for send_timeout_s and was disconnected."""

    def failed(self, exc: Exception) -> bool:
        """Whether an error of the content after the status was sent is handled here."""
        return False

    async def finish(self) -> None:
        """Release what the content holds, after the last chunk or the first failure."""

    @staticmethod
    async def _disconnected(receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass


class ExportResponse(GuardedStreamingResponse):
    def __init__(
        self,
        content: Iterator[bytes],
        media_type: str,
        headers: Mapping[str, str],
        send_timeout_s: float,
        closed: Callable[[], None],
    ) -> None:
        """`closed` runs once the answer ends, however it ends (or if it is never sent)."""
        super().__init__(content, media_type=media_type, headers=headers)
        self.send_timeout_s = send_timeout_s
        self.closed = closed

    def __del__(self) -> None:
        self.closed()  # an answer dropped unsent (e.g. the client left before it started)

    def timed_out(self) -> None:
        log.warning(
            "readings answer: the client took nothing for %.0f s: disconnected after %d bytes "
            "(JOBSCOPE_EXPORT_SEND_TIMEOUT_S)",
            self.send_timeout_s,
            self.sent,
        )

    def failed(self, exc: Exception) -> bool:
        if not isinstance(exc, OperationalError | urllib3.exceptions.HTTPError):
            return False
        # The status is sent: the client learns of the failure by a truncated answer.
        log.warning(
            "readings answer: ClickHouse failed after %d bytes, connection closed: %s",
            self.sent,
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )
        return True
