"""Simulated SNMP devices: snmpsim (PyPI) serving recorded `.snmprec` files on one UDP port.

snmpsim runs from its own venv, never from the project's .venv (its pysnmp would clash with
the project's packages). The venv is built from /usr/bin/python3, because as root snmpsim
drops to `--process-user=nobody`, which can read neither a Python under /root nor a venv
there. It lives outside the clone (/opt/jobscope-snmpsim as root), so it survives fresh
clones: it is built once and reused while its stamp matches the pinned requirements file
(stack/simulators/snmpsim-requirements.txt) and the interpreter version.

Each device is one data file; its SNMP v2c community is the file name without `.snmprec`.
The recorded devices of the project are in stack/simulators/snmp/ (see its README.md).

    sim = SnmpSim(state_dir, DATA_DIR, port=11161)
    sim.start()                      # builds the venv when needed, waits until a GET answers
    sim.get("switch", "1.3.6.1.2.1.31.1.1.1.6.1")   # [("…", "Counter64", "…")]
    sim.pause(); sim.resume()        # SIGSTOP / SIGCONT: a device that stops answering
    sim.stop()
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from stack.processes import ManagedProcess, shared_dir, wait_until
from stack.simulators.base import Simulator, snmp_answers
from stack.venvs import pinned_venv

HERE = Path(__file__).resolve().parent
DATA_DIR = HERE / "snmp"
REQUIREMENTS = HERE / "snmpsim-requirements.txt"
SYSTEM_PYTHON = Path("/usr/bin/python3")
PROCESS_USER = "nobody"
RESPONDER = "snmpsim-command-responder"
VARIATION_MODULES = ("numeric", "delay", "error")  # usable in data files as `<tag>:<module>`


class SnmpSimError(RuntimeError):
    """snmpsim cannot be installed or started; the message says what is missing."""


def default_venv_dir() -> Path:
    """Where the snmpsim venv lives: $JOBSCOPE_SNMPSIM_VENV, else outside any clone
    (/opt/jobscope-snmpsim/venv as root, ~/.cache/jobscope-snmpsim/venv otherwise)."""
    if env := os.environ.get("JOBSCOPE_SNMPSIM_VENV"):
        return Path(env)
    if os.geteuid() == 0:
        return Path("/opt/jobscope-snmpsim/venv")
    return Path.home() / ".cache" / "jobscope-snmpsim" / "venv"


def ensure_venv(
    venv: Path | None = None,
    requirements: Path = REQUIREMENTS,
    python: Path = SYSTEM_PYTHON,
) -> Path:
    """Build (or reuse) the snmpsim venv; return the path of its command responder.

    Reused as is when its stamp file matches the requirements file and the interpreter;
    rebuilt from scratch otherwise. A lock file serialises concurrent test sessions.
    """
    venv = venv or default_venv_dir()
    responder = venv / "bin" / RESPONDER
    if not python.exists():
        raise SnmpSimError(
            f"{python} is missing: snmpsim's venv is built from the system Python "
            "(run stack/install-system-deps.sh)"
        )
    check = subprocess.run(
        [str(python), "-c", "import venv, ensurepip, dbm.gnu"], capture_output=True, text=True
    )
    if check.returncode != 0:
        raise SnmpSimError(
            f"{python} lacks venv/ensurepip/dbm.gnu ({check.stderr.strip().splitlines()[-1:]}):"
            " install the Debian packages python3-venv and python3-gdbm "
            "(stack/install-system-deps.sh)"
        )
    try:
        pinned_venv(venv, requirements, python, on_built=lambda v: _make_world_readable(v.parent))
    except RuntimeError as exc:
        raise SnmpSimError(str(exc)) from None
    return responder


def _make_world_readable(root: Path) -> None:
    """a+rX on a tree we own, whatever the umask was: user nobody runs from it."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        extra = stat.S_IROTH | stat.S_IRGRP
        if path.is_dir() or mode & stat.S_IXUSR:
            extra |= stat.S_IXOTH | stat.S_IXGRP
        path.chmod(mode | extra)


def udp_port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def snmpget(
    host: str, port: int, community: str, *oids: str, timeout: float = 1.0, retries: int = 0
) -> list[tuple[str, str, str]]:
    """GET `oids` with the net-snmp client; [(numeric OID, type, value)] in request order.

    The type is net-snmp's word ("Counter32", "Counter64", "INTEGER", "STRING", "Gauge32",
    "Timeticks" (value in hundredths of a second), "OID", ...), or "noSuchObject" /
    "noSuchInstance" (value "") for a missing OID.
    Raises TimeoutError when the agent does not answer.
    """
    if shutil.which("snmpget") is None:
        raise SnmpSimError("snmpget is missing: install the Debian package snmp")
    argv = ["snmpget", "-v2c", "-c", community, "-On", "-Oe"]
    argv += ["-t", str(timeout), "-r", str(retries), "-m", "", f"udp:{host}:{port}", *oids]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "MIBS": ""})
    if "Timeout" in done.stderr:
        raise TimeoutError(f"no answer from {host}:{port} community {community!r}")
    if done.returncode != 0:
        raise SnmpSimError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
    rows = []
    for line in done.stdout.splitlines():
        oid, _, rest = line.partition(" = ")
        if rest.startswith("No Such Object"):
            rows.append((oid, "noSuchObject", ""))
        elif rest.startswith("No Such Instance"):
            rows.append((oid, "noSuchInstance", ""))
        else:
            rows.append((oid, *_parse_value(rest)))
    return rows


def _parse_value(text: str) -> tuple[str, str]:
    """net-snmp's `TYPE: value` (-On -Oe) as (type, value): strings unquoted, Timeticks as
    the raw hundredths of a second."""
    if text == '""':  # net-snmp prints an empty OCTET STRING without its type
        return "STRING", ""
    kind, _, value = text.partition(": ")
    if kind == "Timeticks":  # "(123456) 0:20:34.56"
        value = value.partition(")")[0].lstrip("(")
    elif kind == "STRING" and len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return kind, value


class SnmpSim(Simulator):
    """One snmpsim command responder serving every `.snmprec` of `data_dir` on host:port/UDP."""

    def __init__(
        self,
        state_dir: Path,
        data_dir: Path = DATA_DIR,
        port: int = 1161,
        host: str = "127.0.0.1",
        venv: Path | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.source_dir = Path(data_dir)
        self.port = port
        self.host = host
        self.venv = venv or default_venv_dir()
        self.run_dir = shared_dir(self.state_dir / "snmpsim")  # user nobody reads it
        self.data_dir = self.run_dir / "data"
        self.cache_dir = self.run_dir / "cache"
        self.variation_dir = self.run_dir / "variation"
        self.process = ManagedProcess(
            f"snmpsim-{port}", self.state_dir / "pids", self.state_dir / "logs"
        )

    @property
    def communities(self) -> list[str]:
        return sorted(p.name.removesuffix(".snmprec") for p in self.source_dir.glob("*.snmprec"))

    @property
    def pid(self) -> int | None:
        return self.process.pid()

    @property
    def log_file(self) -> Path:
        return self.process.log_file

    def get(self, community: str, *oids: str, timeout: float = 1.0) -> list[tuple[str, str, str]]:
        return snmpget(self.host, self.port, community, *oids, timeout=timeout)

    def answers(self, community: str | None = None, timeout: float = 1.0) -> bool:
        """True when a GET of sysUpTime.0 on `community` (default: the first device) answers."""
        return snmp_answers(self.host, self.port, community or self.communities[0], timeout)

    def start(self, timeout: float = 60.0) -> int:
        """Start the responder (building its venv first if needed); return its PID once a GET
        on every device's community answers."""
        if (pid := self.pid) is not None:
            return pid
        communities = self.communities
        if not communities:
            raise SnmpSimError(f"no .snmprec file in {self.source_dir}")
        if not udp_port_free(self.host, self.port):
            raise SnmpSimError(f"cannot start snmpsim: {self.host}:{self.port}/udp is in use")
        responder = ensure_venv(self.venv)
        python = self.venv / "bin" / "python"
        package_dir = subprocess.run(
            [str(python), "-c", "import snmpsim, os; print(os.path.dirname(snmpsim.__file__))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        self._prepare_run_dir(Path(package_dir) / "variation")
        argv = [
            str(responder),
            f"--data-dir={self.data_dir}",
            f"--cache-dir={self.cache_dir}",
            f"--variation-modules-dir={self.variation_dir}",
            f"--agent-udpv4-endpoint={self.host}:{self.port}",
            "--logging-method=stdout",
            "--log-level=error",
        ]
        if os.geteuid() == 0:
            argv += [f"--process-user={PROCESS_USER}", f"--process-group={self._nobody_group()}"]
        # HOME: snmpsim also searches ~/.snmpsim for data and variation modules.
        pid = self.process.start(argv, env={"HOME": str(self.run_dir)}, cwd=self.run_dir)
        try:
            for community in communities:
                wait_until(
                    lambda c=community: self._check_alive() and self.answers(c),
                    timeout,
                    f"snmpsim on {self.host}:{self.port}/udp to answer community {community!r}",
                )
        except (TimeoutError, SnmpSimError) as exc:
            self.stop()
            raise SnmpSimError(f"{exc}; log {self.log_file}:\n{self.log_tail()}") from exc
        return pid

    def stop(self) -> None:
        if (pid := self.pid) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # a paused process would not act on SIGTERM
        self.process.stop(timeout=10)

    def _check_alive(self) -> bool:
        if self.pid is None:
            raise SnmpSimError("snmpsim exited during start-up")
        return True

    @staticmethod
    def _nobody_group() -> str:
        import grp

        return grp.getgrgid(pwd.getpwnam(PROCESS_USER).pw_gid).gr_name

    def _prepare_run_dir(self, variation_source: Path) -> None:
        """A fresh copy of the data, the variation modules the data uses and an empty index
        cache, all usable by user nobody. (snmpsim loads every module of its variation
        directory; the redis and sql ones only log errors without their options.)"""
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.data_dir.mkdir(parents=True)
        self.cache_dir.mkdir()
        self.variation_dir.mkdir()
        for module in VARIATION_MODULES:
            shutil.copyfile(variation_source / f"{module}.py", self.variation_dir / f"{module}.py")
        for source in self.source_dir.glob("*.snmprec"):
            shutil.copyfile(source, self.data_dir / source.name)
        _make_world_readable(self.run_dir)
        if os.geteuid() == 0:
            nobody = pwd.getpwnam(PROCESS_USER)
            os.chown(self.cache_dir, nobody.pw_uid, nobody.pw_gid)


def main() -> None:
    """`python -m stack.simulators.snmpsim [port]`: serve the recorded devices until Ctrl-C."""
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 1161
    state_dir = Path(tempfile.mkdtemp(prefix="jobscope-snmpsim-"))
    state_dir.chmod(0o755)  # user nobody reads the data below it
    sim = SnmpSim(state_dir, DATA_DIR, port)
    sim.start()
    print(f"snmpsim pid {sim.pid} on 127.0.0.1:{port}/udp, communities {sim.communities}")
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        sim.stop()


if __name__ == "__main__":
    main()
