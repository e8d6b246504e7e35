"""Jobs written through the API and the `jobs` topic, read back; parameters refused with the
parameter named; rates across counter wraps; steps from rollups agreeing with raw data."""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka import Producer

from tests.api.conftest import Row, iso, wait_for_job
from tests.conftest import wait_for_rollups


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _job_id() -> str:
    return f"{uuid.uuid4().int % 10**9}"


def test_writes_need_a_known_token(
    api_url: str, api_tokens: dict[str, str], reader_client: Client
) -> None:
    job = {"job_id": _job_id(), "nodes": ["n-1"], "start": "2026-01-01T00:00:00"}
    for headers in ({}, _auth("not-a-token"), {"Authorization": "Basic eDp5"}):
        response = httpx.post(f"{api_url}/api/jobs", json=job, headers=headers, timeout=10)
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"] == "Bearer"
    response = httpx.patch(f"{api_url}/api/jobs/{job['job_id']}", json={}, timeout=10)
    assert response.status_code == 401
    # nothing was written: a job written after them (201: readable; the jobs topic has one
    # partition) is stored, and the refused job is unknown to readers
    marker = {**job, "job_id": _job_id()}
    response = httpx.post(
        f"{api_url}/api/jobs", json=marker, headers=_auth(api_tokens["admin"]), timeout=30
    )
    assert response.status_code == 201, response.text
    count = reader_client.command(
        "SELECT count() FROM jobs WHERE job_id = {j:String}", parameters={"j": job["job_id"]}
    )
    assert count == 0


def test_job_edited_twice_is_one_row(
    api_url: str, api_tokens: dict[str, str], reader_client: Client
) -> None:
    job_id = f"{_job_id()}_5"  # Slurm array task
    headers = _auth(api_tokens["admin"])
    created = httpx.post(
        f"{api_url}/api/jobs",
        json={"job_id": job_id, "user": "bob", "nodes": "n-[1-3]", "start": 1795424400},
        headers=headers,
        timeout=30,
    )
    assert created.status_code == 201, created.text
    assert created.json()["state"] == "running" and created.json()["end"] is None
    url = f"{api_url}/api/jobs/{job_id}"
    first = httpx.patch(url, json={"labels": {"phase": "2"}}, headers=headers, timeout=30)
    assert first.status_code == 200, first.text
    second = httpx.patch(
        url,
        json={"end": "2026-11-23T11:00:00+01:00", "state": "terminated"},
        headers=headers,
        timeout=30,
    )
    assert second.status_code == 200
    job = httpx.get(url, timeout=10).json()
    assert job["labels"] == {"phase": "2"} and job["state"] == "terminated"
    assert job["end"] == "2026-11-23T10:00:00.000000+00:00" and job["nodes"] == [
        "n-1",
        "n-2",
        "n-3",
    ]
    assert job["start"] == iso(datetime(2026, 11, 23, 9, 0))
    rows = reader_client.command(
        "SELECT count() FROM jobs WHERE job_id = {j:String}", parameters={"j": job_id}
    )
    assert rows == 1  # three versions stored, one seen


def test_jobs_from_the_kafka_topic(api_url: str, kafka: str, admin_client: Client) -> None:
    """Any Kafka producer may write jobs; bad messages land in ingest_errors, named."""
    good, bad_state, bad_time = _job_id(), _job_id(), _job_id()
    producer = Producer({"bootstrap.servers": kafka})
    messages = [
        (
            good,
            {
                "job_id": good,
                "user": "carol",
                "nodes": ["c-1.site.org"],
                "start": "1795424400",
                "state": "running",
            },
        ),
        (bad_state, {"job_id": bad_state, "state": "finished"}),
        (bad_time, {"job_id": bad_time, "state": "running", "start": "yesterday"}),
        ("garbage", b"{not json"),
    ]
    for key, value in messages:
        producer.produce("jobs", value if isinstance(value, bytes) else orjson.dumps(value), key)
    assert producer.flush(10) == 0
    job = wait_for_job(api_url, good)
    assert job["nodes"] == ["c-1"] and job["start"] == iso(datetime(2026, 11, 23, 9, 0))
    deadline = time.monotonic() + 30
    while True:
        errors = dict(
            admin_client.query(
                "SELECT key, error FROM ingest_errors WHERE topic = 'jobs' AND key IN "
                "{keys:Array(String)}",
                parameters={"keys": [bad_state, bad_time, "garbage"]},
            ).result_rows
        )
        if len(errors) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "finished" in errors[bad_state]
    assert "yesterday" in errors[bad_time]
    assert errors["garbage"]  # the parser's own message
    for job_id in (bad_state, bad_time):
        assert httpx.get(f"{api_url}/api/jobs/{job_id}", timeout=10).status_code == 404


def test_list_jobs_filters(api_url: str, post_job: Callable[..., dict[str, Any]]) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    early, late = _job_id(), _job_id()
    post_job(
        job_id=early,
        user=user,
        nodes=["x-1"],
        start="2026-01-01T00:00:00",
        end="2026-01-01T01:00:00",
        state="terminated",
    )
    post_job(job_id=late, user=user, nodes=["x-2"], start="2026-02-01T00:00:00", state="running")

    def ids(**params: str) -> list[str]:
        response = httpx.get(f"{api_url}/api/jobs", params={"user": user, **params}, timeout=10)
        assert response.status_code == 200, response.text
        return [j["job_id"] for j in response.json()]

    assert ids() == [late, early]
    assert ids(state="running") == [late]
    assert ids(node="x-1") == [early]
    assert ids(start_time="2026-01-01T02:00:00") == [late]  # early had ended
    assert ids(end_time="2026-01-15T00:00:00") == [early]  # late had not started


def test_waiting_and_running_jobs(
    api_url: str,
    post_job: Callable[..., dict[str, Any]],
    insert_readings: Callable[[list[Row]], None],
) -> None:
    waiting, running, node = _job_id(), _job_id(), f"r{uuid.uuid4().hex[:6]}"
    post_job(job_id=waiting, nodes=[node], state="waiting")
    assert httpx.get(f"{api_url}/api/jobs/{waiting}/metrics", timeout=10).json() == []
    summary = httpx.get(f"{api_url}/api/jobs/{waiting}/summary", timeout=10).json()
    assert summary["metrics"] == [] and summary["energy"] == []
    now = datetime.now(UTC).replace(tzinfo=None)
    post_job(job_id=running, nodes=[node], start=(now - timedelta(minutes=1)).isoformat())
    insert_readings([[now - timedelta(seconds=1), node, "load", 1.5, {}]])
    got = httpx.get(f"{api_url}/api/jobs/{running}/metrics", timeout=10).json()
    assert [r["value"] for r in got] == [1.5]  # a running job's scope ends now


@pytest.fixture(scope="module")
def some_job(post_job: Callable[..., dict[str, Any]]) -> str:
    job = _job_id()
    post_job(job_id=job, nodes=["b-1"], start="2026-01-01T00:00:00")
    return job


@pytest.mark.parametrize(
    "path,params,parameter",
    [
        ("/api/jobs/{job}/metrics", {"step": "5 minutes"}, "step"),
        ("/api/jobs/{job}/metrics", {"step": "0s"}, "step"),
        ("/api/jobs/{job}/metrics", {"step": "1m", "agg": "mode"}, "agg"),
        ("/api/jobs/{job}/metrics", {"format": "xml"}, "format"),
        ("/api/jobs/{job}/metrics", {"as_rate": "true", "step": "1m"}, "as_rate"),
        ("/api/jobs/{job}/metrics", {"as_rate": "maybe"}, "as_rate"),
        ("/api/jobs/{job}/metrics", {"start_time": "noon"}, "start_time"),
        ("/api/jobs/{job}/metrics", {"label": "novalue"}, "label"),
        ("/api/jobs/{job}/summary", {"end_time": "2026-99-01"}, "end_time"),
        ("/api/jobs", {"state": "done"}, "state"),
        ("/api/jobs", {"limit": "0"}, "limit"),
        ("/api/metrics", {"metrics": "a"}, "devices"),
    ],
)
def test_bad_parameters_are_named(
    api_url: str, some_job: str, path: str, params: dict, parameter: str
) -> None:
    response = httpx.get(api_url + path.format(job=some_job), params=params, timeout=10)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["parameter"] == parameter and parameter in body["error"]


@pytest.mark.parametrize(
    "body,field",
    [
        ({"job_id": "", "nodes": ["a"]}, "job_id"),
        ({"job_id": "a b", "nodes": ["a"]}, "job_id"),
        ({"nodes": ["a"]}, "job_id"),
        ({"job_id": "1", "nodes": "node-[1-"}, "nodes"),
        ({"job_id": "1", "start": "tomorrow"}, "start"),
        ({"job_id": "1", "state": "done"}, "state"),
        ({"job_id": "1", "labels": {"a": 1}}, "labels.a"),
        ({"job_id": "1", "colour": "red"}, "colour"),
        (["not", "an", "object"], "body"),
        # what ClickHouse would drop into ingest_errors: refused before it is published
        ({"job_id": "1", "start": "2026-01-02", "end": "2026-01-01"}, "end"),
        ({"job_id": "1", "start": "0001-01-01"}, "start"),
        ({"job_id": "1", "start": 1e11}, "start"),
    ],
)
def test_bad_jobs_are_refused(
    api_url: str, api_tokens: dict[str, str], body: dict, field: str
) -> None:
    response = httpx.post(
        f"{api_url}/api/jobs", json=body, headers=_auth(api_tokens["admin"]), timeout=10
    )
    assert response.status_code == 400, response.text
    assert response.json()["parameter"] == field


@pytest.mark.parametrize(
    "method,path",
    [("GET", ""), ("GET", "/metrics"), ("GET", "/summary"), ("GET", "/catalog"), ("PATCH", "")],
)
def test_unknown_job_is_404(
    api_url: str, api_tokens: dict[str, str], method: str, path: str
) -> None:
    job = f"no-such-{uuid.uuid4().hex[:6]}"
    response = httpx.request(
        method,
        f"{api_url}/api/jobs/{job}{path}",
        headers=_auth(api_tokens["admin"]),
        json={} if method == "PATCH" else None,
        timeout=10,
    )
    assert response.status_code == 404 and job in response.json()["error"]
    kwollect = httpx.get(f"{api_url}/api/metrics", params={"job_id": job}, timeout=10)
    assert kwollect.status_code == 404


def test_as_rate_across_counter32_wrap_and_reset(
    api_url: str, insert_readings: Callable[[list[Row]], None]
) -> None:
    device = f"sw{uuid.uuid4().hex[:6]}"
    base = datetime(2026, 11, 21, 8, 0, 0)
    counter = [4294967000.0, 4294967200.0, 104.0, 304.0, 50.0, 250.0]  # wrap, then reset
    insert_readings(
        [
            [base + timedelta(seconds=2 * i), device, "ifhcinoctets_total", v, {"port": "1"}]
            for i, v in enumerate(counter)
        ]
    )
    params = {"devices": device, "start_time": base.isoformat(), "end_time": "2026-11-21T08:01:00"}
    rates = httpx.get(f"{api_url}/api/metrics", params={**params, "as_rate": "true"}, timeout=10)
    assert [r["value"] for r in rates.json()] == [None, 100.0, 100.0, 100.0, 25.0, 100.0]
    raw = httpx.get(f"{api_url}/api/metrics", params=params, timeout=10).json()
    assert [r["value"] for r in raw] == counter  # the counter itself is kept


def test_steps_from_rollups_agree_with_raw(
    api_url: str,
    admin_client: Client,
    insert_readings: Callable[[list[Row]], None],
    post_job: Callable[..., Any],
) -> None:
    """Over 3 h of 5 s readings, a job starting and ending mid-minute: every aggregate at
    1 min and 1 h (rollups for whole buckets, raw for the ragged ends) equals the same
    aggregate computed from the raw readings here; quantiles are t-digest estimates. Right
    after the insert, before the rollups are refreshed (their buckets read from raw
    readings), and once the rollups hold them."""
    node = f"ru{uuid.uuid4().hex[:6]}"
    base = datetime(2026, 11, 22, 6, 0, 0)
    values = {
        base + timedelta(seconds=5 * i, microseconds=i): 100 + (i * 37 % 101) / 7
        for i in range(3 * 720)
    }
    insert_readings([[t, node, "power_watt", v, {}] for t, v in values.items()])
    start, end = base + timedelta(minutes=7, seconds=31), base + timedelta(hours=2, seconds=44)
    job = _job_id()
    post_job(
        job_id=job, nodes=[node], start=start.isoformat(), end=end.isoformat(), state="terminated"
    )
    inside = {t: v for t, v in values.items() if start <= t <= end}
    _assert_steps(api_url, job, inside)
    wait_for_rollups(admin_client, node, len(values))
    _assert_steps(api_url, job, inside)


def _assert_steps(api_url: str, job: str, inside: dict[datetime, float]) -> None:
    for step, width in (("1m", 60), ("1h", 3600), ("30s", 30)):
        buckets: dict[datetime, list[tuple[datetime, float]]] = {}
        for t, v in sorted(inside.items()):
            b = datetime(1970, 1, 1) + (t - datetime(1970, 1, 1)) // timedelta(
                seconds=width
            ) * timedelta(seconds=width)
            buckets.setdefault(b, []).append((t, v))
        expected = {
            "avg": {b: statistics.fmean(v for _, v in p) for b, p in buckets.items()},
            "min": {b: min(v for _, v in p) for b, p in buckets.items()},
            "max": {b: max(v for _, v in p) for b, p in buckets.items()},
            "sum": {b: sum(v for _, v in p) for b, p in buckets.items()},
            "count": {b: float(len(p)) for b, p in buckets.items()},
            "first": {b: p[0][1] for b, p in buckets.items()},
            "last": {b: p[-1][1] for b, p in buckets.items()},
            "median": {b: statistics.median(v for _, v in p) for b, p in buckets.items()},
        }
        for agg, want in expected.items():
            got = httpx.get(
                f"{api_url}/api/jobs/{job}/metrics", params={"step": step, "agg": agg}, timeout=30
            ).json()
            assert [r["timestamp"] for r in got] == [iso(b) for b in sorted(want)], (step, agg)
            tolerance = 0.05 if agg == "median" else 1e-9
            for r, b in zip(got, sorted(want), strict=True):
                assert r["value"] == pytest.approx(want[b], rel=tolerance), (step, agg, b)


def test_a_body_that_is_not_json_is_explained(api_url: str, api_tokens: dict[str, str]) -> None:
    """`curl -d '{...}'` sends a form: the answer says what to send instead."""
    response = httpx.post(
        f"{api_url}/api/jobs",
        content=b'{"job_id": "1"}',
        headers={**_auth(api_tokens["admin"]), "Content-Type": "application/x-www-form-urlencoded"},
        timeout=10,
    )
    assert response.status_code == 400
    assert response.json()["parameter"] == "body"
    assert "Content-Type: application/json" in response.json()["error"]


def test_step_over_a_span_within_one_bucket(
    api_url: str, insert_readings: Callable[[list[Row]], None], post_job: Callable[..., Any]
) -> None:
    """A job of 30 minutes inside one hour, at step=1h: no whole bucket, and the readings
    after its end (in the same hour) must not count."""
    node = f"sb{uuid.uuid4().hex[:6]}"
    base = datetime(2026, 11, 22, 10, 0, 0)
    insert_readings(
        [[base + timedelta(minutes=m), node, "load", float(m), {}] for m in range(0, 60, 5)]
    )
    job = _job_id()
    post_job(
        job_id=job,
        nodes=[node],
        start="2026-11-22T10:05:00",
        end="2026-11-22T10:35:00",
        state="terminated",
    )
    for step in ("1h", "1m", "10s"):
        got = httpx.get(
            f"{api_url}/api/jobs/{job}/metrics", params={"step": step, "agg": "max"}, timeout=30
        ).json()
        assert max(r["value"] for r in got) == 35.0, step
        assert sum(1 for _ in got) == (1 if step == "1h" else 7), step


def test_energy_of_outlets_with_a_missing_reading(
    api_url: str, insert_readings: Callable[[list[Row]], None], post_job: Callable[..., Any]
) -> None:
    """A node on two outlets of one PDU, one outlet's reading missing at two instants: the
    node's power dips there; it is one series, integrated once."""
    p = uuid.uuid4().hex[:6]
    node, pdu = f"en{p}-node", f"en{p}-pdu"
    base = datetime(2026, 11, 22, 12, 0, 0)
    rows: list[Row] = []
    for i in range(61):
        for outlet in ("1", "2"):
            if outlet == "2" and i in (10, 40):
                continue
            labels = {"outlet": outlet, "_device_alias": node}
            rows.append([base + timedelta(seconds=i), pdu, "outlet_power_watt", 100.0, labels])
    insert_readings(rows)
    job = _job_id()
    post_job(
        job_id=job,
        nodes=[node],
        start=base.isoformat(),
        end=(base + timedelta(seconds=60)).isoformat(),
        state="terminated",
    )
    summary = httpx.get(f"{api_url}/api/jobs/{job}/summary", timeout=30).json()
    (energy,) = summary["energy"]
    assert energy["joules"] == pytest.approx(200 * 60 - 2 * 100)  # each dip: two trapezoids
    assert energy["covered_s"] == pytest.approx(60.0) and energy["sources"] == [pdu]


def test_rates_of_series_told_apart_only_by_alias(
    api_url: str, insert_readings: Callable[[list[Row]], None], post_job: Callable[..., Any]
) -> None:
    """Two outlets whose labels differ only by `_device_alias` (hidden in the output) are
    two series for as_rate, not one."""
    p = uuid.uuid4().hex[:6]
    pdu, a, b = f"ra{p}-pdu", f"ra{p}-a", f"ra{p}-b"
    base = datetime(2026, 11, 22, 13, 0, 0)
    rows = [
        [
            base + timedelta(seconds=i),
            pdu,
            "energy_joules_total",
            start + 10.0 * i,
            {"_device_alias": node},
        ]
        for i in range(5)
        for node, start in ((a, 1000.0), (b, 5000.0))
    ]
    insert_readings(rows)
    job = _job_id()
    post_job(
        job_id=job,
        nodes=[a, b],
        start=base.isoformat(),
        end=(base + timedelta(seconds=10)).isoformat(),
        state="terminated",
    )
    got = httpx.get(
        f"{api_url}/api/jobs/{job}/metrics", params={"as_rate": "true", "devices": pdu}, timeout=30
    ).json()
    assert sorted(r["value"] for r in got if r["value"] is not None) == [10.0] * 8


def test_patch_to_an_invalid_job_is_a_400(
    api_url: str, api_tokens: dict[str, str], some_job: str
) -> None:
    url = f"{api_url}/api/jobs/{some_job}"
    headers = _auth(api_tokens["admin"])
    for patch, field in (({"state": None}, "state"), ({"end": "2025-01-01"}, "end")):
        response = httpx.patch(url, json=patch, headers=headers, timeout=10)
        assert response.status_code == 400, response.text
        assert response.json()["parameter"] == field


def test_invalid_json_is_the_body(api_url: str, api_tokens: dict[str, str]) -> None:
    response = httpx.post(
        f"{api_url}/api/jobs",
        content=b'{"job_id": 1,}',
        headers={**_auth(api_tokens["admin"]), "Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 400 and response.json()["parameter"] == "body"


def test_any_job_id_names_the_download(api_url: str, post_job: Callable[..., Any]) -> None:
    job = f"ジョブ-{_job_id()}"
    post_job(job_id=job, nodes=["x-1"], start="2026-01-01T00:00:00")
    response = httpx.get(f"{api_url}/api/jobs/{job}/metrics", params={"format": "csv"}, timeout=10)
    assert response.status_code == 200
    assert "filename*=UTF-8''job-%E3%82%B8" in response.headers["content-disposition"]
