"""Server-Sent Events on the wire, and a response that never lets one client hold the
server: a client that does not take an event within `send_timeout_s` is disconnected, and
one that goes away is noticed at once (not at the next event)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson
from fastapi.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

log = logging.getLogger("jobscope.api.live")
KEEPALIVE = b": keepalive\n\n"
MEDIA_TYPE = "text/event-stream"


def event(name: str, data: Any) -> bytes:
    """One event; `data` as JSON (one line: JSON text holds no raw newline)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def json_lines_event(name: str, lines: list[bytes]) -> bytes:
    """One event whose data is the JSON array of `lines`, each a JSON text already."""
    return b"event: " + name.encode() + b"\ndata: [" + b",".join(lines) + b"]\n\n"


class EventStreamResponse(StreamingResponse):
    media_type = MEDIA_TYPE

    def __init__(
        self, content: Any, send_timeout_s: float, description: str, closed: Callable[[], None]
    ) -> None:
        """`closed` runs once the response ends, however it ends."""
        super().__init__(
            content,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
        self.send_timeout_s = send_timeout_s
        self.description = description
        self.closed = closed

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
            await timed({"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:
            log.warning(
                "live: %s: the client took nothing for %.0f s: disconnected",
                self.description,
                self.send_timeout_s,
            )
        except OSError:  # the client went away
            pass
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]

    @staticmethod
    async def _disconnected(receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
