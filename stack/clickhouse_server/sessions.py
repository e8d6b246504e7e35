"""HTTP sessions (`session_id`): the database and settings that `USE` and `SET` leave behind,
and the engine connection their temporary tables live on."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from stack.clickhouse_server.engine import EngineConnection
from stack.clickhouse_server.errors import SESSION_IS_LOCKED, SYNTAX_ERROR, ClickHouseError

_ASSIGNMENT = re.compile(r"\s*(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|[^,]+?)\s*(?:,|$)")


@dataclass
class Session:
    id: str | None = None
    """None: a request without `session_id`, whose session ends with it."""
    database: str | None = None
    settings: dict[str, str] = field(default_factory=dict)
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False
    """A request of this session is running: ClickHouse refuses a second one at once."""
    connection: EngineConnection | None = None
    """Its own engine connection, from its first temporary table on; closed when it expires."""


def parse_set(canonical: str) -> dict[str, str]:
    """`SET a = 1, b = 'x'` (as ClickHouse prints it) -> {'a': '1', 'b': 'x'}."""
    body = canonical[len("SET") :].strip()
    result: dict[str, str] = {}
    pos = 0
    while pos < len(body):
        match = _ASSIGNMENT.match(body, pos)
        if match is None:
            raise ClickHouseError(SYNTAX_ERROR, f"Cannot parse SET statement: {canonical}")
        name, value = match.groups()
        if value.startswith("'"):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        result[name] = value
        pos = match.end()
    return result


class SessionStore:
    def __init__(
        self, timeout_s: float, close_connection: Callable[[EngineConnection], None]
    ) -> None:
        self._timeout = timeout_s
        self._close_connection = close_connection
        self._sessions: dict[tuple[str, str], Session] = {}
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, user: str, session_id: str | None) -> Iterator[Session]:
        """The session of this user and id (a throw-away one without id) for one request;
        code 373 while another request of the same session runs, as ClickHouse answers."""
        if not session_id:
            yield Session()
            return
        now = time.monotonic()
        with self._lock:
            expired = [
                k
                for k, s in self._sessions.items()
                if not s.busy and now - s.last_used > self._timeout
            ]
            connections = [c for k in expired if (c := self._sessions.pop(k).connection)]
            session = self._sessions.setdefault((user, session_id), Session(session_id))
            locked, session.busy = session.busy, True
        for connection in connections:
            self._close_connection(connection)
        if locked:
            raise ClickHouseError(
                SESSION_IS_LOCKED, f"Session {session_id} is locked by a concurrent client"
            )
        try:
            yield session
        finally:
            with self._lock:
                session.busy = False
                session.last_used = time.monotonic()
