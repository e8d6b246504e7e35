"""snmp://: Kwollect's entries and jobscope's extensions against real agents (snmpsim serving
recorded PDUs and a switch, Net-SNMP snmpd for SNMPv3 and request counting)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kafka.reading import Reading
from producers.config import ProducerSettings, load_devices
from producers.entry import DeviceEntry
from producers.plugins.base import Plugin, Skips
from producers.plugins.snmp.client import AgentUnavailable
from producers.plugins.snmp.options import parse
from producers.runtime import Runtime, build_groups
from stack.simulators.snmpd import Snmpd
from stack.simulators.snmpsim import SnmpSim
from tests.producers.conftest import RecordingPublisher
from tests.schedules import assert_unbroken

from .conftest import V3

SAMPLE = Path(__file__).resolve().parents[3] / "producers" / "plugins" / "snmp" / "sample.yaml"
APC_POWER = "1.3.6.1.4.1.318.1.1.26.9.4.3.1.7"
APC_NAME = "1.3.6.1.4.1.318.1.1.26.9.4.2.1.3"
IF_NAME = "1.3.6.1.2.1.31.1.1.1.1"
IF_HC_IN = "1.3.6.1.2.1.31.1.1.1.6"
IF_IN_32 = "1.3.6.1.2.1.2.2.1.10"
IF_NUMBER = "1.3.6.1.2.1.2.1.0"
SNMP_IN_GET_REQUESTS = "1.3.6.1.2.1.11.15.0"


def entry(url: str, name: str = "m", device_id: str = "dev-1", **fields: Any) -> DeviceEntry:
    return DeviceEntry(name=name, device_id=device_id, url=url, update_every=1000, **fields)


def plugins(*entries: DeviceEntry) -> list[Plugin]:
    """The plugin instances the runtime would build, each with its own skip counter."""
    built = [member for group in build_groups(entries) for member in group.members]
    for member in built:
        member.skips = Skips(logging.getLogger("test"))
    return built


def poll(*entries: DeviceEntry) -> list[Reading]:
    async def run() -> list[Reading]:
        readings: list[Reading] = []
        for plugin in plugins(*entries):
            readings.extend(await plugin.poll(1_000_000))
        return readings

    return asyncio.run(run())


def sim_url(sim: SnmpSim, community: str, oid: str) -> str:
    return f"snmp://{community}@127.0.0.1:{sim.port}/{oid}"


# ---- what an entry may say ------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "options", "error"),
    [
        ("snmp://h/1.3.6.1.2.1.1.3.0?x=1", {}, "takes no ?query"),
        ("snmp:///1.3.6.1.2.1.1.3.0", {}, "needs a host"),
        ("snmp://u:p@h/1.3.6.1.2.1.1.3.0", {}, "not user:password"),
        ("snmp://h/sysUpTime.0", {}, "not a numeric OID"),
        ("snmp://h/1.3.6.{{ outlet }}", {}, "has no values in options.indexes"),
        ("snmp://h/1.3.6.1", {"aliases": {"1": "node-1"}}, "aliases need rows"),
        ("snmp://h/1.3.6.{{ o }}", {"indexes": {"o": "1-2"}, "walk": True}, "exclude each other"),
        (
            "snmp://u@h/1.3.6.1",
            {"v3": {"auth_password_env": "NOT_SET_ANYWHERE", "level": "authNoPriv"}},
            "NOT_SET_ANYWHERE",
        ),
        ("snmp://u@h/1.3.6.1", {"v3": {"level": "authPriv"}}, "needs auth_password_env"),
        ("snmp://h/1.3.6.1", {"timeout": 2}, "Extra inputs are not permitted"),
        ("snmp://h/1.3.{{ 1.3.6 == a }}.{{ 1.3.7 == b }}", {}, "at most one"),
        ("snmp://h/1.3.6.{{ o }}", {"indexes": {"o": "1-x"}}, "expected a list or ranges"),
    ],
)
def test_bad_entries_are_refused_with_the_reason(
    url: str, options: dict[str, Any], error: str
) -> None:
    with pytest.raises(ValueError, match=error.replace("?", r"\?")):
        parse(entry(url, options=options))


def test_kwollect_url_defaults() -> None:
    """Kwollect's `snmp://host/OID`: community public, port 161."""
    spec = parse(entry("snmp://pdu-1/1.3.6.1.4.1.318.1.1.26.9.4.3.1.7.3"))
    assert (spec.agent.host, spec.agent.port, spec.agent.community) == ("pdu-1", 161, "public")
    assert spec.oid == "1.3.6.1.4.1.318.1.1.26.9.4.3.1.7.3"


def test_entries_of_one_agent_and_period_are_one_batch() -> None:
    same = [entry(f"snmp://c@h:1161/1.3.6.1.2.1.1.{i}.0", name=f"m{i}") for i in range(3)]
    other = entry("snmp://other@h:1161/1.3.6.1.2.1.1.3.0", name="x")
    assert [len(p.entries) for p in plugins(*same, other)] == [3, 1]


# ---- real agents ----------------------------------------------------------------------


def test_one_line_serves_a_24_outlet_pdu(snmpsim: SnmpSim) -> None:
    readings = poll(
        entry(
            sim_url(snmpsim, "pdu-apc", APC_POWER + ".{{ outlet }}"),
            name="pdu_outlet_power_watt",
            device_id="pdu-1",
            labels={"site": "lab"},
            options={
                "indexes": {"outlet": "1-24"},
                "label_oids": {"outlet_name": APC_NAME + ".{{ outlet }}"},
                "aliases": {"3": "node-3", "12": "node-12"},
            },
        )
    )
    assert [r.labels["outlet"] for r in readings] == [str(i) for i in range(1, 25)]
    assert [r.value for r in readings] == [100.0 + i for i in range(1, 25)]
    third = readings[2]
    assert (third.device_id, third.metric_id) == ("pdu-1", "pdu_outlet_power_watt")
    assert dict(third.labels) == {
        "site": "lab",
        "outlet": "3",
        "outlet_name": "node-3",
        "_device_alias": "node-3",
    }
    assert [r.labels.get("_device_alias") for r in readings].count(None) == 22


def test_a_walk_yields_one_reading_per_row_with_labels_from_other_columns(
    snmpsim: SnmpSim,
) -> None:
    readings = poll(
        entry(
            sim_url(snmpsim, "switch", IF_HC_IN),
            name="network_ifacein_bytes_total",
            device_id="switch-1",
            options={
                "walk": True,
                "index_label": "ifindex",
                "label_oids": {"port": IF_NAME},
                "alias_by": "port",
                "aliases": {"Gi1/0/2": "node-2"},
            },
        )
    )
    assert [(r.labels["ifindex"], r.labels["port"]) for r in readings] == [
        (str(i), f"Gi1/0/{i}") for i in range(1, 9)
    ]
    assert [r.labels.get("_device_alias") for r in readings] == [None, "node-2", *[None] * 6]
    assert all(r.value > 0 for r in readings)


def test_kwollect_template_finds_the_port_by_its_name(snmpsim: SnmpSim) -> None:
    url = sim_url(snmpsim, "switch", f"{IF_HC_IN}.{{{{ {IF_NAME} == Gi1/0/5 }}}}")
    (by_template,) = poll(entry(url))
    (direct,) = poll(entry(sim_url(snmpsim, "switch", f"{IF_HC_IN}.5")))
    assert by_template.value == pytest.approx(direct.value, rel=0.01)


def test_no_port_of_that_name_means_no_reading_and_an_error_in_the_log(
    snmpsim: SnmpSim, caplog: pytest.LogCaptureFixture
) -> None:
    url = sim_url(snmpsim, "switch", f"{IF_HC_IN}.{{{{ {IF_NAME} == Gi9/9/9 }}}}")
    assert poll(entry(url, device_id="node-9")) == []
    assert "no index under 1.3.6.1.2.1.31.1.1.1.1 has the value 'Gi9/9/9'" in caplog.text


def test_decimal_digits_read_beside_the_value(snmpsim: SnmpSim) -> None:
    """Raritan: measurementsInletSensorValue with inletSensorDecimalDigits."""
    value = "1.3.6.1.4.1.13742.6.5.2.3.1.4.1.1.{{ sensor }}"
    digits = "1.3.6.1.4.1.13742.6.3.3.4.1.7.1.1.{{ sensor }}"
    readings = poll(
        entry(
            sim_url(snmpsim, "pdu-raritan", value),
            options={"indexes": {"sensor": [1, 4, 5]}, "decimals_oid": digits},
        )
    )
    assert [r.value for r in readings] == [1.234, 230.1, 284.0]


def test_scale_factor_and_divisor(snmpsim: SnmpSim) -> None:
    url = sim_url(snmpsim, "pdu-apc", APC_POWER + ".4")
    (scaled,) = poll(entry(url, scale_factor=0.1))
    (divided,) = poll(entry(url, options={"divisor": 8}))
    assert (scaled.value, divided.value) == (104 * 0.1, 104 / 8)


def test_counter32_is_stored_raw_across_its_wrap(snmpsim: SnmpSim) -> None:
    """The switch's port 1 ifInOctets wraps within seconds of the agent's start; readings
    keep the raw counter (as_rate handles the wrap on the query side)."""
    plugin = plugins(entry(sim_url(snmpsim, "switch", IF_IN_32 + ".1")))[0]

    async def values_until_wrap(timeout: float = 30.0) -> list[float]:
        values: list[float] = []
        deadline = time.monotonic() + timeout
        while not any(b < a for a, b in itertools.pairwise(values)):
            assert time.monotonic() < deadline, f"no wrap seen within {timeout} s: {values}"
            values.extend(r.value for r in await plugin.poll(1))
            await asyncio.sleep(0.2)
        return values

    values = asyncio.run(values_until_wrap())
    assert all(0 <= v < 2**32 for v in values)
    assert max(values) > 2**32 - 2**28


def test_missing_oids_are_skipped_and_counted_the_rest_kept(
    snmpsim: SnmpSim, caplog: pytest.LogCaptureFixture
) -> None:
    present = entry(sim_url(snmpsim, "pdu-apc", APC_POWER + ".1"), name="present")
    missing = entry(sim_url(snmpsim, "pdu-apc", APC_POWER + ".99"), name="missing")
    (plugin,) = plugins(present, missing)
    for _ in range(3):
        readings = asyncio.run(plugin.poll(1))
        assert [r.metric_id for r in readings] == ["present"]
    assert plugin.skips.count == 3
    assert caplog.text.count("noSuchObject/noSuchInstance") == 1


def test_v3_reads_what_v2c_reads(snmpd: Snmpd, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T_AUTH", V3.auth_pass)
    monkeypatch.setenv("T_PRIV", V3.priv_pass)
    v3 = {"v3": {"auth_password_env": "T_AUTH", "priv_password_env": "T_PRIV"}}
    (by_v3,) = poll(entry(f"snmp://{V3.name}@127.0.0.1:{snmpd.port}/{IF_NUMBER}", options=v3))
    (by_v2c,) = poll(entry(f"snmp://public@127.0.0.1:{snmpd.port}/{IF_NUMBER}"))
    assert by_v3.value == by_v2c.value > 0


@pytest.mark.parametrize(
    ("who", "v3", "error"),
    [
        ("wrong", None, r"no answer from .* \(agent down, or wrong community\?\)"),
        (V3.name, "not-the-password", "SNMPv3 authentication refused"),
    ],
)
def test_wrong_credentials_fail_with_a_clear_error(
    snmpd: Snmpd, monkeypatch: pytest.MonkeyPatch, who: str, v3: str | None, error: str
) -> None:
    options: dict[str, Any] = {"timeout_s": 0.2, "retries": 0}
    if v3:
        monkeypatch.setenv("T_WRONG", v3)
        options["v3"] = {"auth_password_env": "T_WRONG", "priv_password_env": "T_WRONG"}
    with pytest.raises(AgentUnavailable, match=error):
        poll(entry(f"snmp://{who}@127.0.0.1:{snmpd.port}/{IF_NUMBER}", options=options))


def _get_requests(snmpd: Snmpd) -> float:
    (counter,) = poll(entry(f"snmp://public@127.0.0.1:{snmpd.port}/{SNMP_IN_GET_REQUESTS}"))
    return counter.value


@pytest.mark.parametrize(("max_oids", "requests"), [(40, 1), (10, 3)])
def test_oids_of_one_agent_travel_in_as_few_requests_as_allowed(
    snmpd: Snmpd, max_oids: int, requests: int
) -> None:
    """30 entries (Kwollect's one OID per entry) of one agent: ceil(30 / max_oids) GETs,
    counted by the agent itself (snmpInGetRequests)."""
    entries = [
        entry(
            f"snmp://public@127.0.0.1:{snmpd.port}/1.3.6.1.2.1.2.2.1.{column}.1",
            name=f"if_{column}",
            options={"max_oids": max_oids},
        )
        for column in range(1, 22)
    ] + [
        entry(
            f"snmp://public@127.0.0.1:{snmpd.port}/1.3.6.1.2.1.11.{counter}.0",
            name=f"snmp_{counter}",
            options={"max_oids": max_oids},
        )
        for counter in (1, 2, 3, 4, 5, 6, 8, 9, 10)
    ]
    (plugin,) = plugins(*entries)
    before = _get_requests(snmpd)
    readings = asyncio.run(plugin.poll(1))
    assert _get_requests(snmpd) - before == requests + 1  # + the second count itself
    assert len(readings) >= 25  # some ifTable columns are not numbers or absent


def test_a_device_that_stops_answering_never_delays_the_others(
    snmpsim: SnmpSim, snmpd: Snmpd, second_snmpd: Snmpd, caplog: pytest.LogCaptureFixture
) -> None:
    period_ms = 500
    live = [
        DeviceEntry(
            name="pdu_outlet_power_watt",
            device_id=f"pdu-{i}",
            url=sim_url(snmpsim, "pdu-apc", f"{APC_POWER}.{i}"),
            update_every=period_ms,
        )
        for i in range(1, 6)
    ] + [
        DeviceEntry(
            name="services",
            device_id="agent-1",
            url=f"snmp://public@127.0.0.1:{snmpd.port}/{IF_NUMBER}",
            update_every=period_ms,
        )
    ]
    dying = DeviceEntry(
        name="services",
        device_id="agent-2",
        url=f"snmp://public@127.0.0.1:{second_snmpd.port}/{IF_NUMBER}",
        update_every=period_ms,
    )
    publisher = RecordingPublisher()
    runtime = Runtime([*live, dying], publisher, ProducerSettings())  # type: ignore[arg-type]

    paused: list[int] = []

    async def scenario() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(runtime.run(stop))
        await asyncio.sleep(1.6)
        second_snmpd.pause()
        paused.append(int(time.time() * 1e6))
        await asyncio.sleep(4.0)
        stop.set()
        await running
        second_snmpd.resume()

    asyncio.run(scenario())
    period_us = period_ms * 1000
    (paused_at,) = paused
    # held back, a live device's poll would start after the dying one's deadline
    deadline_us = int(period_us * ProducerSettings().poll_timeout_ratio)
    group_of = {
        e.device_id: g.name for g in build_groups(live) for m in g.members for e in m.entries
    }
    for device in [e.device_id for e in live]:
        stamps = [t for d, t in publisher.sent if d == device]
        assert_unbroken(stamps, period_us, caplog.text, group_of[device])
        assert [t for t in stamps if t > paused_at], device
        late = max(t % period_us for t in stamps)
        assert late < deadline_us, f"{device}: a tick started {late / 1000:.1f} ms late"
    dead = [t for d, t in publisher.sent if d == "agent-2"]
    assert dead and max(dead) < paused_at + period_us
    assert caplog.text.count("poll failed: device_id=agent-2") == 1


def test_sample_config_reads_every_entry(
    snmpsim: SnmpSim, snmpd: Snmpd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sample, pointed at this test's agents (and its v3 user), yields every metric."""
    monkeypatch.setenv("JOBSCOPE_SNMP_AUTH_PASSWORD", V3.auth_pass)
    monkeypatch.setenv("JOBSCOPE_SNMP_PRIV_PASSWORD", V3.priv_pass)
    text = SAMPLE.read_text().replace(":11161/", f":{snmpsim.port}/")
    text = text.replace("jobscope@127.0.0.1:11162/", f"{V3.name}@127.0.0.1:{snmpd.port}/")
    path = tmp_path / "devices.yaml"
    path.write_text(text)
    entries = load_devices(path)
    readings = poll(*entries)
    assert {r.metric_id for r in readings} == {e.name for e in entries}
    assert len(yaml.safe_load(text)) == len(entries)
