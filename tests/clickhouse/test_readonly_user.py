"""The read-only user (SQL users, Superset, the API) can read everything and write nothing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from stack import services
from stack.config import StackSettings


@pytest.fixture(scope="module")
def reader_http(clickhouse: StackSettings) -> httpx.Client:
    password = services.clickhouse_password(clickhouse, "reader")
    return httpx.Client(base_url=clickhouse.clickhouse_url, auth=("reader", password), timeout=30)


def test_reader_reads(admin_client: Client, reader_client: Client) -> None:
    device = f"ro-{uuid.uuid4().hex[:8]}"
    recent = (datetime.now(UTC) - timedelta(hours=1)).replace(tzinfo=None)  # inside the TTL
    admin_client.insert(
        "metrics",
        [[recent, device, "m", 2.5, {"k": "v"}]],
        column_names=["timestamp", "device_id", "metric_id", "value", "labels"],
    )
    rows = reader_client.query(
        "SELECT metric_id, value, labels FROM metrics WHERE device_id = {d:String}",
        parameters={"d": device},
    ).result_rows
    assert rows == [("m", 2.5, {"k": "v"})]
    assert reader_client.query("SELECT number FROM numbers(5)").result_rows[-1] == (4,)


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO metrics (device_id) VALUES ('x')",
        "INSERT INTO metrics SELECT * FROM metrics",
        "CREATE TABLE evil (x UInt8) ENGINE = Memory",
        "DROP TABLE metrics",
        "ALTER TABLE metrics DELETE WHERE 1",
        "TRUNCATE TABLE metrics",
        "OPTIMIZE TABLE metrics",
        "SYSTEM STOP MERGES",
        "SELECT * FROM file('/etc/passwd', 'LineAsString')",
        "SELECT * FROM url('http://127.0.0.1:1/', CSV, 'a String')",
        "SELECT count() FROM readings_queue SETTINGS stream_like_engine_allow_direct_select = 1",
        "SELECT 1 INTO OUTFILE '/tmp/x'",
        "SELECT 1; DROP TABLE metrics",
        "SELECT getSetting('readonly') SETTINGS readonly = 0",
    ],
)
def test_reader_cannot_write(reader_http: httpx.Client, statement: str) -> None:
    response = reader_http.post("/", content=statement)
    assert response.status_code in (400, 403), response.text
    assert int(response.headers["X-ClickHouse-Exception-Code"]) in (62, 164, 497), response.text


def test_reader_cannot_lift_readonly(reader_http: httpx.Client) -> None:
    response = reader_http.post(
        "/", params={"readonly": "0"}, content="SELECT getSetting('readonly')"
    )
    assert response.status_code == 200 and response.text == "1\n"
    session = {"session_id": str(uuid.uuid4())}
    reader_http.post("/", params=session, content="SET readonly = 0")
    response = reader_http.post("/", params=session, content="SELECT getSetting('readonly')")
    assert response.text == "1\n"


def test_reader_cannot_insert_native(reader_client: Client) -> None:
    with pytest.raises(DatabaseError, match="164"):
        reader_client.insert(
            "metrics",
            [[datetime(2026, 1, 1), "d", "m", 1.0, {}]],
            column_names=["timestamp", "device_id", "metric_id", "value", "labels"],
        )


def test_reader_never_sees_a_reading_twice(admin_client: Client, reader_client: Client) -> None:
    """At-least-once delivery may store a reading twice; readers see it once (FINAL)."""
    device = f"dup-{uuid.uuid4().hex[:8]}"
    recent = (datetime.now(UTC) - timedelta(hours=1)).replace(tzinfo=None)  # inside the TTL
    row = [recent, device, "m", 7.5, {}]
    columns = ["timestamp", "device_id", "metric_id", "value", "labels"]
    admin_client.command("SYSTEM STOP MERGES metrics")  # a merge would remove the copy
    try:
        admin_client.insert("metrics", [row], column_names=columns)
        admin_client.insert("metrics", [row], column_names=columns)  # a second part
        query = "SELECT count() FROM metrics WHERE device_id = {d:String}"
        assert admin_client.query(query, parameters={"d": device}).result_rows == [(2,)]
        assert reader_client.query(query, parameters={"d": device}).result_rows == [(1,)]
    finally:
        admin_client.command("SYSTEM START MERGES metrics")
