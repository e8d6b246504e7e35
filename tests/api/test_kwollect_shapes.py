"""Kwollect's exact shapes (issue 30): `_device_orig` is a JSON list of device ids in the JSON
answers; `job_id=` on Kwollect's routes answers the job's nodes only, the measuring devices'
readings summed under the node; `GET /api/jobs/{id}/metrics` gives the measuring devices' own
rows only when asked (`measuring=true`, or naming them in `devices`). Readings are written
straight into `metrics`; the job is posted to the real API (Kafka -> ClickHouse)."""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.api.conftest import Row

START = datetime(2026, 11, 22, 14, 0, 0)
END = START + timedelta(seconds=20)


@dataclass(frozen=True)
class Scene:
    job_id: str
    node1: str  # measured by a wattmeter port
    node2: str  # two PSUs on outlets of two PDUs
    node3: str  # not in the job, also on pdu_a
    pdu_a: str
    pdu_b: str
    wattmeter: str


@pytest.fixture(scope="module")
def scene(
    insert_readings: Callable[[list[Row]], None], post_job: Callable[..., dict[str, Any]]
) -> Scene:
    p = f"ks{uuid.uuid4().hex[:6]}"
    s = Scene(
        f"{p}_7",
        f"{p}-node-1",
        f"{p}-node-2",
        f"{p}-node-3",
        f"{p}-pdu-a",
        f"{p}-pdu-b",
        f"{p}-wattmetre1-port0",
    )
    rows: list[Row] = []
    for i in range(21):
        t = START + timedelta(seconds=i)
        rows += [[t, s.node1, "load", 1.0, {}], [t, s.node2, "load", 2.0, {}]]
        rows += [[t, s.wattmeter, "wattmetre_power_watt", 180.0, {"_device_alias": s.node1}]]
        rows += [
            [t, s.pdu_a, "pdu_outlet_power_watt", 90.0, {"outlet": "1", "_device_alias": s.node2}]
        ]
        rows += [
            [t, s.pdu_b, "pdu_outlet_power_watt", 95.0, {"outlet": "4", "_device_alias": s.node2}]
        ]
        rows += [
            [t, s.pdu_a, "pdu_outlet_power_watt", 70.0, {"outlet": "2", "_device_alias": s.node3}]
        ]
    insert_readings(rows)
    post_job(
        job_id=s.job_id,
        user="alice",
        nodes=f"{p}-node-[1-2]",
        start=START.isoformat() + "Z",
        end=END.isoformat() + "Z",
        state="terminated",
    )
    return s


def get(api_url: str, path: str, **params: Any) -> httpx.Response:
    response = httpx.get(f"{api_url}{path}", params=params, timeout=60)
    assert response.status_code == 200, response.text
    return response


def by_device(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["device_id"], []).append(r)
    return out


@pytest.mark.parametrize("path", ["/api/metrics", "/rpc/get_metrics"])
def test_job_id_answers_the_nodes_only_with_origins_as_a_list(
    api_url: str, scene: Scene, path: str
) -> None:
    """As Kwollect: no row under a PDU's or a wattmeter's own id; each node's aliased readings
    summed under it, `_device_orig` the list of the devices summed."""
    rows = by_device(get(api_url, path, job_id=scene.job_id).json())
    assert set(rows) == {scene.node1, scene.node2}
    power2 = [r for r in rows[scene.node2] if r["metric_id"] == "pdu_outlet_power_watt"]
    assert len(power2) == 21 and {r["value"] for r in power2} == {185.0}
    assert power2[0]["labels"] == {"_device_orig": [scene.pdu_a, scene.pdu_b]}
    power1 = [r for r in rows[scene.node1] if r["metric_id"] == "wattmetre_power_watt"]
    assert power1[0]["labels"] == {"_device_orig": [scene.wattmeter]}
    assert {r["metric_id"] for r in rows[scene.node1]} == {"load", "wattmetre_power_watt"}


def test_origins_are_a_list_in_ndjson_and_for_devices_too(api_url: str, scene: Scene) -> None:
    lines = get(
        api_url,
        "/api/metrics",
        nodes=scene.node2,
        metrics="pdu_*",
        start_time=START.isoformat(),
        end_time=END.isoformat(),
        format="ndjson",
    ).text.splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 21
    assert all(r["labels"]["_device_orig"] == [scene.pdu_a, scene.pdu_b] for r in rows)


def test_csv_keeps_origins_as_a_string(api_url: str, scene: Scene) -> None:
    """CSV's labels are a text map (documented): the devices comma-separated."""
    body = get(api_url, "/api/metrics", job_id=scene.job_id, metrics="pdu_*", format="csv").text
    rows = list(csv.DictReader(io.StringIO(body)))
    assert {r["device_id"] for r in rows} == {scene.node2}
    assert json.loads(rows[0]["labels"]) == {"_device_orig": f"{scene.pdu_a},{scene.pdu_b}"}


def test_job_metrics_keep_the_measuring_devices_behind_a_parameter(
    api_url: str, scene: Scene
) -> None:
    path = f"/api/jobs/{scene.job_id}/metrics"
    plain = by_device(get(api_url, path).json())
    assert set(plain) == {scene.node1, scene.node2}
    measuring = by_device(get(api_url, path, measuring="true").json())
    assert set(measuring) == {scene.node1, scene.node2, scene.pdu_a, scene.pdu_b, scene.wattmeter}
    assert {r["labels"]["outlet"] for r in measuring[scene.pdu_a]} == {"1"}  # never node3's
    assert all("_device_alias" not in r["labels"] for rs in measuring.values() for r in rs)
    named = by_device(get(api_url, path, devices=scene.pdu_b).json())
    assert set(named) == {scene.pdu_b} and len(named[scene.pdu_b]) == 21
    nodes = by_device(get(api_url, path, devices=scene.node2, measuring="false").json())
    assert set(nodes) == {scene.node2}


def test_the_summary_still_counts_every_source(api_url: str, scene: Scene) -> None:
    """The answer's shape changes, not what the job's energy is made of."""
    summary = get(api_url, f"/api/jobs/{scene.job_id}/summary").json()
    energy = {(e["node"], e["metric_id"]): e for e in summary["energy"]}
    pdu = energy[(scene.node2, "pdu_outlet_power_watt")]
    assert sorted(pdu["sources"]) == [scene.pdu_a, scene.pdu_b]
    assert pdu["joules"] == pytest.approx(185 * 20)
