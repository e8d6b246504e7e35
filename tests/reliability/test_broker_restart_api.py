"""The API across a restart of the Kafka broker (issue 12): /health says Kafka is away and
then recovers, a push while the broker is down is refused (503), pushes are accepted (202)
again once it is back, a live stream opened before the restart goes on delivering, and
every reading accepted is stored exactly once.

The producers' side of a broker outage is test_broker_outage.py's; ClickHouse's Kafka
engine resuming is test_faults.py's.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from clickhouse_connect.driver.client import Client as ClickHouse

from stack import services
from stack.config import StackSettings
from stack.processes import wait_until
from tests.api.conftest import Listener

pytestmark = [pytest.mark.slow, pytest.mark.disruptive]

METRIC = "restart_value"


def _values(listener: Listener) -> set[float]:
    return {row["value"] for row in listener.rows()}


def _health(api_url: str) -> tuple[int, dict[str, Any]]:
    response = httpx.get(f"{api_url}/health", timeout=30)
    return response.status_code, response.json()


def test_api_survives_a_broker_restart(
    clickhouse: StackSettings, api_url: str, api_tokens: dict[str, str], admin: ClickHouse
) -> None:
    prefix = f"br-{uuid.uuid4().hex[:8]}"
    nodes = [f"{prefix}-n0", f"{prefix}-n1"]
    headers = {"Authorization": f"Bearer {api_tokens['admin']}"}
    job_id = f"{prefix}-job"
    start = datetime.now(UTC) - timedelta(minutes=1)
    job = {
        "job_id": job_id,
        "user": "alice",
        "nodes": nodes,
        "start": start.isoformat(),
        "state": "running",
    }
    response = httpx.post(f"{api_url}/api/jobs", json=job, headers=headers, timeout=30)
    assert response.status_code in (201, 202), response.text
    wait_until(
        lambda: httpx.get(f"{api_url}/api/jobs/{job_id}", timeout=10).status_code == 200,
        30,
        "the job to be readable",
    )
    accepted: list[float] = []
    refused: list[float] = []

    def push(value: float) -> int:
        readings = [
            {"timestamp": time.time(), "device_id": n, "metric_id": METRIC, "value": value}
            for n in nodes
        ]
        r = httpx.post(f"{api_url}/api/metrics", json=readings, headers=headers, timeout=60)
        assert r.status_code in (202, 503), r.text
        (accepted if r.status_code == 202 else refused).append(value)
        return r.status_code

    listener = Listener(api_url, job_id, {"metrics": METRIC})
    listener.wait(lambda: "live" in [n for n, _ in listener.events], 30, "the stream to go live")
    assert push(1.0) == 202
    listener.wait(
        lambda: 1.0 in _values(listener),
        30,
        "a pushed reading on the live stream",
    )

    broker = services.process(clickhouse, "kafka")
    try:
        broker.stop()
        wait_until(
            lambda: _health(api_url)[0] == 503 and not _health(api_url)[1]["kafka"]["ok"],
            30,
            "/health to say that Kafka is away",
        )
        assert push(2.0) == 503, "a push was accepted with the broker down"
        services.start_kafka(clickhouse)
        back = time.monotonic()
        wait_until(lambda: _health(api_url)[0] == 200, 60, "/health to recover")
        value = iter(range(100, 10_000))
        wait_until(lambda: push(float(next(value))) == 202, 60, "a push to be accepted again")
        for v in (3.0, 4.0, 5.0):
            assert push(v) == 202, "a push refused with the broker back"
    finally:
        if not broker.is_running():
            services.start_kafka(clickhouse)

    try:
        listener.wait(
            lambda: set(accepted) <= _values(listener),
            60,
            "every accepted reading, also after the restart, on the stream opened before it",
        )
    except TimeoutError as exc:
        missing = sorted(set(accepted) - _values(listener))
        raise AssertionError(f"{exc}\naccepted {accepted}, not on the stream {missing}") from None
    assert not set(refused) & _values(listener), "a refused push reached the live stream"
    where = "WHERE startsWith(device_id, {p:String}) AND metric_id = {m:String}"
    params = {"p": prefix, "m": METRIC}
    # The engine's consumers resumed 7-9 s after the broker was back in four runs, once
    # 55 s (its group's rebalance waited that long for one of them to rejoin): the bound is
    # generous, this test is about the API; the print says how long it took.
    wait_until(
        lambda: (
            admin.command(f"SELECT count() FROM metrics FINAL {where}", parameters=params)
            >= len(nodes) * len(accepted)
        ),
        180,
        "every accepted reading stored",
    )
    print(f"accepted readings stored {time.monotonic() - back:.1f} s after the broker was back")
    rows = admin.query(
        f"SELECT device_id, value FROM metrics FINAL {where}", parameters=params
    ).result_rows
    assert sorted(rows) == sorted((n, v) for n in nodes for v in accepted), (
        f"stored {sorted(rows)}; accepted {accepted}, refused {refused}"
    )
    served = httpx.get(
        f"{api_url}/api/jobs/{job_id}/metrics", params={"metrics": METRIC}, timeout=60
    ).json()
    assert sorted((r["device_id"], r["value"]) for r in served) == sorted(rows)
