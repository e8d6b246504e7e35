"""The suite's port table (tests/ports.py): no two names share a port, in one worker's block
or across workers, none reaches the kernel's ephemeral range or a port of `make up`, and
every test takes its ports from the table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stack.config import StackSettings
from tests import ports

TESTS = Path(__file__).resolve().parents[1]
# What `make up` listens on (stack/config.py's defaults, Superset, AUTH=oidc's provider, the
# sample fleet's simulators).
MAKE_UP = {8000, 8088, 8123, 8180, 9001, 9092, 9093, 9464, 11090, 11161, 11162, 11400, 12001, 12002}


def every_port(shift: int, workers: int, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    monkeypatch.setenv("JOBSCOPE_TEST_PORT_SHIFT", str(shift))
    taken = []
    for worker in range(workers):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        taken += [(f"gw{worker}:{name}", p) for name in ports.TABLE for p in ports.ports(name)]
    return taken


def test_no_port_is_taken_twice_by_any_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = every_port(0, ports.MAX_WORKERS, monkeypatch)
    owners: dict[int, list[str]] = {}
    for owner, p in taken:
        owners.setdefault(p, []).append(owner)
    shared = {p: names for p, names in owners.items() if len(names) > 1}
    assert not shared, f"ports taken twice: {shared}"
    assert max(offset + count for offset, count in ports.TABLE.values()) <= ports.BLOCK


def test_ports_stay_below_the_ephemeral_range_and_off_make_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    taken = [p for _, p in every_port(0, ports.MAX_WORKERS, monkeypatch)]
    assert max(taken) < ephemeral, f"port {max(taken)} is in the ephemeral range ({ephemeral}+)"
    assert not MAKE_UP & set(taken), f"ports of `make up`: {sorted(MAKE_UP & set(taken))}"


def test_a_stack_of_the_table_uses_only_its_own_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    settings = ports.stack_settings("kafka-cluster", kafka_brokers=3)
    used = {settings.clickhouse_port, settings.api_port, settings.producer_metrics_port}
    for node in range(1, 4):
        used |= set(settings.kafka_node_ports(node))
    assert used == set(ports.ports("kafka-cluster"))
    assert isinstance(settings, StackSettings) and settings.state_dir.name.endswith(
        str(ports.port("kafka-cluster"))
    )


def test_tests_take_their_ports_from_the_table() -> None:
    """A port written into a test (a number added to the shift, or a listener's literal port)
    would escape the table's checks."""
    offenders = []
    for path in TESTS.rglob("*.py"):
        if path.name in ("ports.py", "test_ports.py"):
            continue
        text = path.read_text()
        if "JOBSCOPE_TEST_PORT_SHIFT" in text:
            offenders.append(f"{path.relative_to(TESTS)}: reads JOBSCOPE_TEST_PORT_SHIFT")
        for match in re.finditer(r"_port=\d{4,5}\b|\bport=\d{4,5}\b", text):
            offenders.append(f"{path.relative_to(TESTS)}: {match.group()}")
    assert not offenders, offenders
