"""The recorded SNMP devices (stack/simulators/snmp/) served by a real snmpsim process.

Values and formulas checked here are documented in stack/simulators/snmp/README.md. Every
numeric variation shares one clock: t = seconds since snmpsim started, and each device's
sysUpTime.0 = initial + 100·t, so a GET of sysUpTime.0 in the same request tells t.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import pytest

from stack.config import REPO_ROOT
from stack.simulators.snmpsim import DATA_DIR, SnmpSim, SnmpSimError
from tests import ports

PORT = ports.port("snmpsim")  # UDP
C32 = 2**32

SYS_DESCR, SYS_UPTIME = "1.3.6.1.2.1.1.1.0", "1.3.6.1.2.1.1.3.0"
IF_IN, IF_OUT = "1.3.6.1.2.1.2.2.1.10", "1.3.6.1.2.1.2.2.1.16"
IF_OPER = "1.3.6.1.2.1.2.2.1.8"
IF_NAME, IF_HC_IN, IF_HC_OUT = (
    "1.3.6.1.2.1.31.1.1.1.1",
    "1.3.6.1.2.1.31.1.1.1.6",
    "1.3.6.1.2.1.31.1.1.1.10",
)
APC = "1.3.6.1.4.1.318.1.1.26"
RARITAN = "1.3.6.1.4.1.13742.6"
SWITCH_UPTIME0 = 555555500  # sysUpTime.0 of the switch at t = 0
PORT1_IN0, PORT1_RATE = 3494967296, 100_000_000  # ifInOctets.1 wraps at t = 8 s


@pytest.fixture(scope="module")
def sim() -> Iterator[SnmpSim]:
    state = REPO_ROOT / "state" / f"test-snmpsim-{PORT}"
    SnmpSim(state, DATA_DIR, PORT).stop()  # leftovers of a crashed run
    shutil.rmtree(state, ignore_errors=True)
    simulator = SnmpSim(state, DATA_DIR, PORT)
    simulator.start()
    yield simulator
    simulator.stop()


def values(sim: SnmpSim, community: str, *oids: str) -> list[tuple[str, str]]:
    return [(kind, value) for _, kind, value in sim.get(community, *oids)]


def seconds_since_start(uptime_ticks: str, initial: int) -> float:
    return (int(uptime_ticks) - initial) / 100


def test_counter32_wraps_as_documented(sim: SnmpSim) -> None:
    """ifInOctets.1 = floor((3494967296 + 1e8·t) mod 2^32): near 2^32, then small again."""
    before: int | None = None
    deadline = time.monotonic() + 60  # it wraps at t = 8 s, then every 42.9 s
    while time.monotonic() < deadline:
        (_, ticks), (kind, raw), (hc_kind, hc_raw) = values(
            sim, "switch", SYS_UPTIME, f"{IF_IN}.1", f"{IF_HC_IN}.1"
        )
        assert (kind, hc_kind) == ("Counter32", "Counter64")
        value, t = int(raw), seconds_since_start(ticks, SWITCH_UPTIME0)
        predicted = (PORT1_IN0 + PORT1_RATE * t) % C32
        # sysUpTime is truncated to 1/100 s: 1e6 octets at this rate, plus request latency.
        error = min(abs(value - predicted), C32 - abs(value - predicted))
        assert error < 3_000_000, f"ifInOctets.1={value}, predicted {predicted:.0f} at t={t}"
        hc_error = (int(hc_raw) - value) % C32
        assert min(hc_error, C32 - hc_error) < 3_000_000, "ifHCInOctets.1 mod 2^32 != ifInOctets.1"
        if before is not None and value < before:
            assert before > C32 - 200_000_000, f"wrapped from {before}, not from near 2^32"
            assert value < 200_000_000, f"wrapped to {value}, not to a small value"
            return
        before = value
        time.sleep(0.3)
    pytest.fail(f"ifInOctets.1 never wrapped within 60 s (last value {before})")


def test_switch_types_and_rates(sim: SnmpSim) -> None:
    rows = values(
        sim,
        "switch",
        SYS_DESCR,
        f"{IF_NAME}.3",
        f"{IF_OPER}.3",
        f"{IF_OPER}.8",
        f"{IF_OUT}.3",
        f"{IF_HC_IN}.3",
        f"{IF_HC_OUT}.3",
        SYS_UPTIME,
    )
    assert rows[0][0] == "STRING" and rows[0][1].startswith("Cisco IOS Software")
    assert rows[1] == ("STRING", "Gi1/0/3")
    assert rows[2] == ("INTEGER", "1") and rows[3] == ("INTEGER", "2")  # port 8 is down
    assert [kind for kind, _ in rows[4:7]] == ["Counter32", "Counter64", "Counter64"]
    t = seconds_since_start(rows[7][1], SWITCH_UPTIME0)
    # port N: in = N·10^12 + N·10^6·t, out = N·5·10^11 + N·5·10^5·t (octets)
    assert abs(int(rows[5][1]) - (3 * 10**12 + 3_000_000 * t)) < 200_000
    assert abs(int(rows[6][1]) - (15 * 10**11 + 1_500_000 * t)) < 200_000
    assert abs(int(rows[4][1]) - (15 * 10**11 + 1_500_000 * t) % C32) < 200_000


def test_apc_pdu(sim: SnmpSim) -> None:
    rows = values(
        sim,
        "pdu-apc",
        SYS_DESCR,
        f"{APC}.9.4.2.1.3.1",
        f"{APC}.9.4.2.1.3.24",
        f"{APC}.9.4.3.1.7.1",
        f"{APC}.9.4.3.1.7.24",
        f"{APC}.4.3.1.5.1",
        f"{APC}.9.4.3.1.11.5",
        SYS_UPTIME,
    )
    assert rows[0][0] == "STRING" and "MN:AP8858" in rows[0][1]
    assert rows[1:3] == [("STRING", "node-1"), ("STRING", "node-24")]
    assert rows[3:5] == [("INTEGER", "101"), ("INTEGER", "124")]  # watts: 100 + N
    assert rows[5] == ("INTEGER", "270")  # hundredths of kW: sum of the outlets, 2700 W
    t = seconds_since_start(rows[7][1], 123456700)
    assert rows[6][0] == "INTEGER"
    assert abs(int(rows[6][1]) - (5000 + t)) <= 1.5  # 1000·N + 1 per second


def test_raritan_pdu(sim: SnmpSim) -> None:
    value, digits = f"{RARITAN}.5.2.3.1.4.1.1", f"{RARITAN}.3.3.4.1.7.1.1"
    rows = values(
        sim,
        "pdu-raritan",
        f"{value}.1",
        f"{digits}.1",
        f"{value}.4",
        f"{digits}.4",
        f"{value}.5",
        f"{digits}.5",
    )
    assert all(kind == "Gauge32" for kind, _ in rows)
    readings = [int(rows[i][1]) / 10 ** int(rows[i + 1][1]) for i in (0, 2, 4)]
    assert readings == [1.234, 230.1, 284.0]


def test_missing_oids_answer_no_such(sim: SnmpSim) -> None:
    rows = values(
        sim,
        "noisy",
        f"{IF_IN}.2",
        f"{IF_IN}.3",
        f"{IF_HC_IN}.1",
        f"{IF_HC_IN}.4",
        "1.3.6.1.2.1.99.1.1.1.4.2",
        "1.3.6.1.2.1.99.1.1.1.4.3",
        "1.3.6.1.4.1.9.9.13.1.3.1.3.1",  # a vendor subtree the device does not implement
    )
    no_such = {"noSuchInstance", "noSuchObject"}
    assert rows[0][0] == "Counter32" and rows[1][0] in no_such, rows
    assert rows[2][0] == "Counter64" and rows[3][0] in no_such, rows
    assert rows[4] == ("INTEGER", "12034") and rows[5][0] in no_such, rows
    assert rows[6][0] in no_such, rows


def test_pause_stops_answers_until_resume(sim: SnmpSim) -> None:
    sim.pause()
    try:
        with pytest.raises(TimeoutError):
            sim.get("switch", SYS_UPTIME, timeout=1)
    finally:
        sim.resume()
    assert values(sim, "switch", SYS_UPTIME)[0][0] == "Timeticks"


def test_start_refuses_a_busy_port(sim: SnmpSim) -> None:
    other = SnmpSim(REPO_ROOT / "state" / f"test-snmpsim-{PORT}-busy", DATA_DIR, PORT)
    with pytest.raises(SnmpSimError, match="in use"):
        other.start()
