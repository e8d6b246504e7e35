"""Readings pushed through `POST /api/metrics` against the real stack: accepted ones land in
ClickHouse once with their `source=user:<name>` label; every refusal writes nothing (checked
after a later accepted push to the same device is visible: one device's messages share a
partition, ingested in order); Kafka unreachable is a 503, never a false 202. A pusher cannot
write into another user's job (by `_device_alias`, or backdating on a node it holds now),
its power is summarised apart from the measured one, and its token's rate and new series
are limited (429)."""

from __future__ import annotations

import itertools
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

from api.infra.config import ApiSettings
from api.infra.tokens import Role, create_token
from api.main import create_app
from stack import kafka_broker, secrets, services
from stack.config import StackSettings
from stack.processes import wait_until
from tests.api.conftest import Row


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


_SEQ = itertools.count(1)


def _distinct(device: str, metric: str, n: int) -> list[dict[str, Any]]:
    """`n` readings of one series a millisecond apart, none sharing a timestamp with another
    call's: copies of one reading would be one row once merged (ReplacingMergeTree)."""
    now = time.time()
    return [_reading(device, metric, timestamp=now - next(_SEQ) / 1000) for _ in range(n)]


class Pushing:
    """A user with a running job on two nodes, another user's node, and their tokens."""

    def __init__(self, api_url: str, secret: str, admin: str, scheduler: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.url = f"{api_url}/api/metrics"
        self.user = f"alice-{tag}"
        self.nodes = [f"push-{tag}-1", f"push-{tag}-2"]
        self.other_node = f"push-{tag}-bob"
        self.ended_node = f"push-{tag}-ended"
        self.secret = secret
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
        (
            "a long device_id",
            [ok, _reading("n" * 129, "refused")],
            pushing.pusher,
            400,
            "readings[1].device_id: 129 characters; at most 128",
        ),
        (
            "a long metric_id",
            [_reading(node, "m" * 129)],
            pushing.admin,
            400,
            "readings[0].metric_id: 129 characters; at most 128",
        ),
        (
            "a reserved label",
            [ok, _reading(node, "refused", labels={"_device_alias": pushing.other_node})],
            pushing.pusher,
            400,
            "readings[1].labels._device_alias: labels starting with '_' are reserved",
        ),
        (
            "a reserved label, even for an admin",
            [_reading(node, "refused", labels={"_site": "x"})],
            pushing.admin,
            400,
            "labels._site",
        ),
        (
            "before the pusher's job",
            [ok, _reading(node, "refused", timestamp=(now - timedelta(hours=2)).isoformat())],
            pushing.pusher,
            400,
            "readings[1].timestamp",
        ),
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


# ---- nobody writes into another's job -------------------------------------------------------


def _summary(api_url: str, job_id: str) -> dict[str, Any]:
    response = httpx.get(f"{api_url}/api/jobs/{job_id}/summary", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _power(node: str, start: datetime, watts: float, seconds: int = 60) -> list[Row]:
    """Measured readings of `node`'s BMC: `watts` every second from `start`."""
    return [
        [start + timedelta(seconds=i), node, "bmc_power_watt", watts, {}]
        for i in range(seconds + 1)
    ]


def _marker(pushing: Pushing, admin_client: Client, device: str) -> None:
    """An admin's reading of `device`, visible: what was pushed for it before is ingested."""
    metric = f"marker_{uuid.uuid4().hex[:8]}"
    response = pushing.post(_reading(device, metric), pushing.admin)
    assert response.status_code == 202, response.text
    _wait_for(admin_client, device, metric, 1)


def test_a_pushed_device_alias_cannot_reach_another_users_job(
    pushing: Pushing,
    api_url: str,
    admin_client: Client,
    insert_readings: Callable[[list[Row]], None],
    post_job: Callable[..., dict[str, Any]],
) -> None:
    """Alice labels her own node's readings `_device_alias=<bob's node>` (which would sum
    them into the power and energy of every job on bob's node): 400 naming the label, and
    bob's summary stays as it was."""
    victim = f"{pushing.other_node}-victim"
    start = datetime.now(UTC) - timedelta(minutes=50)
    insert_readings(_power(victim, start + timedelta(minutes=5), 100.0))
    job_id = f"{victim}-job"
    post_job(
        job_id=job_id,
        user="bob",
        nodes=[victim],
        start=start.isoformat(),
        end=(start + timedelta(minutes=40)).isoformat(),
        state="terminated",
    )
    wait_until(lambda: _summary(api_url, job_id)["energy"] != [], 30, "bob's measured energy")
    before = _summary(api_url, job_id)
    (energy,) = before["energy"]
    assert energy["joules"] == pytest.approx(6000.0) and energy["pushed"] is False
    node = pushing.nodes[0]
    at = start + timedelta(minutes=5)
    forged = [
        _reading(
            node,
            "pdu_outlet_power_watt",
            1e6,
            timestamp=(at + timedelta(seconds=i)).isoformat(),
            labels={"_device_alias": victim},
        )
        for i in range(2)
    ]
    for token in (pushing.pusher, pushing.admin):
        response = pushing.post(forged, token)
        assert response.status_code == 400, response.text
        assert "readings[0].labels._device_alias" in response.json()["error"]
    _marker(pushing, admin_client, node)
    assert _rows(admin_client, node, "pdu_outlet_power_watt") == []
    assert _summary(api_url, job_id) == before


def test_a_backdated_reading_cannot_reach_the_previous_tenants_job(
    pushing: Pushing,
    api_url: str,
    admin_client: Client,
    insert_readings: Callable[[list[Row]], None],
    post_job: Callable[..., dict[str, Any]],
) -> None:
    """Bob had the node until 20 minutes ago; alice holds it now: her reading timed inside
    bob's job is refused (400 naming it and her job's span), bob's summary is unchanged, and
    her readings inside her own job are accepted."""
    node = f"{pushing.nodes[0]}-shared"
    now = datetime.now(UTC)
    bob_start, bob_end = now - timedelta(minutes=50), now - timedelta(minutes=20)
    insert_readings(_power(node, bob_start + timedelta(minutes=5), 100.0))
    bobs = f"{node}-bob"
    post_job(
        job_id=bobs,
        user="bob",
        nodes=[node],
        start=bob_start.isoformat(),
        end=bob_end.isoformat(),
        state="terminated",
    )
    alices = f"{node}-alice"
    alice_start = now - timedelta(minutes=10)
    post_job(
        job_id=alices,
        user=pushing.user,
        nodes=[node],
        start=alice_start.isoformat(),
        state="running",
    )
    wait_until(lambda: _summary(api_url, bobs)["energy"] != [], 30, "bob's measured energy")
    before = _summary(api_url, bobs)
    backdated = [
        _reading(
            node,
            "bmc_power_watt",
            1e6,
            timestamp=(bob_start + timedelta(minutes=6, seconds=i)).isoformat(),
        )
        for i in range(2)
    ]
    response = pushing.post([_reading(node, "app_ok"), *backdated], pushing.pusher)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "readings[1].timestamp" in error and "outside the running jobs" in error
    assert alice_start.isoformat() in error
    _marker(pushing, admin_client, node)
    assert _rows(admin_client, node, "bmc_power_watt") == [(100.0, {})] * 61
    assert _summary(api_url, bobs) == before
    inside = _reading(node, "app_ok", timestamp=(alice_start + timedelta(seconds=1)).isoformat())
    response = pushing.post([inside, _reading(node, "app_ok")], pushing.pusher)
    assert response.status_code == 202, response.text


def test_pushed_power_is_summarised_apart_from_the_measured(
    pushing: Pushing,
    api_url: str,
    admin_client: Client,
    insert_readings: Callable[[list[Row]], None],
    post_job: Callable[..., dict[str, Any]],
) -> None:
    """The BMC measures 100 W; the user pushes 1000 W under the same metric and node: the
    summary reports both apart (`pushed`), its totals never add them up."""
    node = f"{pushing.nodes[0]}-power"
    now = datetime.now(UTC)
    start = now - timedelta(minutes=30)
    job_id = f"{node}-job"
    post_job(
        job_id=job_id, user=pushing.user, nodes=[node], start=start.isoformat(), state="running"
    )
    at = start + timedelta(minutes=1)
    insert_readings(_power(node, at, 100.0))
    pushed = [
        _reading(node, "bmc_power_watt", 1000, timestamp=(at + timedelta(seconds=i)).isoformat())
        for i in range(61)
    ]
    response = pushing.post(pushed, pushing.pusher)
    assert response.status_code == 202, response.text
    _wait_for(admin_client, node, "bmc_power_watt", 122)
    summary = _summary(api_url, job_id)
    energy = {e["pushed"]: e for e in summary["energy"]}
    assert set(energy) == {False, True} and len(summary["energy"]) == 2
    assert energy[False]["joules"] == pytest.approx(100 * 60)
    assert energy[True]["joules"] == pytest.approx(1000 * 60)
    assert energy[False]["readings"] == energy[True]["readings"] == 61
    totals = {(t["metric_id"], t["pushed"]): t["joules"] for t in summary["energy_total"]}
    assert totals == {
        ("bmc_power_watt", False): pytest.approx(100 * 60),
        ("bmc_power_watt", True): pytest.approx(1000 * 60),
    }
    stats = {(m["metric_id"], m["pushed"]): m for m in summary["metrics"]}
    assert stats[("bmc_power_watt", False)]["max"] == 100.0
    assert stats[("bmc_power_watt", True)]["min"] == 1000.0


# ---- per-token limits ---------------------------------------------------------------------


@pytest.fixture
def limited_app(
    clickhouse: StackSettings, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., TestClient]:
    """The real app (the test stack's ClickHouse and Kafka, as the API process is configured)
    with limits of the caller's choosing."""
    env = {
        **services.component_env(clickhouse, "api"),
        **kafka_broker.client_env(clickhouse, "api"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return lambda **limits: TestClient(create_app(ApiSettings(**limits)))


def test_a_tokens_rate_is_limited(
    pushing: Pushing, limited_app: Callable[..., TestClient], admin_client: Client
) -> None:
    node = pushing.nodes[0]
    with limited_app(push_rate_readings_per_s=0.5, push_rate_burst=5, push_max_readings=5) as app:
        headers = _auth(pushing.pusher)
        response = app.post("/api/metrics", json=_distinct(node, "rated", 5), headers=headers)
        assert response.status_code == 202, response.text
        response = app.post("/api/metrics", json=_distinct(node, "rated", 1), headers=headers)
        assert response.status_code == 429, response.text
        assert "JOBSCOPE_PUSH_RATE_READINGS_PER_S" in response.json()["error"]
        assert 1 <= int(response.headers["Retry-After"]) <= 2
        other = create_token(pushing.secret, pushing.user, Role.PUSHER, timedelta(hours=1))
        response = app.post("/api/metrics", json=_distinct(node, "rated", 1), headers=_auth(other))
        assert response.status_code == 202, "each token has its own budget"
        response = app.post(
            "/api/metrics", json=_distinct(node, "rated", 5), headers=_auth(pushing.admin)
        )
        assert response.status_code == 202, "an admin is not limited"
    _wait_for(admin_client, node, "rated", 11)
    assert len(_rows(admin_client, node, "rated")) == 11  # 5 + 1 + 5: not the refused one


def test_a_tokens_new_series_are_limited(
    pushing: Pushing, limited_app: Callable[..., TestClient]
) -> None:
    node = pushing.nodes[1]
    with limited_app(push_max_new_series=3) as app:
        headers = _auth(pushing.pusher)

        def push(*labels: str) -> httpx.Response:
            body = [_reading(node, "series", labels={"k": v}) for v in labels]
            return app.post("/api/metrics", json=body, headers=headers)

        assert push("a", "b").status_code == 202
        assert push("a", "b", "c").status_code == 202
        assert push("a", "b", "c").status_code == 202, "known series are not new"
        response = push("a", "d")
        assert response.status_code == 429, response.text
        assert "JOBSCOPE_PUSH_MAX_NEW_SERIES" in response.json()["error"]
        assert int(response.headers["Retry-After"]) > 3000
        assert push("c").status_code == 202, "a refused push started no series"
