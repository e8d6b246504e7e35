"""Readings pushed through `POST /api/metrics` against the real stack: accepted ones land in
ClickHouse once with their `source=user:<name>` label; every refusal writes nothing (checked
after a later accepted push to the same device is visible: one device's messages share a
partition, ingested in order); Kafka unreachable is a 503, never a false 202."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
from clickhouse_connect.driver.client import Client
from fastapi.testclient import TestClient

from api.config import ApiSettings
from api.main import create_app
from api.tokens import Role, create_token
from stack import secrets
from stack.config import StackSettings
from stack.processes import wait_until


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _reading(device: str, metric: str, value: Any = 1.0, **fields: Any) -> dict[str, Any]:
    return {
        "timestamp": time.time(),
        "device_id": device,
        "metric_id": metric,
        "value": value,
        **fields,
    }


class Pushing:
    """A user with a running job on two nodes, another user's node, and their tokens."""

    def __init__(self, api_url: str, secret: str, admin: str, scheduler: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.url = f"{api_url}/api/metrics"
        self.user = f"alice-{tag}"
        self.nodes = [f"push-{tag}-1", f"push-{tag}-2"]
        self.other_node = f"push-{tag}-bob"
        self.ended_node = f"push-{tag}-ended"
        self.pusher = create_token(secret, self.user, Role.PUSHER, timedelta(hours=1))
        self.admin = admin
        self.scheduler = scheduler

    def post(self, body: Any, token: str | None, **kwargs: Any) -> httpx.Response:
        headers = {**(_auth(token) if token else {}), **kwargs.pop("headers", {})}
        if isinstance(body, bytes):
            return httpx.post(self.url, content=body, headers=headers, timeout=30)
        return httpx.post(self.url, json=body, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def pushing(
    api_url: str,
    api_tokens: dict[str, str],
    stack_settings: StackSettings,
    post_job: Callable[..., dict[str, Any]],
) -> Pushing:
    secret = secrets.load_or_create(stack_settings.state_dir)["JOBSCOPE_TOKEN_SECRET"]
    p = Pushing(api_url, secret, api_tokens["admin"], api_tokens["scheduler"])
    start = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    tag = p.nodes[0]
    post_job(job_id=f"{tag}-a", user=p.user, nodes=p.nodes, start=start, state="running")
    post_job(job_id=f"{tag}-b", user="bob", nodes=[p.other_node], start=start, state="running")
    post_job(
        job_id=f"{tag}-c",
        user=p.user,
        nodes=[p.ended_node],
        start=start,
        end=datetime.now(UTC).isoformat(),
        state="terminated",
    )
    return p


def _rows(client: Client, device: str, metric: str) -> list[tuple[Any, ...]]:
    return client.query(
        "SELECT value, labels FROM metrics WHERE device_id = {d:String} AND metric_id = {m:String}"
        " ORDER BY timestamp",
        parameters={"d": device, "m": metric},
    ).result_rows


def _wait_for(client: Client, device: str, metric: str, count: int) -> None:
    wait_until(
        lambda: len(_rows(client, device, metric)) >= count, 30, f"{count} {metric} of {device}"
    )


def test_accepted_readings_land_once_with_their_source(
    pushing: Pushing, reader_client: Client, admin_client: Client
) -> None:
    node_1, node_2 = pushing.nodes
    batch = [
        _reading(node_1, "app_step", 1.5, labels={"phase": "solve", "source": "forged"}),
        _reading(node_1, "app_step", 2, timestamp=datetime.now(UTC).isoformat()),
        _reading(f"{node_2}.site.example.org", "app_step", -3.25),
    ]
    response = pushing.post(batch, pushing.pusher)
    assert response.status_code == 202, response.text
    assert response.json() == {"accepted": 3}
    ndjson = b"\n".join(orjson.dumps(_reading(node_2, "app_ndjson", v)) for v in (7, 8)) + b"\n"
    response = pushing.post(
        ndjson, pushing.pusher, headers={"Content-Type": "application/x-ndjson"}
    )
    assert response.status_code == 202, response.text
    assert response.json() == {"accepted": 2}
    response = pushing.post(_reading(pushing.other_node, "app_admin", 5), pushing.admin)
    assert response.status_code == 202, response.text

    _wait_for(reader_client, node_1, "app_step", 2)
    _wait_for(reader_client, node_2, "app_step", 1)  # stored without its domain suffix
    _wait_for(reader_client, node_2, "app_ndjson", 2)
    _wait_for(reader_client, pushing.other_node, "app_admin", 1)
    source = {"source": f"user:{pushing.user}"}
    # the admin client reads without FINAL: a reading delivered twice would show twice
    assert _rows(admin_client, node_1, "app_step") == [
        (1.5, {"phase": "solve", **source}),
        (2.0, source),
    ]
    assert _rows(admin_client, node_2, "app_ndjson") == [(7.0, source), (8.0, source)]
    assert _rows(admin_client, pushing.other_node, "app_admin") == [(5.0, {"source": "user:admin"})]


def test_refusals_write_nothing(pushing: Pushing, admin_client: Client) -> None:
    node = pushing.nodes[0]
    now = datetime.now(UTC)
    ok = _reading(node, "refused")
    refusals: list[tuple[str, Any, str | None, int, str]] = [
        ("no token", [ok], None, 401, "missing bearer token"),
        ("not a token of ours", [ok], "x.y.z", 401, "unknown token"),
        ("scheduler token", [ok], pushing.scheduler, 403, "pusher or admin"),
        (
            "another user's node",
            [ok, _reading(pushing.other_node, "refused")],
            pushing.pusher,
            403,
            pushing.other_node,
        ),
        ("an ended job's node", [_reading(pushing.ended_node, "refused")], pushing.pusher, 403, ""),
        (
            "NaN",
            orjson.dumps([ok])[:-1] + b', {"timestamp": 1, "device_id": "x", "value": NaN}]',
            pushing.pusher,
            400,
            "JSON",
        ),
        ("a string value", [ok, _reading(node, "refused", "nan")], pushing.pusher, 400, "value"),
        (
            "an old timestamp",
            [ok, _reading(node, "refused", timestamp=(now - timedelta(days=8)).isoformat())],
            pushing.pusher,
            400,
            "readings[1].timestamp",
        ),
        (
            "a future timestamp",
            [ok, _reading(node, "refused", timestamp=(now + timedelta(hours=1)).timestamp())],
            pushing.pusher,
            400,
            "window",
        ),
        ("a bad metric name", [ok, _reading(node, "refused-x")], pushing.pusher, 400, "metric_id"),
        (
            "too many labels",
            [ok, _reading(node, "refused", labels={f"l{i}": "v" for i in range(33)})],
            pushing.pusher,
            400,
            "labels",
        ),
        ("a bad label", [_reading(node, "refused", labels={"a b": "v"})], pushing.pusher, 400, ""),
        ("too large a batch", [ok] * 10_001, pushing.pusher, 413, "at most 10000"),
    ]
    for case, body, token, status, says in refusals:
        response = pushing.post(body, token)
        assert response.status_code == status, f"{case}: {response.text}"
        assert says in response.json()["error"], f"{case}: {response.text}"
    for device in (node, pushing.other_node, pushing.ended_node):
        marker = pushing.post(_reading(device, "marker"), pushing.admin)
        assert marker.status_code == 202, marker.text
        _wait_for(admin_client, device, "marker", 1)
        assert _rows(admin_client, device, "refused") == [], device
    assert _rows(admin_client, pushing.other_node, "refused") == []


def test_kafka_down_is_a_503(api_tokens: dict[str, str]) -> None:
    """The real app pointed at an unreachable Kafka: 503 within the write timeout, saying
    nothing was written (ClickHouse is not needed for an admin's push)."""
    settings = ApiSettings(
        clickhouse_port=1,
        kafka_bootstrap="127.0.0.1:1",
        clickhouse_api_password="x",
        admin_token=api_tokens["admin"],
        kafka_write_timeout_s=1.0,
    )
    with TestClient(create_app(settings)) as client:
        began = time.monotonic()
        response = client.post(
            "/api/metrics",
            json=[_reading("n-1", "m"), _reading("n-2", "m")],
            headers=_auth(api_tokens["admin"]),
        )
        assert response.status_code == 503, response.text
        assert "nothing was written" in response.json()["error"]
        assert time.monotonic() - began < 10
