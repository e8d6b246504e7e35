"""Summaries read with the metric registry: counters give their increase across a Counter32
wrap and a reset (as as_rate reads them), gauges their p95, every row its unit and kind;
energy per node and source, the preferred source by the registry's energy_priority, the
spread between two sources measuring one node, energy counters (RAPL) as energy rows, and
the job's energy. Readings are crafted into `metrics`; the job goes through the real API."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from clickhouse_connect.driver.client import Client

from api.queries.summary import summarise
from api.schemas import Job, JobState
from api.scope import EVERYTHING, job_selection
from tests.api.conftest import Row

START = datetime(2026, 11, 21, 8, 0, 0)
END = START + timedelta(seconds=60)
WRAP = 2**32
WHOLE = {"policy": "exclusive", "attribution": "exclusive", "share": 1.0}
"""A job's energy under the default sharing policy: its nodes' whole (api/sharing.py)."""
# a Counter32 near its top, its wrap, a reset (restart from 0), and growth: +2630 in all
COUNTER = [(0, WRAP - 1000), (1, WRAP - 100), (2, 100), (3, 1100), (4, 30), (5, 530)]
COUNTER_DELTA = 900 + 200 + 1000 + 30 + 500


def summary(api_url: str, job_id: str, **params: Any) -> dict[str, Any]:
    response = httpx.get(f"{api_url}/api/jobs/{job_id}/summary", params=params, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def job(
    insert_readings: Callable[[list[Row]], None], post_job: Callable[..., dict[str, Any]]
) -> tuple[str, str, str]:
    """A one-node job: a wrapping and reset counter, temperatures 1..61, the node's power by
    its BMC (200 W) and by a PDU outlet aliased to it (210 W), and RAPL at 50 J/s."""
    p = f"sr{uuid.uuid4().hex[:6]}"
    node, pdu, job_id = f"{p}-node-1", f"{p}-pdu", f"{p}_1"
    rows: list[Row] = [
        [START + timedelta(seconds=s), node, "net_if_in_bytes_total", float(v), {"if": "eth0"}]
        for s, v in COUNTER
    ]
    for i in range(61):
        t = START + timedelta(seconds=i)
        rows += [[t, node, "cpu_temp_celsius", float(i + 1), {}]]
        rows += [[t, node, "bmc_power_watt", 200.0, {}]]
        rows += [[t, pdu, "pdu_outlet_power_watt", 210.0, {"outlet": "1", "_device_alias": node}]]
        rows += [[t, node, "node_rapl_package_joules_total", 1e6 + 50.0 * i, {"package": "0"}]]
    insert_readings(rows)
    post_job(
        job_id=job_id,
        user="alice",
        nodes=[node],
        start=START.isoformat() + "Z",
        end=END.isoformat() + "Z",
        state="terminated",
    )
    return job_id, node, pdu


def test_counter_across_wrap_and_reset(api_url: str, job: tuple[str, str, str]) -> None:
    job_id, node, _ = job
    rows = {(m["device_id"], m["metric_id"]): m for m in summary(api_url, job_id)["metrics"]}
    counter = rows[(node, "net_if_in_bytes_total")]
    assert counter["kind"] == "counter" and counter["unit"] == "B"
    assert counter["delta"] == COUNTER_DELTA
    assert counter["resets"] == 1
    assert counter["rate"] == pytest.approx(COUNTER_DELTA / 5)
    assert counter["p95"] is None
    # as_rate reads the same series the same way: its rates times their intervals add up
    response = httpx.get(
        f"{api_url}/api/jobs/{job_id}/metrics",
        params={"metrics": "net_if_in_bytes_total", "as_rate": "true"},
        timeout=30,
    )
    rates = [r["value"] for r in response.json() if r["value"] is not None]
    assert sum(rates) == pytest.approx(COUNTER_DELTA)  # readings 1 s apart


def test_gauge_has_p95_and_unit(api_url: str, job: tuple[str, str, str]) -> None:
    job_id, node, _ = job
    rows = {(m["device_id"], m["metric_id"]): m for m in summary(api_url, job_id)["metrics"]}
    temp = rows[(node, "cpu_temp_celsius")]
    values = sorted(float(i + 1) for i in range(61))
    assert temp["p95"] == values[int(0.95 * len(values))]
    assert (temp["kind"], temp["unit"], temp["delta"], temp["rate"]) == ("gauge", "Cel", None, None)


def test_energy_per_source_preferred_and_spread(api_url: str, job: tuple[str, str, str]) -> None:
    job_id, node, pdu = job
    got = summary(api_url, job_id)
    energy = {e["metric_id"]: e for e in got["energy"] if e["node"] == node}
    assert set(energy) == {
        "bmc_power_watt",
        "pdu_outlet_power_watt",
        "node_rapl_package_joules_total",
    }
    bmc, outlet = energy["bmc_power_watt"], energy["pdu_outlet_power_watt"]
    rapl = energy["node_rapl_package_joules_total"]
    assert (bmc["joules"], bmc["role"], bmc["preferred"]) == (12000.0, "bmc", False)
    assert (outlet["joules"], outlet["role"], outlet["preferred"]) == (12600.0, "pdu", True)
    assert outlet["sources"] == [pdu]
    # an energy counter: its increase is the energy of the node's CPU package
    assert (rapl["joules"], rapl["role"], rapl["preferred"]) == (3000.0, "rapl", False)
    (per_node,) = got["energy_nodes"]
    assert per_node["node"] == node and per_node["metric_id"] == "pdu_outlet_power_watt"
    assert per_node["joules"] == 12600.0 and per_node["coverage"] == 1.0
    # RAPL measures a part of the node: not compared with the whole-node sources
    assert per_node["sources_count"] == 2
    assert per_node["spread"] == {
        "min_joules": 12000.0,
        "max_joules": 12600.0,
        "relative": pytest.approx(600 / 12600),
    }
    assert got["energy_job"] == {"joules": 12600.0, "role": "pdu", "coverage": 1.0, "nodes": 1} | (
        WHOLE | {"node_joules": 12600.0}
    )


def test_a_node_without_energy_makes_the_coverage_zero(
    api_url: str,
    insert_readings: Callable[[list[Row]], None],
    post_job: Callable[..., dict[str, Any]],
) -> None:
    """Two nodes, one measured: the job's energy is that node's, its coverage 0 (the other
    node's time is not measured at all)."""
    p = f"sr{uuid.uuid4().hex[:6]}"
    rows: list[Row] = [
        [START + timedelta(seconds=i), f"{p}-node-1", "bmc_power_watt", 100.0, {}]
        for i in range(61)
    ]
    insert_readings(rows)
    post_job(
        job_id=f"{p}_2",
        user="alice",
        nodes=[f"{p}-node-1", f"{p}-node-2"],
        start=START.isoformat() + "Z",
        end=END.isoformat() + "Z",
        state="terminated",
    )
    got = summary(api_url, f"{p}_2")
    assert got["energy_job"] == {"joules": 6000.0, "role": "bmc", "coverage": 0.0, "nodes": 1} | (
        WHOLE | {"node_joules": 6000.0}
    )
    assert got["energy_nodes"][0]["spread"] is None


def test_pushed_power_never_becomes_the_nodes_energy(
    api_url: str,
    insert_readings: Callable[[list[Row]], None],
    post_job: Callable[..., dict[str, Any]],
) -> None:
    """The attack: a user pushes a "wattmeter" power for their node (the registry's first
    energy role) to choose their job's energy. Pushed values keep their own row, marked, and
    never become the node's preferred source, its spread or the job's energy."""
    p = f"sr{uuid.uuid4().hex[:6]}"
    node = f"{p}-node-1"
    bmc: list[Row] = [
        [START + timedelta(seconds=i), node, "bmc_power_watt", 100.0, {}] for i in range(61)
    ]
    rows = bmc + [
        [START + timedelta(seconds=i), node, "wattmetre_power_watt", 1.0, {"source": "user:eve"}]
        for i in range(61)
    ]
    insert_readings(rows)
    post_job(
        job_id=f"{p}_3",
        user="eve",
        nodes=[node],
        start=START.isoformat() + "Z",
        end=END.isoformat() + "Z",
        state="terminated",
    )
    got = summary(api_url, f"{p}_3")
    pushed = [e for e in got["energy"] if e["pushed"]]
    assert [(e["metric_id"], e["joules"], e["preferred"]) for e in pushed] == [
        ("wattmetre_power_watt", 60.0, False)
    ]
    (per_node,) = got["energy_nodes"]
    assert (per_node["metric_id"], per_node["joules"], per_node["spread"]) == (
        "bmc_power_watt",
        6000.0,
        None,
    )
    assert got["energy_job"]["joules"] == 6000.0


class Counting:
    """The reader client, counting the summary's scans (the one spied part)."""

    def __init__(self, client: Client) -> None:
        self.client, self.scans = client, 0

    def raw_query(self, sql: str, **kwargs: Any) -> bytes:
        self.scans += "power_series" in sql
        return self.client.raw_query(sql, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


@pytest.mark.parametrize("known", [False, True], ids=["too-new", "known"])
def test_a_counter_is_summed_as_such_whether_or_not_it_is_known_yet(
    known: bool,
    admin_client: Client,
    reader_client: Client,
    insert_readings: Callable[[list[Row]], None],
) -> None:
    """The metrics' kinds come from metrics_latest, which the 1-minute rollups feed: a counter
    it does not hold yet is found in the scan's rows and the scan taken again as a counter's;
    one it holds is read so at once."""
    node = f"sk{uuid.uuid4().hex[:6]}-node"
    insert_readings(
        [[START + timedelta(seconds=s), node, "sk_bytes_total", float(v), {}] for s, v in COUNTER]
    )
    if known:  # as the rollups' refresh would have written it
        admin_client.insert(
            "metrics_latest",
            [[node, "sk_bytes_total", 0, START, 0.0, {}]],
            column_names=["device_id", "metric_id", "labels_hash", "timestamp", "value", "labels"],
        )
    stored = Job(
        job_id=node,
        user="alice",
        project="",
        queue="default",
        nodes=[node],
        start=START.isoformat() + "Z",
        end=END.isoformat() + "Z",
        state=JobState.TERMINATED,
        site="",
        labels={},
        updated_at=END.isoformat() + "Z",
    )
    counting = Counting(reader_client)
    summary = summarise(counting, stored, job_selection(stored, EVERYTHING))  # type: ignore[arg-type]
    (row,) = summary["metrics"]
    assert (row["kind"], row["delta"], row["resets"]) == ("counter", COUNTER_DELTA, 1)
    assert counting.scans == (1 if known else 2)
