"""The local ClickHouse server speaks ClickHouse's HTTP interface to unmodified clients."""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import socket
import struct
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime
from http.client import HTTPConnection
from pathlib import Path

import httpx
import lz4.frame
import pytest
import zstandard
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError
from clickhouse_connect.driver.external import ExternalData

from stack import services
from stack.config import StackSettings
from stack.processes import wait_until


@pytest.fixture(scope="module")
def http(clickhouse: StackSettings) -> httpx.Client:
    password = services.clickhouse_password(clickhouse, "jobscope")
    return httpx.Client(base_url=clickhouse.clickhouse_url, auth=("jobscope", password), timeout=30)


@pytest.fixture
def table(admin_client: Client) -> str:
    name = f"t_{uuid.uuid4().hex[:8]}"
    admin_client.command(
        f"CREATE TABLE {name} (ts DateTime64(6, 'UTC'), name String, value Float64, "
        "labels Map(String, String)) ENGINE = MergeTree ORDER BY (name, ts)"
    )
    return name


ROWS = [
    [datetime(2026, 1, 1, 0, 0, 0, 1), "it's", 1.25, {"k": "v"}],
    [datetime(2026, 1, 1, 0, 0, 1, 999999), 'multi\nline "quoted"', -0.5, {}],
    [datetime(2026, 1, 1, 0, 0, 2, 500000), "ünïcode", 1e300, {"a": "1", "b": "2"}],
]


def test_ping(http: httpx.Client) -> None:
    assert http.get("/ping").text == "Ok.\n"
    assert httpx.get(str(http.base_url) + "/").text == "Ok.\n"


def test_native_insert_and_select_roundtrip(admin_client: Client, table: str) -> None:
    admin_client.insert(table, ROWS, column_names=["ts", "name", "value", "labels"])
    got = admin_client.query(f"SELECT ts, name, value, labels FROM {table} ORDER BY ts").result_rows
    assert [list(r) for r in got] == ROWS


def test_parameters_are_bound_not_pasted(admin_client: Client, table: str) -> None:
    admin_client.insert(table, ROWS, column_names=["ts", "name", "value", "labels"])
    for row in ROWS:
        result = admin_client.query(
            f"SELECT value FROM {table} WHERE name = {{n:String}}", parameters={"n": row[1]}
        )
        assert result.result_rows == [(row[2],)]
    injection = "x' OR 1=1 --"
    result = admin_client.query(
        f"SELECT count() FROM {table} WHERE name = {{n:String}}", parameters={"n": injection}
    )
    assert result.result_rows == [(0,)]


@pytest.mark.parametrize(
    "fmt", ["JSONEachRow", "CSV", "TabSeparated", "Parquet", "Arrow", "RowBinary"]
)
def test_any_output_format(admin_client: Client, fmt: str) -> None:
    expected = admin_client.raw_query(f"SELECT number FROM numbers(1000) FORMAT {fmt}")
    raw = admin_client.raw_query("SELECT number FROM numbers(1000)", fmt=fmt)
    assert raw == expected and len(raw) > 0
    if fmt == "CSV":
        assert raw.decode().split("\n")[:3] == ["0", "1", "2"]


def test_settings_are_applied(admin_client: Client) -> None:
    result = admin_client.query(
        "SELECT getSetting('max_block_size')", settings={"max_block_size": 1234}
    )
    assert result.result_rows == [(1234,)]
    with pytest.raises(DatabaseError, match=r"TOO_MANY_ROWS|158"):
        admin_client.query(
            "SELECT number FROM numbers(100)",
            settings={"max_result_rows": 10, "result_overflow_mode": "throw"},
        )


def test_database_parameter(http: httpx.Client, admin_client: Client) -> None:
    db = f"db_{uuid.uuid4().hex[:8]}"
    admin_client.command(f"CREATE DATABASE {db}")
    admin_client.command(f"CREATE TABLE {db}.only_here (x UInt8) ENGINE = Memory")
    response = http.post("/", params={"database": db}, content="EXISTS TABLE only_here")
    assert response.status_code == 200 and response.text == "1\n"
    response = http.post("/", content="EXISTS TABLE only_here")
    assert response.text == "0\n"  # the default database, not the previous request's


def test_insert_statement_in_body_or_url(
    http: httpx.Client, admin_client: Client, table: str
) -> None:
    line = "2026-01-01 00:00:00.000001\tbody\t1\t{}\n"
    assert (
        http.post("/", content=f"INSERT INTO {table} FORMAT TabSeparated\n{line}").status_code
        == 200
    )
    response = http.post(
        "/",
        params={"query": f"INSERT INTO {table} FORMAT TabSeparated"},
        content=line.replace("body", "url"),
    )
    assert response.status_code == 200
    values = f"INSERT INTO {table} VALUES ('2026-01-01 00:00:00.000002', 'values', 2, {{}})"
    assert http.post("/", content=values).status_code == 200
    names = admin_client.query(f"SELECT name FROM {table} ORDER BY name").result_rows
    assert names == [("body",), ("url",), ("values",)]


@pytest.mark.parametrize(
    "encoding,compress,decompress",
    [
        ("gzip", gzip.compress, gzip.decompress),
        ("lz4", lz4.frame.compress, lz4.frame.decompress),
        (
            "zstd",
            zstandard.ZstdCompressor().compress,
            lambda data: zstandard.ZstdDecompressor().decompressobj().decompress(data),
        ),
    ],
)
def test_compressed_requests_and_responses(
    http: httpx.Client, encoding: str, compress, decompress
) -> None:
    body = compress(b"SELECT number FROM numbers(100000) FORMAT TSV")
    with http.stream(
        "POST",
        "/",
        params={"enable_http_compression": "1"},
        content=body,
        headers={"Content-Encoding": encoding, "Accept-Encoding": encoding},
    ) as r:
        assert r.status_code == 200
        assert r.headers["Content-Encoding"] == encoding
        raw = b"".join(r.iter_raw())
    text = decompress(raw).decode()
    assert len(raw) < len(text)
    assert text.split("\n")[:2] == ["0", "1"] and text.count("\n") == 100000


def test_clickhouse_connect_compression(clickhouse: StackSettings) -> None:
    for compress in ("lz4", "gzip"):
        client = services.clickhouse_client(clickhouse, "jobscope", compress=compress)
        assert client.query("SELECT sum(number) FROM numbers(1000000)").result_rows == [
            (499999500000,)
        ]


def test_block_compression_is_refused_clearly(http: httpx.Client) -> None:
    response = http.post("/", params={"compress": "1"}, content="SELECT 1")
    assert response.status_code != 200
    assert response.headers["X-ClickHouse-Exception-Code"] == "48"
    assert "Content-Encoding" in response.text


def test_errors_carry_code_and_message(http: httpx.Client, admin_client: Client) -> None:
    response = http.post("/", content="SELECT * FROM no_such_table")
    assert response.status_code == 404
    assert response.headers["X-ClickHouse-Exception-Code"] == "60"
    assert response.text.startswith("Code: 60. DB::Exception:") and "no_such_table" in response.text
    response = http.post("/", content="SELEKT 1")
    assert response.status_code == 400 and response.headers["X-ClickHouse-Exception-Code"] == "62"
    with pytest.raises(DatabaseError, match="60"):
        admin_client.query("SELECT * FROM no_such_table")


def test_wrong_password_is_refused(clickhouse: StackSettings) -> None:
    response = httpx.post(clickhouse.clickhouse_url, content="SELECT 1", auth=("jobscope", "nope"))
    assert response.status_code == 403
    assert response.headers["X-ClickHouse-Exception-Code"] == "516"
    response = httpx.post(clickhouse.clickhouse_url, content="SELECT 1")  # no user at all
    assert response.status_code == 403


def test_several_statements_are_refused(
    http: httpx.Client, table: str, admin_client: Client
) -> None:
    response = http.post("/", content=f"SELECT 1; DROP TABLE {table}")
    assert response.status_code == 400 and "Multi-statements" in response.text
    assert admin_client.command(f"EXISTS TABLE {table}") == 1


def test_large_results_stream(clickhouse: StackSettings, http: httpx.Client) -> None:
    """30 M rows (~250 MB of text) stream through; the server's memory grows far less."""
    pid = services.process(clickhouse, "clickhouse").pid()
    assert pid is not None
    http.post("/", content="SELECT number FROM numbers(3000000) FORMAT Null")  # warm up
    baseline = _rss_bytes(pid)
    peak_rss = baseline
    received = 0
    with http.stream("POST", "/", content="SELECT number FROM numbers(30000000) FORMAT TSV") as r:
        assert r.headers.get("Transfer-Encoding") == "chunked"
        for chunk in r.iter_raw():
            received += len(chunk)
            peak_rss = max(peak_rss, _rss_bytes(pid))
    assert received > 250_000_000
    growth = peak_rss - baseline
    assert growth < received / 4, f"server grew {growth} bytes for a {received}-byte result"


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_concurrent_requests_while_a_stream_is_open(
    http: httpx.Client, clickhouse: StackSettings
) -> None:
    """Queries of other requests give correct results while one result is being streamed."""
    errors: list[str] = []
    answered: list[int] = []

    def worker(n: int) -> None:
        try:
            client = services.clickhouse_client(clickhouse, "jobscope")
            for i in range(20):
                got = client.query(f"SELECT count() FROM numbers({n * 1000 + i})").result_rows
                if got != [(n * 1000 + i,)]:
                    errors.append(f"{n}/{i}: {got}")
                answered.append(1)
        except Exception as exc:
            errors.append(f"{n}: {exc}")

    with http.stream("POST", "/", content="SELECT number FROM numbers(50000000) FORMAT TSV") as r:
        next(r.iter_raw())  # the stream is open and paused
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert errors == []
    assert len(answered) == 80


def test_malformed_request_fails_alone(clickhouse: StackSettings, http: httpx.Client) -> None:
    bad = httpx.post(
        clickhouse.clickhouse_url,
        content=b"\x1f\x8b not gzip at all",
        headers={"Content-Encoding": "gzip"},
        auth=http.auth,
    )  # type: ignore[arg-type]
    assert bad.status_code == 400 and bad.headers["X-ClickHouse-Exception-Code"] == "271"
    assert http.post("/", content="SELECT 42").text == "42\n"


def test_get_is_read_only(http: httpx.Client, table: str) -> None:
    assert http.get("/", params={"query": "SELECT 1"}).text == "1\n"
    response = http.get("/", params={"query": f"DROP TABLE {table}"})
    assert response.status_code == 403 and response.headers["X-ClickHouse-Exception-Code"] == "164"


@pytest.mark.parametrize("fmt", ["Arrow", "Parquet", "JSON", "CSVWithNames"])
def test_whole_file_formats_stay_whole(admin_client: Client, fmt: str) -> None:
    """Formats with a header or footer come out as one document, even when large."""
    query = "SELECT number, toString(number) AS s FROM numbers(3000000)"
    if fmt == "Arrow":
        assert admin_client.query_arrow(query).num_rows == 3000000
    elif fmt == "JSON":
        import json

        doc = json.loads(admin_client.raw_query(query, fmt="JSON"))
        assert doc["rows"] == 3000000 and doc["data"][-1] == {"number": 2999999, "s": "2999999"}
    else:
        raw = admin_client.raw_query(query, fmt=fmt)
        if fmt == "CSVWithNames":
            assert raw.count(b'"number","s"') == 1 and raw.count(b"\n") == 3000001
        else:
            import io

            import pyarrow.parquet as pq

            assert pq.read_table(io.BytesIO(raw)).num_rows == 3000000


def test_query_and_parameters_in_form_fields(http: httpx.Client, reader_client: Client) -> None:
    """`curl -F 'query=SELECT {x:UInt8}+1' -F 'param_x=41'`, and clickhouse-connect's own
    switch to form fields past 4 KiB of bound parameters (a job of a thousand nodes)."""
    response = http.post(
        "/", files={"query": (None, "SELECT {x:UInt8} + 1"), "param_x": (None, "41")}
    )
    assert response.status_code == 200 and response.text == "42\n"
    names = [f"node-{i:05d}.a-long-site-name.example.org" for i in range(1000)]
    got = reader_client.command("SELECT length({names:Array(String)})", parameters={"names": names})
    assert got == 1000


def test_external_tables(http: httpx.Client, reader_client: Client) -> None:
    """`curl -F 'ext=@ext.tsv' '...?query=SELECT count() FROM ext&ext_structure=x UInt8'`,
    two tables in one query (one by `_types`, one in CSV), and clickhouse-connect's
    ExternalData; each lives for its query only."""
    one = http.post(
        "/?query=SELECT+count(),+sum(x)+FROM+ext&ext_structure=x+UInt8",
        files={"ext": ("ext.tsv", b"1\n2\n")},
    )
    assert (one.status_code, one.text) == (200, "2\t3\n")
    two = http.post(
        "/",
        params={
            "query": "SELECT a.name, b._2 FROM a JOIN b ON a.id = b._1 ORDER BY a.id",
            "a_structure": "id UInt32, name String",
            "b_types": "UInt32,Float64",
            "b_format": "CSV",
        },
        files={"a": ("a.tsv", b"1\tone\n2\ttwo\n"), "b": ("b.csv", b"2,2.5\n1,1.5\n")},
    )
    assert (two.status_code, two.text) == (200, "one\t1.5\ntwo\t2.5\n")
    data = ExternalData(data=b"x\ny\nz\n", file_name="letters", structure=["l String"])
    got = reader_client.query("SELECT groupArray(l) FROM letters", external_data=data).result_rows
    assert got == [(["x", "y", "z"],)]
    gone = [http.post("/", content="SELECT count() FROM ext") for _ in range(10)]
    assert all(r.status_code == 404 and "ext" in r.text for r in gone)  # dropped after use
    missing = http.post("/?query=SELECT+1+FROM+ext", files={"ext": ("ext.tsv", b"1\n")})
    assert missing.status_code == 400 and "ext_structure" in missing.text


def test_a_form_body_is_bounded_as_it_is_read() -> None:
    """The form is held in memory: past the limit (max_form_bytes) it is refused at once, not
    buffered."""
    from stack.clickhouse_server import forms

    read = []

    def chunks() -> Iterator[bytes]:
        for _ in range(1000):
            read.append(1)
            yield b"x" * 4

    with pytest.raises(forms.ClickHouseError, match="over 10 bytes"):
        forms.read_form(chunks(), 10)
    assert len(read) == 3


def _listen_overflows() -> int:
    """SYNs the kernel dropped, in this network namespace, because a listening socket's
    accept queue was full (TcpExt ListenOverflows): each makes its client retry after 1 s."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    names, values = next(
        (a.split(), b.split()) for a, b in itertools.pairwise(lines) if a.startswith("TcpExt:")
    )
    return int(values[names.index("ListenOverflows")])


def test_a_burst_of_new_connections_is_answered_at_once(clickhouse: StackSettings) -> None:
    """50 clients connecting at the same instant: every one is answered and no SYN is
    dropped for a full accept queue, which a listen backlog of 5 did to ten of them (each
    then waited for a SYN retry, 1 s). Counted by the kernel, not timed: a loaded machine
    is slow to answer, not wrong."""
    clients = 50
    start = threading.Barrier(clients)
    answered: list[int] = []
    failures: list[BaseException] = []
    overflows = _listen_overflows()

    def ping() -> None:
        try:
            start.wait(10)
            with socket.create_connection((clickhouse.host, clickhouse.clickhouse_port), 10) as s:
                s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert s.recv(1024).startswith(b"HTTP/1.1 200")
            answered.append(1)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=ping) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not failures and len(answered) == clients
    assert _listen_overflows() == overflows, "SYNs dropped: the accept queue was full"


def test_a_client_resetting_an_idle_connection_leaves_no_traceback(
    clickhouse: StackSettings,
) -> None:
    log_file = clickhouse.log_dir / "clickhouse.log"
    before = log_file.read_text().count("Traceback")
    for _ in range(3):
        with socket.create_connection((clickhouse.host, clickhouse.clickhouse_port), 10) as s:
            s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(1024).startswith(b"HTTP/1.1 200")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
    # a request after the resets: the server has handled them (its log is written in order)
    assert httpx.get(f"{clickhouse.clickhouse_url}/ping", timeout=10).text == "Ok.\n"
    assert log_file.read_text().count("Traceback") == before


def test_url_settings_apply_to_ddl_and_do_not_linger(admin_client: Client) -> None:
    """A setting sent with the request (as clickhouse-connect sends them: URL parameters)
    applies to a CREATE TABLE, and to that statement only: the pooled engine connection it
    ran on does not keep it for the next requests."""
    name = f"lc_{uuid.uuid4().hex[:8]}"
    ddl = "CREATE TABLE {} (x LowCardinality(Int32)) ENGINE = Memory"
    with pytest.raises(DatabaseError, match="455"):
        admin_client.command(ddl.format(name))
    admin_client.command(ddl.format(name), settings={"allow_suspicious_low_cardinality_types": 1})
    assert admin_client.command(f"SELECT count() FROM {name}") == 0
    for i in range(12):  # more than the engine's connections: each one was given back clean
        with pytest.raises(DatabaseError, match="455"):
            admin_client.command(ddl.format(f"{name}_{i}"))


def test_a_session_runs_one_query_at_a_time(http: httpx.Client) -> None:
    """A second query of a session while its first one runs is refused with code 373, as
    ClickHouse does; once the first one is over, the session takes queries again."""
    session = {"session_id": f"s-{uuid.uuid4().hex}"}
    slow_id = f"slow-{uuid.uuid4().hex}"
    slow = threading.Thread(
        target=lambda: http.post(
            "/",
            params={**session, "max_block_size": "1", "query_id": slow_id},
            content="SELECT sleepEachRow(0.5) FROM numbers(12) FORMAT Null",
        ),
    )
    slow.start()
    try:
        # The session's next query only once the slow one holds it (else it might be first).
        running = f"SELECT count() FROM system.processes WHERE query_id = '{slow_id}'"
        wait_until(lambda: http.post("/", content=running).text == "1\n", 5, "the slow query")

        def refused() -> bool:
            answer = http.post("/", params=session, content="SELECT 1")
            return answer.status_code == 500 and "373" in answer.headers.get(
                "X-ClickHouse-Exception-Code", ""
            )

        wait_until(refused, 5, "a concurrent query of the session to be refused", interval=0.05)
    finally:
        slow.join(20)
    assert http.post("/", params=session, content="SELECT 1").text == "1\n"


def test_with_insert_takes_its_inline_data(http: httpx.Client, table: str) -> None:
    """`WITH ... INSERT ... FORMAT X <data>` inserts its data like `INSERT ...` does; a query
    that only mentions the word INSERT after a WITH stays a query."""
    insert = http.post(
        "/",
        content=f"WITH 1 AS unused INSERT INTO {table} (ts, name, value) FORMAT CSV\n"
        "2026-01-01 00:00:00,a,1.5\n2026-01-01 00:00:01,b,2.5\n",
    )
    assert insert.status_code == 200, insert.text
    count = http.post("/", content=f"SELECT count(), sum(value) FROM {table}")
    assert count.text == "2\t4\n"
    for query, expected in (
        ("WITH 'INSERT' AS w SELECT w FORMAT TSV", "INSERT\n"),
        ("WITH 'INSERT' AS w SELECT w, x FROM values('x UInt8', 7) FORMAT TSV", "INSERT\t7\n"),
    ):
        answer = http.post("/", content=query)
        assert (answer.status_code, answer.text) == (200, expected)


def _exception_code(answer: httpx.Response) -> str:
    return answer.headers.get("X-ClickHouse-Exception-Code", "")


def test_query_id_is_seen_in_system_processes_and_killable(
    http: httpx.Client, clickhouse: StackSettings
) -> None:
    """A client's query_id and user are what system.processes shows; a second query with an
    id in use is refused (216); KILL QUERY by that id cancels it (394 for its client)."""
    query_id = f"long-{uuid.uuid4().hex}"
    password = services.clickhouse_password(clickhouse, "reader")
    with httpx.Client(
        base_url=clickhouse.clickhouse_url, auth=("reader", password), timeout=60
    ) as reader:
        answers: list[httpx.Response] = []
        long_query = "SELECT sum(sleepEachRow(0.1)) FROM numbers(500)"
        runner = threading.Thread(
            target=lambda: answers.append(
                reader.post(
                    "/", params={"query_id": query_id, "max_block_size": "1"}, content=long_query
                )
            )
        )
        runner.start()
        try:
            seen = f"SELECT user, query FROM system.processes WHERE query_id = '{query_id}'"
            wait_until(
                lambda: http.post("/", content=seen).text.startswith("reader\t"),
                10,
                "the query in system.processes under its id and user",
                interval=0.05,
            )
            assert "sleepEachRow(0.1)" in http.post("/", content=seen).text
            again = reader.post("/", params={"query_id": query_id}, content="SELECT 1")
            assert _exception_code(again) == "216", again.text
            killed = http.post("/", content=f"KILL QUERY WHERE query_id = '{query_id}' SYNC")
            assert killed.status_code == 200, killed.text
            assert killed.text.startswith(f"finished\t{query_id}\treader\t"), killed.text
        finally:
            runner.join(20)
    assert not runner.is_alive(), "the killed query still runs"
    assert _exception_code(answers[0]) == "394", answers[0].text
    assert http.post("/", content=seen).text == ""


def test_temporary_tables_belong_to_their_session(http: httpx.Client) -> None:
    """A temporary table is seen by its own session only: not by another session, not by a
    request without a session; one made outside any session ends with its request."""
    a, b = ({"session_id": f"s-{uuid.uuid4().hex}"} for _ in range(2))
    assert http.post("/", params=a, content="CREATE TEMPORARY TABLE tmp (x UInt8)").is_success
    assert http.post("/", params=a, content="INSERT INTO tmp VALUES (7)").is_success
    for _ in range(10):  # more requests than the engine has pooled connections
        assert http.post("/", params=a, content="SELECT x FROM tmp").text == "7\n"
        assert _exception_code(http.post("/", params=b, content="SELECT x FROM tmp")) == "60"
        assert _exception_code(http.post("/", content="SELECT x FROM tmp")) == "60"
    made = http.post("/", content="CREATE TEMPORARY TABLE loose (x UInt8)")
    assert made.is_success, made.text
    for _ in range(10):
        assert _exception_code(http.post("/", content="SELECT * FROM loose")) == "60"
    assert http.post("/", params=b, content="CREATE TEMPORARY TABLE tmp (y String)").is_success
    assert (
        http.post(
            "/",
            params=b,
            content="SELECT name FROM system.columns WHERE table = 'tmp' AND database = ''",
        ).text
        == "y\n"
    )
    assert http.post("/", params=a, content="SELECT x FROM tmp").text == "7\n"


def test_a_session_takes_its_next_query_as_soon_as_an_answer_ends(
    clickhouse: StackSettings,
) -> None:
    """Queries of one session sent one after another, each on a new connection, are never
    refused as concurrent: the session is free before its answer is complete."""
    password = services.clickhouse_password(clickhouse, "jobscope")
    session = {"session_id": f"s-{uuid.uuid4().hex}"}
    codes = []
    for i in range(200):
        with httpx.Client(
            base_url=clickhouse.clickhouse_url, auth=("jobscope", password), timeout=30
        ) as client:
            answer = client.post("/", params=session, content=f"SELECT {i}")
            codes.append((answer.status_code, answer.text))
    assert codes == [(200, f"{i}\n") for i in range(200)]


def test_statement_bytes_reach_the_engine_as_they_are(http: httpx.Client) -> None:
    """Bytes that are not UTF-8 in a statement are passed through, not replaced."""
    answer = http.post("/", content=b"SELECT length($b$\xff\xfe\x00\x01$b$), '\xff' FORMAT TSV")
    assert answer.status_code == 200, answer.text
    assert answer.content == b"4\t\xff\n"


def test_external_data_is_read_with_the_request_input_settings(http: httpx.Client) -> None:
    """Input format settings of the request (here: errors allowed) apply to external data."""
    answer = http.post(
        "/",
        params={
            "query": "SELECT count(), sum(x) FROM ext",
            "ext_structure": "x UInt8",
            "ext_format": "CSV",
            "input_format_allow_errors_num": "1",
        },
        files={"ext": ("ext.csv", b"1\nnot a number\n2\n")},
    )
    assert (answer.status_code, answer.text) == (200, "2\t3\n")


def test_summary_header_and_errors_within_a_result(http: httpx.Client, table: str) -> None:
    """An insert's X-ClickHouse-Summary counts its rows; an error after the first rows comes in
    the result stream framed with the response's X-ClickHouse-Exception-Tag."""
    insert = http.post(
        "/",
        content=f"INSERT INTO {table} (ts, name, value) FORMAT CSV\n"
        "2026-01-01 00:00:00,a,1\n2026-01-01 00:00:01,b,2\n2026-01-01 00:00:02,c,3\n",
    )
    assert insert.status_code == 200, insert.text
    summary = json.loads(insert.headers["X-ClickHouse-Summary"])
    assert (summary["read_rows"], summary["written_rows"]) == ("3", "3")
    answer = http.post(
        "/",
        params={"max_block_size": "1"},
        content="SELECT number, throwIf(number = 1000) FROM numbers(2000) FORMAT TSV",
    )
    tag = answer.headers["X-ClickHouse-Exception-Tag"]
    assert answer.text.startswith("0\t0\n")
    tail = answer.content[answer.content.index(b"__exception__") :]
    assert tail.startswith(b"__exception__\r\n" + tag.encode() + b"\r\nCode: 395.")
    assert tail.endswith(b" " + tag.encode() + b"\r\n__exception__\r\n")


def test_a_connection_serves_the_next_query_after_an_error_within_a_result(
    clickhouse: StackSettings,
) -> None:
    """A result cut by an error still ends with its last chunk and leaves the keep-alive
    connection open: a client sends its next query on it at once (a server closing it after
    a complete response loses that query)."""
    password = services.clickhouse_password(clickhouse, "jobscope")
    auth = base64.b64encode(f"jobscope:{password}".encode()).decode()
    headers = {"Authorization": f"Basic {auth}"}
    conn = HTTPConnection(clickhouse.host, clickhouse.clickhouse_port, timeout=30)
    try:
        failing = "SELECT number, throwIf(number = 1000) FROM numbers(2000) FORMAT TSV"
        conn.request("POST", "/?max_block_size=1", body=failing, headers=headers)
        first = conn.getresponse()
        assert b"__exception__" in first.read()
        assert not first.will_close
        conn.request("POST", "/", body="SELECT 42", headers=headers)
        second = conn.getresponse()
        assert (second.status, second.read()) == (200, b"42\n")
    finally:
        conn.close()


def test_statements_taking_no_clause_reach_the_engine_as_they_are(http: httpx.Client) -> None:
    """SHOW POLICIES takes no FORMAT or SETTINGS clause: with request settings it is answered
    (no policies), not refused as a syntax error."""
    answer = http.post("/", params={"max_threads": "1"}, content="SHOW POLICIES")
    assert (answer.status_code, answer.text) == (200, ""), answer.text
    assert http.post("/", params={"max_threads": "1"}, content="SHOW GRANTS").is_success
