"""Server-Sent Events framing (`text/event-stream`), as the HTML standard reads it: a blank
line ends an event, an event without a `data:` line is not dispatched, comments (`:`) are
counted, `id:` and `retry:` are ignored. The client and the benchmarks feed it lines."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    name: str
    """"message" when the server named none."""
    data: str
    received: float
    """When the line that completed it arrived (the caller's clock)."""


class EventParser:
    """Lines in, events out; counts the comments (heartbeats) and the events dropped for want
    of data."""

    def __init__(self) -> None:
        self._name = ""
        self._data: list[str] = []
        self.comments = 0
        self.without_data = 0

    def feed(self, line: str, received: float = 0.0) -> Event | None:
        if not line:
            name, data = self._name, self._data
            self._name, self._data = "", []
            if not data:
                self.without_data += bool(name)
                return None
            return Event(name or "message", "\n".join(data), received)
        if line.startswith(":"):
            self.comments += 1
            return None
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            self._name = value
        elif field == "data":
            self._data.append(value)
        return None
