"""`python -m stack.simulators`: the simulated devices of `make up DEVICES=sample`, until SIGTERM.

One supervised process (the stack knows it as `simulators`) runs every simulator the
sample devices files point at, on loopback, with the passwords of state/secrets.env:

    snmpsim   127.0.0.1:11161/udp  the recorded PDUs and switch (community = device)
    snmpd     127.0.0.1:11162/udp  SNMPv3 user `jobscope` (authPriv, SHA + AES)
    ipmi_sim  127.0.0.1:9001/udp   a Dell-style BMC, user `root` (IPMI 2.0 lanplus)
    node_exporter 127.0.0.1:11100/tcp  this host's metrics, textfiles in
              <state>/simulators/node-exporter/textfiles (not 9100: the host may run its own)
    wattmetre 127.0.0.1:12001/tcp, 12002/tcp  Omegawatt wattmeters wattmetre1 (version 2, 24
              ports) and wattmetre2 (version 3, 8 ports), 50 frames/s; control on 12000/tcp
    dcgm-exporter 127.0.0.1:11400/tcp  node-3's two GPUs (the H100 recording) as NVIDIA's
              dcgm-exporter shows them (stack/simulators/dcgm_exporter.py)
    prometheus 127.0.0.1:11090/tcp  the site's Prometheus: scrapes that exporter as
              node-3:9400 and remote-writes its GPU metrics to the API
              (examples/prometheus/) with an agent token for node-3 it is given at start
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from datetime import timedelta
from pathlib import Path

from api.infra.tokens import Role, create_token
from stack import secrets, services
from stack.config import StackSettings
from stack.simulators.base import Simulator
from stack.simulators.dcgm_exporter import DcgmExporter
from stack.simulators.ipmi import IpmiSim
from stack.simulators.node_exporter import NodeExporter
from stack.simulators.prometheus import Prometheus, gpu_remote_write_config
from stack.simulators.snmpd import Snmpd, V3User
from stack.simulators.snmpsim import SnmpSim
from stack.simulators.wattmetre import MeterSpec, Wattmetres

SNMPSIM_PORT = 11161
SNMPD_PORT = 11162
IPMI_PORT = 9001
NODE_EXPORTER_PORT = 11100
WATTMETRE_CONTROL_PORT = 12000
DCGM_EXPORTER_PORT = 11400
PROMETHEUS_PORT = 11090
GPU_NODE, GPU_NODE_GPUS = "node-3", 2
WATTMETRES = (MeterSpec("wattmetre1", 12001, 2, 24), MeterSpec("wattmetre2", 12002, 3, 8))
SNMP_USER = "jobscope"
IPMI_USER = "root"
log = logging.getLogger("jobscope.simulators")


def site_prometheus(settings: StackSettings, folder: Path, token_secret: str) -> Prometheus:
    """The site's Prometheus of `make up DEVICES=sample`, with a new agent token for the GPU
    node (a token file of its own beside its state, which its start deletes)."""
    folder.mkdir(parents=True, exist_ok=True)
    token_file = folder / "prometheus.token"
    token = create_token(
        token_secret, "prometheus", Role.AGENT, timedelta(days=30), nodes=[GPU_NODE]
    )
    secrets.write_private(token_file, token)
    config = gpu_remote_write_config(
        f"127.0.0.1:{DCGM_EXPORTER_PORT}", f"{GPU_NODE}:9400", settings.api_url, token_file
    )
    return Prometheus(folder / "prometheus", PROMETHEUS_PORT, config)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    settings = StackSettings()
    passwords = secrets.load_or_create(settings.state_dir)
    folder = settings.state_dir / "simulators"
    v3 = V3User(
        SNMP_USER,
        "SHA",
        passwords["JOBSCOPE_SNMP_AUTH_PASSWORD"],
        "AES",
        passwords["JOBSCOPE_SNMP_PRIV_PASSWORD"],
    )
    running: list[Simulator] = [
        SnmpSim(folder, port=SNMPSIM_PORT, host=settings.host),
        Snmpd(folder / "snmpd", settings.host, SNMPD_PORT, v3_users=[v3]),
        IpmiSim(
            folder / "ipmi",
            IPMI_PORT,
            IPMI_USER,
            passwords["JOBSCOPE_IPMI_PASSWORD"],
            settings.host,
        ),
        NodeExporter(folder / "node-exporter", NODE_EXPORTER_PORT, settings.host),
        Wattmetres(folder / "wattmetre", WATTMETRES, WATTMETRE_CONTROL_PORT, settings.host),
        DcgmExporter(folder / "dcgm-exporter", DCGM_EXPORTER_PORT, GPU_NODE_GPUS, GPU_NODE),
        site_prometheus(settings, folder, passwords["JOBSCOPE_TOKEN_SECRET"]),
    ]
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    started = []
    ready = services.simulators_ready_file(settings)
    try:
        for simulator in running:
            simulator.start()
            started.append(simulator)
            log.info("started %r", simulator)
        log.info("simulated devices ready")
        ready.write_text("")
        stop.wait()
    finally:
        ready.unlink(missing_ok=True)
        for simulator in reversed(started):
            simulator.stop()
        log.info("simulated devices stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
