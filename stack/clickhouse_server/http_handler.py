"""ClickHouse's HTTP interface: one request in, one statement run by the engine, its output out."""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import socket
import string
import sys
import tempfile
import threading
import uuid
from collections.abc import Generator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

from stack.clickhouse_server import native, processes, sql_policy, statements
from stack.clickhouse_server.compression import choose_encoding, compress_stream
from stack.clickhouse_server.config import ServerSettings
from stack.clickhouse_server.engine import (
    Engine,
    EngineConnection,
    Summary,
    quote_identifier,
    statement_text,
)
from stack.clickhouse_server.errors import (
    NOT_IMPLEMENTED,
    QUERY_IS_TOO_LARGE,
    SOCKET_TIMEOUT,
    ClickHouseError,
)
from stack.clickhouse_server.forms import (
    ExternalTable,
    external_tables,
    is_form,
    parse_form,
    read_form,
)
from stack.clickhouse_server.monitoring import ServerMetrics
from stack.clickhouse_server.request_body import RequestBody
from stack.clickhouse_server.sessions import Session, SessionStore, parse_set
from stack.clickhouse_server.users import User, authenticate, credentials, users_from_settings

log = logging.getLogger("clickhouse.server")

# URL parameters that steer the HTTP exchange; every other one is a query setting.
TRANSPORT_PARAMS = frozenset(
    {
        "query",
        "database",
        "default_format",
        "user",
        "password",
        "quota_key",
        "query_id",
        "session_id",
        "session_timeout",
        "session_check",
        "compress",
        "decompress",
        "enable_http_compression",
        "buffer_size",
        "wait_end_of_query",
        "send_progress_in_http_headers",
        "http_headers_progress_interval_ms",
        "http_zlib_compression_level",
        "http_response_buffer_size",
        "client_protocol_version",
        "role",
    }
)


class ClickHouseHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # ClickHouse's listen backlog: with Python's default of 5, a burst of new connections
    # overflows the queue and the kernel drops SYNs, which clients retry only after 1 s.
    request_queue_size = 4096

    def __init__(self, settings: ServerSettings, engine: Engine) -> None:
        self.settings = settings
        self._connections = threading.BoundedSemaphore(settings.max_connections)
        self.engine = engine
        self.users = users_from_settings(settings)
        self.sessions = SessionStore(settings.session_timeout_s, engine.close_session_connection)
        self.running = processes.RunningQueries()
        self.disconnects = processes.DisconnectWatch(self.cancel_query)
        self.open_connections = 0
        self._open_lock = threading.Lock()
        self.metrics = ServerMetrics(settings, engine, lambda: self.open_connections)
        settings.spool_dir.mkdir(parents=True, exist_ok=True)
        super().__init__((settings.host, settings.port), ClickHouseRequestHandler)

    def process_request(self, request: socket.socket, client_address: tuple[str, int]) -> None:
        """One thread per connection, up to max_connections: beyond, a connection is closed
        at once, so slow or idle clients cannot make the server grow without bound."""
        if not self._connections.acquire(blocking=False):
            log.warning(
                "%s: %d connections open already; closed",
                client_address[0],
                self.settings.max_connections,
            )
            self.shutdown_request(request)
            return
        with self._open_lock:
            self.open_connections += 1
        super().process_request(request, client_address)

    def process_request_thread(
        self, request: socket.socket, client_address: tuple[str, int]
    ) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self.open_connections -= 1
            self._connections.release()

    def cancel_query(self, query_id: str) -> None:
        """The client of a running query has gone: stop the engine's work for it."""
        try:
            with self.engine.control() as conn:
                cancelled = processes.kill_query_id(conn, query_id)
            log.info(
                "query %s: client went away; %d engine query(ies) cancelled", query_id, cancelled
            )
        except ClickHouseError as exc:
            log.warning("query %s: client went away; cancelling failed: %s", query_id, exc.message)

    def handle_error(self, request: object, client_address: tuple[str, int]) -> None:
        """A client closing its (idle keep-alive) connection is routine, not a traceback."""
        if isinstance(sys.exception(), ConnectionError):
            log.debug("%s closed the connection", client_address[0])
            return
        log.exception("unexpected error serving %s", client_address[0])


class ClickHouseRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body chunks are separate small writes: with Nagle's algorithm each one
    # after the first waits for the client's delayed ACK, 40 ms per response.
    disable_nagle_algorithm = True
    server: ClickHouseHTTPServer
    server_version = "jobscope-clickhouse"
    _body: RequestBody | None = None
    _handling = False  # inside _handle: answers close the connection when its body is unread
    _expect_continue = False
    _query_failed = False  # counted as failed already (an error after the first rows)

    def setup(self) -> None:
        self.timeout = self.server.settings.receive_timeout_s  # each read of a request
        super().setup()

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s " + format, self.client_address[0], *args)

    def handle_expect_100(self) -> bool:
        """`Expect: 100-continue` is answered when the body is first read, after authentication
        (as ClickHouse does), so a refused client is told so before it sends the body."""
        self._expect_continue = True
        return True

    def end_headers(self) -> None:
        """An answer that leaves its request's body unread ends the connection, and says so:
        reading (and decompressing) the rest would cost what the request was refused for."""
        if self._handling and (self.close_connection or self._body_pending()):
            self.send_header("Connection", "close")
        super().end_headers()

    def do_GET(self) -> None:
        self._handle(is_get=True)

    def do_POST(self) -> None:
        self._handle(is_get=False)

    # --- request handling -------------------------------------------------------------

    def _handle(self, is_get: bool) -> None:
        url = urlsplit(self.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        query_id = params.get("query_id") or str(uuid.uuid4())
        self._body = None
        self._handling = True
        self._response_open = False
        send_continue, self._expect_continue = self._expect_continue, False
        self._query_failed = False
        try:
            if (
                url.path in ("/ping", "/")
                and "query" not in params
                and (is_get or not self.headers.get("Content-Length", "0").strip("0"))
                and "chunked" not in self.headers.get("Transfer-Encoding", "")
            ):
                self._send(200, [b"Ok.\n"], {"Content-Type": "text/plain; charset=UTF-8"})
                return
            if url.path == "/metrics" and is_get:  # Prometheus' exposition (monitoring.py)
                body, content_type = self.server.metrics.exposition()
                self._send(200, [body], {"Content-Type": content_type})
                return
            if url.path != "/":
                raise ClickHouseError(NOT_IMPLEMENTED, f"There is no handler for {url.path}")
            user = self._authenticate(params)
            for flag in ("compress", "decompress"):
                if params.get(flag) in ("1", "true"):
                    raise ClickHouseError(
                        NOT_IMPLEMENTED,
                        f"{flag}=1 (ClickHouse block compression) is not supported by this "
                        "server; use HTTP compression (Content-Encoding / Accept-Encoding)",
                    )
            self._body = body = RequestBody(self, self.server.settings, send_continue)
            with (
                self.server.sessions.hold(user.name, params.get("session_id")) as session,
                self.server.running.claim(query_id, user.name, user.max_concurrent_queries),
            ):
                externals = external_tables(self._read_form(body, params, is_get), params)
                self._execute(user, session, params, body, query_id, is_get, externals)
            if not self._query_failed:
                self.server.metrics.answered()
        except ClickHouseError as exc:
            self._fail(exc, query_id)
        except TimeoutError:
            self.close_connection = True
            timeout = self.server.settings.receive_timeout_s
            message = f"Timeout exceeded while reading from socket ({timeout:g} s)"
            self._fail(ClickHouseError(SOCKET_TIMEOUT, message), query_id)
        except Exception as exc:
            log.exception("internal error in query %s", query_id)
            self._fail(ClickHouseError(1001, f"{type(exc).__name__}: {exc}"), query_id)
        finally:
            self._end_response()
            if self._body_pending():
                self.close_connection = True
            self._handling = False

    def _authenticate(self, params: dict[str, str]) -> User:
        """The request's user, from its headers and URL alone (as in ClickHouse, form fields
        are no credentials), before a byte of its body is read; a refused client's connection
        is closed after the answer."""
        try:
            return authenticate(self.server.users, *credentials(self.headers, params))
        except ClickHouseError:
            self.close_connection = True
            raise

    def _read_form(
        self, body: RequestBody, params: dict[str, str], is_get: bool
    ) -> dict[str, bytes]:
        """A multipart/form-data body's fields into `params`; its files (external tables) by
        name. Read once the query holds its slot, so only admitted queries hold a form in
        memory (up to max_form_bytes, decompressed)."""
        content_type = self.headers.get("Content-Type")
        if is_get or not is_form(content_type):
            return {}
        limit = self.server.settings.max_form_bytes
        form = parse_form(content_type or "", read_form(body.chunks(), limit))
        params.update(form.fields)
        return form.files

    def _body_pending(self) -> bool:
        """Whether bytes of the request's body may still be unread on the connection."""
        if self._body is not None:
            return not self._body.finished
        return RequestBody.declared(self.headers)

    def _execute(
        self,
        user: User,
        session: Session,
        params: dict[str, str],
        body: RequestBody,
        query_id: str,
        is_get: bool,
        externals: list[ExternalTable],
    ) -> None:
        settings_obj = self.server.settings
        query_settings = {
            **session.settings,
            **{
                k: v
                for k, v in params.items()
                if k not in TRANSPORT_PARAMS and not k.startswith("param_")
            },
        }
        if user.readonly:  # its profile is on its engine connection; the client's are checked
            query_settings.pop("readonly", None)
            sql_policy.check_settings(query_settings, self.server.engine.profile(user.profile))
        query_params = {k[len("param_") :]: v for k, v in params.items() if k.startswith("param_")}
        database = (
            self.headers.get("X-ClickHouse-Database")
            or params.get("database")
            or session.database
            or "default"
        )

        prefix, rest = self._read_prefix(params.get("query", ""), body, settings_obj.max_query_size)
        split = statements.split_insert(prefix)
        with self._connection(session, user, query_settings, externals) as conn:
            conn.use(database)
            head = ""
            if split is not None:
                try:
                    head = conn.canonical(split.head)
                except ClickHouseError:
                    if not split.guessed:
                        raise
            if split is not None and statements.kind_of(head) == "INSERT":
                canonical = head
                statements.check_allowed("INSERT", canonical, user.readonly, is_get)
                self._insert(
                    conn,
                    canonical,
                    prefix[split.data_offset :],
                    rest,
                    query_settings,
                    query_params,
                    query_id,
                    user.name,
                )
                return
            if rest is not None:
                raise ClickHouseError(
                    QUERY_IS_TOO_LARGE,
                    f"Query is too large (more than {settings_obj.max_query_size} bytes)",
                )
            canonical = conn.canonical(statement_text(prefix))
            kind = statements.kind_of(canonical)
            statements.check_allowed(kind, canonical, user.readonly, is_get)
            if user.readonly and kind not in statements.SESSION_KINDS:
                sql_policy.check_tree(conn.parse_tree(canonical, query_params))
            kill = processes.kill_parts(canonical) if kind == "KILL" else None
            if kill is not None:
                canonical = processes.kill_output_query(*kill)  # its rows, found before
            else:
                canonical = processes.with_processes_view(canonical)
            if kind == "SET":
                assigned = parse_set(canonical)
                if user.readonly:
                    assigned.pop("readonly", None)
                    sql_policy.check_settings(assigned, self.server.engine.profile(user.profile))
                session.settings.update(assigned)
                self._send(200, [], {}, query_id)
            elif kind == "USE":
                session.database = canonical.split(None, 1)[1].strip("`")
                self._send(200, [], {}, query_id)
            elif kind in statements.OUTPUT_KINDS or kill is not None:
                with self.server.disconnects.watching(self.connection, query_id):
                    self._answer(
                        conn,
                        canonical,
                        kind,
                        kill,
                        params,
                        query_params,
                        query_settings,
                        query_id,
                        user,
                    )
            else:
                statement = processes.tagged(canonical, query_id, user.name)
                self._run_statement(
                    session, conn, database, statement, query_params, query_settings
                )
                self._send(200, [], {}, query_id)

    def _answer(
        self,
        conn: EngineConnection,
        canonical: str,
        kind: str,
        kill: tuple[str, str, str] | None,
        params: dict[str, str],
        query_params: dict[str, str],
        query_settings: dict[str, str],
        query_id: str,
        user: User,
    ) -> None:
        """Run a statement with output (a query, or KILL QUERY) and stream its result."""
        default_format = (
            self.headers.get("X-ClickHouse-Format")
            or params.get("default_format")
            or statements.DEFAULT_FORMAT
        )
        # A read-only user's settings are on its engine connection already.
        sql, fmt = statements.output_query(
            canonical, default_format, {} if user.readonly else query_settings
        )
        sql = processes.tagged(sql, query_id, user.name)
        streamed = (
            kind in statements.STREAMING_KINDS and fmt.lower() in statements.STREAMABLE_FORMATS
        )
        revision = native.client_revision(params)
        if fmt.lower() == "native" and revision:
            chunks = native.output_for_client(conn, sql, query_params, fmt, revision, streamed)
        elif streamed:
            chunks = conn.stream(sql, query_params, fmt)
        else:  # chdb streams only SELECTs, and only these formats chunk by chunk
            chunks = iter([conn.run(sql, query_params, fmt)])
        first = next(chunks, b"")  # errors found before the first row get a proper status
        if kill is not None and kill[1] != "TEST":
            ids = conn.run(processes.engine_ids_query(kill[0])).decode().split()
            processes.kill_engine_queries(conn.run, ids, wait=kill[1] == "SYNC")
        encoding = (
            choose_encoding(self.headers.get("Accept-Encoding"))
            if params.get("enable_http_compression") in ("1", "true")
            else None
        )
        headers = {"Content-Type": _content_type(fmt), "X-ClickHouse-Format": fmt}
        if encoding:
            headers["Content-Encoding"] = encoding
        self._send(
            200,
            compress_stream(_chain(first, chunks), encoding),
            headers,
            query_id,
            conn.read,
        )

    @contextlib.contextmanager
    def _connection(
        self,
        session: Session,
        user: User,
        settings: dict[str, str],
        externals: list[ExternalTable],
    ) -> Iterator[EngineConnection]:
        """The engine connection of a request, its external tables on it: for a read-only user
        one under its profile (the tables made before it is restricted), else the session's
        own once it holds temporary tables, else a pooled one."""
        engine, timeout = self.server.engine, self.server.settings.queue_timeout_s
        input_settings = statements.input_settings(settings)
        if user.profile is not None:

            def prepare(conn: EngineConnection) -> None:
                for table in externals:
                    self._create_external_table(conn, table, input_settings)

            with engine.read_only_connection(
                timeout, user.profile, settings, prepare if externals else None
            ) as conn:
                yield conn
            return
        with (
            (
                contextlib.nullcontext(session.connection)
                if session.connection is not None
                else engine.connection(timeout)
            ) as conn,
            self._external_tables(conn, externals, input_settings),
        ):
            yield conn

    def _run_statement(
        self,
        session: Session,
        conn: EngineConnection,
        database: str,
        statement: str,
        params: dict[str, str],
        settings: dict[str, str],
    ) -> None:
        """A statement without output. A temporary table is its session's alone: created on
        the session's own connection, or, outside any session, dropped when the request ends."""
        temporary = statements.temporary_table(statement)
        if temporary is not None and session.id is not None and session.connection is None:
            session.connection = conn = self.server.engine.open_session_connection()
            conn.use(database)
        conn.run_with_settings(statement, params, settings)
        if temporary is not None and session.id is None:
            conn.run(f"DROP TEMPORARY TABLE IF EXISTS {temporary}")

    @contextlib.contextmanager
    def _external_tables(
        self, conn: EngineConnection, tables: list[ExternalTable], settings: dict[str, str]
    ) -> Iterator[None]:
        """The request's external tables as temporary tables of its engine connection (which
        no other request uses meanwhile), read under the request's input format settings,
        dropped afterwards."""
        created: list[str] = []
        try:
            for table in tables:
                created.append(table.name)
                self._create_external_table(conn, table, settings)
            yield
        finally:
            for name in created:
                with contextlib.suppress(ClickHouseError):
                    conn.run(f"DROP TEMPORARY TABLE IF EXISTS {quote_identifier(name)}")

    def _create_external_table(
        self, conn: EngineConnection, table: ExternalTable, settings: dict[str, str]
    ) -> None:
        with tempfile.NamedTemporaryFile(
            dir=self.server.settings.spool_dir, prefix="external-"
        ) as tmp:
            tmp.write(table.data)
            tmp.flush()
            source = ", ".join(
                statements.string_literal(v) for v in (tmp.name, table.format, table.structure)
            )
            conn.run(
                f"CREATE TEMPORARY TABLE {quote_identifier(table.name)} ENGINE = Memory "
                f"AS SELECT * FROM file({source})"
                + (f" SETTINGS {statements.settings_list(settings)}" if settings else "")
            )

    def _read_prefix(
        self, url_query: str, body: RequestBody, limit: int
    ) -> tuple[bytes, Iterator[bytes] | None]:
        """The start of the query stream (URL query + newline + body) up to `limit` bytes.

        Returns the prefix and, when the stream is longer, an iterator over the rest.
        """
        head = (url_query + "\n").encode() if url_query else b""
        chunks = body.chunks()
        parts = [head]
        size = len(head)
        for chunk in chunks:
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                return b"".join(parts), chunks
        return b"".join(parts), None

    def _insert(
        self,
        conn: EngineConnection,
        canonical: str,
        data_start: bytes,
        rest: Iterator[bytes] | None,
        settings: dict[str, str],
        params: dict[str, str],
        query_id: str,
        user_name: str,
    ) -> None:
        """Spool the insert data to a file and let the engine read it with the table's types."""
        spool = self.server.settings.spool_dir
        with tempfile.NamedTemporaryFile(dir=spool, prefix="insert-", suffix=".data") as tmp:
            tmp.write(data_start)
            written = len(data_start)
            for chunk in rest or ():
                tmp.write(chunk)
                written += len(chunk)
            tmp.flush()
            sql = statements.insert_from_file(canonical, tmp.name, settings)
            conn.run(processes.tagged(sql, query_id, user_name), params)
        done = Summary(conn.read.rows, written, conn.read.elapsed_s)
        self._send(200, [], {}, query_id, done, written=True)

    # --- responses ----------------------------------------------------------------------

    def _send(
        self,
        status: int,
        chunks,
        headers: dict[str, str],
        query_id: str = "",
        summary: Summary | None = None,
        written: bool = False,
    ) -> None:
        """A chunked response; its last chunk is sent by `_end_response`, once the request has
        let go of its session, so a client never sees the end of a response before it may
        send the session's next query."""
        tag = "".join(secrets.choice(string.ascii_lowercase) for _ in range(16))
        self.send_response(status)
        for name, value in {
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Timezone": "UTC",
            "X-ClickHouse-Server-Display-Name": "jobscope",
            "X-ClickHouse-Exception-Tag": tag,
            "X-ClickHouse-Summary": _summary_header(summary or Summary(), written),
            **headers,
        }.items():
            if value:
                self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._response_open = True
        try:
            try:
                for data in chunks:
                    if data:
                        self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))
            except ClickHouseError as exc:  # failed after the first rows: ClickHouse appends it
                # The response still ends with its last chunk, so the connection stays usable:
                # closing it after a complete response would race the client's next request.
                log.warning("query %s failed while streaming: %s", query_id, exc.message)
                self._query_failed = True
                self.server.metrics.failed(exc.code)
                body = _tagged_exception(exc.body(), tag)
                self.wfile.write(b"%x\r\n%b\r\n" % (len(body), body))
        except (BrokenPipeError, ConnectionResetError):
            log.info("query %s: client went away before the end of the result", query_id)
            self.close_connection = True
            self._response_open = False
            close = getattr(chunks, "close", None)
            if close:
                close()

    def _end_response(self) -> None:
        if not self._response_open:
            return
        self._response_open = False
        try:
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _fail(self, exc: ClickHouseError, query_id: str) -> None:
        log.warning("query %s failed: code %s: %s", query_id, exc.code, exc.message)
        self.server.metrics.failed(exc.code)
        if self._response_open:  # an answer is under way: a cut connection tells the client
            self._response_open = False
            self.close_connection = True
            return
        body = exc.body()
        try:
            self.send_response(exc.http_status)
            self.send_header("X-ClickHouse-Exception-Code", str(exc.code))
            self.send_header("X-ClickHouse-Query-Id", query_id)
            self.send_header("Content-Type", "text/plain; charset=UTF-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def _summary_header(summary: Summary, written: bool) -> str:
    rows, size = str(summary.rows), str(summary.bytes)
    return json.dumps(
        {
            "read_rows": rows,
            "read_bytes": size,
            "written_rows": rows if written else "0",
            "written_bytes": size if written else "0",
            "total_rows_to_read": "0",
            "result_rows": "0",
            "result_bytes": "0",
            "elapsed_ns": str(int(summary.elapsed_s * 1e9)),
        },
        separators=(",", ":"),
    )


def _tagged_exception(body: bytes, tag: str) -> bytes:
    """An error after the first rows as ClickHouse 25.11+ frames it in the result stream."""
    message = body.rstrip(b"\n")
    start = b"__exception__\r\n%b\r\n" % tag.encode()
    return start + message + b"\n%d %b\r\n__exception__\r\n" % (len(message), tag.encode())


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    try:
        yield first
        yield from rest
    finally:
        if isinstance(rest, Generator):
            rest.close()


def _content_type(fmt: str) -> str:
    lower = fmt.lower()
    if lower.startswith("json"):
        return "application/json; charset=UTF-8"
    if lower in ("native", "rowbinary", "arrow", "parquet", "arrowstream") or lower.startswith(
        "rowbinary"
    ):
        return "application/octet-stream"
    if lower.startswith(("csv", "tsv", "tabseparated")):
        return (
            "text/tab-separated-values; charset=UTF-8"
            if not lower.startswith("csv")
            else "text/csv; charset=UTF-8"
        )
    return "text/plain; charset=UTF-8"
