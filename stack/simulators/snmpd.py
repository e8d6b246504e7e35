"""A real SNMP agent for tests, benchmarks and `make up`: Debian's Net-SNMP `snmpd`.

    agent = Snmpd(state_dir / "agent-1", "127.0.0.2", 161,
                  v3_users=[V3User("alice", "SHA-256", "alice-auth", "AES", "alice-priv")])
    agent.start()      # writes its config, starts `snmpd -f`, waits until it answers a GET
    agent.pause()      # SIGSTOP: a device that stops answering (requests time out)
    agent.resume()     # SIGCONT: it answers again
    agent.stop()

The agent serves the host's own MIBs (system, IF-MIB of the host's interfaces, HOST-RESOURCES,
UCD-SNMP: load, memory, CPU counters...) read-only: SNMPv2c with `community` and SNMPv3 with
each of `v3_users` (authPriv). One process may listen on several endpoints (`also_listen`):
each endpoint looks like a device of its own to a client, which is how a benchmark puts
hundreds of "devices" on a few processes (up to about 120 endpoints per process: see
MAX_LISTEN_CHARS). Every address of 127.0.0.0/8 is loopback on Linux,
so distinct devices on the standard port 161 are 127.0.0.2:161, 127.0.0.3:161... (ports
below 1024 need root).

Files, all under `state_dir` (one folder per agent): `snmpd.conf` (rewritten by every
`start`), `persistent/` (SNMP_PERSISTENT_DIR: engine boots, USM keys; kept across restarts,
and never the folder holding the config, which snmpd would overwrite on shutdown),
`snmpd.pid` and `snmpd.log` (appended to).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from producers.plugins.snmp.options import AUTH_PROTOCOLS, PRIV_PROTOCOLS
from stack.simulators.base import ChildProcess, snmp_answers

SNMPD = "/usr/sbin/snmpd"
# snmpd keeps its listening addresses in one string of 2,560 characters (SPRINT_MAX_LEN) and
# silently drops what does not fit: about 120 endpoints of the form udp:127.0.1.1:161.
MAX_LISTEN_CHARS = 2500
_TOKEN = re.compile(r"^[A-Za-z0-9_.@%+=:,/-]+$")  # safe in snmpd.conf without quoting


@dataclass(frozen=True)
class V3User:
    """An SNMPv3 USM user with authentication and privacy (authPriv), read-only.

    Passphrases need at least 8 characters (RFC 3414); AES is AES-128.
    """

    name: str
    auth_protocol: str  # MD5, SHA, SHA-224, SHA-256, SHA-384, SHA-512
    auth_pass: str
    priv_protocol: str  # DES, AES, AES-192, AES-256
    priv_pass: str

    def check(self) -> None:
        if not _TOKEN.match(self.name):
            raise ValueError(f"SNMPv3 user name {self.name!r}: letters, digits, _.@%+=:,/- only")
        if self.auth_protocol not in AUTH_PROTOCOLS:
            raise ValueError(
                f"{self.name}: auth protocol {self.auth_protocol!r} not in {AUTH_PROTOCOLS}"
            )
        if self.priv_protocol not in PRIV_PROTOCOLS:
            raise ValueError(
                f"{self.name}: priv protocol {self.priv_protocol!r} not in {PRIV_PROTOCOLS}"
            )
        for what, phrase in (("auth", self.auth_pass), ("priv", self.priv_pass)):
            if len(phrase) < 8 or not _TOKEN.match(phrase):
                raise ValueError(
                    f"{self.name}: {what} passphrase needs 8+ characters among "
                    "letters, digits, _.@%+=:,/-"
                )


class Snmpd(ChildProcess):
    """One `snmpd` process answering on `address:port` (and on `also_listen` endpoints)."""

    def __init__(
        self,
        state_dir: Path,
        address: str,
        port: int,
        community: str = "public",
        v3_users: Sequence[V3User] = (),
        also_listen: Sequence[tuple[str, int]] = (),
        snmpd: str = SNMPD,
    ) -> None:
        if not _TOKEN.match(community):
            raise ValueError(f"community {community!r}: letters, digits, _.@%+=:,/- only")
        for user in v3_users:
            user.check()
        self.state_dir = Path(state_dir).resolve()
        self.address = address
        self.port = port
        self.community = community
        self.v3_users = tuple(v3_users)
        self.endpoints: tuple[tuple[str, int], ...] = ((address, port), *also_listen)
        listen = ",".join(_transport(host, port) for host, port in self.endpoints)
        if len(listen) > MAX_LISTEN_CHARS:
            raise ValueError(
                f"{len(self.endpoints)} endpoints are too many for one snmpd (it keeps them in "
                f"a string of {MAX_LISTEN_CHARS} characters, here {len(listen)}): use several"
            )
        self.snmpd = snmpd
        self.config_file = self.state_dir / "snmpd.conf"
        self.persistent_dir = self.state_dir / "persistent"
        self.pid_file = self.state_dir / "snmpd.pid"
        self.log_file = self.state_dir / "snmpd.log"

    def __repr__(self) -> str:
        return f"Snmpd({self.address}:{self.port}, pid={self.pid})"

    # -- lifecycle -------------------------------------------------------------------------

    def config_text(self) -> str:
        """The snmpd.conf `start` writes."""
        transports = [_transport(host, port) for host, port in self.endpoints]
        lines = [
            "# written by stack/simulators/snmpd.py; rewritten at every start",
            # several lines add up; one long line would be cut (snmpd's line buffer)
            *(
                "agentAddress " + ",".join(transports[i : i + 16])
                for i in range(0, len(transports), 16)
            ),
            "dontLogTCPWrappersConnects yes",  # no log line per request
            f"rocommunity {self.community}",
            f"rocommunity6 {self.community}",
        ]
        for user in self.v3_users:
            lines += [
                f"createUser {user.name} {user.auth_protocol} {user.auth_pass} "
                f"{user.priv_protocol} {user.priv_pass}",
                f"rouser {user.name} priv",
            ]
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 15.0) -> None:
        """Write the config, start `snmpd -f` and wait until it answers an SNMPv2c GET on
        every endpoint. Raises RuntimeError (with the end of its log) if it exits or does
        not answer within `timeout` seconds."""
        if self.pid is not None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.persistent_dir.mkdir(exist_ok=True)
        # USM keys are saved in the persistent dir at shutdown: drop them so that the
        # `createUser` lines of this config (maybe other passphrases) are the only users.
        saved = self.persistent_dir / "snmpd.conf"
        if saved.exists():
            kept = [ln for ln in saved.read_text().splitlines() if not ln.startswith("usmUser ")]
            saved.write_text("\n".join(kept) + "\n")
        self.config_file.write_text(self.config_text())
        self.pid_file.unlink(missing_ok=True)
        env = {**os.environ, "MIBS": "", "SNMP_PERSISTENT_DIR": str(self.persistent_dir)}
        env.pop("SNMPCONFPATH", None)
        argv = [
            self.snmpd,
            "-f",  # foreground: this object owns the process
            "-Lo",  # log to stdout (the log file)
            "-C",  # read no default config file
            "-I",
            "-smux",  # no SMUX listener (TCP 199): one host can run many agents
            "-c",
            str(self.config_file),
            "-p",
            str(self.pid_file),
        ]
        pending = list(self.endpoints)

        def every_endpoint_answers() -> bool:
            while pending and snmp_answers(*pending[0], self.community, timeout=0.2):
                pending.pop(0)
            return not pending

        self._spawn(argv, every_endpoint_answers, timeout, "answer on every endpoint", env)


def _transport(host: str, port: int) -> str:
    return f"udp6:[{host}]:{port}" if ":" in host else f"udp:{host}:{port}"
