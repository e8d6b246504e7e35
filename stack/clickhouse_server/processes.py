"""Query ids and users in `system.processes`, and `KILL QUERY`, as a real server has them.

The engine (chdb 4.1.7) gives every statement an id of its own and knows one user, so each
statement run for a request starts with a comment carrying the request's `query_id` and
user. A statement that reads `system.processes` reads it through a view that takes them from
that comment (statements without one are the server's own and are hidden); `KILL QUERY WHERE
...` finds the engine's ids of the matching queries through the same view and kills those.
"""

from __future__ import annotations

import re
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import quote

from stack.clickhouse_server.engine import EngineConnection
from stack.clickhouse_server.errors import (
    QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING,
    TOO_MANY_SIMULTANEOUS_QUERIES,
    ClickHouseError,
)
from stack.clickhouse_server.statements import string_literal

_TAG_ID = r"'^/\\* jobscope query_id=([^ ]*) user=[^ ]* \\*/ '"
_TAG_USER = r"'^/\\* jobscope query_id=[^ ]* user=([^ ]*) \\*/ '"
_TAG = r"'^/\\* jobscope [^*]* \\*/ '"
_KILL_QUERY = re.compile(
    r"^KILL QUERY WHERE (.+?)(?: (SYNC|ASYNC|TEST))?( FORMAT \w+(?: SETTINGS .+)?)?$", re.S
)
# A string literal (left as it is) or a reference to the table the view stands for.
_PROCESSES_REF = re.compile(r"'(?:[^'\\]|\\.)*'|\bsystem\.processes\b")
KILL_WAIT_S = 10.0


def tagged(sql: str, query_id: str, user: str) -> str:
    """`sql` marked as run for this query id and user (percent-encoded: no `*/`, no space)."""
    return f"/* jobscope query_id={quote(query_id, safe='')} user={quote(user, safe='')} */ {sql}"


def _view(with_engine_id: bool) -> str:
    engine_id = ", query_id AS _engine_query_id" if with_engine_id else ""
    return (
        "(SELECT * EXCEPT (_id, _user) REPLACE ("
        "decodeURLComponent(_id) AS query_id, decodeURLComponent(_id) AS initial_query_id, "
        "decodeURLComponent(_user) AS user, decodeURLComponent(_user) AS initial_user, "
        f"replaceRegexpOne(query, {_TAG}, '') AS query) "
        f"FROM (SELECT *, extract(query, {_TAG_ID}) AS _id, extract(query, {_TAG_USER}) AS _user"
        f"{engine_id} FROM system.processes) WHERE _id != '')"
    )


PROCESSES_VIEW = _view(with_engine_id=False)


def with_processes_view(canonical: str) -> str:
    """The statement reading `system.processes` through the view (string literals untouched)."""
    if "system.processes" not in canonical:
        return canonical
    return _PROCESSES_REF.sub(
        lambda m: m[0] if m[0].startswith("'") else f"{PROCESSES_VIEW} AS processes", canonical
    )


def kill_parts(canonical: str) -> tuple[str, str, str] | None:
    """(condition, mode, trailing FORMAT clause) of `KILL QUERY WHERE <condition>
    [SYNC|ASYNC|TEST] [FORMAT X]`, else None."""
    match = _KILL_QUERY.match(canonical.strip())
    if match is None:
        return None
    return match.group(1), (match.group(2) or "SYNC"), match.group(3) or ""


def kill_output_query(condition: str, mode: str, format_clause: str = "") -> str:
    """The rows KILL QUERY answers with (as ClickHouse: status, query_id, user, query)."""
    status = {"SYNC": "finished", "ASYNC": "waiting", "TEST": "test"}[mode]
    return (
        f"SELECT {string_literal(status)} AS kill_status, query_id, user, query "
        f"FROM {PROCESSES_VIEW} AS processes WHERE {condition}{format_clause}"
    )


def engine_ids_query(condition: str) -> str:
    return f"SELECT _engine_query_id FROM {_view(with_engine_id=True)} WHERE {condition}"


def kill_engine_queries(
    run: Callable[[str], bytes], engine_ids: list[str], wait: bool, timeout_s: float = KILL_WAIT_S
) -> None:
    """Cancel the engine's queries; with `wait`, until they have left `system.processes`.

    The engine's own `KILL QUERY ... SYNC` never returns (chdb 4.1.7), so the server waits.
    """
    if not engine_ids:
        return
    ids = ", ".join(string_literal(i) for i in engine_ids)
    run(f"KILL QUERY WHERE query_id IN ({ids}) ASYNC")
    deadline = time.monotonic() + timeout_s
    while wait and time.monotonic() < deadline:
        left = run(f"SELECT count() FROM system.processes WHERE query_id IN ({ids})")
        if left.strip() == b"0":
            return
        time.sleep(0.02)


def kill_query_id(conn: EngineConnection, query_id: str) -> int:
    """Cancel the engine's queries of a request (without waiting); returns how many."""
    condition = f"query_id = {string_literal(query_id)}"
    ids = conn.run(engine_ids_query(condition)).decode().split()
    kill_engine_queries(conn.run, ids, wait=False)
    return len(ids)


class DisconnectWatch:
    """Cancels the engine's queries of a request whose client has closed its connection, as
    a query that nobody will read must not hold an engine connection and cores (ClickHouse's
    `cancel_http_readonly_queries_on_client_close`). One thread polls every watched socket."""

    def __init__(self, cancel: Callable[[str], None], interval_s: float = 0.2) -> None:
        self._cancel = cancel
        self._interval = interval_s
        self._watched: dict[int, tuple[socket.socket, str]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self, sock: socket.socket, query_id: str) -> Iterator[None]:
        fd = sock.fileno()
        with self._lock:
            self._watched[fd] = (sock, query_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="disconnects", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._watched.pop(fd, None)

    def _run(self) -> None:
        while True:
            time.sleep(self._interval)
            with self._lock:
                watched = dict(self._watched)
            poller = select.poll()
            for fd in watched:
                poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
            for fd, _ in poller.poll(0):
                sock, query_id = watched[fd]
                if _closed(sock):
                    with self._lock:
                        gone = self._watched.pop(fd, None) is not None
                    if gone:
                        self._cancel(query_id)


def _closed(sock: socket.socket) -> bool:
    """Whether the peer has closed (a readable socket with nothing to read)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class RunningQueries:
    """The requests running now: ClickHouse refuses a second query with an id in use, and one
    more query of a user already running as many as it may."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._per_user: Counter[str] = Counter()
        self._lock = threading.Lock()

    @contextmanager
    def claim(self, query_id: str, user: str, max_for_user: int = 0) -> Iterator[None]:
        with self._lock:
            if query_id in self._ids:
                raise ClickHouseError(
                    QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING,
                    f"Query with id = {query_id} is already running.",
                )
            running = self._per_user[user]
            if max_for_user and running >= max_for_user:
                raise ClickHouseError(
                    TOO_MANY_SIMULTANEOUS_QUERIES,
                    f"Too many simultaneous queries for user {user}. Current: {running}, "
                    f"maximum: {max_for_user}",
                )
            self._ids.add(query_id)
            self._per_user[user] += 1
        try:
            yield
        finally:
            with self._lock:
                self._ids.discard(query_id)
                self._per_user[user] -= 1
