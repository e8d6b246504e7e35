"""Server-Sent Events read with httpx on asyncio, so that a benchmark holds many streams open
in one process at little cost; the framing is the client's (jobscope/sse.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping

import httpx

from jobscope.sse import Event, EventParser


async def events(
    client: httpx.AsyncClient,
    url: str,
    params: Mapping[str, str],
    parser: EventParser,
) -> AsyncIterator[Event]:
    """The events of one stream until the server closes it (the client's own headers, e.g. a
    token, are sent); RuntimeError (status, content type and the start of the body) when the
    answer is not an event stream."""
    async with client.stream("GET", url, params=params) as response:
        kind = response.headers.get("content-type", "")
        if response.status_code != 200 or not kind.startswith("text/event-stream"):
            body = (await response.aread())[:300].decode(errors="replace")
            raise RuntimeError(f"GET {response.url}: {response.status_code} {kind!r}: {body}")
        async for line in response.aiter_lines():
            event = parser.feed(line, time.time())
            if event is not None:
                yield event
