"""Start detached processes with a log file and a PID file; stop exactly those processes."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from stack import secrets

T = TypeVar("T")

_REPR_MAX = 300


def wait_until(
    check: Callable[[], T],
    timeout: float,
    what: str,
    interval: float = 0.2,
    transient: tuple[type[Exception], ...] = (),  # stack/transient.py
) -> T:
    """Poll `check` every `interval` s until it returns a truthy value, and return that value.

    An AssertionError, or any exception not in `transient`, raised by `check` fails at once:
    a check that is wrong now will not become right by waiting. A `transient` one is retried.
    After `timeout` s, TimeoutError names `what` and the last value `check` returned, chained
    to the last transient exception it raised."""
    deadline = time.monotonic() + timeout
    last: str = "none (every call raised)"
    last_exc: Exception | None = None
    while True:
        try:
            value = check()
        except AssertionError:
            raise
        except transient as exc:
            last_exc = exc
        else:
            if value:
                return value
            last = _short_repr(value)
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"timed out after {timeout:g} s waiting for {what}; last value: {last}"
            ) from last_exc
        time.sleep(min(interval, left))


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_MAX else f"{text[:_REPR_MAX]}... ({len(text)} chars)"


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port nothing listens on now on 127.0.0.1 (TCP by default), picked by the kernel."""
    return free_ports(1, kind)[0]


def free_ports(n: int, kind: int = socket.SOCK_STREAM) -> list[int]:
    """`n` distinct ports nothing listens on now on 127.0.0.1 (TCP by default): each held
    while the next is picked (the kernel may hand out a port again once it is released)."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket(socket.AF_INET, kind)) for _ in range(n)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0


def shared_dir(path: Path) -> Path:
    """`path`, or, when root runs a process as another user (nobody, postgres) who could not
    traverse one of its parents (a clone in a private folder), a folder of the system's
    temporary directory named after `path`."""
    path = path.resolve()
    if os.geteuid() != 0 or all(
        p.stat().st_mode & stat.S_IXOTH for p in path.parents if p.exists()
    ):
        return path
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"jobscope-{path.name}-{digest}"


def stop_child(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Stop a child process: SIGCONT (a stopped process would not act on SIGTERM), SIGTERM,
    SIGKILL after `timeout` s; nothing if it already exited."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


class ManagedProcess:
    """One long-running process of the stack, known by name, its PID file and its log file."""

    def __init__(self, name: str, pid_dir: Path, log_dir: Path) -> None:
        self.name = name
        self.pid_file = pid_dir / f"{name}.pid"
        self.log_file = log_dir / f"{name}.log"

    def pid(self) -> int | None:
        """The PID of the running process, or None: a PID file whose process is gone, or
        whose PID now names another process (after a reboot, or once recycled), is stale."""
        try:
            pid, *identity = self.pid_file.read_text().split()
            pid_number = int(pid)
        except (FileNotFoundError, ValueError):
            return None
        if not is_alive(pid_number) or not _same_process(pid_number, identity, self.pid_file):
            return None
        return pid_number

    def is_running(self) -> bool:
        return self.pid() is not None

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        ports: Sequence[tuple[str, int]] = (),
        account: tuple[int, int] | None = None,
        pass_fds: Sequence[int] = (),
    ) -> int:
        """Start `argv` detached (own session), appending output to the log file, with the
        calling shell's environment less its secrets (stack.secrets.public_environ) plus
        `env`, as `account` (uid, gid; root only) when given, files it creates private.

        Refuses when one of `ports` is already taken by a process this one did not start.
        """
        if (pid := self.pid()) is not None:
            return pid
        for host, port in ports:
            if port_in_use(host, port):
                raise RuntimeError(
                    f"cannot start {self.name}: {host}:{port} is already in use by another "
                    "process (another jobscope? set the JOBSCOPE_*_PORT variables)"
                )
        self.pid_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        as_account = (
            {"user": account[0], "group": account[1], "extra_groups": []} if account else {}
        )
        log_fd = os.open(self.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with open(log_fd, "ab") as log:
            proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**secrets.public_environ(), **(env or {})},
                cwd=cwd,
                start_new_session=True,
                pass_fds=tuple(pass_fds),
                umask=0o077,
                **as_account,
            )
        secrets.write_private(self.pid_file, f"{proc.pid} {_identity(proc.pid)}\n")
        return proc.pid

    def wait_ready(
        self,
        check: Callable[[], object],
        timeout: float,
        what: str,
        interval: float = 0.2,
        transient: tuple[type[Exception], ...] = (),
    ) -> None:
        """`wait_until(check, ...)`, cut short when the process exits: a process that died
        starting fails at once with its log's path, not at the timeout."""
        wait_until(lambda: not self.is_running() or check(), timeout, what, interval, transient)
        if not self.is_running():
            raise RuntimeError(f"{self.name} exited before {what}: see {self.log_file}")

    def stop(self, timeout: float = 20.0, sig: int = signal.SIGTERM) -> None:
        """Send `sig` to the process group, escalate to SIGKILL after `timeout`."""
        pid = self.pid()
        if pid is not None:
            _signal_group(pid, sig)
            try:
                wait_until(lambda: self.pid() is None, timeout, f"{self.name} to exit")
            except TimeoutError:
                _signal_group(pid, signal.SIGKILL)
                wait_until(lambda: self.pid() is None, 10, f"{self.name} to die")
        self.pid_file.unlink(missing_ok=True)

    def kill(self) -> None:
        """kill -9, as a crash would: for fault-injection tests."""
        self.stop(timeout=0.0, sig=signal.SIGKILL)


def is_alive(pid: int) -> bool:
    """Running, as opposed to gone or exited and waiting to be reaped. A zombie leader counts
    as gone only once its other threads are gone too: they may still hold its sockets while
    a multi-threaded process is torn down."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False
    return not (state in "ZX" and threads <= 1)


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _start_ticks(pid: int) -> int:
    """When `pid` started, in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])


def _identity(pid: int) -> str:
    """What tells this process from a later one with the same PID: its start and the boot."""
    return f"{_start_ticks(pid)} {_boot_id()}"


def _same_process(pid: int, identity: Sequence[str], pid_file: Path) -> bool:
    """Whether `pid` is the process its PID file was written for. A file of an older
    release (the PID alone) is trusted only if the process started before it was written."""
    try:
        if identity:
            return " ".join(identity) == _identity(pid)
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        started = boot + _start_ticks(pid) / os.sysconf("SC_CLK_TCK")
        return started <= pid_file.stat().st_mtime + 2.0
    except (OSError, IndexError, ValueError, StopIteration):
        return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)
