"""The report's plotted series (api/queries/report.py `node_series`: one query for every
metric, the pending buckets' condition left out when none is pending) answer exactly what
the shared stepped readings path (`stepped_rows`) answers, summed and averaged per node:
while the job's minutes are still pending in the 1-minute rollup, once the rollup holds
them, and with no rollup (a step none tiles). The data has what each shortcut could get
wrong: a node with two series of one metric (sum and mean differ), a non-finite reading,
a PDU whose outlets are summed under the nodes they feed, a job node that is also aliased
to another job node, a counter (last value per bucket) that resets, and ragged ends."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from api.footprint import scales_of
from api.infra.params import NamePatterns
from api.queries.footprint import footprint_rows
from api.queries.metrics import Selection, aliased_devices, pending_in_span, stepped_rows
from api.queries.report import node_series
from stack.processes import wait_until
from tests.conftest import wait_for_rollups

from .conftest import Row

AGGS = {"bmc_power_watt": "avg", "pdu_power_watt": "avg", "net_bytes_total": "last"}
PERIOD_S = 10
STEP_S = 120  # tiled by the 1-minute rollup
RAW_STEP_S = 70  # tiled by no rollup


def _rows(tag: str, base: datetime) -> dict[str, list[Row]]:
    """Readings by device, every PERIOD_S s over 20 minutes from `base`."""
    a, b, c, pdu = (f"rs{tag}-{n}" for n in ("node-a", "node-b", "node-c", "pdu"))
    out: dict[str, list[Row]] = {a: [], b: [], c: [], pdu: []}
    for i in range(20 * 60 // PERIOD_S):
        t = base + timedelta(seconds=i * PERIOD_S, microseconds=1000 * (i % 7))
        out[a].append([t, a, "bmc_power_watt", 100.0 + i % 13, {"psu": "1"}])
        nan = i == 40
        out[a].append([t, a, "bmc_power_watt", math.nan if nan else 50.0 + i % 5, {"psu": "2"}])
        out[a].append([t, a, "net_bytes_total", 1000.0 * (i % 50) + 3.5 * i, {}])
        out[b].append([t, b, "bmc_power_watt", 200.0 + i % 11, {}])
        # node C measures node B (its own rows and, summed under B, an alias row)
        out[c].append([t, c, "pdu_power_watt", 30.0 + i % 3, {"_device_alias": b}])
        for outlet, node in ((1, a), (2, a), (3, b)):
            labels = {"outlet": str(outlet), "_device_alias": node}
            out[pdu].append([t, pdu, "pdu_power_watt", 10.0 * outlet + i % 4, labels])
    return out


def _expected(client: Client, selection: Selection, step_s: int) -> dict[tuple, tuple]:
    """Per (node, metric): times (Unix ms), sums and means of `stepped_rows`' finite rows."""
    points: dict[tuple[str, str], dict[int, list[float]]] = {}
    for metric, agg in AGGS.items():
        narrowed = Selection(
            selection.devices,
            selection.start,
            selection.end,
            NamePatterns((metric,)),
            only=selection.devices,
            aliased=selection.aliased,
        )
        params: dict[str, Any] = {}
        sql = (
            "SELECT device_id, metric_id, toUnixTimestamp64Milli(ts), value "
            f"FROM ({stepped_rows(narrowed, step_s, agg, params)})"
        )
        for device, metric_id, t, value in client.query(sql, parameters=params).result_rows:
            if math.isfinite(value):
                points.setdefault((device, metric_id), {}).setdefault(t, []).append(value)
    return {
        key: (
            sorted(at),
            [sum(at[t]) for t in sorted(at)],
            [sum(at[t]) / len(at[t]) for t in sorted(at)],
        )
        for key, at in points.items()
    }


def _assert_same(client: Client, selection: Selection, step_s: int) -> None:
    expected = _expected(client, selection, step_s)
    got = {
        (r["device_id"], r["metric_id"]): (r["t"], r["sum"], r["avg"])
        for r in node_series(client, selection, AGGS, step_s)
    }
    assert set(got) == set(expected)
    for key, (t, sums, means) in expected.items():
        assert got[key][0] == t, key
        assert got[key][1] == pytest.approx(sums, rel=1e-12), key
        assert got[key][2] == pytest.approx(means, rel=1e-12), key


def _pending(client: Client, selection: Selection, step_s: int) -> bool:
    params: dict[str, Any] = {}
    sql = pending_in_span(selection, step_s, params)
    assert sql is not None
    return bool(client.command(sql, parameters=params))


@pytest.mark.slow
def test_node_series_answer_as_the_stepped_path(
    admin_client: Client, reader_client: Client, insert_readings: Callable[[list[Row]], None]
) -> None:
    # Notes of an insert stay pending until the refresh after the next minute starts (+10 s):
    # inserted before second 40, they are pending for 30 s at least.
    wait_until(lambda: datetime.now(UTC).second < 40, 30, "a minute's first 40 seconds")
    tag = uuid.uuid4().hex[:6]
    base = (datetime.now(UTC) - timedelta(hours=2)).replace(tzinfo=None, second=0, microsecond=0)
    rows = _rows(tag, base)
    insert_readings([r for device in rows.values() for r in device])
    nodes = tuple(d for d in rows if "-node-" in d)
    start = base + timedelta(minutes=2, seconds=17, microseconds=500_000)
    end = base + timedelta(minutes=16, seconds=41)
    selection = Selection(
        nodes, start, end, aliased=aliased_devices(admin_client, list(nodes), start, end)
    )
    assert set(selection.aliased) == {f"rs{tag}-pdu", f"rs{tag}-node-c"}

    assert _pending(reader_client, selection, STEP_S)
    _assert_same(reader_client, selection, STEP_S)
    assert _pending(reader_client, selection, STEP_S), "the refresh ran: pending path untested"

    for device, readings in rows.items():
        wait_for_rollups(admin_client, device, len(readings))
    assert not _pending(reader_client, selection, STEP_S)
    _assert_same(reader_client, selection, STEP_S)
    _assert_same(reader_client, selection, RAW_STEP_S)
    _assert_footprint_sums_a_nodes_psus(reader_client, selection)


def _assert_footprint_sums_a_nodes_psus(client: Client, selection: Selection) -> None:
    """The footprint from the rollups combines node A's two PSUs by the registry's
    aggregation (bmc_power_watt: sum, about 158 W, in the tenths 1 and 2 between idle 100 W
    and peak 400 W); averaged, they would sit under idle (tenth 0)."""
    scales = scales_of(["bmc_power_watt"])
    rows = footprint_rows(client, selection, scales, True)
    (node_a,) = [r for r in rows if r["node"] == selection.devices[0]]
    seconds = node_a["deciles"]
    assert sum(seconds[1:3]) >= 0.9 * sum(seconds) > 0, seconds
