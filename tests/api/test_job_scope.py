"""A job's scope through the API: its nodes and the devices measuring them, over its time,
in every format, as rates, by step, summarised with energy. Readings are crafted and written
straight into `metrics`; the job is posted to the real API (Kafka -> ClickHouse)."""

from __future__ import annotations

import csv
import io
import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
import pyarrow.ipc
import pyarrow.parquet
import pytest

from tests.api.conftest import Row, iso

START = datetime(2026, 11, 20, 10, 0, 10)
END = START + timedelta(seconds=60)
US = timedelta(microseconds=1)


@dataclass(frozen=True)
class Scene:
    job_id: str
    node1: str
    node2: str
    node3: str  # not in the job
    pdu: str
    temps: dict[datetime, float]  # node1's temperature inside the job


@pytest.fixture(scope="module")
def scene(
    insert_readings: Callable[[list[Row]], None], post_job: Callable[..., dict[str, Any]]
) -> Scene:
    p = f"sc{uuid.uuid4().hex[:6]}"
    s = Scene(f"{p}_4242", f"{p}-node-1", f"{p}-node-2", f"{p}-node-3", f"{p}-pdu", {})
    rng = random.Random(7)
    rows: list[Row] = []
    for i in range(-10, 71):  # 10 s before the job to 10 s after, every second
        t = START + timedelta(seconds=i)
        temp = rng.uniform(20, 80)  # full-precision floats: formats must keep every bit
        rows += [[t, s.node1, "temp_celsius", temp, {"sensor": "cpu"}]]
        rows += [[t, s.node3, "temp_celsius", temp + 1, {}]]
        if 0 <= i <= 60:
            s.temps[t] = temp
            if not 20 < i < 40:  # a 19 s gap: not bridged
                rows += [[t, s.node1, "bmc_power_watt", 100.0 + i, {}]]
            rows += [[t, s.node2, "bmc_power_watt", 250.0, {}]]
            # node2 has two PSUs on outlets 1 and 2 of the PDU; outlet 3 powers node3
            for outlet, watts, node in (
                (1, 100.0, s.node2),
                (2, 150.0, s.node2),
                (3, 70.0, s.node3),
            ):
                labels = {"outlet": str(outlet), "_device_alias": node, "source": "pdu"}
                rows += [[t, s.pdu, "pdu_outlet_power_watt", watts, labels]]
    # one microsecond outside the job on each side, and exactly on its bounds
    rows += [[START - US, s.node1, "edge_watt", 1.0, {}], [END + US, s.node1, "edge_watt", 2.0, {}]]
    rows += [[START, s.node1, "edge_watt", 3.0, {}], [END, s.node1, "edge_watt", 4.0, {}]]
    insert_readings(rows)
    post_job(
        job_id=s.job_id,
        user="alice",
        nodes=f"{p}-node-[1-2].site.example.org",
        start=START.isoformat() + "Z",
        end=(END.replace(tzinfo=None) - datetime(1970, 1, 1)).total_seconds(),
        state="terminated",
    )
    return s


def get(api_url: str, path: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{api_url}{path}", params=params, timeout=60)


def readings(api_url: str, s: Scene, **params: Any) -> list[dict[str, Any]]:
    response = get(api_url, f"/api/jobs/{s.job_id}/metrics", **params)
    assert response.status_code == 200, response.text
    return response.json()


def test_job_stored_with_expanded_nodes(api_url: str, scene: Scene) -> None:
    job = get(api_url, f"/api/jobs/{scene.job_id}").json()
    assert job["nodes"] == [scene.node1, scene.node2]  # hostlist expanded, domain dropped
    assert job["start"] == iso(START) and job["end"] == iso(END)
    assert job["state"] == "terminated" and job["user"] == "alice"


def test_scope_is_nodes_and_time_inclusive(api_url: str, scene: Scene) -> None:
    got = readings(api_url, scene, measuring="true")
    devices = {r["device_id"] for r in got}
    assert devices == {scene.node1, scene.node2, scene.pdu}  # never node3
    edges = [(r["timestamp"], r["value"]) for r in got if r["metric_id"] == "edge_watt"]
    assert edges == [(iso(START), 3.0), (iso(END), 4.0)]  # 1 µs outside: absent
    temps = [r for r in got if r["metric_id"] == "temp_celsius"]
    assert [(r["timestamp"], r["value"]) for r in temps] == [
        (iso(t), v) for t, v in sorted(scene.temps.items())
    ]
    assert [r["timestamp"] for r in got] == sorted(r["timestamp"] for r in got)


def test_aliased_devices_under_their_id_and_summed_under_the_node(
    api_url: str, scene: Scene
) -> None:
    got = readings(api_url, scene, metrics="pdu_*", measuring="true")
    own = [r for r in got if r["device_id"] == scene.pdu]
    assert {r["labels"]["outlet"] for r in own} == {"1", "2"}  # outlet 3 powers node3
    assert len(own) == 2 * 61
    assert all("_device_alias" not in r["labels"] for r in got)
    summed = [r for r in got if r["device_id"] == scene.node2]
    assert len(summed) == 61
    assert {r["value"] for r in summed} == {250.0}  # both PSUs' outlets, at each instant
    assert summed[0]["labels"] == {"source": "pdu", "_device_orig": [scene.pdu]}


def test_kwollect_query_by_job_id(api_url: str, scene: Scene) -> None:
    """/api/metrics?job_id= answers like /api/jobs/{id}/metrics; devices narrow it."""
    params = {"job_id": scene.job_id, "metrics": "temp_celsius,bmc_*"}
    via_kwollect = get(api_url, "/api/metrics", **params).json()
    assert via_kwollect == readings(api_url, scene, metrics="temp_celsius,bmc_*")
    narrowed = get(api_url, "/api/metrics", **params, nodes=f"{scene.node2}.site.org").json()
    assert {r["device_id"] for r in narrowed} == {scene.node2}
    # times narrow the scope, never widen it
    wide = get(api_url, "/api/metrics", **params, start_time="2000-01-01").json()
    assert wide == via_kwollect
    late = get(
        api_url, "/api/metrics", **params, start_time=(END - timedelta(seconds=1)).isoformat()
    ).json()
    assert {r["timestamp"] for r in late} == {iso(END - timedelta(seconds=1)), iso(END)}


def test_label_filter(api_url: str, scene: Scene) -> None:
    """Labels select readings before aliased ones are summed under their node."""
    got = readings(api_url, scene, label="outlet=2", measuring="true")
    assert {(r["device_id"], r["value"]) for r in got} == {(scene.pdu, 150.0), (scene.node2, 150.0)}
    assert readings(api_url, scene, label=["outlet=2", "source=nope"], measuring="true") == []


@pytest.mark.parametrize("fmt", ["json", "ndjson", "csv", "parquet", "arrow"])
def test_formats_parse_back_bit_for_bit(api_url: str, scene: Scene, fmt: str) -> None:
    response = get(api_url, f"/api/jobs/{scene.job_id}/metrics", metrics="temp_celsius", format=fmt)
    assert response.status_code == 200, response.text
    body = response.content
    if fmt == "json":
        rows = json.loads(body)
    elif fmt == "ndjson":
        rows = [json.loads(line) for line in body.splitlines()]
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(body.decode())))
        for r in rows:
            r["value"], r["labels"] = float(r["value"]), json.loads(r["labels"])
    else:
        table = (
            pyarrow.parquet.read_table(io.BytesIO(body))
            if fmt == "parquet"
            else pyarrow.ipc.open_stream(body).read_all()
        )
        rows = table.to_pylist()
        for r in rows:
            r["timestamp"] = iso(r["timestamp"].replace(tzinfo=None))
            r["labels"] = dict(r["labels"])
    expected = [(iso(t), v, {"sensor": "cpu"}) for t, v in sorted(scene.temps.items())]
    assert [(r["timestamp"], r["value"], r["labels"]) for r in rows] == expected


def test_format_by_accept_header(api_url: str, scene: Scene) -> None:
    path = f"{api_url}/api/jobs/{scene.job_id}/metrics"
    response = httpx.get(path, headers={"Accept": "text/csv"}, timeout=30)
    assert response.headers["content-type"].startswith("text/csv")
    response = httpx.get(path, headers={"Accept": "application/vnd.apache.parquet"}, timeout=30)
    assert response.content[:4] == b"PAR1"
    response = httpx.get(path, headers={"Accept": "image/png"}, timeout=30)
    assert response.status_code == 406 and "text/csv" in response.json()["error"]


def test_summary_stats_and_energy(api_url: str, scene: Scene) -> None:
    summary = get(api_url, f"/api/jobs/{scene.job_id}/summary").json()
    assert summary["duration_s"] == 60.0
    stats = {(m["device_id"], m["metric_id"]): m for m in summary["metrics"]}
    temps = [v for _, v in sorted(scene.temps.items())]
    t = stats[(scene.node1, "temp_celsius")]
    assert (t["min"], t["max"], t["last"], t["count"]) == (min(temps), max(temps), temps[-1], 61)
    assert t["avg"] == pytest.approx(sum(temps) / 61, rel=1e-12)
    energy = {(e["node"], e["metric_id"]): e for e in summary["energy"]}
    ramp = energy[(scene.node1, "bmc_power_watt")]  # 100+i W, i = 0..20 and 40..60
    assert ramp["joules"] == pytest.approx(
        (100 * 20 + 20**2 / 2) + (100 * 20 + (60**2 - 40**2) / 2)
    )
    assert ramp["covered_s"] == pytest.approx(40.0) and ramp["readings"] == 42
    assert energy[(scene.node2, "bmc_power_watt")]["joules"] == pytest.approx(250 * 60)
    pdu = energy[(scene.node2, "pdu_outlet_power_watt")]
    assert pdu["joules"] == pytest.approx(250 * 60) and pdu["sources"] == [scene.pdu]
    assert (scene.node1, "edge_watt") in energy
    totals = {e["metric_id"]: e for e in summary["energy_total"]}
    assert totals["bmc_power_watt"]["joules"] == pytest.approx(ramp["joules"] + 250 * 60)
    assert totals["bmc_power_watt"]["nodes"] == 2


def test_kwollect_summary_flag(api_url: str, scene: Scene) -> None:
    """summary=true: 5-minute buckets (the job's minute lies in one), mean of each series."""
    got = get(api_url, "/api/metrics", job_id=scene.job_id, metrics="temp_celsius", summary="true")
    rows = got.json()
    assert len(rows) == 1 and rows[0]["timestamp"] == iso(datetime(2026, 11, 20, 10, 0))
    assert rows[0]["value"] == pytest.approx(sum(scene.temps.values()) / 61, rel=1e-12)


def test_catalog(api_url: str, scene: Scene) -> None:
    catalog = get(api_url, f"/api/jobs/{scene.job_id}/catalog").json()
    entry = {(c["device_id"], c["metric_id"]): c for c in catalog}
    assert set(entry) == {
        (scene.node1, "temp_celsius"),
        (scene.node1, "bmc_power_watt"),
        (scene.node1, "edge_watt"),
        (scene.node2, "bmc_power_watt"),
        (scene.node2, "pdu_outlet_power_watt"),
        (scene.pdu, "pdu_outlet_power_watt"),
    }
    assert entry[(scene.node1, "temp_celsius")] == {
        "device_id": scene.node1,
        "metric_id": "temp_celsius",
        "count": 61,
        "first": iso(START),
        "last": iso(END),
        "unit": "Cel",
        "kind": "gauge",
        "scope": "device",
        "description": "no registry entry: unit and kind inferred from the name",
        "inferred": True,
    }


def test_latest_and_devices(api_url: str, scene: Scene) -> None:
    latest = get(api_url, f"/api/devices/{scene.node1}/latest").json()
    temp = next(r for r in latest if r["metric_id"] == "temp_celsius")
    assert temp["timestamp"] == iso(END + timedelta(seconds=10))
    devices = {d["device_id"]: d for d in get(api_url, "/api/devices").json()}
    assert devices[scene.node1]["metrics"] == 3
    assert devices[scene.pdu]["last_reading"] == iso(END)
    missing = get(api_url, "/api/devices/no-such-device/latest")
    assert missing.status_code == 404 and "no-such-device" in missing.json()["error"]


def test_kwollect_rpc_paths(api_url: str, scene: Scene) -> None:
    """Scripts written against Kwollect's PostgREST paths work unchanged."""
    params = {"job_id": scene.job_id, "metrics": "temp_celsius"}
    assert get(api_url, "/rpc/get_metrics", **params).json() == readings(
        api_url, scene, metrics="temp_celsius"
    )
    at = (END + timedelta(seconds=30)).isoformat()
    available = get(
        api_url, "/rpc/available_metrics", at=at, params=f'{{"job_id": "{scene.job_id}"}}'
    )
    assert available.status_code == 200, available.text
    pairs = {(a["device_id"], a["metric_id"]) for a in available.json()}
    assert (scene.node1, "temp_celsius") in pairs  # at the job's end, not 30 s later
    assert (scene.node2, "pdu_outlet_power_watt") in pairs  # aliased, under the node
    assert all(d != scene.node3 for d, _ in pairs)
    by_devices = get(
        api_url, "/rpc/available_metrics", at=at, params=f'{{"devices": ["{scene.node3}"]}}'
    ).json()
    assert [(a["device_id"], a["metric_id"], a["unit"]) for a in by_devices] == [
        (scene.node3, "pdu_outlet_power_watt", "W"),  # outlet 3 of the PDU powers node3
        (scene.node3, "temp_celsius", "Cel"),
    ]
    bad = get(api_url, "/rpc/available_metrics", params="{not json")
    assert bad.status_code == 400 and bad.json()["parameter"] == "params"
    past = get(api_url, "/rpc/available_metrics", at="2020-01-01T00:00:00")
    assert past.status_code == 400 and "devices or job_id" in past.json()["error"]
