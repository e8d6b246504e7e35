"""Files, processes and secrets of the stack: a private state directory, each process with
its own secrets only, the ClickHouse server under an account of its own when started as
root (an SQL `file()` that slipped through finds nothing to steal), PID files that cannot
make `make down` signal an unrelated process, device credentials never logged."""

from __future__ import annotations

import os
import pwd
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from stack import secrets, services
from stack.config import REPO_ROOT, StackSettings
from stack.processes import ManagedProcess, free_port, is_alive, wait_until

AS_ROOT = os.geteuid() == 0
root_only = pytest.mark.skipif(not AS_ROOT, reason="the engine's own account needs root")


def environ_of(pid: int) -> str:
    return Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b"\n").decode()


def test_state_directory_and_secrets_are_private(clickhouse: StackSettings) -> None:
    state = clickhouse.state_dir
    mode = state.stat()
    if AS_ROOT:  # its group (the engine's account) may only traverse it
        engine = pwd.getpwnam(clickhouse.clickhouse_account)
        assert (stat.S_IMODE(mode.st_mode), mode.st_gid) == (0o710, engine.pw_gid)
    else:
        assert stat.S_IMODE(mode.st_mode) == 0o700
    secrets_file = state / "secrets.env"
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    assert secrets_file.stat().st_uid == os.geteuid()
    for path in (*state.iterdir(), *clickhouse.log_dir.iterdir()):
        assert not path.lstat().st_mode & 0o007, f"{path} is open to other accounts"
        if path.is_file():
            assert not path.stat().st_mode & 0o077, f"{path} is readable by others"


def test_secrets_file_and_folder_are_private_whatever_the_umask(tmp_path: Path) -> None:
    state = tmp_path / "new-state"
    old = os.umask(0)
    try:
        values = secrets.load_or_create(state)
    finally:
        os.umask(old)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((state / "secrets.env").stat().st_mode) == 0o600
    assert secrets.load_or_create(state) == values  # read back, not drawn again


def test_each_process_holds_only_its_own_secrets(
    clickhouse: StackSettings, api_url: str, tmp_path: Path
) -> None:
    devices = tmp_path / "devices.yaml"
    devices.write_text("- {name: env_value, device_id: env-1, url: 'tester://?metrics=1'}\n")
    producers = services.start_producers(clickhouse, devices, name="producers-env")
    try:
        # set at the end of the exec that Popen returns from: read once the process runs
        wait_until(
            lambda: environ_of(producers.pid() or 0) != "",
            10,
            "the producers to run",
            transient=(FileNotFoundError,),  # no /proc entry before the process runs
        )
        values = secrets.load_or_create(clickhouse.state_dir)
        parts = {
            "kafka": services.process(clickhouse, "kafka").pid(),
            "clickhouse": services.process(clickhouse, "clickhouse").pid(),
            "api": services.process(clickhouse, "api").pid(),
            "producers": producers.pid(),
        }
        for part, pid in parts.items():
            assert pid is not None, part
            environ = environ_of(pid)
            # the ClickHouse server read its passwords from a pipe: none in its environment
            own = () if part == "clickhouse" else secrets.OWNERS[part]
            for name, value in values.items():
                if name not in own:
                    assert value not in environ, f"{part} (pid {pid}) holds {name}"
            for name in own:
                assert f"{name}={values[name]}" in environ.splitlines(), f"{part} lacks {name}"
    finally:
        producers.stop()


@root_only
def test_engine_runs_as_its_own_account_and_cannot_reach_secrets(
    clickhouse: StackSettings, admin_client: Client, api_url: str
) -> None:
    engine_pid = services.process(clickhouse, "clickhouse").pid()
    assert engine_pid is not None
    engine = pwd.getpwnam(clickhouse.clickhouse_account)
    assert os.stat(f"/proc/{engine_pid}").st_uid == engine.pw_uid != 0
    api_pid = services.process(clickhouse, "api").pid()
    venv_lib = Path(services.sysconfig.get_paths()["purelib"])
    # the admin may call file(): the operating system stops it
    for statement in (
        f"SELECT * FROM file('{clickhouse.state_dir / 'secrets.env'}', 'LineAsString')",
        f"SELECT * FROM file('/proc/{api_pid}/environ', 'LineAsString')",
        f"SELECT * FROM file('{clickhouse.log_dir / 'api.log'}', 'LineAsString')",
        f"INSERT INTO FUNCTION file('{venv_lib / 'jobscope-owned.pth'}', 'LineAsString') "
        "SELECT 'import os'",
        f"INSERT INTO FUNCTION file('{REPO_ROOT / 'jobscope-owned.py'}', 'LineAsString') "
        "SELECT 'x'",
    ):
        with pytest.raises(Exception, match="Permission denied") as refused:
            admin_client.command(statement)
        assert "errno: 13" in str(refused.value), statement
    assert not (venv_lib / "jobscope-owned.pth").exists()
    assert not (REPO_ROOT / "jobscope-owned.py").exists()


def _sleeper() -> subprocess.Popen[bytes]:
    """An unrelated process leading its own process group, as a recycled PID would name."""
    return subprocess.Popen(["sleep", "300"], start_new_session=True)


def test_stale_pid_files_never_signal_another_process(tmp_path: Path) -> None:
    settings = StackSettings(state_dir=tmp_path / "state")
    settings.pid_dir.mkdir(parents=True)
    sleepers = [_sleeper(), _sleeper()]
    try:
        # an older release's file (the PID alone), written before that process started
        legacy = settings.pid_dir / "api.pid"
        legacy.write_text(f"{sleepers[0].pid}\n")
        long_ago = time.time() - 3600
        os.utime(legacy, (long_ago, long_ago))
        # a file of this release naming the PID of a process that started at another time
        current = settings.pid_dir / "producers.pid"
        current.write_text(
            f"{sleepers[1].pid} 1 {Path('/proc/sys/kernel/random/boot_id').read_text().strip()}\n"
        )
        proc = ManagedProcess("api", settings.pid_dir, settings.log_dir)
        assert proc.pid() is None and not proc.is_running()
        proc.stop(timeout=1)
        assert services.stop_all(settings, drain_timeout=1) == []
        for sleeper in sleepers:
            assert sleeper.poll() is None and is_alive(sleeper.pid)
    finally:
        for sleeper in sleepers:
            sleeper.send_signal(signal.SIGKILL)
            sleeper.wait()


def test_managed_process_is_stopped_by_its_pid_file(tmp_path: Path) -> None:
    proc = ManagedProcess("sleeper", tmp_path / "pids", tmp_path / "logs")
    pid = proc.start(["sleep", "300"])
    assert proc.pid() == pid
    assert stat.S_IMODE(proc.log_file.stat().st_mode) == 0o600
    proc.stop(timeout=10)
    assert not is_alive(pid)


def test_device_credentials_are_not_logged(clickhouse: StackSettings, tmp_path: Path) -> None:
    community = "c0mmunity-s3cret"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:  # takes, never answers
        silent.bind(("127.0.0.1", free_port(socket.SOCK_DGRAM)))
        port = silent.getsockname()[1]
        devices = tmp_path / "devices.yaml"
        devices.write_text(
            f"- {{name: sys_uptime, device_id: quiet-1, update_every: 1000,"
            f" url: 'snmp://{community}@127.0.0.1:{port}/1.3.6.1.2.1.1.3.0',"
            " options: {timeout_s: 0.2, retries: 0}}\n"
        )
        producers = services.start_producers(clickhouse, devices, name="producers-quiet")
        try:
            wait_until(
                lambda: "poll failed" in producers.log_file.read_text(),
                60,
                "the producers to log the failing poll",
            )
        finally:
            producers.stop()
    log = producers.log_file.read_text()
    assert f"url=snmp://***@127.0.0.1:{port}/" in log
    assert community not in log


@root_only
def test_a_private_checkout_is_opened_to_the_engine_account_alone(
    clickhouse: StackSettings, tmp_path: Path
) -> None:
    """A checkout in a folder closed to others (`mktemp -d`, /root) is let through by an ACL
    entry for the engine's account alone: it reads what it needs, `nobody` still cannot."""
    account = services.clickhouse_account(clickhouse)
    assert account is not None
    closed = tmp_path / "private"
    inner = closed / "inner"
    inner.mkdir(parents=True)
    closed.chmod(0o700)
    (inner / "code.py").write_text("x = 1\n")
    (inner / "code.py").chmod(0o644)

    def cat_as(uid: int, gid: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                "setpriv",
                f"--reuid={uid}",
                f"--regid={gid}",
                "--clear-groups",
                "cat",
                str(inner / "code.py"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )

    assert cat_as(*account).returncode != 0  # closed before
    services.let_account_reach(inner, *account, listed=True)
    assert cat_as(*account).stdout == "x = 1\n"
    nobody = pwd.getpwnam("nobody")
    assert cat_as(nobody.pw_uid, nobody.pw_gid).returncode != 0
    assert stat.S_IMODE(closed.stat().st_mode) & 0o007 == 0
