"""The ClickHouse engine in this process: a pool of chdb connections to one data directory.

chdb runs one streaming query per connection (a second query on a connection with an open
stream silently returns nothing), so every request borrows a connection of its own for as
long as its result streams; the pool size bounds the queries running at once.
"""

from __future__ import annotations

import contextlib
import queue
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chdb

from stack.clickhouse_server import sql_policy
from stack.clickhouse_server.errors import (
    SERVER_SHUTTING_DOWN,
    TOO_MANY_SIMULTANEOUS_QUERIES,
    ClickHouseError,
)
from stack.clickhouse_server.statements import escape_param, settings_list

_PARSER_SCOPE = re.compile(
    r"\.? ?: In scope SELECT formatQuerySingleLine\(.*\)\.?(?= \(\w+\)$)", re.S
)


def _unescape_tsv(value: str) -> str:
    """A TSV field back to its text (ClickHouse escapes backslash, tab and newline)."""
    return re.sub(r"\\(.)", lambda m: {"t": "\t", "n": "\n"}.get(m[1], m[1]), value)


# Bytes that are not UTF-8 reach the server as lone surrogates (`surrogateescape`). For the
# parser's text they become private-use characters (which it copies as they are), and back.
_TO_PRIVATE = {0xDC80 + i: 0xF780 + i for i in range(128)}
_FROM_PRIVATE = {v: k for k, v in _TO_PRIVATE.items()}


def statement_text(data: bytes) -> str:
    """Statement bytes as text, any byte that is not UTF-8 kept (it goes back out as it came)."""
    return data.decode("utf-8", "surrogateescape")


def _raw(sql: str) -> bytes:
    return sql.encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Summary:
    """What the engine reports of a statement it ran (ClickHouse's X-ClickHouse-Summary)."""

    rows: int = 0
    bytes: int = 0
    elapsed_s: float = 0.0


def quote_identifier(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


class _CanonicalCache:
    """Statement text -> canonical text, shared by the pool's connections: applications send
    the same parameterised statements again and again, and parsing one costs an engine
    query (~1.3 ms, a third of a small request). Least recently used entries go first."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._entries: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, statement: str) -> str | None:
        with self._lock:
            found = self._entries.get(statement)
            if found is not None:
                self._entries.move_to_end(statement)
            return found

    def put(self, statement: str, canonical: str) -> None:
        with self._lock:
            self._entries[statement] = canonical
            if len(self._entries) > self._size:
                self._entries.popitem(last=False)


class EngineConnection:
    """One chdb connection and the database it currently uses."""

    _canonical = _CanonicalCache()
    _trees = _CanonicalCache()

    def __init__(self, connection_string: str) -> None:
        self._conn = chdb.connect(connection_string)
        self.database = "default"
        self.read = Summary()
        """What the statement run last read (so far, while its result streams)."""

    def use(self, database: str) -> None:
        if database != self.database:
            self.run(f"USE {quote_identifier(database)}")
            self.database = database

    def canonical(self, statement: str) -> str:
        """The statement as ClickHouse's parser prints it; raises on several statements."""
        if (cached := self._canonical.get(statement)) is not None:
            return cached
        try:
            text = self.run(
                "SELECT formatQuerySingleLine({q:String})",
                {"q": escape_param(statement.translate(_TO_PRIVATE))},
                "TSVRaw",
            )
        except ClickHouseError as exc:
            exc.message = _PARSER_SCOPE.sub("", exc.message)
            raise
        canonical = text.decode().rstrip("\n").translate(_FROM_PRIVATE)
        self._canonical.put(statement, canonical)
        return canonical

    def parse_tree(self, canonical: str, params: Mapping[str, str]) -> str:
        """The engine parser's tree of a canonical statement (`EXPLAIN AST`, which parses and
        runs nothing), checked to be the whole dump (sql_policy.check_dump)."""
        if (cached := self._trees.get(canonical)) is not None:
            return cached
        # A FORMAT clause of the statement belongs to it, not to EXPLAIN: the dump is TSVRaw.
        tree = self.run(f"EXPLAIN AST {canonical}", params, "TSVRaw").decode()
        sql_policy.check_dump(tree)
        self._trees.put(canonical, tree)
        return tree

    def restrict(self, settings: Mapping[str, str]) -> None:
        """Apply a read-only user's profile (and the settings it may give) to this connection,
        `readonly=1` last: from then on it can neither write nor change a setting."""
        self.run("SET " + settings_list({**settings, "readonly": "1"}))

    def run(self, sql: str, params: Mapping[str, str] | None = None, fmt: str = "TSV") -> bytes:
        """Run a statement to completion and return its whole (small) output."""
        return bytes(self._query(sql, params, fmt).bytes())

    def _query(self, sql: str, params: Mapping[str, str] | None, fmt: str) -> Any:
        try:
            result = self._conn.query(_raw(sql), fmt, params=dict(params or {}))
        except Exception as exc:
            raise ClickHouseError.from_engine(exc) from exc
        self.read = Summary(result.rows_read(), result.bytes_read(), result.elapsed())
        return result

    def run_with_settings(
        self, sql: str, params: Mapping[str, str], settings: Mapping[str, str]
    ) -> bytes:
        """Run a statement that takes no SETTINGS clause of query settings (DDL, ALTER,
        OPTIMIZE, SYSTEM...) under the request's settings: SET on this connection for the
        statement, then the previous values back, so the next request does not inherit them."""
        if not settings:
            return self.run(sql, params)
        names = ", ".join(f"'{name}'" for name in settings)  # names checked by settings_list
        assignments = settings_list(settings)
        previous = self.run(f"SELECT name, value FROM system.settings WHERE name IN ({names})")
        self.run(f"SET {assignments}")
        try:
            return self.run(sql, params)
        finally:
            rows = [line.split("\t", 1) for line in previous.decode().splitlines()]
            if rows:
                self.run("SET " + settings_list({name: _unescape_tsv(v) for name, v in rows}))

    def stream(self, sql: str, params: Mapping[str, str], fmt: str) -> Iterator[bytes]:
        """Yield the output of a query chunk by chunk; closing the generator cancels it."""
        try:
            self.read = Summary()
            result = self._conn.send_query(_raw(sql), fmt, params=dict(params))
        except Exception as exc:
            raise ClickHouseError.from_engine(exc) from exc
        finished = False
        try:
            while True:
                try:
                    chunk = result.fetch()
                except Exception as exc:
                    finished = True
                    raise ClickHouseError.from_engine(exc) from exc
                if chunk is None:
                    finished = True
                    return
                self.read = Summary(
                    self.read.rows + chunk.rows_read(),
                    self.read.bytes + chunk.bytes_read(),
                    chunk.elapsed(),
                )
                yield bytes(chunk.bytes())
        finally:
            if not finished:
                with contextlib.suppress(Exception):
                    result.cancel()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()


class _ProfilePool:
    """Connections under one read-only profile: at most `size` in use at once; idle ones
    kept, already restricted, for the next request without settings of its own."""

    def __init__(self, settings: Mapping[str, str], size: int) -> None:
        self.settings = dict(settings)
        self.slots = threading.BoundedSemaphore(size)
        self.idle: queue.LifoQueue[EngineConnection] = queue.LifoQueue()
        self.in_use = 0


class Engine:
    """The pools of connections every request borrows from: the read-write user's, and one
    for each read-only profile (users.profiles)."""

    def __init__(
        self,
        data_dir: Path,
        connection_string: str,
        pool_size: int,
        max_session_connections: int = 16,
        profiles: Mapping[str, tuple[Mapping[str, str], int]] | None = None,
    ) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self._connection_string = connection_string
        self._all = [EngineConnection(connection_string) for _ in range(pool_size)]
        self._free: queue.LifoQueue[EngineConnection] = queue.LifoQueue()
        for conn in self._all:
            self._free.put(conn)
        self._closing = False
        self._max_session_connections = max_session_connections
        self._session_connections: set[EngineConnection] = set()
        self._lock = threading.Lock()
        self._profiles = {
            name: _ProfilePool(*profile) for name, profile in (profiles or {}).items()
        }
        self._control = EngineConnection(connection_string)
        self._control_lock = threading.Lock()

    def connections_in_use(self) -> dict[str, int]:
        """Engine connections serving a request now, by pool: the read-write user's, each
        read-only profile's, and the sessions' own (held while their temporary tables live)."""
        with self._lock:
            return {
                "read_write": len(self._all) - self._free.qsize(),
                **{name: pool.in_use for name, pool in self._profiles.items()},
                "session": len(self._session_connections),
            }

    def profile(self, name: str | None) -> Mapping[str, str]:
        """The settings of a read-only profile (none for the read-write user)."""
        return self._profiles[name].settings if name is not None else {}

    @contextlib.contextmanager
    def control(self) -> Iterator[EngineConnection]:
        """The server's own connection (finding and killing queries), never busy for long."""
        with self._control_lock:
            yield self._control

    def open_session_connection(self) -> EngineConnection:
        """A connection of its own for an HTTP session: its temporary tables live on it,
        where no other session sees them (an engine connection is a ClickHouse session)."""
        with self._lock:
            if self._closing:
                raise ClickHouseError(SERVER_SHUTTING_DOWN, "The server is shutting down")
            if len(self._session_connections) >= self._max_session_connections:
                raise ClickHouseError(
                    TOO_MANY_SIMULTANEOUS_QUERIES,
                    f"Too many sessions with temporary tables: at most "
                    f"{self._max_session_connections}; end one (or let it time out) first",
                )
            conn = EngineConnection(self._connection_string)
            self._session_connections.add(conn)
        return conn

    def close_session_connection(self, conn: EngineConnection) -> None:
        with self._lock:
            self._session_connections.discard(conn)
        conn.close()

    @contextlib.contextmanager
    def connection(self, timeout: float) -> Iterator[EngineConnection]:
        """A connection of the read-write user's pool."""
        if self._closing:
            raise ClickHouseError(SERVER_SHUTTING_DOWN, "The server is shutting down")
        try:
            conn = self._free.get(timeout=timeout)
        except queue.Empty:
            raise ClickHouseError(
                TOO_MANY_SIMULTANEOUS_QUERIES,
                f"Too many simultaneous queries: all {len(self._all)} engine connections busy",
            ) from None
        try:
            yield conn
        finally:
            self._free.put(conn)

    @contextlib.contextmanager
    def read_only_connection(
        self,
        timeout: float,
        profile: str,
        settings: Mapping[str, str],
        prepare: Callable[[EngineConnection], None] | None = None,
    ) -> Iterator[EngineConnection]:
        """A connection under a read-only profile, `readonly=1` set on it. A request with
        settings of its own (checked by sql_policy) or a preparation (its external tables,
        made before the connection is restricted) gets a new connection, closed after it;
        any other an idle one of the profile."""
        if self._closing:
            raise ClickHouseError(SERVER_SHUTTING_DOWN, "The server is shutting down")
        pool = self._profiles[profile]
        if not pool.slots.acquire(timeout=timeout):
            raise ClickHouseError(
                TOO_MANY_SIMULTANEOUS_QUERIES,
                f"Too many simultaneous queries of {profile} users: the engine connections "
                "they share are all busy",
            )
        with self._lock:
            pool.in_use += 1
        try:
            if settings or prepare is not None:
                conn = EngineConnection(self._connection_string)
                try:
                    if prepare is not None:
                        prepare(conn)
                    conn.restrict({**pool.settings, **settings})
                    yield conn
                finally:
                    conn.close()
                return
            try:
                conn = pool.idle.get_nowait()
            except queue.Empty:
                conn = EngineConnection(self._connection_string)
                conn.restrict(pool.settings)
            try:
                yield conn
            finally:
                pool.idle.put(conn)
        finally:
            with self._lock:
                pool.in_use -= 1
            pool.slots.release()

    def close(self, grace_s: float = 10.0) -> None:
        """Refuse new queries, let running ones finish (up to `grace_s`), then close."""
        self._closing = True
        deadline = time.monotonic() + grace_s
        for _ in self._all:
            try:
                self._free.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
        for conn in reversed(self._all):
            conn.close()
        for pool in self._profiles.values():
            while not pool.idle.empty():
                pool.idle.get_nowait().close()
        self._control.close()
        with self._lock:
            sessions, self._session_connections = self._session_connections, set()
        for conn in sessions:
            conn.close()
