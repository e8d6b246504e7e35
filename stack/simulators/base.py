"""What the simulators share: their log in errors, use as a context manager, the life of a
child process (start, wait until it answers, pause, stop), and an SNMP readiness probe."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from gufo.snmp import SnmpError
from gufo.snmp.sync import SnmpSession

from stack.processes import stop_child

SYS_UPTIME = "1.3.6.1.2.1.1.3.0"


def snmp_answers(host: str, port: int, community: str = "public", timeout: float = 1.0) -> bool:
    """True when an SNMPv2c GET of sysUpTime.0 on host:port (an IP address) gets an answer."""
    try:
        with SnmpSession(addr=host, port=port, community=community, timeout=timeout) as session:
            session.get(SYS_UPTIME)
    except (TimeoutError, OSError, SnmpError):
        return False
    return True


class Simulator(ABC):
    """A simulated device process: `start()` waits until it answers, `stop()` is idempotent."""

    log_file: Path
    """Where the simulator's output goes."""

    @abstractmethod
    def start(self) -> Any:
        """Start, and return once it answers (raise with `log_tail()` otherwise)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop it; safe to call twice."""

    @property
    @abstractmethod
    def pid(self) -> int | None:
        """The process id while it runs (paused included), else None."""

    def pause(self) -> None:
        """SIGSTOP: the device keeps its sockets but answers nothing (clients time out)."""
        os.kill(self._running_pid(), signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT: it answers again (first what queued up while paused)."""
        os.kill(self._running_pid(), signal.SIGCONT)

    def _running_pid(self) -> int:
        if (pid := self.pid) is None:
            raise RuntimeError(f"{self!r} is not running")
        return pid

    def log_tail(self, lines: int = 20) -> str:
        """The last `lines` lines of its log, for error messages."""
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ChildProcess(Simulator):
    """A simulator run as a child of this process (snmpd, ipmi_sim), output to `log_file`."""

    _proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    def _spawn(
        self,
        argv: Sequence[str],
        ready: Callable[[], bool],
        timeout: float,
        what: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Start `argv` and wait until `ready()`; RuntimeError with the end of the log if it
        exits or is not ready within `timeout` s (`what`: e.g. "answer on 127.0.0.1:161")."""
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a Ctrl-C in a terminal does not reach it
            )
        name = Path(argv[0]).name
        deadline = time.monotonic() + timeout
        while not ready():
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with status {self._proc.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"{name} did not {what} within {timeout:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.02)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, SIGKILL after `timeout`; safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_child(proc, timeout)
