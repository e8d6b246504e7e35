"""Jobs from OAR's PostgreSQL by change data capture: a job inserted, started and finished in
OAR's tables becomes a jobscope job whose scope is exact; a worker killed mid-stream and a
PostgreSQL crash lose no change and duplicate no job. Real PostgreSQL 15, Debezium in a real
Connect worker, real broker, real ClickHouse engine and API."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
from clickhouse_connect.driver.client import Client

from connectors import rest
from connectors.oar_postgres import OarDatabase
from connectors.worker import Worker
from stack.processes import wait_until
from tests.api.conftest import COLUMNS, iso
from tests.connectors.conftest import Oar, stored_jobs

START = datetime(2026, 11, 21, 8, 0, 0)
END = START + timedelta(seconds=30)


def _epoch(t: datetime) -> int:
    return int(t.replace(tzinfo=UTC).timestamp())


def _wait_api(api_url: str, job_id: int, timeout: float = 60.0, **expected: object) -> float:
    """Poll the API until job `job_id` has the `expected` fields; the time it took."""
    began = time.monotonic()

    def visible() -> bool:
        response = httpx.get(f"{api_url}/api/jobs/{job_id}", timeout=10)
        job = response.json() if response.status_code == 200 else {}
        return all(job.get(key) == value for key, value in expected.items())

    wait_until(visible, timeout, f"job {job_id} with {expected} in the API", 0.05)
    return time.monotonic() - began


def test_oar_job_becomes_a_scoped_jobscope_job(
    connect_worker: Worker, oar: Oar, api_url: str, admin_client: Client
) -> None:
    p = f"cdc{uuid.uuid4().hex[:6]}"
    node1, node2, _ = (oar.add_node(f"{p}-node-{i}.site.example.org") for i in (1, 2, 3))
    rows = [
        [START + timedelta(seconds=s), f"{p}-node-{n}", "power_watt", 100.0 * n + s, {}]
        for s in range(-5, 36)
        for n in (1, 2, 3)
    ]
    admin_client.insert("metrics", rows, column_names=COLUMNS)

    job_id = oar.submit(f"{p}-alice", project="stream")
    waiting = _wait_api(api_url, job_id, state="waiting", user=f"{p}-alice")
    oar.schedule(job_id, [*node1, *node2])
    oar.set_state(job_id, "Launching")
    oar.set_state(job_id, "Running", start_time=_epoch(START))
    running = _wait_api(api_url, job_id, state="running", start=iso(START))
    oar.set_state(job_id, "Terminated", stop_time=_epoch(END))
    terminated = _wait_api(api_url, job_id, state="terminated", end=iso(END))
    print(
        f"\nCDC lag, OAR commit -> job in the API: submitted {waiting:.2f} s, "
        f"running {running:.2f} s, terminated {terminated:.2f} s"
    )

    job = httpx.get(f"{api_url}/api/jobs/{job_id}", timeout=10).json()
    assert job["nodes"] == [f"{p}-node-1", f"{p}-node-2"]  # node3 is not the job's
    assert (job["user"], job["project"], job["queue"]) == (f"{p}-alice", "stream", "default")
    assert job["start"] == iso(START) and job["end"] == iso(END)
    response = httpx.get(f"{api_url}/api/jobs/{job_id}/metrics", timeout=60)
    assert response.status_code == 200, response.text
    got = sorted((r["device_id"], r["timestamp"], r["value"]) for r in response.json())
    expected = sorted(
        (device, iso(t), value)
        for t, device, _, value, _ in rows
        if device != f"{p}-node-3" and START <= t <= END
    )
    assert got == expected and len(got) == 2 * 31


def _run_jobs(oar: Oar, user: str, resources: list[int], count: int, done: list[int]) -> None:
    start = _epoch(START)
    for _ in range(count):
        job_id = oar.submit(user)
        oar.run(job_id, resources, start, start + 60)
        done.append(job_id)


def _all_stored(
    admin: Client, user: str, jobs: list[int], node: str, timeout: float = 90.0
) -> None:
    expected = {str(j): ("terminated", [node], _epoch(START), _epoch(START) + 60) for j in jobs}
    try:
        wait_until(lambda: stored_jobs(admin, user) == expected, timeout, "the jobs", 0.5)
    except TimeoutError:
        stored = stored_jobs(admin, user)
        wrong = {j: stored.get(j) for j, job in expected.items() if stored.get(j) != job}
        raise AssertionError(
            f"{len(wrong)} of {len(jobs)} jobs missing or wrong: {wrong}"
        ) from None


def _stream_while(
    oar: Oar, admin: Client, fault: Callable[[], None], recover: Callable[[], None]
) -> None:
    """OAR runs jobs in a thread; after some, `fault`, then `recover` while it goes on; every
    job arrives once, terminated, with its node."""
    p = f"cdc{uuid.uuid4().hex[:6]}"
    node = oar.add_node(f"{p}-node-1.site.example.org", cores=1)
    done: list[int] = []
    writer = threading.Thread(target=_run_jobs, args=(oar, f"{p}-bob", node, 40, done))
    writer.start()
    wait_until(lambda: len(done) >= 10, 60, "10 jobs written", 0.05)
    fault()
    recover()
    writer.join(120)
    assert not writer.is_alive() and len(done) == 40
    _all_stored(admin, f"{p}-bob", done, f"{p}-node-1")


def test_worker_killed_mid_stream_resumes_from_its_offsets(
    connect_worker: Worker, oar: Oar, clickhouse: object, admin_client: Client
) -> None:
    began = time.monotonic()

    def recover() -> None:
        connect_worker.start()
        rest.wait_running(connect_worker, "oar-jobs", 60)

    _stream_while(oar, admin_client, connect_worker.kill, recover)
    print(f"\nworker kill -9 and restart: 40 jobs complete after {time.monotonic() - began:.1f} s")


def test_postgres_crash_loses_no_job_change(
    connect_worker: Worker, oar: Oar, oar_db: OarDatabase, admin_client: Client
) -> None:
    """Jobs committed just before a kill -9 of PostgreSQL and jobs after its restart all
    arrive: the replication slot keeps every change the connector has not confirmed."""
    p = f"cdc{uuid.uuid4().hex[:6]}"
    node = oar.add_node(f"{p}-node-1.site.example.org", cores=1)
    done: list[int] = []
    _run_jobs(oar, f"{p}-carol", node, 10, done)
    oar_db.kill()
    began = time.monotonic()
    oar_db.start()
    _run_jobs(oar, f"{p}-carol", node, 10, done)
    _all_stored(admin_client, f"{p}-carol", done, f"{p}-node-1", timeout=120)
    print(
        f"\nPostgreSQL kill -9 and restart: 20 jobs complete {time.monotonic() - began:.1f} s later"
    )
