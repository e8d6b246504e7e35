"""Allocations from OAR's CDC (clickhouse/migrations/0026): a job's assigned resources' `cpuset`
and GPU index property (`gpudevice`), written by OAR into its PostgreSQL, reach the job's
`allocations` through Debezium, Kafka and ClickHouse, and the API serves them. Real
PostgreSQL 15, Debezium in a real Connect worker, real broker, ClickHouse engine and API."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import httpx

from connectors.worker import Worker
from stack.processes import wait_until
from tests.connectors.conftest import Oar


def add_resources(oar: Oar, node: str, rows: Sequence[tuple[str, str, str | None]]) -> list[int]:
    """Resources of `node` as (type, cpuset, gpudevice), as `oarnodesetting -a -p ...` adds
    them."""
    with oar.db.connect() as conn:
        return [
            conn.execute(
                "INSERT INTO resources (type, network_address, host, cpuset, gpudevice)"
                " VALUES (%s, %s, %s, %s, %s) RETURNING resource_id",
                (kind, node, node, cpuset, gpu),
            ).fetchone()[0]
            for kind, cpuset, gpu in rows
        ]


def test_resources_cpusets_and_gpus_become_the_jobs_allocations(
    connect_worker: Worker, oar: Oar, api_url: str
) -> None:
    p = f"cdca{uuid.uuid4().hex[:6]}"
    gpu_node = add_resources(
        oar,
        f"{p}-gpu-1.site.example.org",
        [("default", str(c), str(c // 2)) for c in range(4)],  # 4 cores, 2 per GPU
    )
    ht_node = add_resources(
        oar,
        f"{p}-cpu-1.site.example.org",
        [("default", "8,40", None), ("default", "9,41", None), ("disk", "0", None)],
    )
    # one resource whose cpuset is not a CPU list: the node's CPUs are not told apart
    bad_node = add_resources(oar, f"{p}-cpu-2", [("default", "1", None), ("default", "x", None)])
    add_resources(oar, f"{p}-gpu-1.site.example.org", [("default", "4", "2")])  # not the job's

    job_id = oar.submit(f"{p}-alice")
    oar.run(job_id, [*gpu_node, *ht_node, *bad_node], start=1795000000, stop=1795000060)

    def served() -> dict[str, object]:
        response = httpx.get(f"{api_url}/api/jobs/{job_id}", timeout=10)
        job = response.json() if response.status_code == 200 else {}
        return job if job.get("state") == "terminated" else {}

    job = wait_until(served, 90, f"OAR job {job_id} terminated in the API", 0.1)
    assert sorted(job["nodes"]) == [f"{p}-cpu-1", f"{p}-cpu-2", f"{p}-gpu-1"]
    got = {n: {k: v for k, v in a.items() if v is not None} for n, a in job["allocations"].items()}
    assert got == {
        f"{p}-gpu-1": {"cpus": "0-3", "gpus": ["0", "1"]},
        f"{p}-cpu-1": {"cpus": "8-9,40-41"},  # the disk resource gives no CPU
    }
