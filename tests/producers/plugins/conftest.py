"""Real SNMP agents for the plugin tests: snmpsim serving the recorded devices of
stack/simulators/snmp/, and Net-SNMP snmpd (SNMPv3 user, a second agent to pause)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack.config import REPO_ROOT
from stack.simulators.node_exporter import NodeExporter
from stack.simulators.snmpd import Snmpd, V3User
from stack.simulators.snmpsim import SnmpSim
from tests import ports

SNMPSIM_PORT, SNMPD_V3_PORT, SNMPD_V2_PORT = ports.ports("snmp-agents")  # UDP
V3 = V3User("jobscope", "SHA", "test-auth-pass", "AES", "test-priv-pass")


@pytest.fixture(scope="session")
def agents_dir() -> Iterator[Path]:
    state = REPO_ROOT / "state" / f"test-agents-{SNMPSIM_PORT}"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    yield state


@pytest.fixture(scope="session")
def snmpsim(agents_dir: Path) -> Iterator[SnmpSim]:
    """The recorded PDUs and switch: one community per device, on one UDP port."""
    sim = SnmpSim(agents_dir, port=SNMPSIM_PORT)
    sim.start()
    yield sim
    sim.stop()


@pytest.fixture(scope="session")
def snmpd(agents_dir: Path) -> Iterator[Snmpd]:
    """snmpd with community `public` and the v3 user V3 (authPriv, SHA + AES)."""
    agent = Snmpd(agents_dir / "snmpd-1", "127.0.0.1", SNMPD_V3_PORT, v3_users=[V3])
    agent.start()
    yield agent
    agent.stop()


@pytest.fixture
def second_snmpd(agents_dir: Path) -> Iterator[Snmpd]:
    """Another agent, for a test to pause (a device that stops answering)."""
    agent = Snmpd(agents_dir / "snmpd-2", "127.0.0.1", SNMPD_V2_PORT)
    agent.start()
    yield agent
    agent.stop()


@pytest.fixture
def node_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeExporter]:
    """Debian's node_exporter on 127.0.0.1:19000+shift, its textfile folder empty; one per
    test (~0.1 s to start), so that a test may pause it or fill its textfiles."""
    exporter = NodeExporter(tmp_path_factory.mktemp("node-exporter"), ports.port("node-exporter"))
    exporter.start()
    yield exporter
    exporter.stop()
