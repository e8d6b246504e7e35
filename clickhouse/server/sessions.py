"""HTTP sessions (`session_id`): the database and settings that `USE` and `SET` leave behind."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

from clickhouse.server.errors import SYNTAX_ERROR, ClickHouseError

_ASSIGNMENT = re.compile(r"\s*(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|[^,]+?)\s*(?:,|$)")


@dataclass
class Session:
    database: str | None = None
    settings: dict[str, str] = field(default_factory=dict)
    last_used: float = field(default_factory=time.monotonic)


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
    def __init__(self, timeout_s: float) -> None:
        self._timeout = timeout_s
        self._sessions: dict[tuple[str, str], Session] = {}
        self._lock = threading.Lock()

    def get(self, user: str, session_id: str | None) -> Session:
        """The session of this user and id (a throw-away one without id)."""
        if not session_id:
            return Session()
        now = time.monotonic()
        with self._lock:
            for key in [k for k, s in self._sessions.items() if now - s.last_used > self._timeout]:
                del self._sessions[key]
            session = self._sessions.setdefault((user, session_id), Session())
            session.last_used = now
            return session
