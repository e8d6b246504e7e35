"""Influx line protocol (`POST /api/v2/write`, `POST /api/write`) against the real stack, with
an agent token sent as InfluxDB clients send it (`Authorization: Token ...`): each numeric
field stored as a reading named as documented, its device the `host` tag, the other tags its
labels; strings and non-finite values skipped and counted. Lines are written here by hand (no
Telegraf here: the mocked part is the sender). Each bad write is a 4xx that stores nothing:
a line that does not parse, a reserved tag, a node not in the token, a gzip bomb, another
encoding, no token."""

from __future__ import annotations

import gzip
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from clickhouse_connect.driver.client import Client

from api.infra.tokens import Role, create_token
from api.line_protocol import metric_id, split_line
from stack import secrets
from stack.config import StackSettings
from stack.processes import wait_until


def test_a_line_splits_with_the_protocols_escapes_and_strings() -> None:
    line = r'my\ meas,tag\,a=b\=c,host=n1 f="x y,z",g=1.5,h=3i,t=T 1700000000000000000'
    assert split_line(line) == (
        "my meas",
        {"tag,a": "b=c", "host": "n1"},
        [("f", '"x y,z"'), ("g", "1.5"), ("h", "3i"), ("t", "T")],
        "1700000000000000000",
    )
    assert metric_id("cpu", "usage_user") == "cpu_usage_user"
    assert metric_id("disk.io", "value") == "disk_io"
    assert metric_id("1m", "x") == "_1m_x"
    for bad in ("m", "m f", 'm f="open', ",t=1 f=1", "m,t f=1"):
        with pytest.raises(ValueError):
            split_line(bad)


@pytest.fixture(scope="module")
def agent(clickhouse: StackSettings) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    secret = secrets.load_or_create(clickhouse.state_dir)["JOBSCOPE_TOKEN_SECRET"]
    node = f"lp-{tag}"
    token = create_token(secret, f"agent-{tag}", Role.AGENT, timedelta(hours=1), nodes=[node])
    return {"node": node, "foreign": f"lpother-{tag}", "token": token, "user": f"agent-{tag}"}


def _post(api_url: str, path: str, body: bytes, token: str | None, **params: str) -> httpx.Response:
    headers = {"Content-Type": "text/plain; charset=utf-8"}
    if token is not None:
        headers["Authorization"] = token
    return httpx.post(f"{api_url}{path}", content=body, headers=headers, params=params, timeout=30)


def _rows(client: Client, device: str) -> list[tuple[Any, ...]]:
    return client.query(
        "SELECT metric_id, labels, toUnixTimestamp64Micro(timestamp), value FROM metrics "
        "WHERE device_id = {d:String} ORDER BY metric_id, timestamp",
        parameters={"d": device},
    ).result_rows


def test_lines_are_stored_as_documented(
    api_url: str, agent: dict[str, str], admin_client: Client
) -> None:
    at_ms = int((datetime.now(UTC) - timedelta(seconds=30)).timestamp() * 1000)
    node = agent["node"]
    body = (
        f"# a comment, then an empty line\n\n"
        f'gpu,host={node}.example.org,gpu=0 power=250.5,util=97i,name="H100",busy=true {at_ms}\n'
        f"node_load,host={node} value=0.25,procs=12u {at_ms + 1}\n"
        f"weird,host={node} inf=+Inf {at_ms + 2}\n"
    ).encode()
    response = _post(api_url, "/api/v2/write", body, f"Token {agent['token']}", precision="ms")
    assert response.status_code == 204, response.text
    assert response.headers["X-Jobscope-Accepted"] == "5"
    assert response.headers["X-Jobscope-Skipped-Strings"] == "1"
    assert response.headers["X-Jobscope-Skipped-Non-Finite"] == "1"
    source = f"agent:{agent['user']}"
    wait_until(lambda: len(_rows(admin_client, node)) == 5, 30, "the five readings")
    at_us = at_ms * 1000
    assert _rows(admin_client, node) == [
        ("gpu_busy", {"gpu": "0", "source": source}, at_us, 1.0),
        ("gpu_power", {"gpu": "0", "source": source}, at_us, 250.5),
        ("gpu_util", {"gpu": "0", "source": source}, at_us, 97.0),
        ("node_load", {"source": source}, at_us + 1000, 0.25),
        ("node_load_procs", {"source": source}, at_us + 1000, 12.0),
    ]


def test_influxdb_1s_path_with_gzip_and_seconds(
    api_url: str, agent: dict[str, str], admin_client: Client
) -> None:
    at_s = int(datetime.now(UTC).timestamp()) - 20
    node = agent["node"]
    body = gzip.compress(f"v1_seconds,host={node} value=7 {at_s}\n".encode())
    response = httpx.post(
        f"{api_url}/api/write",
        content=body,
        params={"db": "telegraf", "precision": "s"},
        headers={"Authorization": f"Bearer {agent['token']}", "Content-Encoding": "gzip"},
        timeout=30,
    )
    assert response.status_code == 204, response.text
    wanted = ("v1_seconds", {"source": f"agent:{agent['user']}"}, at_s * 1_000_000, 7.0)
    wait_until(lambda: wanted in _rows(admin_client, node), 30, "the gzip write's reading")


@pytest.mark.parametrize(
    ("case", "body", "token", "headers", "status", "error"),
    [
        ("a line that does not parse", "{ok}\nbroken,host={node}\n", "token", {}, 400, "line 2"),
        ("not a number", "lpbad,host={node} f=12abc\n", "token", {}, 400, "line 1.f"),
        ("a reserved tag", "lpbad,host={node},_device_alias=x f=1\n", "token", {}, 400, "_"),
        ("a node not in the token", "lpbad,host={foreign} f=1\n", "token", {}, 403, ""),
        ("no host or instance tag", "lpbad f=1\n", "token", {}, 400, "no instance or host"),
        ("a gzip bomb", "", "token", {"Content-Encoding": "gzip"}, 413, "decompressed"),
        ("another encoding", "{ok}\n", "token", {"Content-Encoding": "br"}, 415, "gzip"),
        ("no token", "{ok}\n", None, {}, 401, "bearer"),
        ("a Basic scheme", "{ok}\n", "Basic", {}, 401, "bearer"),
    ],
)
def test_bad_writes_are_refused_and_store_nothing(
    api_url: str,
    agent: dict[str, str],
    admin_client: Client,
    case: str,
    body: str,
    token: str | None,
    headers: dict[str, str],
    status: int,
    error: str,
) -> None:
    marker = f"lpmark_{uuid.uuid4().hex[:8]}"
    ok = f"{marker},host={agent['node']} f=1"
    content = body.format(ok=ok, node=agent["node"], foreign=agent["foreign"]).encode()
    if case == "a gzip bomb":  # 64 KiB on the wire, 64 MiB once decompressed
        content = gzip.compress(b"x" * (64 << 20), compresslevel=9)
    auth = {"token": f"Token {agent['token']}", "Basic": f"Basic {agent['token']}"}
    sent_headers = {"Content-Type": "text/plain"} | headers
    if token is not None:
        sent_headers["Authorization"] = auth[token]
    response = httpx.post(
        f"{api_url}/api/v2/write", content=content, headers=sent_headers, timeout=60
    )
    assert response.status_code == status, f"{case}: {response.text}"
    assert error.lower() in response.text.lower(), response.text
    # a good write after it lands; nothing of the refused one ever does
    after = _post(
        api_url,
        "/api/v2/write",
        f"{marker}_after,host={agent['node']} f=1\n".encode(),
        f"Token {agent['token']}",
    )
    assert after.status_code == 204, after.text
    wait_until(
        lambda: any(r[0] == f"{marker}_after_f" for r in _rows(admin_client, agent["node"])),
        30,
        "the write after",
    )
    stored = {r[0] for r in _rows(admin_client, agent["node"])}
    assert f"{marker}_f" not in stored and "lpbad_f" not in stored
    assert _rows(admin_client, agent["foreign"]) == []


def test_a_precision_that_is_none_is_refused(api_url: str, agent: dict[str, str]) -> None:
    """`precision` is one of the listed units, never pasted into a computation."""
    body = f"lpprec,host={agent['node']} f=1 1\n".encode()
    for precision in ("weeks", "ns;drop", ""):
        response = _post(
            api_url, "/api/v2/write", body, f"Token {agent['token']}", precision=precision
        )
        assert response.status_code == 400, response.text
        assert response.json()["parameter"] == "precision", response.text
