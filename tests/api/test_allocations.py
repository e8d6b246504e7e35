"""Scope by allocation against the real API, Kafka and ClickHouse: two jobs share one node,
one holding GPUs 0-1 and CPUs 0-1, the other GPUs 2-3 and CPUs 2-3; a third job on the same
node has no allocations. Readings labelled gpu=0..3 (and cpu=0..3) belong to the job holding
that GPU (CPU); node-level readings (no such label, or `core="all"`) to all three. Checked
through `/metrics`, `/summary` (per-GPU energy), the live stream, and the job's record
(`GET /api/jobs/{id}`); hostile allocations are refused."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from clickhouse_connect.driver.client import Client

from api.footprint import scales_of
from api.infra.params import NamePatterns
from api.queries.footprint import footprint_rows
from api.queries.metrics import Selection
from kafka.allocations import Allocated
from kafka.reading import Reading
from tests.api.conftest import Listener, Row
from tests.conftest import wait_for_rollups

SPAN_S = 60
GPU_WATTS = {"0": 100.0, "1": 200.0, "2": 300.0, "3": 400.0}
NODE_WATTS = 1000.0


@dataclass(frozen=True)
class Shared:
    node: str
    first: str
    """holds GPUs 0-1 and CPUs 0-1"""
    second: str
    """holds GPUs 2-3 (by index) and CPUs 2-3"""
    whole: str
    """no allocations"""


def uuid_of(gpu: str) -> str:
    return f"GPU-00000000-0000-0000-0000-00000000000{gpu}"


@pytest.fixture(scope="module")
def shared(
    insert_readings: Callable[[list[Row]], None], post_job: Callable[..., dict[str, Any]]
) -> Shared:
    p = f"al{uuid.uuid4().hex[:6]}"
    node = f"{p}-gpu-01"
    start = datetime(2026, 11, 20, 10, 0, 0)
    rows: list[Row] = []
    for s in range(SPAN_S + 1):
        t = start + timedelta(seconds=s)
        for gpu, watts in GPU_WATTS.items():
            labels = {"gpu": gpu, "gpu_uuid": uuid_of(gpu)}
            rows.append([t, node, "gpu_power_watt", watts, labels])
            rows.append([t, node, "node_cpu_busy_ratio", 0.5, {"cpu": gpu}])
        rows.append([t, node, "bmc_power_watt", NODE_WATTS, {}])
        rows.append([t, node, "node_load1", 1.0, {"core": "all"}])
    insert_readings(rows)
    span = {
        "start": f"{start.isoformat()}Z",
        "end": f"{(start + timedelta(seconds=SPAN_S)).isoformat()}Z",
    }
    jobs = Shared(node, f"{p}_a", f"{p}_b", f"{p}_c")
    common = {"user": "alice", "nodes": [node], "state": "terminated", **span}
    post_job(job_id=jobs.first, allocations={node: {"cpus": "0-1", "gpus": ["0", "1"]}}, **common)
    # GPUs by UUID only: the `gpu_uuid` label decides
    post_job(
        job_id=jobs.second,
        allocations={node: {"cpus": "2,3", "gpu_uuids": [uuid_of("2"), uuid_of("3")]}},
        **common,
    )
    post_job(job_id=jobs.whole, **common)
    return jobs


def series(api_url: str, job_id: str) -> set[tuple[str, str]]:
    """(metric, its gpu or cpu label) of every reading of the job's `/metrics`."""
    response = httpx.get(f"{api_url}/api/jobs/{job_id}/metrics", timeout=30)
    assert response.status_code == 200, response.text
    return {
        (r["metric_id"], r["labels"].get("gpu") or r["labels"].get("cpu") or "")
        for r in response.json()
    }


def node_level() -> set[tuple[str, str]]:
    return {("bmc_power_watt", ""), ("node_load1", "")}


def test_each_job_reads_its_own_gpus_and_cpus_and_every_node_level_reading(
    api_url: str, shared: Shared
) -> None:
    def held(ids: str) -> set[tuple[str, str]]:
        return {(m, i) for m in ("gpu_power_watt", "node_cpu_busy_ratio") for i in ids}

    assert series(api_url, shared.first) == held("01") | node_level()
    assert series(api_url, shared.second) == held("23") | node_level()
    assert series(api_url, shared.whole) == held("0123") | node_level()


def test_gpu_energy_in_a_summary_is_the_jobs_gpus_only(api_url: str, shared: Shared) -> None:
    def energy(job_id: str) -> dict[str, float]:
        response = httpx.get(f"{api_url}/api/jobs/{job_id}/summary", timeout=30)
        assert response.status_code == 200, response.text
        return {e["metric_id"]: e["joules"] for e in response.json()["energy"]}

    first, second, whole = (energy(j) for j in (shared.first, shared.second, shared.whole))
    assert first["gpu_power_watt"] == pytest.approx((100 + 200) * SPAN_S)
    assert second["gpu_power_watt"] == pytest.approx((300 + 400) * SPAN_S)
    assert whole["gpu_power_watt"] == pytest.approx(sum(GPU_WATTS.values()) * SPAN_S)
    for got in (first, second, whole):
        assert got["bmc_power_watt"] == pytest.approx(NODE_WATTS * SPAN_S)


def test_the_job_shows_its_allocations_canonically(api_url: str, shared: Shared) -> None:
    got = httpx.get(f"{api_url}/api/jobs/{shared.second}", timeout=10).json()
    entry = got["allocations"][shared.node]
    assert (entry["cpus"], entry["gpu_uuids"], entry["gpus"]) == (
        "2-3",
        [uuid_of("2"), uuid_of("3")],
        None,
    )
    assert httpx.get(f"{api_url}/api/jobs/{shared.whole}", timeout=10).json()["allocations"] == {}


@pytest.mark.parametrize(
    "allocations",
    [
        {"other-node": {"gpus": ["0"]}},  # not a node of the job
        {"NODE": {"cpus": "0-99999999"}},  # a range that would expand to millions
        {"NODE": {"cpus": "0-3;rm -rf /"}},
        {"NODE": {"gpus": ["0 OR 1=1"]}},
        {"NODE": {"gpu_uuids": ["GPU-x') OR 1=1 --"]}},
        {"NODE": {"gpus": [str(i) for i in range(300)]}},  # more than 256
        {"NODE": {"memory_mb": -1}},
        {"NODE": {"privileged": True}},
        {"NODE": "all of it"},
        {"n-[1-9999999]": {"gpus": ["0"]}},
    ],
)
def test_hostile_allocations_are_refused(
    api_url: str, api_tokens: dict[str, str], allocations: dict[str, Any]
) -> None:
    node = f"al{uuid.uuid4().hex[:6]}-n"
    body = {
        "job_id": f"{node}-job",
        "nodes": [node],
        "allocations": {k.replace("NODE", node): v for k, v in allocations.items()},
    }
    headers = {"Authorization": f"Bearer {api_tokens['scheduler']}"}
    response = httpx.post(f"{api_url}/api/jobs", json=body, headers=headers, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["parameter"].startswith("allocations") or "allocations" in error["error"]
    assert httpx.get(f"{api_url}/api/jobs/{node}-job", timeout=10).status_code == 404


def test_a_patch_with_allocations_off_the_job_is_refused_and_changes_nothing(
    api_url: str, api_tokens: dict[str, str], post_job: Callable[..., dict[str, Any]]
) -> None:
    node = f"al{uuid.uuid4().hex[:6]}-n"
    post_job(job_id=f"{node}-job", nodes=[node], allocations={node: {"gpus": ["0"]}})
    headers = {"Authorization": f"Bearer {api_tokens['scheduler']}"}
    url = f"{api_url}/api/jobs/{node}-job"
    stray = httpx.patch(url, json={"allocations": {"x": {}}}, headers=headers, timeout=30)
    assert stray.status_code == 400, stray.text
    moved = httpx.patch(url, json={"nodes": ["elsewhere"]}, headers=headers, timeout=30)
    assert moved.status_code == 400, moved.text
    changed = httpx.patch(
        url, json={"allocations": {node: {"gpus": ["1"]}}}, headers=headers, timeout=30
    )
    assert changed.status_code in (200, 202), changed.text
    assert changed.json()["allocations"][node]["gpus"] == ["1"]


def test_live_stream_holds_the_jobs_gpus_only(
    api_url: str,
    post_job: Callable[..., dict[str, Any]],
    publish: Callable[[list[Reading]], None],
) -> None:
    p = f"al{uuid.uuid4().hex[:6]}"
    node = f"{p}-gpu-01"
    start = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    job = {"user": "alice", "nodes": [node], "start": start, "state": "running"}
    post_job(job_id=f"{p}_a", allocations={node: {"gpus": ["0", "1"]}}, **job)
    post_job(job_id=f"{p}_c", **job)
    first, whole = Listener(api_url, f"{p}_a"), Listener(api_url, f"{p}_c")
    for listener in (first, whole):
        listener.wait(lambda lst=listener: "live" in lst.names(), 30, "the stream to be live")
    t = int(time.time() * 1e6)
    readings = [Reading(t, node, "gpu_power_watt", w, {"gpu": g}) for g, w in GPU_WATTS.items()]
    readings.append(Reading(t, node, "bmc_power_watt", NODE_WATTS, {}))
    publish(readings)
    publish([Reading(t + 1, node, "marker", 1.0, {})])
    for listener in (first, whole):
        listener.wait(
            lambda lst=listener: any(r["metric_id"] == "marker" for r in lst.rows()),
            30,
            "the readings published after the stream went live",
        )

    def seen(listener: Listener) -> set[tuple[str, str]]:
        return {(r["metric_id"], r["labels"].get("gpu", "")) for r in listener.rows()}

    node_rows = {("bmc_power_watt", ""), ("marker", "")}
    assert seen(first) == {("gpu_power_watt", "0"), ("gpu_power_watt", "1")} | node_rows
    assert seen(whole) == {("gpu_power_watt", g) for g in GPU_WATTS} | node_rows


@pytest.mark.slow
def test_the_footprint_from_the_rollups_holds_the_jobs_gpus_only(
    shared: Shared, admin_client: Client, reader_client: Client
) -> None:
    """Once raw readings expire the footprint is read from the 1-minute rollups: a job's
    node GPU power there is its own GPUs' summed (the registry's node aggregation), as from
    raw readings, never the node's four."""
    per_instant = len(GPU_WATTS) * 2 + 2  # 4 GPUs, 4 CPUs, the BMC, the load
    wait_for_rollups(admin_client, shared.node, per_instant * (SPAN_S + 1))
    start = datetime(2026, 11, 20, 10, 0, 0)
    for gpus in ("01", "23", "0123"):
        held = Allocated.of({shared.node: {"gpus": list(gpus)}})
        selection = Selection(
            (shared.node,),
            start,
            start + timedelta(seconds=SPAN_S),
            NamePatterns(),
            measured=True,
            allocated=held,
        )
        means = {
            from_rollups: [
                r["mean"]
                for r in footprint_rows(
                    reader_client, selection, scales_of(["gpu_power_watt"]), from_rollups
                )
            ]
            for from_rollups in (False, True)
        }
        own = sum(GPU_WATTS[g] for g in gpus)
        assert means == {False: [pytest.approx(own)], True: [pytest.approx(own)]}, gpus
