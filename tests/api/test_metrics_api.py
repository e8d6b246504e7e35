"""GET /api/metrics and /health of the API process, against the real test stack."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka.admin import AdminClient, NewTopic
from fastapi.testclient import TestClient

from api.infra.config import ApiSettings
from api.main import create_app


@pytest.fixture(scope="module")
def readings(admin_client: Client) -> tuple[str, datetime]:
    """Two devices x two metrics x three readings written straight into `metrics`."""
    prefix = f"api-{uuid.uuid4().hex[:8]}"
    base = (datetime.now(UTC) - timedelta(hours=1)).replace(tzinfo=None, microsecond=123456)
    rows = [
        [base + timedelta(seconds=i), f"{prefix}-{d}", metric, i + d / 10, {"port": str(d)}]
        for d in (1, 2)
        for metric in ("power_watt", "temp_celsius")
        for i in range(3)
    ]
    admin_client.insert(
        "metrics", rows, column_names=["timestamp", "device_id", "metric_id", "value", "labels"]
    )
    return prefix, base


def _get(api_url: str, **params: str) -> httpx.Response:
    return httpx.get(f"{api_url}/api/metrics", params=params, timeout=30)


def test_kwollect_shape(api_url: str, readings: tuple[str, datetime]) -> None:
    prefix, base = readings
    response = _get(
        api_url,
        devices=f"{prefix}-1",
        metrics="power_watt",
        start_time=(base - timedelta(minutes=1)).isoformat() + "Z",
        end_time=(base + timedelta(minutes=1)).isoformat() + "+00:00",
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == [
        {
            "timestamp": (base + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00"),
            "device_id": f"{prefix}-1",
            "metric_id": "power_watt",
            "value": i + 0.1,
            "labels": {"port": "1"},
        }
        for i in range(3)
    ]


def test_selection_by_devices_metrics_and_time(
    api_url: str, readings: tuple[str, datetime]
) -> None:
    prefix, base = readings
    window = {
        "start_time": (base - timedelta(minutes=1)).isoformat(),
        "end_time": (base + timedelta(minutes=1)).isoformat(),
    }
    both = _get(api_url, devices=f"{prefix}-1,{prefix}-2", **window).json()
    assert len(both) == 12
    assert [r["timestamp"] for r in both] == sorted(r["timestamp"] for r in both)
    one_metric = _get(
        api_url, devices=f"{prefix}-1, {prefix}-2", metrics="temp_celsius", **window
    ).json()
    assert {r["metric_id"] for r in one_metric} == {"temp_celsius"} and len(one_metric) == 6
    # Unix seconds, and a window that holds only the second reading of each series
    narrow = _get(
        api_url,
        devices=f"{prefix}-1",
        start_time=str((base + timedelta(seconds=0.5)).replace(tzinfo=UTC).timestamp()),
        end_time=(base + timedelta(seconds=1.5)).isoformat(),
    ).json()
    assert [r["value"] for r in narrow] == [1.1, 1.1]


def test_default_window_is_recent(api_url: str, readings: tuple[str, datetime]) -> None:
    prefix, _base = readings  # an hour old: outside the default 5-minute window
    assert _get(api_url, devices=f"{prefix}-1").json() == []


@pytest.mark.parametrize(
    "params,parameter",
    [
        ({}, "devices"),
        ({"devices": " , "}, "devices"),
        ({"devices": "n", "start_time": "yesterday"}, "start_time"),
        ({"devices": "n", "end_time": "2026-13-45T00:00"}, "end_time"),
        ({"devices": "n", "start_time": "2026-01-02", "end_time": "2026-01-01"}, "start_time"),
        ({"devices": "n", "metrics": ","}, "metrics"),
    ],
)
def test_bad_parameters_are_named(api_url: str, params: dict[str, str], parameter: str) -> None:
    response = _get(api_url, **params)
    assert response.status_code == 400
    body = response.json()
    assert body["parameter"] == parameter and parameter in body["error"]


def test_parameters_are_bound(api_url: str, readings: tuple[str, datetime]) -> None:
    prefix, _ = readings
    for hostile in ("x' OR '1'='1", "x') OR 1=1 --", "\\'; DROP TABLE metrics; --"):
        response = _get(api_url, devices=hostile, start_time="2000-01-01", end_time="2100-01-01")
        assert response.status_code == 200 and response.json() == []
    assert (
        _get(api_url, devices=f"{prefix}-1", start_time="2000-01-01", end_time="2100-01-01").json()
        != []
    )


def test_openapi_docs(api_url: str) -> None:
    assert httpx.get(f"{api_url}/docs").status_code == 200
    spec = httpx.get(f"{api_url}/openapi.json").json()
    assert spec["paths"]["/api/metrics"]["get"]["operationId"] == "get_metrics"


def test_health_ok(api_url: str) -> None:
    body = httpx.get(f"{api_url}/health").json()
    assert body["status"] == "ok" and body["kafka"]["ok"] and body["clickhouse"]["ok"]


def test_health_degraded_when_nothing_answers() -> None:
    """The real app, pointed at ports where nothing listens: it starts and says so."""
    settings = ApiSettings(
        clickhouse_port=1,
        kafka_bootstrap="127.0.0.1:1",
        clickhouse_api_password="x",
        health_timeout_s=0.5,
    )
    with TestClient(create_app(settings)) as client:
        response = client.get("/health")
        assert response.status_code == 503
        body = response.json()
        assert body["status"] == "degraded"
        assert not body["kafka"]["ok"] and not body["clickhouse"]["ok"]
        response = client.get("/api/metrics", params={"devices": "n"})
        assert response.status_code == 503 and "ClickHouse" in response.json()["error"]


def test_kwollect_time_defaults(api_url: str, readings: tuple[str, datetime]) -> None:
    """start_time alone means the 5 minutes from it; end_time alone the 5 minutes before."""
    prefix, base = readings
    before = (base - timedelta(minutes=4)).isoformat()
    assert len(_get(api_url, devices=f"{prefix}-1", start_time=before).json()) == 6
    assert (
        _get(
            api_url, devices=f"{prefix}-1", start_time=(base - timedelta(minutes=6)).isoformat()
        ).json()
        == []
    )
    after = (base + timedelta(minutes=4)).isoformat()
    assert len(_get(api_url, devices=f"{prefix}-1", end_time=after).json()) == 6
    # nodes and devices are one list; a node's domain suffix is ignored
    both = _get(
        api_url, devices=f"{prefix}-1", nodes=f"{prefix}-2.site.example.org", start_time=before
    )
    assert {r["device_id"] for r in both.json()} == {f"{prefix}-1", f"{prefix}-2"}


def test_openapi_documents_every_endpoint_with_an_example(api_url: str) -> None:
    spec = httpx.get(f"{api_url}/openapi.json").json()
    schemas = spec["components"]["schemas"]

    def has_example(node: object) -> bool:
        if isinstance(node, dict):
            if "$ref" in node:
                return has_example(schemas[node["$ref"].rsplit("/", 1)[1]])
            return "example" in node or "examples" in node or any(map(has_example, node.values()))
        return isinstance(node, list) and any(map(has_example, node))

    operations = [
        (path, method, op) for path, item in spec["paths"].items() for method, op in item.items()
    ]
    assert len(operations) >= 10
    for path, method, op in operations:
        assert op.get("operationId") and op.get("summary"), (path, method)
        ok = next(code for code in op["responses"] if code.startswith(("2", "3")))
        assert has_example(op["responses"][ok]) or has_example(op.get("requestBody")), (
            path,
            method,
        )


def test_job_writes_need_kafka_not_clickhouse(api_tokens: dict[str, str], kafka: str) -> None:
    """The real app. Kafka unreachable: a job write fails with 503 within the write timeout
    and says nothing was written. ClickHouse unreachable but Kafka up: the job is accepted
    (202), to be ingested once ClickHouse is back."""
    job = {"job_id": f"nock-{uuid.uuid4().hex[:6]}", "nodes": ["n-1"]}
    headers = {"Authorization": f"Bearer {api_tokens['admin']}"}
    topic = f"nowhere-{uuid.uuid4().hex[:6]}"  # a topic of its own: not ingested
    admin = AdminClient({"bootstrap.servers": kafka})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    for bootstrap, status, timeout in (("127.0.0.1:1", 503, 1.0), (kafka, 202, 5.0)):
        settings = ApiSettings(
            clickhouse_port=1,
            kafka_bootstrap=bootstrap,
            clickhouse_api_password="x",
            admin_token=api_tokens["admin"],
            kafka_write_timeout_s=timeout,
            jobs_topic=topic,
        )
        with TestClient(create_app(settings)) as client:
            began = time.monotonic()
            response = client.post("/api/jobs", json=job, headers=headers)
            assert response.status_code == status, response.text
            assert time.monotonic() - began < 10
            if status == 503:
                assert "nothing was written" in response.json()["error"]
            else:
                assert response.json()["job_id"] == job["job_id"]


def test_time_offset_typed_unencoded_in_a_url(api_url: str, readings: tuple[str, datetime]) -> None:
    """`+01:00` pasted into a URL arrives as ` 01:00`: still that offset, not an error."""
    prefix, base = readings
    start = (base - timedelta(minutes=1) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    end = (base + timedelta(minutes=1) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    url = f"{api_url}/api/metrics?devices={prefix}-1&start_time={start}+01:00&end_time={end}+01:00"
    response = httpx.get(url, timeout=30)
    assert response.status_code == 200, response.text
    assert len(response.json()) == 6
