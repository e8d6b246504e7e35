"""A real IPMI 2.0 BMC for tests, benchmarks and `make up`: OpenIPMI's `ipmi_sim`.

    bmc = IpmiSim(state_dir / "bmc-1", port=9001, user="root", password="calvin")
    bmc.start()                           # fresh state, waits until it answers on LAN
    bmc.set_value("Inlet Temp", 30)       # through ipmi_sim's console
    bmc.pause() / bmc.resume()            # SIGSTOP/SIGCONT: a BMC that stops answering
    bmc.stop()

The BMC (`ipmi/bmc.emu`) is a Dell-style server: the sensors of `SENSORS`, with the values
listed there, on 127.0.0.1:`port` (UDP, lanplus) for `user`/`password` (admin). Its console
(`sensor_set_value`...) listens on TCP `console_port` (default: a free port). Files, all
under `state_dir` (deleted by `start`): `lan.conf` (from the `ipmi/lan.conf` template),
`state/` (ipmi_sim's persistent SDRs, SEL, users) and `ipmi_sim.log`. Instances with
distinct ports and state dirs run side by side.

FreeIPMI's `ipmi-sensors` needs `-W opensesspriv` with ipmi_sim (it answers the Open
Session request with privilege level 0); ipmitool needs nothing special.
"""

from __future__ import annotations

import math
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from string import Template

from stack.processes import free_port
from stack.simulators.base import ChildProcess

IPMI_SIM = "/usr/bin/ipmi_sim"
DATA_DIR = Path(__file__).resolve().parent / "ipmi"
_ASF_PING = bytes.fromhex("0600ff06000011be80000000")
"""RMCP presence ping (ASF): a BMC's LAN interface answers it without a session."""
_TOKEN = re.compile(r"^[A-Za-z0-9_.@%+=:,/-]+$")  # safe in lan.conf without escaping


@dataclass(frozen=True)
class SimSensor:
    """One sensor of `bmc.emu`: its record ID (= sensor number), name, type, unit, the value
    of one raw step (M * 10^R of its SDR) and the value it starts with."""

    record_id: int
    name: str
    type: str
    unit: str
    step: float
    value: float | None
    """None: the sensor reads N/A (scanning disabled)."""


SENSORS: tuple[SimSensor, ...] = (
    SimSensor(1, "Pwr Consumption", "Current", "W", 4, 280),
    SimSensor(2, "Current 1", "Current", "A", 0.1, 1.2),
    SimSensor(3, "Voltage 1", "Voltage", "V", 1, 230),
    SimSensor(4, "Inlet Temp", "Temperature", "C", 1, 23),
    SimSensor(5, "Exhaust Temp", "Temperature", "C", 1, 38),
    SimSensor(6, "CPU1 Temp", "Temperature", "C", 1, 55),
    SimSensor(7, "CPU2 Temp", "Temperature", "C", 1, 58),
    *(SimSensor(7 + i, f"Fan{i}", "Fan", "RPM", 120, (59 + i) * 120) for i in range(1, 7)),
    SimSensor(14, "PS2 Pwr", "Current", "W", 4, None),
)
"""What `ipmi/bmc.emu` defines, in record order (a test reads them back)."""


def ping(address: str, port: int, timeout: float = 0.2) -> bool:
    """Whether a BMC answers an RMCP presence ping on address:port (UDP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(_ASF_PING, (address, port))
            return sock.recv(512).startswith(b"\x06\x00\xff\x06")
        except OSError:
            return False


class IpmiSim(ChildProcess):
    """One `ipmi_sim` process: the BMC of `bmc.emu` on `address:port`."""

    def __init__(
        self,
        state_dir: Path,
        port: int,
        user: str = "root",
        password: str = "calvin",
        address: str = "127.0.0.1",
        console_port: int | None = None,
        ipmi_sim: str = IPMI_SIM,
    ) -> None:
        for what, value, longest in (("user", user, 16), ("password", password, 16)):
            if not _TOKEN.match(value) or len(value) > longest:
                raise ValueError(
                    f"{what} {value!r}: 1-{longest} letters, digits or _.@%+=:,/- (ipmi_sim)"
                )
        self.state_dir = Path(state_dir).resolve()
        self.address = address
        self.port = port
        self.user = user
        self.password = password
        self.console_port = console_port
        self.ipmi_sim = ipmi_sim
        self.config_file = self.state_dir / "lan.conf"
        self.log_file = self.state_dir / "ipmi_sim.log"

    def __repr__(self) -> str:
        return f"IpmiSim({self.address}:{self.port}, pid={self.pid})"

    def start(self, timeout: float = 10.0) -> None:
        """Delete the state dir, write lan.conf, start ipmi_sim and wait until it answers a
        presence ping. RuntimeError (with its log) if it exits or stays silent `timeout` s."""
        if self.pid is not None:
            return
        if not Path(self.ipmi_sim).exists():
            raise RuntimeError(
                f"{self.ipmi_sim} not found: install the Debian package openipmi "
                "(stack/install-system-deps.sh)"
            )
        shutil.rmtree(self.state_dir, ignore_errors=True)
        (self.state_dir / "state").mkdir(parents=True)
        if self.console_port is None:
            self.console_port = free_port()
        template = Template((DATA_DIR / "lan.conf").read_text())
        self.config_file.write_text(
            template.substitute(
                name=f"bmc{self.port}",
                address=self.address,
                port=self.port,
                user=self.user,
                password=self.password,
                console_port=self.console_port,
            )
        )
        argv = [self.ipmi_sim, "-c", str(self.config_file), "-f", str(DATA_DIR / "bmc.emu")]
        self._spawn(
            [*argv, "-s", str(self.state_dir / "state"), "-n"],
            lambda: ping(self.address, self.port),
            timeout,
            f"answer on {self.address}:{self.port}",
        )

    def set_value(self, name: str, value: float, timeout: float = 5.0) -> None:
        """Set sensor `name` to `value` (rounded to its step) through the console."""
        sensor = next((s for s in SENSORS if s.name == name), None)
        if sensor is None:
            raise ValueError(f"no sensor {name!r}; known: {', '.join(s.name for s in SENSORS)}")
        raw = round(value / sensor.step)
        if not 0 <= raw <= 255 or not math.isfinite(value):
            raise ValueError(f"{name}: {value} is out of range 0..{255 * sensor.step:g}")
        self.command(f"sensor_set_value 0x20 0 {sensor.record_id} {raw} 0", timeout)

    def command(self, line: str, timeout: float = 5.0) -> str:
        """Run one ipmi_sim command (ipmi_sim_cmd(5)) on the console; return its output."""
        if self.console_port is None or self.pid is None:
            raise RuntimeError(f"{self!r} is not running")
        with socket.create_connection((self.address, self.console_port), timeout) as sock:
            _read_until_prompt(sock)
            sock.sendall(line.encode() + b"\n")
            output = _read_until_prompt(sock).decode(errors="replace")
        answer = output.replace("\r", "").split("\n", 1)[-1].rsplit(">", 1)[0].strip()
        if answer.startswith("**"):
            raise RuntimeError(f"ipmi_sim refused {line!r}: {answer}")
        return answer


def _read_until_prompt(sock: socket.socket) -> bytes:
    """What the console sends up to its `> ` prompt (telnet negotiation included)."""
    data = b""
    while not data.endswith(b"> "):
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError("ipmi_sim closed its console")
        data += chunk
    return data
