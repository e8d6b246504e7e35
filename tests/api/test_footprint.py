"""The footprint in a job's summary (read from raw readings), and `GET /api/jobs` filtered
and sorted by the jobs' records: severity (at least), note, energy and efficiency, within
the other filters. The records are written straight into `job_records` (as the API tests
write readings into `metrics`): what is tested is the list, not the refresher."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from clickhouse_connect.driver.client import Client

from api.footprint import scales_of
from api.queries.footprint import footprint_rows
from api.queries.metrics import Selection
from tests.api.conftest import Row, iso

TAG = uuid.uuid4().hex[:6]
USER = f"fp-{TAG}"
LISTER = f"fp-{TAG}-list"


def test_summary_has_the_footprint(
    api_url: str,
    post_job: Callable[..., dict[str, Any]],
    insert_readings: Callable[[list[Row]], None],
) -> None:
    """Power from idle (100 W) to peak (400 W) in equal steps: each tenth holds a tenth of
    the time; the node's readings stop 40 s before the end: silent."""
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(minutes=5)
    start = end - timedelta(seconds=140)
    node = f"fp-{TAG}-node"
    insert_readings(
        [
            [start + timedelta(seconds=s), node, "bmc_power_watt", 100.0 + 3 * s + 1.5, {}]
            for s in range(100)
        ]
    )
    job_id = f"fp-{TAG}-steps"
    post_job(
        job_id=job_id, user=USER, nodes=[node], start=iso(start), end=iso(end), state="terminated"
    )
    summary = httpx.get(f"{api_url}/api/jobs/{job_id}/summary", timeout=60).json()
    assert summary["footprint_source"] == "raw"
    (power,) = [f for f in summary["footprint"] if f["metric_id"] == "bmc_power_watt"]
    assert power["idle"] == 100 and power["peak"] == 400 and power["unit"] == "W"
    assert power["position"] == pytest.approx(0.5, abs=0.01)
    assert power["deciles"] == pytest.approx([0.1] * 10, abs=0.011)
    (silent,) = summary["silent"]
    assert silent["node"] == node and silent["silent_s"] == pytest.approx(41, abs=1)
    assert [n["id"] for n in summary["notes"]] == ["node-silent", "energy-coverage-low"]


def _record(
    job: dict[str, Any], energy: float, severity: str, notes: list[str], position: float
) -> list[Any]:
    now = datetime.now(UTC).replace(tzinfo=None)
    start, end = now - timedelta(hours=1), now - timedelta(minutes=30)
    return [
        job["site"],
        job["job_id"],
        job["user"],
        job["project"],
        start,
        end,
        job["nodes"],
        1,
        now,
        now,
        now,
        energy,
        "bmc",
        1.0,
        notes,
        severity,
        {"bmc_power_watt": position},
        "{}",
    ]


RECORD_COLUMNS = [
    "site",
    "job_id",
    "user",
    "project",
    "start_time",
    "end_time",
    "nodes",
    "version",
    "job_updated_at",
    "computed_at",
    "last_received",
    "energy_j",
    "energy_role",
    "coverage",
    "notes",
    "severity",
    "footprint",
    "summary",
]


def test_jobs_filtered_and_sorted_by_their_records(
    api_url: str, post_job: Callable[..., dict[str, Any]], admin_client: Client
) -> None:
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(minutes=30)
    jobs = {}
    for name, project in (("a", "p1"), ("b", "p1"), ("c", "p1"), ("d", "p2"), ("running", "p1")):
        jobs[name] = post_job(
            job_id=f"fp-{TAG}-{name}",
            user=LISTER,
            project=f"{project}-{TAG}",
            nodes=["x"],
            start=iso(end - timedelta(minutes=30)),
            **({"end": iso(end), "state": "terminated"} if name != "running" else {}),
        )
    admin_client.insert(
        "job_records",
        [
            _record(jobs["a"], 5e5, "warning", ["node-power-idle"], 0.05),
            _record(jobs["b"], 9e5, "", [], 0.7),
            _record(jobs["c"], 2e5, "alert", ["node-silent", "gpu-idle"], 0.3),
            _record(jobs["d"], 1e6, "alert", ["node-silent"], 0.9),
        ],
        column_names=RECORD_COLUMNS,
    )

    def ids(**params: Any) -> list[str]:
        response = httpx.get(f"{api_url}/api/jobs", params={"user": LISTER, **params}, timeout=30)
        assert response.status_code == 200, response.text
        return [j["job_id"].removeprefix(f"fp-{TAG}-") for j in response.json()]

    assert ids(sort="-energy") == ["d", "b", "a", "c", "running"]
    assert ids(sort="energy", project=f"p1-{TAG}") == ["c", "a", "b", "running"]
    assert ids(sort="efficiency") == ["a", "c", "b", "d", "running"]
    assert ids(sort="-efficiency", position_metric="bmc_power_watt") == [
        "d",
        "b",
        "c",
        "a",
        "running",
    ]
    assert sorted(ids(severity="warning")) == ["a", "c", "d"]
    assert sorted(ids(severity="alert", project=f"p1-{TAG}")) == ["c"]
    assert ids(note="node-silent", sort="-energy") == ["d", "c"]
    params = {"user": LISTER, "note": "gpu-idle"}
    listed = httpx.get(f"{api_url}/api/jobs", params=params, timeout=30)
    (c,) = listed.json()
    assert (
        c["energy_j"] == 2e5
        and c["severity"] == "alert"
        and c["notes"] == ["node-silent", "gpu-idle"]
    )
    assert c["efficiency"] == pytest.approx(0.3)
    running = httpx.get(f"{api_url}/api/jobs/{jobs['running']['job_id']}", timeout=30)
    assert running.status_code == 200
    refused = httpx.get(f"{api_url}/api/jobs", params={"sort": "__class__"}, timeout=30)
    assert refused.status_code == 400 and "sort" in refused.text
    # the attack: SQL in the filters stays a value (bound, never pasted into the query)
    injected = "node-silent') OR 1=1 --"
    assert ids(note=injected) == []
    unknown_metric = ids(sort="-efficiency", position_metric=injected)  # no such metric: all
    assert sorted(unknown_metric) == ["a", "b", "c", "d", "running"]
    sorting = httpx.get(f"{api_url}/api/jobs", params={"sort": "energy, 1"}, timeout=30)
    assert sorting.status_code == 400 and "sort" in sorting.text


def test_a_nodes_series_combine_by_the_registrys_aggregation(
    api_url: str,
    reader_client: Client,
    post_job: Callable[..., dict[str, Any]],
    insert_readings: Callable[[list[Row]], None],
) -> None:
    """Two PSUs of 125 W are a node of 250 W (bmc_power_watt: sum), halfway from idle (100 W)
    to peak (400 W); two GPUs busy 5% and 95% are a node busy 50% (mean), never under the
    caution level (10%) that one of them is under. The summary's scan and the footprint read
    apart (api/queries/footprint.py) agree."""
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(minutes=5)
    start = end - timedelta(seconds=60)
    node = f"fp-{TAG}-combined"
    rows: list[Row] = []
    for s in range(61):
        t = start + timedelta(seconds=s)
        rows += [[t, node, "bmc_power_watt", 125.0, {"psu": str(psu)}] for psu in (1, 2)]
        rows += [
            [t, node, "DCGM_FI_DEV_GPU_UTIL", busy, {"gpu": str(g)}]
            for g, busy in enumerate((5.0, 95.0))
        ]
    insert_readings(rows)
    job_id = f"fp-{TAG}-combined"
    post_job(
        job_id=job_id, user=USER, nodes=[node], start=iso(start), end=iso(end), state="terminated"
    )
    summary = httpx.get(f"{api_url}/api/jobs/{job_id}/summary", timeout=60).json()
    found = {f["metric_id"]: f for f in summary["footprint"]}
    power, gpu = found["bmc_power_watt"], found["DCGM_FI_DEV_GPU_UTIL"]
    assert (power["mean"], power["p95"], power["position"]) == (250.0, 250.0, 0.5)
    assert (gpu["mean"], gpu["position"], gpu["above_caution_s"]) == (50.0, 0.5, 0.0)
    assert power["covered_s"] == gpu["covered_s"] == 60.0

    selection = Selection((node,), start, end)
    scales = scales_of(["bmc_power_watt", "DCGM_FI_DEV_GPU_UTIL"])
    assert scales.aggregation == ["sum", "mean"]
    apart = {r["metric_id"]: r for r in footprint_rows(reader_client, selection, scales, False)}
    assert apart["bmc_power_watt"]["mean"] == power["mean"]
    assert apart["DCGM_FI_DEV_GPU_UTIL"]["above_caution_s"] == gpu["above_caution_s"]
