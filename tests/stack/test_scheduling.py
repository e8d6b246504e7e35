"""How the suite is spread over xdist workers (tests/scheduling.py): which tests share a unit,
and the order units go out in, the disruptive one last on the first worker."""

from __future__ import annotations

from collections import OrderedDict, defaultdict

from tests.scheduling import DISRUPTIVE, SuiteScheduling, unit_of


def test_units_are_modules_shared_set_ups_or_the_disruptive_tests() -> None:
    assert unit_of("tests/api/test_push.py::test_x[a]") == "tests/api/test_push.py"
    assert unit_of("tests/superset/test_dashboards.py::test_y") == "superset"
    assert unit_of("tests/connectors/test_oar_cdc.py::test_z") == "connect"
    assert (
        unit_of("tests/connectors/test_multisite.py::test_z")
        == "tests/connectors/test_multisite.py"
    )
    assert unit_of(f"tests/api/test_limits.py::test_frozen@{DISRUPTIVE}") == DISRUPTIVE


def plan(weights: dict[str, float], workers: int) -> dict[str, list[str]]:
    """The units each worker gets, asking in turn, as xdist's loop would (without xdist)."""
    scheduler = SuiteScheduling.__new__(SuiteScheduling)
    scheduler.weights, scheduler.unknown = weights, 1.0
    scheduler.given, scheduler.share = defaultdict(float), 0.0
    scheduler.assigned_work = {f"gw{i}": {} for i in range(workers)}  # type: ignore[misc]
    scheduler.workqueue = OrderedDict((unit, {}) for unit in weights)
    got: dict[str, list[str]] = {f"gw{i}": [] for i in range(workers)}
    done: set[str] = set()
    while scheduler.workqueue:
        worker = min(sorted(set(got) - done), key=lambda w: scheduler.given[w])  # least loaded
        unit = scheduler._next_unit(worker)
        scheduler.given[worker] += scheduler.weight(unit)
        del scheduler.workqueue[unit]
        got[worker].append(unit)
        if unit == DISRUPTIVE:
            done.add(worker)
    return got


def test_the_heaviest_go_first_and_the_disruptive_unit_last_on_the_first_worker() -> None:
    weights = {"a": 10.0, "b": 200.0, "c": 120.0, DISRUPTIVE: 150.0, "d": 30.0, "e": 90.0}
    got = plan(weights, 3)
    assert got["gw0"] == ["d", "a", DISRUPTIVE]
    assert all(DISRUPTIVE not in units for worker, units in got.items() if worker != "gw0")
    share = sum(weights.values()) / 3
    assert sum(weights[u] for u in got["gw0"]) <= share + min(weights.values())
    firsts = [units[0] for units in got.values()]
    assert "b" in firsts and "c" in firsts  # the two heaviest other units start at once


def test_without_room_the_disruptive_unit_comes_first_and_alone() -> None:
    got = plan({DISRUPTIVE: 500.0, "a": 100.0, "b": 100.0}, 2)
    assert got["gw0"] == [DISRUPTIVE]
    assert sorted(got["gw1"]) == ["a", "b"]
