"""SQL users (the read-only `reader`) cannot starve the API's user or ingestion of the local
ClickHouse server: a settings profile they cannot lift, a limit of queries at once, engine
connections of their own, and queries nobody waits for cancelled."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from stack import services
from stack.config import StackSettings
from stack.processes import wait_until

HEAVY = "SELECT sum(sleepEachRow(0.1)) FROM numbers(300)"  # 30 s of nothing, block by block


def _client(settings: StackSettings, user: str, timeout: float = 60) -> httpx.Client:
    password = services.clickhouse_password(settings, user)
    return httpx.Client(base_url=settings.clickhouse_url, auth=(user, password), timeout=timeout)


@pytest.fixture
def reader(clickhouse: StackSettings) -> Iterator[httpx.Client]:
    with _client(clickhouse, "reader") as client:
        yield client


@pytest.fixture
def admin(clickhouse: StackSettings) -> Iterator[httpx.Client]:
    with _client(clickhouse, "jobscope") as client:
        yield client


def _code(answer: httpx.Response) -> str:
    return answer.headers.get("X-ClickHouse-Exception-Code", "")


def _running(admin: httpx.Client, marker: str) -> int:
    answer = admin.post(
        "/",
        content=f"SELECT count() FROM system.processes WHERE query_id LIKE '{marker}%'",
    )
    return int(answer.text)


def test_the_reader_limits_hold_whatever_it_asks(reader: httpx.Client) -> None:
    """Reading too many rows is refused at once (158), however the reader asks to lift the
    limit: as a URL setting (refused, naming it: 497), or in the query (readonly refuses the
    change: 164). Lowering it is allowed."""
    huge = "SELECT sum(cityHash64(number)) FROM numbers(100000000000)"
    started = time.monotonic()
    assert _code(reader.post("/", content=huge)) == "158"
    lifted = reader.post("/", params={"max_rows_to_read": "0"}, content=huge)
    assert _code(lifted) == "497" and "max_rows_to_read" in lifted.text, lifted.text
    lowered = reader.post("/", params={"max_rows_to_read": "10"}, content=huge)
    assert _code(lowered) == "158", lowered.text
    assert _code(reader.post("/", content=huge + " SETTINGS max_rows_to_read = 0")) == "164"
    assert time.monotonic() - started < 10  # refused up front, not after reading
    answer = reader.post("/", content="SELECT getSetting('max_execution_time')")
    assert answer.text == "60\n"


def test_a_flood_of_reader_queries_leaves_the_api_user_and_the_admin_served(
    clickhouse: StackSettings, reader: httpx.Client, admin: httpx.Client
) -> None:
    """Nine heavy queries of the reader at once: four run, five are refused with code 202;
    meanwhile the API's user and the admin (ingestion, migrations) are answered at once."""
    marker = f"flood-{uuid.uuid4().hex}"
    answers: list[httpx.Response] = []

    def heavy(i: int) -> None:
        answers.append(
            reader.post(
                "/", params={"query_id": f"{marker}-{i}", "max_block_size": "1"}, content=HEAVY
            )
        )

    threads = [threading.Thread(target=heavy, args=(i,)) for i in range(9)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(answers) >= 5, 20, "five of nine reader queries refused")
        assert sorted(_code(a) for a in answers) == ["202"] * 5
        assert _running(admin, marker) == 4
        with _client(clickhouse, "api") as api:
            for _ in range(20):  # more than the engine's 8 connections, one after another
                assert api.post("/", content="SELECT 1", timeout=5).text == "1\n"
        assert admin.post("/", content="SELECT 2", timeout=5).text == "2\n"
    finally:
        admin.post("/", content=f"KILL QUERY WHERE query_id LIKE '{marker}%' SYNC")
        for thread in threads:
            thread.join(30)
    assert sorted(_code(a) for a in answers) == ["202"] * 5 + ["394"] * 4


def test_a_query_whose_client_went_away_is_cancelled(
    clickhouse: StackSettings, admin: httpx.Client
) -> None:
    """A client that sends a long query and closes its connection: the query leaves the
    engine (system.processes) within a second or so, its engine connection free again."""
    query_id = f"gone-{uuid.uuid4().hex}"
    password = services.clickhouse_password(clickhouse, "reader")
    body = HEAVY.encode()
    request = (
        f"POST /?query_id={query_id}&max_block_size=1&user=reader&password={password} HTTP/1.1\r\n"
        f"Host: x\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection((clickhouse.host, clickhouse.clickhouse_port)) as sock:
        sock.sendall(request)
        wait_until(lambda: _running(admin, query_id) == 1, 10, "the query to run")
    closed = time.monotonic()
    wait_until(lambda: _running(admin, query_id) == 0, 5, "the abandoned query to be cancelled")
    assert time.monotonic() - closed < 3
