"""Stepped answers in Kwollect's order and shape: rows by time, device and metric (byte
order of the ids), labels as Kwollect has them, values equal to the same aggregate computed
here from the readings. The ids' insertion order differs from their sorted order (and an
upper-case id sorts first), one device has two series of a metric, a PDU's outlets are
summed under the node they feed and answered under the PDU too (`measuring=true`), and the
job starts and ends mid-minute. Checked while the minutes are pending in the 1-minute
rollup (raw readings), once the rollup holds them (a row per minute and series, no
merging), and after a late reading recomputes a rolled-up minute: the rollup then holds
that minute twice until its rows merge, which `stepped_rows` must count once even for a
client without the API's `final` setting."""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
from clickhouse_connect.driver.client import Client

from api import formats
from api.queries.metrics import Selection, aliased_devices, projected, stepped_rows
from tests.conftest import wait_for_rollups

from .conftest import Row, iso

BASE = datetime(2026, 11, 23, 9, 0, 0)
START, END = BASE + timedelta(seconds=25), BASE + timedelta(minutes=4, seconds=35)


def _readings(tag: str) -> tuple[list[str], str, list[Row]]:
    """The job's nodes (in insertion order), the PDU and readings every 10 s for 5 minutes."""
    nodes = [f"{tag}-b", f"{tag}-a", f"{tag}-C"]
    pdu = f"{tag}-pdu"
    rows: list[Row] = []
    for i in range(30):
        t = BASE + timedelta(seconds=10 * i, microseconds=i)
        for n, node in enumerate(nodes):
            for m, metric in enumerate(("zeta_watt", "alpha_watt", "Beta_watt")):
                rows.append([t, node, metric, float(100 * n + 10 * m + i % 7), {"src": "bmc"}])
        rows.append([t, nodes[0], "alpha_watt", 5.0 + i % 3, {"src": "bmc", "psu": "2"}])
        for outlet in (1, 2):
            labels = {"outlet": str(outlet), "src": "pdu", "_device_alias": nodes[1]}
            rows.append([t, pdu, "pdu_watt", 10.0 * outlet + i % 4, labels])
    return nodes, pdu, rows


def _minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def _expected(nodes: list[str], pdu: str, rows: list[Row]) -> list[tuple[Any, ...]]:
    """(timestamp, device_id, metric_id, labels as JSON, mean) of every series and minute,
    in the answer's order (series of one device, metric and minute in label order)."""
    series: dict[tuple[Any, ...], list[float]] = {}
    summed: dict[tuple[datetime, str], dict[datetime, float]] = {}
    for t, device, metric, value, labels in rows:
        if not START <= t <= END:
            continue
        shown = {k: v for k, v in labels.items() if k != "_device_alias"}
        key = (iso(_minute(t)), device, metric, orjson.dumps(shown, option=orjson.OPT_SORT_KEYS))
        series.setdefault(key, []).append(value)
        if device == pdu:  # outlets summed at each instant, then averaged per minute
            at = summed.setdefault((_minute(t), labels["_device_alias"]), {})
            at[t] = at.get(t, 0.0) + value
    out = [(*key, statistics.fmean(values)) for key, values in series.items()]
    node_labels = orjson.dumps({"src": "pdu", "_device_orig": [pdu]}, option=orjson.OPT_SORT_KEYS)
    for (minute, node), at in summed.items():
        out.append((iso(minute), node, "pdu_watt", node_labels, statistics.fmean(at.values())))
    assert {node for _, node, *_ in out} == {*nodes, pdu}
    return sorted(out, key=lambda r: (r[0], r[1].encode(), r[2].encode(), r[3]))


def _as_rows(answer: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (
            r["timestamp"],
            r["device_id"],
            r["metric_id"],
            orjson.dumps(r["labels"], option=orjson.OPT_SORT_KEYS),
            r["value"],
        )
        for r in answer
    ]


def _assert_answer(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    assert [r[:3] for r in got] == [r[:3] for r in want]  # the order (ties: by labels here)
    by_series = sorted(got, key=lambda r: r[:4])
    assert [r[:4] for r in by_series] == [w[:4] for w in want]
    for g, w in zip(by_series, want, strict=True):
        assert g[4] == pytest.approx(w[4], rel=1e-9), (g, w)


def _check(
    api_url: str, admin_client: Client, job: str, nodes: list[str], want: list[tuple]
) -> None:
    answer = httpx.get(
        f"{api_url}/api/jobs/{job}/metrics",
        params={"step": "1m", "agg": "avg", "measuring": "true"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    _assert_answer(_as_rows(answer.json()), want)
    # the same SQL from a client that reads without the API profile's `final` setting
    aliased = aliased_devices(admin_client, nodes, START, END)
    selection = Selection(tuple(nodes), START, END, measured=True, aliased=aliased)
    params: dict[str, Any] = {}
    fmt = formats.FORMATS["json"]
    sql = projected(stepped_rows(selection, 60, "avg", params), fmt.timestamp, fmt.labels)
    lines = admin_client.raw_query(sql, parameters=params, fmt="JSONEachRow").splitlines()
    _assert_answer(_as_rows([orjson.loads(line) for line in lines]), want)


def test_steps_in_kwollect_order_and_shape(
    api_url: str,
    admin_client: Client,
    insert_readings: Callable[[list[Row]], None],
    post_job: Callable[..., Any],
) -> None:
    nodes, pdu, rows = _readings(f"so{uuid.uuid4().hex[:6]}")
    insert_readings(rows)
    job = f"{uuid.uuid4().int % 10**9}"
    post_job(
        job_id=job,
        nodes=nodes,
        start=START.isoformat(),
        end=END.isoformat(),
        state="terminated",
    )
    want = _expected(nodes, pdu, rows)
    _check(api_url, admin_client, job, nodes, want)  # pending: from raw readings
    per_node = {n: sum(1 for r in rows if r[1] == n) for n in [*nodes, pdu]}
    for device, count in per_node.items():
        wait_for_rollups(admin_client, device, count)
    _check(api_url, admin_client, job, nodes, want)  # from the rollup
    # a late reading for a rolled-up minute: the minute is computed again
    late = [BASE + timedelta(minutes=2, seconds=5), nodes[2], "zeta_watt", 1000.0, {"src": "bmc"}]
    insert_readings([late])
    rows.append(late)
    wait_for_rollups(admin_client, nodes[2], per_node[nodes[2]] + 1)
    _check(api_url, admin_client, job, nodes, _expected(nodes, pdu, rows))
