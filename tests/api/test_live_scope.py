"""The live stream's scope rules (api/live/scope.py) on readings built here: the same rows as
the readings query would show, so that a live stream and `/api/jobs/{id}/metrics` agree."""

from __future__ import annotations

from api.infra.params import parse_patterns
from api.live.scope import LiveScope, Seam, glob_regex
from kafka.message import iso_us
from kafka.reading import Reading

T = 1_795_400_000_123_456


def test_iso_us_is_the_api_timestamp() -> None:
    assert iso_us(T) == "2026-11-23T02:13:20.123456+00:00"  # date -u -d @1795400000
    assert iso_us(0) == "1970-01-01T00:00:00.000000+00:00"


def test_globs_and_names() -> None:
    pattern = glob_regex(parse_patterns("metrics", "bmc_*,cpu_load,prom_node_load?,a%b_c"))
    assert pattern is not None
    matches = {
        name: bool(pattern.match(name))
        for name in ("bmc_power_watt", "cpu_load", "cpu_load1", "prom_node_load1", "a%b_c", "axb_c")
    }
    assert matches == {
        "bmc_power_watt": True,
        "cpu_load": True,
        "cpu_load1": False,
        "prom_node_load1": True,
        "a%b_c": True,
        "axb_c": False,
    }
    assert glob_regex(parse_patterns("metrics", None)) is None


def test_scope_rows_alias_sums_filters_and_seam() -> None:
    scope = LiveScope(frozenset({"n1", "n2"}), start_us=T - 10, end_us=T + 10)
    readings = [
        Reading(T, "n1", "load", 1.0, {}),
        Reading(T, "n3", "load", 1.0, {}),
        Reading(T - 11, "n1", "load", 1.0, {}),
        Reading(T + 11, "n1", "load", 1.0, {}),
        Reading(T, "pdu", "power_watt", 3.0, {"outlet": "1", "_device_alias": "n2", "r": "a"}),
        Reading(T, "pdu", "power_watt", 4.0, {"outlet": "2", "_device_alias": "n2", "r": "a"}),
        Reading(T, "pdu", "power_watt", 9.0, {"outlet": "3", "_device_alias": "n3"}),
    ]
    rows = scope.rows(readings)
    ts = iso_us(T)
    assert rows == [
        {"timestamp": ts, "device_id": "n1", "metric_id": "load", "value": 1.0, "labels": {}},
        {
            "timestamp": ts,
            "device_id": "n2",
            "metric_id": "power_watt",
            "value": 7.0,
            "labels": {"r": "a", "_device_orig": "pdu"},
        },
        {
            "timestamp": ts,
            "device_id": "pdu",
            "metric_id": "power_watt",
            "value": 3.0,
            "labels": {"outlet": "1", "r": "a"},
        },
        {
            "timestamp": ts,
            "device_id": "pdu",
            "metric_id": "power_watt",
            "value": 4.0,
            "labels": {"outlet": "2", "r": "a"},
        },
    ]
    scope.metrics = glob_regex(parse_patterns("metrics", "power_*"))
    scope.only = frozenset({"n2"})
    assert [r["device_id"] for r in scope.rows(readings)] == ["n2"]

    seam = Seam()
    seam.note(rows)
    scope.metrics, scope.only = None, frozenset()
    later = Reading(T + 1, "n1", "load", 2.0, {})
    again = scope.rows([*readings, later], seam)
    assert [(r["device_id"], r["value"]) for r in again] == [("n1", 2.0)]
