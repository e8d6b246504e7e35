"""The local ClickHouse server under bad input and slow clients: a clear error each time, and
it keeps serving everyone else."""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from clickhouse_connect.driver.client import Client

from stack import services
from stack.config import StackSettings


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
        "huge header": ("X-Big: " + "x" * 70000 + "\r\nContent-Length: 8\r\n", b"SELECT 1", b""),
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
