"""ClickHouse killed (kill -9) under API load: the API answers 503 with a message naming
ClickHouse's URL (never a 500), and serves every endpoint again, with the right data, once
ClickHouse is back, without being restarted (issue 12)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from clickhouse_connect.driver.client import Client

from stack import services
from stack.config import StackSettings
from stack.processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.disruptive]
READINGS = 120  # per device: 2 devices x 1 metric, one a second
COLUMNS = ["timestamp", "device_id", "metric_id", "value", "labels"]
STREAMED = ("/api/metrics", "/metrics")  # answers that may be cut once they have begun


@dataclass
class Answer:
    path: str
    at: float
    status: int | None  # None: the connection failed or the answer was cut
    body: str


class ApiLoad(threading.Thread):
    """Asks every path in turn, recording each answer, until stopped."""

    def __init__(self, url: str, paths: list[tuple[str, dict[str, str]]]) -> None:
        super().__init__(daemon=True)
        self.url, self.paths = url, paths
        self.answers: list[Answer] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as client:
            while not self.stopped.is_set():
                for path, params in self.paths:
                    try:
                        response = client.get(path, params=params)
                        answer = Answer(path, time.monotonic(), response.status_code, response.text)
                    except httpx.TransportError as exc:
                        answer = Answer(path, time.monotonic(), None, repr(exc))
                    self.answers.append(answer)

    def latest(self, path: str, since: float) -> list[Answer]:
        return [a for a in list(self.answers) if a.path == path and a.at > since]


def test_clickhouse_killed_under_api_load_gives_503_then_recovers(
    clickhouse: StackSettings, api_url: str, api_tokens: dict[str, str], admin: Client
) -> None:
    prefix = f"apifault-{uuid.uuid4().hex[:8]}"
    devices = [f"{prefix}-1", f"{prefix}-2"]
    base = (datetime.now(UTC) - timedelta(minutes=30)).replace(tzinfo=None, microsecond=0)
    rows = [
        [base + timedelta(seconds=i), d, "power_watt", float(i), {}]
        for d in devices
        for i in range(READINGS)
    ]
    admin.insert("metrics", rows, column_names=COLUMNS)
    job_id = f"{prefix}-job"
    job = {"job_id": job_id, "user": "alice", "nodes": devices, "start": base.isoformat()}
    job["end"] = (base + timedelta(seconds=READINGS - 1)).isoformat()
    job["state"] = "terminated"
    headers = {"Authorization": f"Bearer {api_tokens['scheduler']}"}
    assert httpx.post(f"{api_url}/api/jobs", json=job, headers=headers, timeout=30).status_code in (
        201,
        202,
    )
    wait_until(
        lambda: httpx.get(f"{api_url}/api/jobs/{job_id}", timeout=10).status_code == 200,
        30,
        f"job {job_id}",
    )
    span = {"start_time": base.isoformat(), "end_time": job["end"]}
    paths = [
        ("/api/metrics", {"devices": ",".join(devices), **span}),
        (f"/api/jobs/{job_id}/metrics", {"format": "ndjson"}),
        (f"/api/jobs/{job_id}", {}),
        (f"/api/jobs/{job_id}/summary", {}),
        (f"/api/jobs/{job_id}/catalog", {}),
        ("/api/jobs", {"user": "alice", "limit": "5"}),
        (f"/api/devices/{devices[0]}/latest", {}),
    ]
    api = services.process(clickhouse, "api")
    api_pid = api.pid()
    load = ApiLoad(api_url, paths)
    load.start()
    try:
        wait_until(lambda: len(load.answers) >= 3 * len(paths), 60, "the load to run")
        killed_at = time.monotonic()
        services.process(clickhouse, "clickhouse").kill()
        wait_until(
            lambda: all(
                any(a.status == 503 for a in load.latest(path, killed_at)) for path, _ in paths
            ),
            60,
            "a 503 from every endpoint while ClickHouse is down",
        )
        health = httpx.get(f"{api_url}/health", timeout=30)
        assert health.status_code == 503 and not health.json()["clickhouse"]["ok"]
        services.start_clickhouse(clickhouse)
        back_at = time.monotonic()
        wait_until(
            lambda: all(
                any(a.status == 200 for a in load.latest(path, back_at)) for path, _ in paths
            ),
            120,
            "every endpoint to answer 200 again",
        )
    finally:
        load.stopped.set()
        load.join(120)
    assert api.pid() == api_pid, "the API was restarted"
    statuses = Counter(a.status for a in load.answers)
    assert set(statuses) <= {200, 503, None}, statuses
    url = f"http://127.0.0.1:{clickhouse.clickhouse_port}"
    for answer in load.answers:
        if answer.status == 503:
            assert f"ClickHouse at {url} is not answering: " in answer.body, answer
    # only a readings answer may be cut (the kill came while it streamed): its status was sent
    cut = [a for a in load.answers if a.status is None]
    assert all(a.path.endswith(STREAMED) for a in cut), cut
    # the data once ClickHouse is back, through the same API process
    readings = httpx.get(f"{api_url}/api/jobs/{job_id}/metrics", params={"format": "ndjson"})
    assert readings.status_code == 200
    assert len(readings.text.splitlines()) == 2 * READINGS
    assert httpx.get(f"{api_url}/health", timeout=30).status_code == 200
