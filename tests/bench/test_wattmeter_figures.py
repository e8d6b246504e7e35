"""The wattmeter step's ratio of jobscope to Kwollect (bench/polling/wattmeter.py) is taken at
equal load only: a collector's readings per CPU-second grow with its load (fixed costs
amortised), so jobscope at 160 meters beside Kwollect at 40 would flatter jobscope. The
collectors' results are as `_run` records them; no collector runs here."""

from __future__ import annotations

from typing import Any

from bench.polling import wattmeter


def _result(meters: int, per_core_s: float, completeness: float = 1.0) -> dict[str, Any]:
    return {"meters": meters, "readings_per_core_s": per_core_s, "completeness": completeness}


def test_the_ratio_is_taken_at_kwollects_load() -> None:
    """jobscope at its own load for its goal, at Kwollect's for the ratio."""
    figures = wattmeter.figures(
        {
            "jobscope": _result(160, 400_000.0),
            "jobscope_at_kwollect_load": _result(40, 300_000.0),
            "kwollector_wattmetre": _result(40, 150_000.0),
        }
    )
    assert figures["wattmeter_readings_per_core_s"] == 400_000.0
    assert figures["wattmeter_goal_met"] is True
    assert figures["wattmeter_vs_kwollector"] == 2.0
    assert figures["wattmeter_vs_kwollector_meters"] == 40
    assert figures["kwollector_wattmetre_kept_up"] is True


def test_no_ratio_between_unequal_loads() -> None:
    figures = wattmeter.figures(
        {"jobscope": _result(160, 400_000.0), "kwollector_wattmetre": _result(40, 150_000.0)}
    )
    assert figures["wattmeter_vs_kwollector"] is None
    assert figures["wattmeter_vs_kwollector_meters"] is None


def test_a_peer_behind_its_load_is_flagged() -> None:
    figures = wattmeter.figures(
        {"jobscope": _result(40, 400_000.0), "kwollector_wattmetre": _result(40, 200_000.0, 0.8)}
    )
    assert figures["wattmeter_vs_kwollector"] == 2.0
    assert figures["kwollector_wattmetre_kept_up"] is False
