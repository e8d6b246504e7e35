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
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

from stack import secrets, services
from stack.config import StackSettings
from stack.simulators.ipmi import IpmiSim
from stack.simulators.node_exporter import NodeExporter
from stack.simulators.snmpd import Snmpd, V3User
from stack.simulators.snmpsim import SnmpSim
from stack.simulators.wattmetre import MeterSpec, Wattmetres

SNMPSIM_PORT = 11161
SNMPD_PORT = 11162
IPMI_PORT = 9001
NODE_EXPORTER_PORT = 11100
WATTMETRE_CONTROL_PORT = 12000
WATTMETRES = (MeterSpec("wattmetre1", 12001, 2, 24), MeterSpec("wattmetre2", 12002, 3, 8))
SNMP_USER = "jobscope"
IPMI_USER = "root"
log = logging.getLogger("jobscope.simulators")


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
    running: list[SnmpSim | Snmpd | IpmiSim | NodeExporter | Wattmetres] = [
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
