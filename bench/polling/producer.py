"""What the polling benchmarks share about the process they measure: jobscope's producer
started in a benchmark's stack, and the end of a log for error messages."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from bench.systems.base import wait_for
from stack import services
from stack.config import REPO_ROOT, StackSettings
from stack.processes import ManagedProcess


def tail(path: Path, lines: int = 30) -> str:
    """The last `lines` of a log, for an error message."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


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
    wait_for(lambda: ready() or not proc.is_running(), timeout_s, what)
    if not proc.is_running():
        raise RuntimeError("producer exited:\n" + tail(proc.log_file))
    return proc
