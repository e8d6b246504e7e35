"""The API's limits against the real test stack: devices and metrics per request, the size of
a JSON answer, readings answers streaming at once (503 with Retry-After), a client that stops
reading an export, /health while every worker thread and ClickHouse hang, ClickHouse too slow
(504), and 500 idle or byte-at-a-time connections (header and body timeouts).

Most tests run a second API process with small limits (`limited_api`) in front of the session's
Kafka and ClickHouse; the slow-client test runs against the session's API, with the defaults.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from clickhouse_connect.driver.client import Client

from stack import services
from stack.config import REPO_ROOT, StackSettings
from stack.processes import free_port, wait_until
from stack.transient import STARTING

LIMITS = {
    "JOBSCOPE_MAX_DEVICES": "3",
    "JOBSCOPE_MAX_METRICS": "3",
    "JOBSCOPE_JSON_MAX_SPAN_S": "60",
    "JOBSCOPE_JSON_MAX_READINGS": "5",
    "JOBSCOPE_COLUMNAR_MAX_READINGS": "5",
    "JOBSCOPE_MAX_EXPORTS": "2",
    "JOBSCOPE_EXPORT_QUEUE": "1",
    # long enough for a queued request to outlive, on a loaded machine, the few requests the
    # test makes before freeing a slot for it
    "JOBSCOPE_EXPORT_WAIT_S": "6",
    "JOBSCOPE_EXPORT_SEND_TIMEOUT_S": "15",
    "JOBSCOPE_RETRY_AFTER_S": "7",
    "JOBSCOPE_THREADS": "4",
    "JOBSCOPE_HEALTH_TIMEOUT_S": "1",
    "JOBSCOPE_QUERY_TIMEOUT_S": "5",
    "JOBSCOPE_HEADER_TIMEOUT_S": "2",
    "JOBSCOPE_BODY_TIMEOUT_S": "2",
    "JOBSCOPE_LIVE_MAX_CLIENTS": "0",
}
COLUMNS = ["timestamp", "device_id", "metric_id", "value", "labels"]
BIG_ROWS = 100_000  # ~30 MB of NDJSON: far more than the sockets between API and client hold


@contextmanager
def extra_api(settings: StackSettings, name: str, env: dict[str, str]) -> Iterator[str]:
    """Another API process on a free port with `env` over the stack's settings; its URL."""
    port = free_port()
    proc = services.process(settings, f"{name}-{port}")
    proc.start(
        [sys.executable, "-m", "api"],
        env={**services.component_env(settings), "JOBSCOPE_API_PORT": str(port), **env},
        cwd=REPO_ROOT,
        ports=[("127.0.0.1", port)],
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: httpx.get(f"{url}/health", timeout=5).status_code == 200,
            60,
            f"API {name}",
            transient=STARTING,
        )
        yield url
    finally:
        proc.stop(timeout=30)


@pytest.fixture(scope="module")
def limited_api(clickhouse: StackSettings) -> Iterator[str]:
    with extra_api(clickhouse, "api-limits", LIMITS) as url:
        # its ClickHouse client exists before any test stops ClickHouse
        assert httpx.get(f"{url}/api/jobs", params={"limit": 1}, timeout=30).status_code == 200
        yield url


@pytest.fixture(scope="module")
def ten_readings(admin_client: Client) -> tuple[str, datetime]:
    """One device, one reading a minute for 10 minutes, an hour ago."""
    device = f"lim-{uuid.uuid4().hex[:8]}"
    base = (datetime.now(UTC) - timedelta(hours=1)).replace(tzinfo=None, second=0, microsecond=0)
    rows = [[base + timedelta(minutes=i), device, "m", float(i), {}] for i in range(10)]
    admin_client.insert(
        "metrics", rows, column_names=["timestamp", "device_id", "metric_id", "value", "labels"]
    )
    return device, base


@pytest.fixture(scope="module")
def big_device(admin_client: Client) -> tuple[str, datetime]:
    """One device with BIG_ROWS readings of padded labels, over the last ~28 h."""
    device = f"lim-big-{uuid.uuid4().hex[:8]}"
    base = (datetime.now(UTC) - timedelta(hours=30)).replace(tzinfo=None)
    pad = {"pad": "x" * 200}
    rows = [[base + timedelta(seconds=i), device, "m", float(i), pad] for i in range(BIG_ROWS)]
    admin_client.insert(
        "metrics", rows, column_names=["timestamp", "device_id", "metric_id", "value", "labels"]
    )
    return device, base


def _export_params(device: str, base: datetime) -> dict[str, str]:
    return {
        "devices": device,
        "format": "ndjson",
        "start_time": base.isoformat(),
        "end_time": (base + timedelta(days=2)).isoformat(),
    }


def test_devices_and_metrics_per_request_are_bounded(
    limited_api: str, ten_readings: tuple[str, datetime]
) -> None:
    device, _ = ten_readings
    for path, params, parameter in (
        ("/api/metrics", {"devices": "a,b,c,d"}, "devices"),
        ("/api/metrics", {"nodes": "a,b,c,d"}, "nodes"),
        ("/api/metrics", {"devices": device, "metrics": "a,b*,c,d"}, "metrics"),
        ("/api/jobs/any/metrics", {"devices": "a,b,c,d"}, "devices"),
        ("/api/jobs/any/summary", {"metrics": "a,b,c,d"}, "metrics"),
        ("/rpc/available_metrics", {"params": '{"devices": ["a", "b", "c", "d"]}'}, "params"),
    ):
        response = httpx.get(f"{limited_api}{path}", params=params, timeout=30)
        assert response.status_code == 400, (path, response.text)
        body = response.json()
        assert body["parameter"] == parameter, body
        assert "4 given, at most 3" in body["error"], body
    response = httpx.get(
        f"{limited_api}/api/metrics", params={"devices": f"{device},b,c", "metrics": "m,x,y"}
    )
    assert response.status_code == 200, response.text


def test_a_large_json_answer_is_refused_pointing_to_the_streamed_formats(
    limited_api: str, ten_readings: tuple[str, datetime]
) -> None:
    """Over JOBSCOPE_JSON_MAX_SPAN_S (60 s here), a JSON answer is counted; past
    JOBSCOPE_JSON_MAX_READINGS (5) it is a 400 naming `format`; Parquet and Arrow, built whole
    by the engine, are refused past JOBSCOPE_COLUMNAR_MAX_READINGS (5); NDJSON and CSV are not
    bounded; a long span holding few readings is served."""
    device, base = ten_readings
    hour = {"devices": device, "start_time": base.isoformat()}
    hour["end_time"] = (base + timedelta(hours=1)).isoformat()

    def get(**extra: str) -> httpx.Response:
        return httpx.get(f"{limited_api}/api/metrics", params={**hour, **extra}, timeout=30)

    refused = get()
    assert refused.status_code == 400, refused.text
    body = refused.json()
    assert body["parameter"] == "format"
    assert "format=ndjson or csv" in body["error"]
    assert "JOBSCOPE_JSON_MAX_READINGS" in body["error"]
    for columnar in ("parquet", "arrow"):  # built whole by the engine: counted the same way
        built = get(format=columnar)
        assert built.status_code == 400 and built.json()["parameter"] == "format", built.text
        assert "JOBSCOPE_COLUMNAR_MAX_READINGS" in built.json()["error"]
    five = get(format="parquet", end_time=(base + timedelta(minutes=4, seconds=30)).isoformat())
    assert five.status_code == 200 and five.content.startswith(b"PAR1")
    ndjson = get(format="ndjson")
    assert ndjson.status_code == 200 and len(ndjson.text.splitlines()) == 10
    assert len(get(format="csv").text.splitlines()) == 11  # and a header
    few = get(end_time=(base + timedelta(minutes=4, seconds=30)).isoformat())
    assert few.status_code == 200 and len(few.json()) == 5  # 270 s > 60 s, but 5 readings
    short = get(end_time=(base + timedelta(seconds=59)).isoformat())
    assert short.status_code == 200 and len(short.json()) == 1  # not counted at all
    assert get(step="1m").status_code == 200  # 60 buckets: not over
    stepped = get(step="10s")  # 360 buckets: counted, 10 rows
    assert stepped.status_code == 400 and stepped.json()["parameter"] == "format"


def test_streaming_answers_beyond_the_limit_wait_then_get_503_with_retry_after(
    limited_api: str, big_device: tuple[str, datetime], clickhouse: StackSettings
) -> None:
    """Two exports held by clients that stop reading fill JOBSCOPE_MAX_EXPORTS (2): a third
    request waits JOBSCOPE_EXPORT_WAIT_S (6 s) for a slot, then is refused; while one waits
    (JOBSCOPE_EXPORT_QUEUE: 1), another is refused at once. A client that goes away frees its
    slot for the one waiting; one that stays but takes nothing is dropped after
    JOBSCOPE_EXPORT_SEND_TIMEOUT_S, freeing its slot too."""
    params = _export_params(*big_device)
    url = f"{limited_api}/api/metrics"
    small = {**params, "devices": "x"}
    first, second = httpx.Client(timeout=60), httpx.Client(timeout=60)
    with (
        first.stream("GET", url, params=params) as held_1,
        second.stream("GET", url, params=params) as held_2,
        ThreadPoolExecutor(1) as waiter,
    ):
        assert held_1.status_code == 200 and held_2.status_code == 200
        began = time.monotonic()
        refused = httpx.get(url, params=small, timeout=30)
        waited = time.monotonic() - began
        assert refused.status_code == 503, refused.text
        assert waited >= 6, f"refused after {waited:.2f} s, before the 6 s wait"
        assert refused.headers["retry-after"] == "7"
        assert "JOBSCOPE_EXPORT_WAIT_S" in refused.json()["error"]
        queued = waiter.submit(lambda: httpx.get(url, params=small, timeout=30))
        wait_until(
            lambda: httpx.get(f"{limited_api}/health").json()["exports_waiting"] == 1,
            10,
            "the request in the queue",
        )
        refused = httpx.get(url, params=small, timeout=30)  # the queue is full: no wait
        assert refused.status_code == 503 and "JOBSCOPE_EXPORT_QUEUE" in refused.json()["error"]
        first.close()  # the first client goes away: the one waiting takes its slot
        assert queued.result(timeout=30).status_code == 200
        wait_until(
            lambda: httpx.get(url, params=small).status_code == 200,
            30,
            "a slot freed by a client that went away",
        )
        # the second takes nothing: dropped after the send timeout
        wait_until(
            lambda: any(
                "the client took nothing for 15 s" in p.read_text(errors="replace")
                for p in clickhouse.log_dir.glob("api-limits-*.log")
            ),
            90,
            "the API to drop the client that stopped reading",
        )
        with pytest.raises(httpx.RemoteProtocolError):
            for _ in held_2.iter_raw():
                pass  # what was buffered, then the cut: the answer is incomplete
    second.close()
    # both slots free: two answers at once again
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: httpx.get(url, params=params, timeout=120), range(2)))
    assert [a.status_code for a in answers] == [200, 200]
    assert all(len(a.text.splitlines()) == BIG_ROWS for a in answers)


def test_live_streams_beyond_the_limit_get_503_with_retry_after(
    limited_api: str, post_job: Callable[..., dict[str, Any]]
) -> None:
    job_id = f"lim-live-{uuid.uuid4().hex[:8]}"
    post_job(job_id=job_id, nodes=["lim-live-node"], start=datetime.now(UTC).isoformat())
    refused = httpx.get(f"{limited_api}/api/jobs/{job_id}/live", timeout=30)
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "7"
    assert "JOBSCOPE_LIVE_MAX_CLIENTS" in refused.json()["error"]


@contextmanager
def clickhouse_stopped(settings: StackSettings) -> Iterator[None]:
    """ClickHouse frozen (SIGSTOP): it accepts connections and never answers."""
    pid = services.process(settings, "clickhouse").pid()
    assert pid is not None, "the test ClickHouse server is not running"
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.disruptive
def test_health_answers_while_clickhouse_and_every_worker_thread_hang(
    limited_api: str, clickhouse: StackSettings
) -> None:
    """8 queries on 4 worker threads (JOBSCOPE_THREADS) all wait for a frozen ClickHouse;
    /health still answers within its timeout (1 s here), and each query gets a 504 naming
    JOBSCOPE_QUERY_TIMEOUT_S (5 s here). Once ClickHouse is back, all answer again."""

    def query(_: int) -> tuple[httpx.Response, float]:
        response = httpx.get(f"{limited_api}/api/jobs", params={"limit": 1}, timeout=120)
        return response, time.monotonic()

    with clickhouse_stopped(clickhouse), ThreadPoolExecutor(8) as pool:
        queries = [pool.submit(query, i) for i in range(8)]
        began = time.monotonic()
        health = httpx.get(f"{limited_api}/health", timeout=30)
        answered = time.monotonic()
        assert answered - began < 5, f"/health took {answered - began:.1f} s"
        assert health.status_code == 503
        body = health.json()
        assert body["kafka"]["ok"] and not body["clickhouse"]["ok"]
        assert "no answer within 1 s" in body["clickhouse"]["detail"]
        results = [q.result() for q in queries]
    for response, done in results:
        assert response.status_code == 504, response.text
        assert "did not answer within 5 s (JOBSCOPE_QUERY_TIMEOUT_S)" in response.json()["error"]
        assert done > answered, "a query answered before /health: the threads were not all held"
    wait_until(
        lambda: httpx.get(f"{limited_api}/health", timeout=5).status_code == 200,
        60,
        "/health after ClickHouse is back",
    )
    assert httpx.get(f"{limited_api}/api/jobs", params={"limit": 1}, timeout=30).status_code == 200


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=10)


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (what it sent first is read and dropped)."""
    while select.select([sock], [], [], 0)[0]:
        try:
            if not sock.recv(65536):
                return True
        except ConnectionError:
            return True
    return False


class Trickle(threading.Thread):
    """Sends `head` one byte at a time to each socket, every `interval_s`, until stopped."""

    def __init__(self, socks: list[socket.socket], head: bytes, interval_s: float) -> None:
        super().__init__(daemon=True)
        self.socks, self.head, self.interval_s = socks, head, interval_s
        self.stopped = threading.Event()

    def run(self) -> None:
        for i in range(len(self.head)):
            for sock in self.socks:
                with contextlib.suppress(OSError):  # closed by the server
                    sock.send(self.head[i : i + 1])
            if self.stopped.wait(self.interval_s):
                return


def test_slow_and_idle_clients_do_not_block_new_requests(api_url: str) -> None:
    """250 connections that send nothing and 250 that send a request head a byte at a time:
    while all 500 are open, a normal request is answered; the server then closes every one of
    them (after JOBSCOPE_HEADER_TIMEOUT_S, default 10 s), the trickling ones included."""
    idle = [_connect(api_url) for _ in range(250)]
    slow = [_connect(api_url) for _ in range(250)]
    head = b"GET /api/jobs HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 1000
    trickle = Trickle(slow, head, 0.2)
    trickle.start()
    try:
        began = time.monotonic()
        response = httpx.get(f"{api_url}/api/jobs", params={"limit": 1}, timeout=30)
        took = time.monotonic() - began
        assert response.status_code == 200 and took < 5, (response.status_code, took)
        still_open = [s for s in idle + slow if not _closed_by_server(s)]
        assert len(still_open) == 500, "connections were closed before the request was answered"
        wait_until(
            lambda: all(_closed_by_server(s) for s in idle + slow),
            60,
            "the server to close the 500 slow connections",
        )
        assert trickle.is_alive(), "the trickle ended before the server closed its connections"
    finally:
        trickle.stopped.set()
        for sock in idle + slow:
            sock.close()


def _read_all(sock: socket.socket) -> bytes:
    """What arrives until the server closes the connection. A close while the client is still
    sending comes as a reset (the server had unread bytes): a close all the same."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_request_head_and_body_have_deadlines(limited_api: str, api_tokens: dict[str, str]) -> None:
    """JOBSCOPE_HEADER_TIMEOUT_S and JOBSCOPE_BODY_TIMEOUT_S (2 s here): a connection that
    sends nothing gets a 408 and is closed; a body sent a byte at a time is cut off."""
    idle = _connect(limited_api)
    idle.settimeout(30)
    began = time.monotonic()
    assert _read_all(idle).startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - began < 15
    idle.close()

    slow = _connect(limited_api)
    slow.settimeout(30)
    slow.sendall(
        b"POST /api/metrics HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {api_tokens['admin']}\r\n".encode()
        + b"Content-Length: 1000\r\n\r\n["
    )
    trickle = Trickle([slow], b" " * 998, 0.2)
    trickle.start()
    try:
        began = time.monotonic()
        _read_all(slow)  # returns once the server closes the connection
        assert time.monotonic() - began < 15 and trickle.is_alive()
    finally:
        trickle.stopped.set()
        slow.close()


def _response_head(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and the body of the response read from `sock`: whole when it has
    a Content-Length (the body may come in a later segment than the head), else its start."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}
    with contextlib.suppress(ConnectionError):
        while len(rest) < int(headers.get("content-length", 0)):
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    return int(status_line.split()[1]), headers, rest


def _closed_soon(sock: socket.socket, timeout_s: float = 10.0) -> bool:
    """Whether the server closes `sock` within `timeout_s` (what it still sends is dropped)."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except ConnectionError:
        pass
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_unauthenticated_huge_body_is_refused_before_it_is_read(
    api_url: str, framing: str
) -> None:
    """A 100 MB job body without a valid token: the client sends the head and 64 KiB of the
    body, and gets the 401 at once, the connection closed (the other ~100 MB never read)."""
    for auth in (b"", b"Authorization: Bearer not-a-token-of-ours\r\n"):
        sock = _connect(api_url)
        sock.settimeout(10)
        size = (
            b"Content-Length: 100000000\r\n"
            if framing == "content-length"
            else (b"Transfer-Encoding: chunked\r\n")
        )
        sock.sendall(
            b"POST /api/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + auth
            + size
            + b"\r\n"
        )
        part = b'{"job_id": "' + b"x" * 65536
        sock.sendall(part if framing == "content-length" else b"%x\r\n%s\r\n" % (len(part), part))
        status, headers, _ = _response_head(sock)
        assert status == 401, (auth, status)
        assert headers["connection"] == "close" and headers["www-authenticate"] == "Bearer"
        assert _closed_soon(sock), "the server kept the connection open to read the body"
        sock.close()


def test_an_oversize_body_of_an_authenticated_write_gets_413(
    api_url: str, api_tokens: dict[str, str]
) -> None:
    """JOBSCOPE_MAX_BODY_BYTES (1 MiB by default), with a valid token: a larger Content-Length
    is refused before the body is read; a chunked body is counted as it comes and refused
    once past the cap; either way the connection is closed, not drained."""
    auth = f"Authorization: Bearer {api_tokens['scheduler']}\r\n".encode()
    head = b"POST /api/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + auth
    declared = _connect(api_url)
    declared.settimeout(10)
    declared.sendall(head + b"Content-Length: 2097152\r\n\r\n" + b'{"job_id": "')
    status, headers, body = _response_head(declared)
    assert status == 413 and headers["connection"] == "close", (status, headers)
    assert b"JOBSCOPE_MAX_BODY_BYTES" in body
    assert _closed_soon(declared)
    declared.close()

    streamed = _connect(api_url)
    streamed.settimeout(10)
    streamed.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b" " * 262144
    with contextlib.suppress(ConnectionError):  # closed by the server once over the cap
        for _ in range(16):  # 4 MiB at most; no more once the answer is there
            streamed.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            if select.select([streamed], [], [], 0.05)[0]:
                break
    status, headers, _ = _response_head(streamed)
    # The answer's body may be cut: the server closes with our bytes unread (TCP reset); the
    # message itself is checked above, with Content-Length.
    assert status == 413 and headers["connection"] == "close", (status, headers)
    assert _closed_soon(streamed)
    streamed.close()
    # the same body within the cap is read and judged on its content
    small = httpx.post(
        f"{api_url}/api/jobs",
        content=b'{"nodes": ["n-1"]}' + b" " * 100_000,
        headers={
            "Authorization": f"Bearer {api_tokens['scheduler']}",
            "Content-Type": "application/json",
        },
        timeout=10,
    )
    assert small.status_code == 400 and small.json()["parameter"] == "job_id", small.text


def test_the_push_route_keeps_its_own_body_cap(api_url: str, api_tokens: dict[str, str]) -> None:
    """A push of 2 MiB (over JOBSCOPE_MAX_BODY_BYTES, under JOBSCOPE_PUSH_MAX_BODY_BYTES) is
    read by the push route, not refused by the general cap."""
    response = httpx.post(
        f"{api_url}/api/metrics",
        content=b"[" + b" " * (2 * 1024 * 1024) + b"]",
        headers={"Authorization": f"Bearer {api_tokens['admin']}"},
        timeout=30,
    )
    assert response.status_code == 400 and response.json()["parameter"] == "body", response.text
