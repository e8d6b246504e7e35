"""Server-Sent Events on the wire, and a response that never lets one client hold the
server: a client that does not take an event within `send_timeout_s` is disconnected, and
one that goes away is noticed at once (not at the next event)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from api.infra.streaming import GuardedStreamingResponse

log = logging.getLogger("jobscope.api.live")
KEEPALIVE = b": keepalive\n\n"
MEDIA_TYPE = "text/event-stream"


def event(name: str, data: Any) -> bytes:
    """One event; `data` as JSON (one line: JSON text holds no raw newline)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def json_lines_event(name: str, lines: list[bytes]) -> bytes:
    """One event whose data is the JSON array of `lines`, each a JSON text already."""
    return b"event: " + name.encode() + b"\ndata: [" + b",".join(lines) + b"]\n\n"


class EventStreamResponse(GuardedStreamingResponse):
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

    def timed_out(self) -> None:
        log.warning(
            "live: %s: the client took nothing for %.0f s: disconnected",
            self.description,
            self.send_timeout_s,
        )

    async def finish(self) -> None:
        await self.body_iterator.aclose()  # type: ignore[attr-defined]
