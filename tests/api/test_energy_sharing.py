"""Energy attribution on a shared node (JOBSCOPE_ENERGY_SHARING, api/sharing.py) against the
real API, Kafka and ClickHouse: a node of 64 CPUs whose BMC reads 400 W for 60 s, with two
GPUs (gpu=0 at 100 W, gpu=1 at 200 W). Job A holds CPUs 0-15 and GPU 0, job B CPUs 16-63 and
GPU 1, job C nothing (whole node). The stack's API runs the default policy (exclusive); two
more APIs run `cores` and `gpus` with JOBSCOPE_NODE_CPUS=64. A job record, computed as the
refresher computes it (api/records.py `compute`), carries the attribution of its settings.
A third API runs `cores` with JOBSCOPE_NODE_CPUS as a per-node object: nodes of different
sizes, one it does not name."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka import Producer

from api import records
from api.infra.config import ApiSettings
from api.schemas import Job
from kafka import topics
from stack import services
from stack.config import StackSettings
from stack.processes import wait_until
from tests import ports
from tests.api.conftest import Row
from tests.api.test_job_records import RECORD_WAIT_S

SPAN_S = 60
NODE_CPUS = 64
NODE_WATTS = 400.0
GPU_WATTS = {"0": 100.0, "1": 200.0}
NODE_J = NODE_WATTS * SPAN_S


@dataclass(frozen=True)
class Shared:
    node: str
    a: str
    """CPUs 0-15, GPU 0"""
    b: str
    """CPUs 16-63, GPU 1"""
    whole: str
    """no allocations"""


@pytest.fixture(scope="module")
def shared(
    insert_readings: Callable[[list[Row]], None], post_job: Callable[..., dict[str, Any]]
) -> Shared:
    p = f"es{uuid.uuid4().hex[:6]}"
    node = f"{p}-gpu-01"
    start = datetime(2026, 11, 21, 10, 0, 0)
    rows: list[Row] = []
    for s in range(SPAN_S + 1):
        t = start + timedelta(seconds=s)
        rows.append([t, node, "bmc_power_watt", NODE_WATTS, {}])
        rows += [[t, node, "gpu_power_watt", w, {"gpu": g}] for g, w in GPU_WATTS.items()]
    insert_readings(rows)
    jobs = Shared(node, f"{p}_a", f"{p}_b", f"{p}_c")
    common = {
        "user": "alice",
        "nodes": [node],
        "state": "terminated",
        "start": f"{start.isoformat()}Z",
        "end": f"{(start + timedelta(seconds=SPAN_S)).isoformat()}Z",
    }
    post_job(job_id=jobs.a, allocations={node: {"cpus": "0-15", "gpus": ["0"]}}, **common)
    post_job(job_id=jobs.b, allocations={node: {"cpus": "16-63", "gpus": ["1"]}}, **common)
    post_job(job_id=jobs.whole, **common)
    return jobs


def _api(clickhouse: StackSettings, policy: str, index: int) -> Iterator[str]:
    name = f"api-energy-{policy}"
    env = {
        "JOBSCOPE_ENERGY_SHARING": policy,
        "JOBSCOPE_NODE_CPUS": str(NODE_CPUS),
        "JOBSCOPE_RECORDS_INTERVAL_S": "0",
    }
    port = ports.port("energy-sharing", index)
    try:
        yield services.start_api(clickhouse, name=name, port=port, env=env)
    finally:
        services.process(clickhouse, name).stop(timeout=30)


@pytest.fixture(scope="module")
def cores_api(clickhouse: StackSettings) -> Iterator[str]:
    yield from _api(clickhouse, "cores", 0)


@pytest.fixture(scope="module")
def gpus_api(clickhouse: StackSettings) -> Iterator[str]:
    yield from _api(clickhouse, "gpus", 1)


def summary(api_url: str, job_id: str) -> dict[str, Any]:
    response = httpx.get(f"{api_url}/api/jobs/{job_id}/summary", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def job_energy(api_url: str, job_id: str) -> dict[str, Any]:
    """The summary's energy_job, with its one node's row under `node`."""
    got = summary(api_url, job_id)
    (node,) = got["energy_nodes"]
    return {**got["energy_job"], "node": node}


def test_exclusive_by_default_gives_each_job_the_nodes_whole_energy(
    api_url: str, shared: Shared
) -> None:
    for job_id in (shared.a, shared.b, shared.whole):
        energy = job_energy(api_url, job_id)
        assert energy["joules"] == pytest.approx(NODE_J)
        assert (energy["policy"], energy["attribution"], energy["share"]) == (
            "exclusive",
            "exclusive",
            1.0,
        )
        node = energy["node"]
        assert (node["attribution"], node["share"], node["node_joules"]) == (
            "exclusive",
            1.0,
            pytest.approx(NODE_J),
        )


def test_cores_share_the_node_by_allocated_cpus(cores_api: str, shared: Shared) -> None:
    a, b = job_energy(cores_api, shared.a), job_energy(cores_api, shared.b)
    assert a["joules"] == pytest.approx(NODE_WATTS * 16 / NODE_CPUS * SPAN_S)
    assert b["joules"] == pytest.approx(NODE_WATTS * 48 / NODE_CPUS * SPAN_S)
    assert (a["attribution"], a["share"]) == ("cores", pytest.approx(0.25))
    node = a["node"]
    assert {k: node[k] for k in ("attribution", "share", "cpu_share", "gpu_joules")} == {
        "attribution": "cores",
        "share": pytest.approx(0.25),
        "cpu_share": pytest.approx(0.25),
        "gpu_joules": None,
    }
    assert (node["joules"], node["node_joules"]) == (pytest.approx(NODE_J / 4), NODE_J)


def test_gpus_measured_plus_a_cpu_share_of_the_rest_sum_to_the_node(
    gpus_api: str, shared: Shared
) -> None:
    a, b = job_energy(gpus_api, shared.a), job_energy(gpus_api, shared.b)
    rest = NODE_WATTS - sum(GPU_WATTS.values())
    assert a["joules"] == pytest.approx(100 * SPAN_S + rest * 16 / NODE_CPUS * SPAN_S)
    assert b["joules"] == pytest.approx(200 * SPAN_S + rest * 48 / NODE_CPUS * SPAN_S)
    assert a["joules"] + b["joules"] == pytest.approx(NODE_J)
    assert a["attribution"] == b["attribution"] == "gpus"
    node = a["node"]
    assert node["gpu_joules"] == pytest.approx(100 * SPAN_S)
    assert node["node_gpu_joules"] == pytest.approx(sum(GPU_WATTS.values()) * SPAN_S)
    assert node["share"] == pytest.approx(a["joules"] / NODE_J)
    # the per-source figures stay what was measured: the node's BMC, the job's own GPU
    measured = {e["metric_id"]: e["joules"] for e in summary(gpus_api, shared.a)["energy"]}
    assert measured == {
        "bmc_power_watt": pytest.approx(NODE_J),
        "gpu_power_watt": pytest.approx(100 * SPAN_S),
    }


def test_a_job_without_allocations_keeps_the_whole_node_under_every_policy(
    api_url: str, cores_api: str, gpus_api: str, shared: Shared
) -> None:
    for url in (api_url, cores_api, gpus_api):
        energy = job_energy(url, shared.whole)
        assert energy["joules"] == pytest.approx(NODE_J)
        assert (energy["attribution"], energy["share"]) == ("exclusive", 1.0)


def record_summary(
    admin_client: Client, api_url: str, job_id: str, **settings: Any
) -> dict[str, Any]:
    """The summary a job record would hold, computed as the refresher does."""
    job = Job.model_validate(httpx.get(f"{api_url}/api/jobs/{job_id}", timeout=30).json())
    config = ApiSettings(clickhouse_api_password="unused", **settings)
    return orjson.loads(records.compute(admin_client, config, job)["summary"])


def test_a_record_carries_the_attribution_and_an_unknown_node_size_is_exclusive(
    admin_client: Client, api_url: str, shared: Shared
) -> None:
    kept = record_summary(admin_client, api_url, shared.a, energy_sharing="cores", node_cpus=64)
    assert kept["energy_job"]["joules"] == pytest.approx(NODE_J / 4)
    assert (kept["energy_job"]["attribution"], kept["energy_job"]["policy"]) == ("cores", "cores")
    unknown = record_summary(admin_client, api_url, shared.a, energy_sharing="gpus", node_cpus=0)
    assert unknown["energy_job"]["joules"] == pytest.approx(NODE_J)
    assert (unknown["energy_job"]["attribution"], unknown["energy_job"]["policy"]) == (
        "exclusive",
        "gpus",
    )


def test_a_record_of_another_policy_is_not_served_while_raw_readings_remain(
    admin_client: Client,
    clickhouse: StackSettings,
    api_url: str,
    cores_api: str,
    shared: Shared,
) -> None:
    """A record computed under `exclusive` (by a refresher with the site's old policy, or an
    API replica set otherwise) is what the exclusive API serves; the `cores` API answers
    from raw readings with its own attribution."""
    job = Job.model_validate(httpx.get(f"{api_url}/api/jobs/{shared.a}", timeout=30).json())
    exclusive = ApiSettings(clickhouse_api_password="unused", energy_sharing="exclusive")
    packed = records.message(records.compute(admin_client, exclusive, job), 1 << 20)
    producer = Producer({"bootstrap.servers": clickhouse.kafka_bootstrap})
    producer.produce(topics.JOB_RECORDS.name, packed, f"/{shared.a}".encode())
    assert producer.flush(30) == 0, "Kafka did not take the record"
    wait_until(
        lambda: summary(api_url, shared.a)["record"]["source"] == "record",
        RECORD_WAIT_S,
        f"the exclusive record of {shared.a} served",
    )
    got = summary(cores_api, shared.a)
    assert got["record"]["source"] == "raw"
    assert got["energy_job"]["joules"] == pytest.approx(NODE_J / 4)
    assert (got["energy_job"]["policy"], got["energy_job"]["attribution"]) == ("cores", "cores")


SMALL_WATTS = 80.0
"""the small nodes' BMCs"""


@dataclass(frozen=True)
class Sized:
    big: str
    """the 64-CPU node of `shared`, 128 CPUs by the map"""
    small: str
    """a node the map gives 16 CPUs by a hostlist expression"""
    unnamed: str
    """a node the map does not name: unknown size, exclusive"""
    d: str
    """CPUs 0-15 on big, 0-3 on small, 0-3 on unnamed"""
    e: str
    """CPUs 4-15 on small"""


@pytest.fixture(scope="module")
def sized(
    shared: Shared,
    insert_readings: Callable[[list[Row]], None],
    post_job: Callable[..., dict[str, Any]],
) -> Sized:
    p = shared.node.removesuffix("-gpu-01")
    small, unnamed = f"{p}-cpu-2", f"{p}-other-1"
    start = datetime(2026, 11, 21, 10, 0, 0)
    insert_readings(
        [
            [start + timedelta(seconds=s), node, "bmc_power_watt", SMALL_WATTS, {}]
            for s in range(SPAN_S + 1)
            for node in (small, unnamed)
        ]
    )
    jobs = Sized(shared.node, small, unnamed, f"{p}_d", f"{p}_e")
    times = {
        "user": "alice",
        "state": "terminated",
        "start": f"{start.isoformat()}Z",
        "end": f"{(start + timedelta(seconds=SPAN_S)).isoformat()}Z",
    }
    d_cpus = {shared.node: {"cpus": "0-15"}, small: {"cpus": "0-3"}, unnamed: {"cpus": "0-3"}}
    post_job(job_id=jobs.d, nodes=list(d_cpus), allocations=d_cpus, **times)
    post_job(job_id=jobs.e, nodes=[small], allocations={small: {"cpus": "4-15"}}, **times)
    return jobs


@pytest.fixture(scope="module")
def mapped_api(clickhouse: StackSettings, sized: Sized) -> Iterator[str]:
    """`cores` with a map: the big node by its full name (a domain suffix is dropped), the
    small ones by a hostlist expression."""
    p = sized.big.removesuffix("-gpu-01")
    node_cpus = {f"{sized.big}.site.org": 128, f"{p}-cpu-[1-4]": 16}
    name = "api-energy-mapped"
    env = {
        "JOBSCOPE_ENERGY_SHARING": "cores",
        "JOBSCOPE_NODE_CPUS": orjson.dumps(node_cpus).decode(),
        "JOBSCOPE_RECORDS_INTERVAL_S": "0",
    }
    port = ports.port("energy-sharing", 2)
    try:
        yield services.start_api(clickhouse, name=name, port=port, env=env)
    finally:
        services.process(clickhouse, name).stop(timeout=30)


def test_a_per_node_cpu_map_shares_each_node_by_its_own_size(mapped_api: str, sized: Sized) -> None:
    got = summary(mapped_api, sized.d)
    nodes = {row["node"]: row for row in got["energy_nodes"]}
    assert {n: (r["attribution"], r["cpu_share"]) for n, r in nodes.items()} == {
        sized.big: ("cores", pytest.approx(16 / 128)),
        sized.small: ("cores", pytest.approx(4 / 16)),
        sized.unnamed: ("exclusive", None),
    }
    small_j = SMALL_WATTS * SPAN_S
    assert nodes[sized.big]["joules"] == pytest.approx(NODE_J * 16 / 128)
    assert nodes[sized.small]["joules"] == pytest.approx(small_j / 4)
    assert nodes[sized.unnamed]["joules"] == pytest.approx(small_j)
    job = got["energy_job"]
    assert job["attribution"] == "mixed"
    assert job["joules"] == pytest.approx(NODE_J / 8 + small_j / 4 + small_j)
    # the other job on the small node: the two shares are the node's whole energy
    e = job_energy(mapped_api, sized.e)
    assert (e["attribution"], e["joules"]) == ("cores", pytest.approx(small_j * 12 / 16))
    assert e["joules"] + nodes[sized.small]["joules"] == pytest.approx(small_j)


def test_a_per_node_cpu_map_is_checked_at_start() -> None:
    def settings(node_cpus: Any) -> ApiSettings:
        return ApiSettings(clickhouse_api_password="unused", node_cpus=node_cpus)

    assert settings({"n-[1-2]": 8, "gpu-1.site.org": 64}).node_cpus == {
        "n-1": 8,
        "n-2": 8,
        "gpu-1": 64,
    }
    assert settings(64).node_cpus == 64
    for bad, says in [
        ({"n-[1-2]": 8, "n-2": 16}, "named twice"),
        ({"n-[1-": 8}, "hostlist expression"),
        ({"n-1": 0}, "from 1 to"),
        ({"n-[1-999999]": 8}, "hostlist expression"),  # hostlist refuses to expand it
        (-1, "from 0 to"),
    ]:
        with pytest.raises(ValueError, match=says):
            settings(bad)
