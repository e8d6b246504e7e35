"""What the polling benchmarks share about the process they measure: jobscope's producer
started in a benchmark's stack, a whole fresh stack, and the end of a log for error
messages."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from stack import services
from stack.config import REPO_ROOT, StackSettings
from stack.processes import ManagedProcess, wait_until


def tail(path: Path, lines: int = 30) -> str:
    """The last `lines` of a log, for an error message."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


@contextmanager
def whole_stack(state_dir: Path, write_devices: Callable[[Path], Path]) -> Iterator[StackSettings]:
    """A fresh stack in `state_dir` (Kafka, ClickHouse, the API, producers polling the
    devices file `write_devices` writes into the given path), stopped when the block ends."""
    settings = services.fresh_stack(state_dir)
    settings.state_dir.mkdir(parents=True)
    devices = write_devices(settings.state_dir / "devices.yaml")
    try:
        services.start_kafka(settings)
        services.start_clickhouse(settings)
        services.start_api(settings)
        services.start_producers(settings, devices)
        yield settings
    finally:
        services.stop_all(settings)


def start_producer(
    settings: StackSettings,
    devices: Path,
    ready: Callable[[], bool],
    what: str,
    timeout_s: float,
    **env: str,
) -> ManagedProcess:
    """`python -m producers --devices DEVICES` in the stack of `settings` (extra `env`
    settings), once `ready()`; RuntimeError with its log's end if it exits first."""
    proc = ManagedProcess("producers", settings.pid_dir, settings.log_dir)
    proc.start(
        [sys.executable, "-m", "producers", "--devices", str(devices)],
        env={**services.component_env(settings), **env},
        cwd=REPO_ROOT,
    )
    wait_until(lambda: ready() or not proc.is_running(), timeout_s, what)
    if not proc.is_running():
        raise RuntimeError("producer exited:\n" + tail(proc.log_file))
    return proc
