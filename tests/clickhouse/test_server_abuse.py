"""The local ClickHouse server under bad input and slow clients: a clear error each time, and
it keeps serving everyone else."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import struct
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest
from clickhouse_connect.driver.client import Client

from stack import services
from stack.config import REPO_ROOT, StackSettings
from stack.processes import free_port, wait_until
from stack.transient import STARTING


@pytest.fixture(scope="module")
def http(clickhouse: StackSettings) -> Iterator[httpx.Client]:
    password = services.clickhouse_password(clickhouse, "jobscope")
    with httpx.Client(
        base_url=clickhouse.clickhouse_url, auth=("jobscope", password), timeout=30
    ) as client:
        yield client


def _raw(settings: StackSettings, request: bytes, timeout: float = 10) -> bytes:
    """Send raw bytes; return everything the server answers before it closes or goes quiet."""
    with socket.create_connection((settings.host, settings.clickhouse_port), timeout) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _post(settings: StackSettings, headers: str, body: bytes) -> bytes:
    password = services.clickhouse_password(settings, "jobscope")
    head = f"POST /?user=jobscope&password={password} HTTP/1.1\r\nHost: x\r\n{headers}\r\n"
    return _raw(settings, head.encode() + body)


def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(
    clickhouse: StackSettings, http: httpx.Client, admin_client: Client
) -> None:
    table = f"t_{uuid.uuid4().hex[:8]}"
    admin_client.command(f"CREATE TABLE {table} (a UInt32, s String) ENGINE = MergeTree ORDER BY a")
    native_block = b"\x02\x02\x01a\x06UInt32" + struct.pack("<II", 1, 2) + b"\x01s\x06String"
    cases = {
        "malformed chunk size": (
            "Transfer-Encoding: chunked\r\n",
            b"zz\r\nSELECT 1\r\n0\r\n\r\n",
            b"Malformed chunk size",
        ),
        "unknown compression": (
            "Content-Encoding: br\r\nContent-Length: 8\r\n",
            b"SELECT 1",
            b"Unsupported Content-Encoding: br",
        ),
        "garbage gzip": (
            "Content-Encoding: gzip\r\nContent-Length: 8\r\n",
            b"SELECT 1",
            b"Cannot decompress",
        ),
        "truncated Native insert": (
            f"Content-Length: {len(f'INSERT INTO {table} FORMAT Native ') + len(native_block)}\r\n",
            f"INSERT INTO {table} FORMAT Native ".encode() + native_block,
            b"Code: ",
        ),
        "truncated RowBinary insert": (
            f"Content-Length: {len(f'INSERT INTO {table} FORMAT RowBinary ') + 6}\r\n",
            f"INSERT INTO {table} FORMAT RowBinary ".encode() + b"\x01\x00\x00\x00\x05a",
            b"Code: ",
        ),
        "huge header": (
            "X-Big: " + "x" * 70000 + "\r\nContent-Length: 8\r\n",
            b"SELECT 1",
            b"HTTP/1.1 431 ",  # Request Header Fields Too Large
        ),
    }
    for name, (headers, body, expected) in cases.items():
        answer = _post(clickhouse, headers, body)
        status = answer.split(b"\r\n", 1)[0]
        assert status.split()[1:2] != [b"200"] and status.startswith(b"HTTP/1."), (name, answer)
        assert not status.startswith(b"HTTP/1.1 5") or b"Code: 1001" not in answer, (name, answer)
        assert expected in answer, (name, answer[:300])
        assert http.post("/", content="SELECT 42").text == "42\n", name
    assert admin_client.command(f"SELECT count() FROM {table}") == 0


def test_idle_and_trickling_connections_do_not_block_new_requests(
    clickhouse: StackSettings, http: httpx.Client
) -> None:
    """500 connections that send nothing, or a request line one byte at a time, while a normal
    client's queries are answered."""
    idle = []
    try:
        for i in range(500):
            sock = socket.create_connection((clickhouse.host, clickhouse.clickhouse_port), 10)
            if i % 2:
                sock.sendall(b"P")  # the start of a request that never comes
            idle.append(sock)
        for i in range(20):
            started = time.monotonic()
            assert http.post("/", content=f"SELECT {i}").text == f"{i}\n"
            assert time.monotonic() - started < 5, "a request waited behind idle connections"
        for sock in idle[1::2]:
            sock.sendall(b"O")
        assert http.post("/", content="SELECT 'still'").text == "still\n"
    finally:
        for sock in idle:
            sock.close()


# --- request bodies: authenticated before they are read, then read in bounded slices --------

MiB = 1 << 20
# Growth of the server's peak RSS allowed while it refuses one of the attacks below, each of
# which makes the server of before hold hundreds of MiB (a whole chunk, a whole decompressed
# body) at once.
MEMORY_BOUND = 64 * MiB
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def zstd_bomb(size: int) -> bytes:
    """A zstd frame of RLE blocks: 4 bytes per 128 KiB of zeros (32,768:1)."""
    block = 128 << 10
    count = size // block
    frame = bytearray(b"\x28\xb5\x2f\xfd\x00\x38")  # magic; no content size; 128 KiB window
    for i in range(count):
        frame += ((block << 3) | (1 << 1) | (i == count - 1)).to_bytes(3, "little") + b"\0"
    return bytes(frame)


def gzip_bomb(size: int, prefix: bytes = b"") -> bytes:
    """A valid gzip member of `prefix` and `size` zeros (~1,000:1): one fully flushed deflate
    segment of a MiB of zeros, repeated."""
    zeros = bytes(MiB)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    start = deflate.compress(prefix) + deflate.flush(zlib.Z_FULL_FLUSH)
    segment = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(prefix)
    for _ in range(size // MiB):
        crc = zlib.crc32(zeros, crc)
    last = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS).flush()
    trailer = struct.pack("<II", crc, (len(prefix) + size) & 0xFFFFFFFF)
    return GZIP_HEADER + start + segment * (size // MiB) + last + trailer


BOMBS = {"zstd": zstd_bomb, "gzip": gzip_bomb}


def _memory(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM", "RssAnon"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


class PeakMemory:
    """How much a process's memory grows at its peak over a `with` block: `rss` from VmHWM
    (reset at the start through /proc/<pid>/clear_refs: exact, but it counts the pages of
    files the process maps, such as the engine reading a spooled insert), `anon` from RssAnon
    sampled every few ms (its heap alone)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss = self.anon = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakMemory:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        start = _memory(self.pid)
        self._rss, self._anon = start["VmRSS"], start["RssAnon"]
        self._anon_peak = self._anon
        self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self._anon_peak = max(self._anon_peak, _memory(self.pid)["RssAnon"])

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sampler.join()
        end = _memory(self.pid)
        self.rss = end["VmHWM"] - self._rss
        self.anon = max(self._anon_peak, end["RssAnon"]) - self._anon

    def __repr__(self) -> str:
        return f"server memory grew by {self.rss >> 20} MiB (RSS), {self.anon >> 20} MiB (heap)"


def _exchange(port: int, head: bytes, body: bytes | Iterator[bytes], timeout: float = 30) -> bytes:
    """Send a request while reading the answer until the server closes the connection (a
    sender thread, since the server may answer and close before the body is all sent)."""
    with socket.create_connection(("127.0.0.1", port), timeout) as sock:

        def send() -> None:
            with contextlib.suppress(OSError):
                sock.sendall(head)
                for piece in [body] if isinstance(body, bytes) else body:
                    sock.sendall(piece)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
        return answer


def _head(path: str, headers: dict[str, str | int]) -> bytes:
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return f"POST {path} HTTP/1.1\r\nHost: x\r\n{lines}\r\n".encode()


def _status_and_headers(answer: bytes) -> tuple[int, dict[str, str]]:
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
    return int(head[0].split()[1]), {k.lower(): v for k, v in headers.items()}


def _server_pid(settings: StackSettings, name: str = "clickhouse") -> int:
    pid = services.process(settings, name).pid()
    assert pid is not None
    return pid


def _url(user: str, password: str, query: str = "") -> str:
    params = {"user": user, "password": password} | ({"query": query} if query else {})
    return f"/?{urlencode(params)}"


@pytest.mark.parametrize("encoding", BOMBS)
def test_a_compression_bomb_is_refused_before_authentication(
    clickhouse: StackSettings, http: httpx.Client, encoding: str
) -> None:
    """1 GiB of zeros in 32 KiB (zstd) or 1 MiB (gzip), with a wrong password: refused (516)
    before a byte is decompressed, the connection closed rather than drained."""
    bomb = BOMBS[encoding](1 << 30)
    headers = {"Content-Encoding": encoding, "Content-Length": len(bomb)}
    with PeakMemory(_server_pid(clickhouse)) as peak:
        answer = _exchange(
            clickhouse.clickhouse_port, _head(_url("reader", "wrong"), headers), bomb
        )
    status, got = _status_and_headers(answer)
    assert (status, got.get("x-clickhouse-exception-code")) == (403, "516"), answer[:300]
    assert got.get("connection") == "close"
    assert peak.rss < MEMORY_BOUND, peak
    assert http.post("/", content="SELECT 42").text == "42\n"


@pytest.mark.parametrize("encoding", BOMBS)
def test_a_compression_bomb_of_an_authenticated_user_is_read_in_slices(
    clickhouse: StackSettings, http: httpx.Client, encoding: str
) -> None:
    """The same bomb as the body of a SQL user's query: decompressed a slice at a time, refused
    once past the statement size limit, the rest left unread (the connection closes)."""
    bomb = BOMBS[encoding](1 << 30)
    password = services.clickhouse_password(clickhouse, "reader")
    headers = {"Content-Encoding": encoding, "Content-Length": len(bomb)}
    with PeakMemory(_server_pid(clickhouse)) as peak:
        answer = _exchange(
            clickhouse.clickhouse_port, _head(_url("reader", password), headers), bomb
        )
    status, got = _status_and_headers(answer)
    assert 400 <= status < 500 and got.get("x-clickhouse-exception-code"), answer[:300]
    assert got.get("connection") == "close"
    assert peak.rss < MEMORY_BOUND, peak
    assert http.post("/", content="SELECT 42").text == "42\n"


def test_a_huge_chunk_is_refused_or_read_in_slices(
    clickhouse: StackSettings, http: httpx.Client
) -> None:
    """A chunk size past max_chunk_size is refused at once (69); a chunk of 1 GiB announced
    and 300 MiB sent is read a slice at a time, never whole."""
    password = services.clickhouse_password(clickhouse, "reader")
    head = _head(_url("reader", password), {"Transfer-Encoding": "chunked"})
    answer = _exchange(clickhouse.clickhouse_port, head, b"ffffffffffffffff\r\nSELECT 1")
    status, got = _status_and_headers(answer)
    assert (status, got.get("x-clickhouse-exception-code")) == (400, "69"), answer[:300]
    assert b"Chunk size exceeded the limit" in answer and b"max_chunk_size" in answer

    def pieces() -> Iterator[bytes]:
        yield b"%x\r\n" % (1 << 30)
        for _ in range(300):
            yield bytes(MiB)

    with PeakMemory(_server_pid(clickhouse)) as peak:
        answer = _exchange(clickhouse.clickhouse_port, head, pieces())
    status, got = _status_and_headers(answer)
    assert 400 <= status < 500 and got.get("connection") == "close", answer[:300]
    assert peak.rss < MEMORY_BOUND, peak
    assert http.post("/", content="SELECT 42").text == "42\n"


def test_a_form_with_a_wrong_password_is_refused_before_its_body_is_read(
    clickhouse: StackSettings, http: httpx.Client
) -> None:
    """A multipart form announced at 100 MB, of which the client has sent 100 bytes and then
    waits: the server answers 516 at once (it does not wait for the form). Credentials in form
    fields are none, as in ClickHouse: a password given there only is refused the same way."""
    boundary = "b0undary"
    form_head = {
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "Content-Length": 100_000_000,
    }
    start = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="password"\r\n\r\n'
        f"{services.clickhouse_password(clickhouse, 'jobscope')}\r\n--{boundary}\r\n"
    ).encode()
    for path in (_url("jobscope", "wrong", "SELECT 1"), "/?query=SELECT+1"):
        with socket.create_connection((clickhouse.host, clickhouse.clickhouse_port), 10) as sock:
            sock.sendall(_head(path, form_head) + start)
            started = time.monotonic()
            answer = b""
            while chunk := sock.recv(65536):  # the server closes after its answer
                answer += chunk
            assert time.monotonic() - started < 5
        status, got = _status_and_headers(answer)
        assert (status, got.get("x-clickhouse-exception-code")) == (403, "516"), answer[:300]
        assert got.get("connection") == "close"
    assert http.post("/", content="SELECT 42").text == "42\n"


def test_expect_continue_is_answered_after_authentication(clickhouse: StackSettings) -> None:
    """`Expect: 100-continue` (curl sends it with large bodies): a refused client gets its 516
    instead of '100 Continue', so it never sends the body; an accepted one gets '100 Continue'."""
    body = b"SELECT 42"
    headers = {"Content-Length": len(body), "Expect": "100-continue"}
    for user, password, first in (
        ("jobscope", "wrong", b"HTTP/1.1 403 "),
        ("reader", services.clickhouse_password(clickhouse, "reader"), b"HTTP/1.1 100 "),
    ):
        with socket.create_connection((clickhouse.host, clickhouse.clickhouse_port), 10) as sock:
            sock.sendall(_head(_url(user, password), headers))
            answer = sock.recv(65536)
            assert answer.startswith(first), answer[:300]
            if first == b"HTTP/1.1 100 ":
                sock.sendall(body)
                while not answer.endswith(b"0\r\n\r\n"):
                    answer += sock.recv(65536)
                assert b"HTTP/1.1 200 " in answer and b"\r\n42\n\r\n" in answer


def test_keep_alive_lasts_through_errors_whose_body_was_read(
    clickhouse: StackSettings,
) -> None:
    """Closing after an unread body does not close after every error: a statement that fails
    once its body is read keeps the connection, like successful ones."""
    password = services.clickhouse_password(clickhouse, "reader")
    auth = "Basic " + base64.b64encode(f"reader:{password}".encode()).decode()
    conn = HTTPConnection(clickhouse.host, clickhouse.clickhouse_port, timeout=10)
    try:
        sockets = set()
        for body, status in (("SELECT 1", 200), ("SELEC 1", 400), ("SELECT 2", 200)):
            conn.request("POST", "/", body=body, headers={"Authorization": auth})
            response = conn.getresponse()
            response.read()
            assert response.status == status and response.getheader("Connection") is None
            sockets.add(id(conn.sock))
        assert len(sockets) == 1
    finally:
        conn.close()


# --- a server of its own with small body limits ---------------------------------------------

CAPPED = {"max_body_bytes": 64 * MiB, "max_form_bytes": 4 * MiB}


@pytest.fixture(scope="module")
def capped(clickhouse: StackSettings) -> Iterator[tuple[str, int, Path]]:
    """A second local server (no Kafka tables) with CAPPED limits; yields its URL, PID and
    spool directory."""
    port = free_port()
    data = clickhouse.state_dir / "clickhouse-capped"
    env = {
        **services.component_env(clickhouse),
        "JOBSCOPE_CLICKHOUSE_PORT": str(port),
        "JOBSCOPE_CLICKHOUSE_DATA_DIR": str(data / "data"),
        "JOBSCOPE_CLICKHOUSE_TMP_DIR": str(data / "spool"),
        "JOBSCOPE_CLICKHOUSE_ENGINE_LOG_FILE": str(data / "engine.log"),
        **{f"JOBSCOPE_CLICKHOUSE_{k.upper()}": str(v) for k, v in CAPPED.items()},
    }
    proc = services.process(clickhouse, "clickhouse-capped")
    proc.start([sys.executable, "-m", "stack.clickhouse_server"], env=env, cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"

    try:
        wait_until(
            lambda: httpx.get(f"{url}/ping", timeout=2).status_code == 200,
            60,
            f"the capped ClickHouse server on {url}",
            transient=STARTING,
        )
        yield url, _server_pid(clickhouse, "clickhouse-capped"), data / "spool"
    finally:
        proc.stop()


def test_inserts_stream_in_slices_up_to_max_body_bytes(
    clickhouse: StackSettings, capped: tuple[str, int, Path]
) -> None:
    """An insert of 48 MiB (gzip) streams in with bounded memory; a gzip bomb inserted by the
    read-write user is cut at max_body_bytes decompressed (413, code 290), its spool removed."""
    url, pid, spool = capped
    auth = ("jobscope", services.clickhouse_password(clickhouse, "jobscope"))
    with httpx.Client(base_url=url, auth=auth, timeout=60) as client:
        client.post("/", content="CREATE TABLE sink (x UInt8) ENGINE = Null").raise_for_status()
        insert = {"query": "INSERT INTO sink FORMAT RowBinary"}
        headers = {"Content-Encoding": "gzip"}
        warm_up = client.post("/", params=insert, content=gzip_bomb(4 * MiB), headers=headers)
        assert warm_up.status_code == 200, warm_up.text  # the engine's first insert sets up
        with PeakMemory(pid) as peak:
            ok = client.post("/", params=insert, content=gzip_bomb(48 * MiB), headers=headers)
        assert ok.status_code == 200, ok.text
        assert json.loads(ok.headers["X-ClickHouse-Summary"])["written_rows"] == str(48 * MiB)
        assert peak.anon < MEMORY_BOUND, peak  # the engine maps the spool file it reads
        with PeakMemory(pid) as peak:
            refused = client.post("/", params=insert, content=gzip_bomb(1 << 30), headers=headers)
        assert refused.status_code == 413, refused.text
        assert refused.headers["X-ClickHouse-Exception-Code"] == "290"
        assert "max_body_bytes" in refused.text
        assert peak.rss < MEMORY_BOUND, peak
        assert list(spool.iterdir()) == []
        assert client.post("/", content="SELECT 42").text == "42\n"


def test_the_form_limit_counts_decompressed_bytes(
    clickhouse: StackSettings, capped: tuple[str, int, Path]
) -> None:
    """A 1 MiB gzip form that inflates to 1 GiB is refused at max_form_bytes (4 MiB here) of
    decompressed bytes, 413 with code 290, and memory stays bounded."""
    url, pid, _ = capped
    password = services.clickhouse_password(clickhouse, "reader")
    boundary = "b0undary"
    part = f'--{boundary}\r\nContent-Disposition: form-data; name="query"\r\n\r\n'
    form = gzip_bomb(1 << 30, part.encode())
    headers = {
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "Content-Encoding": "gzip",
        "Content-Length": len(form),
    }
    with PeakMemory(pid) as peak:
        answer = _exchange(
            int(url.rsplit(":", 1)[1]), _head(_url("reader", password), headers), form
        )
    status, got = _status_and_headers(answer)
    assert (status, got.get("x-clickhouse-exception-code")) == (413, "290"), answer[:300]
    assert b"max_form_bytes" in answer
    assert peak.rss < MEMORY_BOUND, peak
