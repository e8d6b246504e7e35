"""Job records through the real stack: an API whose refresher runs every 0.5 s (60 s by
default: the test only waits less for the same rounds; the stack's shared API has it off)
computes a record for every ended job, publishes it to Kafka, ClickHouse stores it; the
summary of an ended job then comes from it.

Raw expiry is made honest without waiting for a TTL: that API keeps raw readings 2 days
(JOBSCOPE_RETENTION_DAYS, which is what it knows of the schema's TTL), the expired job
started 3 days ago, and its readings are then deleted (`ALTER TABLE metrics DELETE`, as a
TTL merge drops them: no ingest note is written). Computations are counted on the
`job-records` topic: every record this API published."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
import zstandard
from clickhouse_connect.driver.client import Client
from confluent_kafka import Consumer, TopicPartition

from kafka import topics
from stack import services
from stack.config import StackSettings
from stack.processes import wait_until
from tests import ports
from tests.api.conftest import Row

RECORDS_MAX_BYTES = 8 * 1024 * 1024
"""That API's bound on a record's message (16 MiB by default: the test's bigger job needs
fewer series to pass it)."""


@pytest.fixture(scope="module")
def records_api(clickhouse: StackSettings, api_url: str) -> Iterator[str]:
    env = {
        "JOBSCOPE_RECORDS_INTERVAL_S": "0.5",
        "JOBSCOPE_RETENTION_DAYS": "2",
        "JOBSCOPE_RECORDS_MAX_BYTES": str(RECORDS_MAX_BYTES),
    }
    name, port = "api-job-records", ports.port("job-records")
    try:
        yield services.start_api(clickhouse, name=name, port=port, env=env)
    finally:
        services.process(clickhouse, name).stop(timeout=30)


RECORD_WAIT_S = 180
"""A record lands after a refresher round, which computes the due records of every ended job
of the worker's shared stack (the earliest ended first), then ClickHouse's Kafka flush: on
a loaded 2-core run that took over 60 s."""


def utc_now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None, microsecond=0)


def summary(api_url: str, job_id: str, **params: Any) -> dict[str, Any]:
    response = httpx.get(f"{api_url}/api/jobs/{job_id}/summary", params=params, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def from_record(api_url: str, job_id: str, newer_than: int = -1) -> dict[str, Any] | None:
    """The job's summary once it comes from a record of a version above `newer_than`. Until
    the record exists the summary is computed from raw readings: for a job of thousands of
    series on a loaded machine that may outlast the request's timeout, which is a "not yet"."""
    try:
        got = summary(api_url, job_id)
    except httpx.TimeoutException:
        return None
    record = got["record"]
    if record["source"] == "record" and record["version"] > newer_than:
        return got
    return None


def published(settings: StackSettings, job_id: str) -> list[dict[str, Any]]:
    """Every record of the job on the job-records topic (site '')."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"test-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        partition = TopicPartition(topics.JOB_RECORDS.name, 0)
        _, high = consumer.get_watermark_offsets(partition, timeout=10)
        consumer.assign([TopicPartition(topics.JOB_RECORDS.name, 0, 0)])
        found, position = [], 0
        while position < high:
            message = consumer.poll(10)
            assert message is not None, "the job-records topic did not answer"
            position = message.offset() + 1
            if message.key() == f"/{job_id}".encode():
                found.append(orjson.loads(message.value()))
        return found
    finally:
        consumer.close()


def bmc_power(node: str, start: datetime, watts: float = 100.0) -> list[Row]:
    return [[start + timedelta(seconds=i), node, "bmc_power_watt", watts, {}] for i in range(61)]


def ended_job(post_job: Callable[..., dict[str, Any]], job_id: str, node: str, start: datetime):
    return post_job(
        job_id=job_id,
        user="alice",
        project="p1",
        nodes=[node],
        start=start.isoformat() + "Z",
        end=(start + timedelta(seconds=60)).isoformat() + "Z",
        state="terminated",
    )


def test_running_job_is_served_raw(
    records_api: str,
    insert_readings: Callable[[list[Row]], None],
    post_job: Callable[..., dict[str, Any]],
) -> None:
    p = f"jr{uuid.uuid4().hex[:6]}"
    start = utc_now() - timedelta(minutes=5)
    insert_readings(bmc_power(f"{p}-node-1", start))
    post_job(job_id=f"{p}_run", user="alice", nodes=[f"{p}-node-1"], start=start.isoformat() + "Z")
    got = summary(records_api, f"{p}_run")
    assert got["record"] == {"computed_at": None, "source": "raw", "version": None}
    assert got["energy_job"]["joules"] > 0


def test_job_past_raw_retention_answers_from_its_record(
    records_api: str,
    clickhouse: StackSettings,
    admin_client: Client,
    insert_readings: Callable[[list[Row]], None],
    post_job: Callable[..., dict[str, Any]],
    api_tokens: dict[str, str],
) -> None:
    p = f"jr{uuid.uuid4().hex[:6]}"
    node, job_id = f"{p}-node-1", f"{p}_old"
    start = utc_now() - timedelta(days=3)
    insert_readings(bmc_power(node, start))
    ended_job(post_job, job_id, node, start)
    before = wait_until(lambda: from_record(records_api, job_id), RECORD_WAIT_S, "the job's record")
    assert before["energy_job"]["joules"] == 6000.0
    admin_client.command(
        "ALTER TABLE metrics DELETE WHERE device_id = {node:String}",
        parameters={"node": node},
        settings={"mutations_sync": 2},
    )
    assert (
        admin_client.command(
            "SELECT count() FROM metrics WHERE device_id = {node:String}", parameters={"node": node}
        )
        == 0
    )
    assert summary(records_api, job_id) == before
    # narrowed, it cannot be computed any more: the record answers, with no error
    assert summary(records_api, job_id, metrics="bmc_power_watt") == before
    # an edit recomputes the record's metadata, never its summary from the readings left
    headers = {"Authorization": f"Bearer {api_tokens['scheduler']}"}
    edit = httpx.patch(
        f"{records_api}/api/jobs/{job_id}", json={"project": "p2"}, headers=headers, timeout=30
    )
    assert edit.status_code in (200, 202), edit.text
    version = before["record"]["version"]
    after = wait_until(
        lambda: from_record(records_api, job_id, version), RECORD_WAIT_S, "the edit's record"
    )
    assert after["energy_job"] == before["energy_job"] and after["metrics"] == before["metrics"]
    project = admin_client.command(
        "SELECT project FROM job_records FINAL WHERE job_id = {j:String}", parameters={"j": job_id}
    )
    assert project == "p2"


def test_late_reading_and_edit_each_recompute_once(
    records_api: str,
    clickhouse: StackSettings,
    insert_readings: Callable[[list[Row]], None],
    post_job: Callable[..., dict[str, Any]],
    api_tokens: dict[str, str],
) -> None:
    p = f"jr{uuid.uuid4().hex[:6]}"
    node, job_id = f"{p}-node-1", f"{p}_late"
    start = utc_now() - timedelta(minutes=10)
    insert_readings(bmc_power(node, start))
    ended_job(post_job, job_id, node, start)
    first = wait_until(lambda: from_record(records_api, job_id), RECORD_WAIT_S, "the job's record")
    assert first["energy_job"]["joules"] == 6000.0

    def round_done(sentinel: int) -> None:
        """Wait until a job that ended after this one has its record: the refresher went
        through a round after the last one, which took this job too if it were due."""
        other = f"{p}_sentinel{sentinel}"
        insert_readings(bmc_power(f"{p}-node-9", start))
        ended_job(post_job, other, f"{p}-node-9", start + timedelta(seconds=1))
        wait_until(lambda: from_record(records_api, other), RECORD_WAIT_S, "the sentinel's record")

    # a reading of the job's span stored now: 1,000 W between two of 100 W, 0.5 s from each
    # (the trapezoids over that second: 550 J instead of 100 J)
    insert_readings([[start + timedelta(seconds=30.5), node, "bmc_power_watt", 1000.0, {}]])
    version = first["record"]["version"]
    late = wait_until(
        lambda: from_record(records_api, job_id, version), RECORD_WAIT_S, "the late record"
    )
    assert late["energy_job"]["joules"] == pytest.approx(6000.0 + 450.0)
    round_done(1)
    headers = {"Authorization": f"Bearer {api_tokens['scheduler']}"}
    edit = httpx.patch(
        f"{records_api}/api/jobs/{job_id}", json={"project": "p2"}, headers=headers, timeout=30
    )
    assert edit.status_code in (200, 202), edit.text
    version = late["record"]["version"]
    edited = wait_until(
        lambda: from_record(records_api, job_id, version), RECORD_WAIT_S, "the edit's record"
    )
    assert edited["energy_job"] == late["energy_job"]
    round_done(2)
    records = published(clickhouse, job_id)
    versions = sorted({r["version"] for r in records})
    assert versions == [first["record"]["version"], version, edited["record"]["version"]]
    assert len(records) == 3, records  # each computed and published once


def many_series(node: str, start: datetime, count: int) -> list[Row]:
    """`count` series of one node, each with a name of 96 random hex digits and two random
    values: ~100 bytes per series that no compression takes away."""
    rows: list[Row] = []
    for i in range(count):
        metric = f"many_{i}_{uuid.uuid4().hex}{uuid.uuid4().hex}{uuid.uuid4().hex}"
        rows += [
            [start + timedelta(seconds=s), node, metric, random.random() * 1e6, {}] for s in (0, 60)
        ]
    return rows


@pytest.mark.slow
def test_a_job_of_many_series_gets_its_record_and_a_larger_one_a_truncated_one(
    records_api: str,
    clickhouse: StackSettings,
    insert_readings: Callable[[list[Row]], None],
    post_job: Callable[..., dict[str, Any]],
) -> None:
    """12,000 series: a record of ~5 MB, over 1 MB even compressed (Kafka's default message
    limit, the producer's and the topic's), stored whole; 25,000 series: over the API's
    JOBSCOPE_RECORDS_MAX_BYTES, stored without its per-series rows, saying so."""
    p = f"jr{uuid.uuid4().hex[:6]}"
    start = utc_now() - timedelta(minutes=20)
    sizes = {f"{p}_big": 12_000, f"{p}_bigger": 25_000}
    for n, (job_id, count) in enumerate(sizes.items()):
        node = f"{p}-node-{n}"
        insert_readings(many_series(node, start, count) + bmc_power(node, start))
        ended_job(post_job, job_id, node, start)
    big = wait_until(lambda: from_record(records_api, f"{p}_big"), 120, "the big job's record")
    assert len(big["metrics"]) == 12_001 and "truncated" not in big
    assert big["energy_job"]["joules"] == 6000.0
    (message,) = (orjson.dumps(r) for r in published(clickhouse, f"{p}_big"))
    assert len(zstandard.ZstdCompressor().compress(message)) > 1_000_000
    bigger = wait_until(
        lambda: from_record(records_api, f"{p}_bigger"), 120, "the bigger job's record"
    )
    assert bigger["metrics"] == [] and bigger["truncated"] == {"metrics": 25_001}
    assert bigger["energy_job"]["joules"] == 6000.0 and len(bigger["energy"]) == 1
    # narrowed, it is computed from the raw readings, which are whole
    narrowed = summary(records_api, f"{p}_bigger", metrics="bmc_power_watt")
    assert narrowed["record"]["source"] == "raw" and len(narrowed["metrics"]) == 1


def test_expired_jobs_report_and_comparison_come_from_their_records(
    records_api: str,
    admin_client: Client,
    insert_readings: Callable[[list[Row]], None],
    post_job: Callable[..., dict[str, Any]],
) -> None:
    """The report (format=json) and the comparison of jobs past raw retention, their raw
    readings deleted: the energy of their records, as before the deletion."""
    p = f"jr{uuid.uuid4().hex[:6]}"
    start = utc_now() - timedelta(days=3)
    job_ids = [f"{p}_old1", f"{p}_old2"]
    for job_id, node, watts in zip(
        job_ids, (f"{p}-node-1", f"{p}-node-2"), (100.0, 200.0), strict=True
    ):
        insert_readings(bmc_power(node, start, watts))
        ended_job(post_job, job_id, node, start)
    before = [wait_until(lambda j=j: from_record(records_api, j), 60, j) for j in job_ids]
    assert [b["energy_job"]["joules"] for b in before] == [6000.0, 12000.0]
    admin_client.command(
        "ALTER TABLE metrics DELETE WHERE device_id LIKE {p:String}",
        parameters={"p": f"{p}-node-%"},
        settings={"mutations_sync": 2},
    )
    for job_id, earlier in zip(job_ids, before, strict=True):
        response = httpx.get(
            f"{records_api}/api/jobs/{job_id}/report", params={"format": "json"}, timeout=60
        )
        assert response.status_code == 200, response.text
        report = response.json()
        assert report["summary"]["record"]["source"] == "record"
        assert report["summary"]["energy_job"] == earlier["energy_job"]
        assert report["energy"]["joules"] == earlier["energy_job"]["joules"]
    response = httpx.get(
        f"{records_api}/api/jobs/compare", params={"ids": ",".join(job_ids)}, timeout=60
    )
    assert response.status_code == 200, response.text
    rows = response.json()["jobs"]
    assert [r["figures"]["energy_j"] for r in rows] == [6000.0, 12000.0]
    assert rows[1]["diff"]["energy_j"] == {"delta": 6000.0, "relative": 1.0}
