"""What the polling benchmarks share: one stack (Kafka, ClickHouse, the API) started once for
all of them, jobscope's producer started in it for one part, and the end of a log for error
messages."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from stack import services
from stack.config import REPO_ROOT, StackSettings
from stack.processes import ManagedProcess, wait_until

log = logging.getLogger("bench.polling")


def tail(path: Path, lines: int = 30) -> str:
    """The last `lines` of a log, for an error message."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


# The stack's parts in the order they start (each needs the ones before it).
COMPONENTS = ("kafka", "clickhouse", "api")


class PollingStack:
    """One stack for every polling benchmark of a run, in `state_dir` (emptied first), each
    part started the first time a benchmark asks for it (`need`) and kept until `close`.
    Starting Kafka (Maven's classpath, the JVM), ClickHouse (the schema's migrations) and the
    API took each benchmark 20-40 s when each had its own; what they measure (the producer's
    or the API's CPU, a latency through the stack) does not need a stack of its own. Every
    benchmark stops what it started in it (`producer`, `whole_stack`), so that the next one
    finds only the stack; readings topic counters start at its end (bench/polling/topic.py)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.started: list[str] = []
        self._settings: StackSettings | None = None

    def need(self, *components: str) -> StackSettings:
        """The stack's settings, with `components` (and those they need) running."""
        unknown = set(components) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"no such part of the stack: {', '.join(sorted(unknown))}")
        if self._settings is None:
            self._settings = services.fresh_stack(self.state_dir)
            self._settings.state_dir.mkdir(parents=True)
        last = max(COMPONENTS.index(c) for c in components) if components else -1
        for name in COMPONENTS[: last + 1]:
            if name not in self.started:
                began = time.monotonic()
                STARTERS[name](self._settings)
                self.started.append(name)
                log.info("polling stack: %s up in %.1f s", name, time.monotonic() - began)
        return self._settings

    @property
    def settings(self) -> StackSettings:
        """The running stack's settings (after a `need`)."""
        if self._settings is None:
            raise RuntimeError("the polling stack is not started: need() first")
        return self._settings

    def close(self) -> None:
        """Stop everything the stack's folder started (a benchmark's leftovers included)."""
        if self._settings is not None:
            services.stop_all(self._settings)
            self._settings = None
            self.started.clear()

    def __enter__(self) -> PollingStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


STARTERS: dict[str, Callable[[StackSettings], object]] = {
    "kafka": services.start_kafka,
    "clickhouse": services.start_clickhouse,
    "api": services.start_api,
}


@contextmanager
def whole_stack(stack: PollingStack, devices: Path) -> Iterator[StackSettings]:
    """The stack with its API, and jobscope's producers polling `devices` (a process of the
    benchmark's own, named after the file's folder), stopped when the block ends."""
    settings = stack.need(*COMPONENTS)
    proc = services.start_producers(settings, devices, name=f"producers-{devices.parent.name}")
    try:
        yield settings
    finally:
        proc.stop(timeout=30)


@contextmanager
def producer(
    stack: PollingStack,
    devices: Path,
    ready: Callable[[], bool],
    what: str,
    timeout_s: float,
    **env: str,
) -> Iterator[ManagedProcess]:
    """`start_producer` in `stack` (already holding what the benchmark needs), named after
    the devices file's folder, stopped when the block ends."""
    proc = start_producer(
        stack.settings,
        devices,
        ready,
        what,
        timeout_s,
        name=f"producers-{devices.parent.name}",
        **env,
    )
    try:
        yield proc
    finally:
        proc.stop(timeout=30)


def start_producer(
    settings: StackSettings,
    devices: Path,
    ready: Callable[[], bool],
    what: str,
    timeout_s: float,
    name: str = "producers",
    **env: str,
) -> ManagedProcess:
    """`python -m producers --devices DEVICES` in the stack of `settings` (extra `env`
    settings), once `ready()`; RuntimeError with its log's end if it exits first. `name`:
    its PID and log files' (`ManagedProcess.start` leaves a running process of that name
    alone)."""
    proc = ManagedProcess(name, settings.pid_dir, settings.log_dir)
    proc.start(
        [sys.executable, "-m", "producers", "--devices", str(devices)],
        env={**services.component_env(settings), **env},
        cwd=REPO_ROOT,
    )
    wait_until(lambda: ready() or not proc.is_running(), timeout_s, what)
    if not proc.is_running():
        raise RuntimeError("producer exited:\n" + tail(proc.log_file))
    return proc
