"""Helpers for the API tests: readings written straight into `metrics`, jobs through the API."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka import Producer

from jobscope.client import Client as ApiClient
from kafka.message import pack_by_device
from kafka.reading import Reading
from stack.config import StackSettings
from stack.processes import wait_until

COLUMNS = ["timestamp", "device_id", "metric_id", "value", "labels"]
Row = list[Any]


@pytest.fixture(scope="module")
def publish(clickhouse: StackSettings) -> Iterator[Callable[[list[Reading]], None]]:
    """Publish readings to the test stack's readings topic, as the producers do."""
    producer = Producer({"bootstrap.servers": clickhouse.kafka_bootstrap, "linger.ms": 5})

    def send(readings: list[Reading]) -> None:
        for device, packed in pack_by_device(readings):
            producer.produce("readings", packed.payload, device.encode())
        assert producer.flush(30) == 0, "Kafka did not take the readings"

    yield send
    producer.flush(30)


@pytest.fixture(scope="session")
def insert_readings(admin_client: Client) -> Callable[[list[Row]], None]:
    def insert(rows: list[Row]) -> None:
        admin_client.insert("metrics", rows, column_names=COLUMNS)

    return insert


@pytest.fixture(scope="session")
def post_job(api_url: str, api_tokens: dict[str, str]) -> Callable[..., dict[str, Any]]:
    """POST a job with the scheduler's token; return it once it is queryable."""

    def post(**job: Any) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {api_tokens['scheduler']}"}
        response = httpx.post(f"{api_url}/api/jobs", json=job, headers=headers, timeout=30)
        assert response.status_code in (201, 202), response.text
        wait_for_job(api_url, job["job_id"])
        return response.json()

    return post


def wait_for_job(api_url: str, job_id: str, timeout: float = 20.0, **expected: Any) -> dict:
    """GET the job until it exists (and has the `expected` fields), or fail."""
    deadline = time.monotonic() + timeout
    while True:
        response = httpx.get(f"{api_url}/api/jobs/{job_id}", timeout=10)
        if response.status_code == 200:
            job = response.json()
            if all(job.get(k) == v for k, v in expected.items()):
                return job
        if time.monotonic() > deadline:
            raise AssertionError(
                f"job {job_id} not as expected within {timeout} s: {response.text}"
            )
        time.sleep(0.1)


def iso(t: datetime) -> str:
    """Kwollect's timestamp of a naive UTC datetime."""
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")


@dataclass
class Listener:
    """A client of the live stream in a thread, keeping every event it receives."""

    api_url: str
    job_id: str
    params: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, Any]] = field(default_factory=list)
    failure: BaseException | None = None

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with ApiClient(self.api_url) as client:
                for item in client.live_events(self.job_id, **self.params):
                    self.events.append(item)
        except BaseException as exc:  # reported by the test through `wait`
            self.failure = exc

    def rows(self) -> list[dict[str, Any]]:
        return [row for name, data in list(self.events) if name == "readings" for row in data]

    def names(self) -> list[str]:
        return [name for name, _ in list(self.events)]

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait for `condition`; on a timeout, say how the stream stands."""
        try:
            wait_until(lambda: self.failure is not None or condition(), timeout, what)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; the stream: {self.state()}") from None
        if self.failure is not None:
            raise AssertionError(f"the live stream failed: {self.failure!r}")

    def state(self) -> str:
        names = self.names()
        open_or_ended = "open" if self.thread.is_alive() else "ended"
        return f"{open_or_ended}, {len(names)} events, the last ones {names[-8:]}"
