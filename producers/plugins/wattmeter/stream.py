"""A meter's byte stream, read in the background into a bounded buffer that each poll empties.

The bytes come from a TCP connection or from a command's standard output (the way sites pipe
a meter into Kwollect's collector). Whatever ends a session (the meter closes or resets the
connection, the command exits, nothing arrives for `timeout_s`) is kept as the stream's
`problem`, and the stream starts again after a wait that doubles from RETRY_MIN_S up to
`retry_max_s` (back to RETRY_MIN_S once data flowed). The problem is cleared by the first
bytes of a new session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from producers.plugins.wattmeter.options import Command, Tcp

RETRY_MIN_S = 0.5
_STDERR_KEPT = 2000
_CLOSE_WAIT_S = 5.0

log = logging.getLogger(__name__)


class Taken(NamedTuple):
    items: list[bytes | None]
    """Chunks in arrival order; None where a session ended (its unfinished line is lost)."""
    dropped_lines: int
    """Lines dropped, whole, to keep the buffer under its limit."""
    tail_lost: bool
    """The data before `items` was dropped: a line the previous take left unfinished is
    one of the dropped lines."""


class Buffer:
    """What arrived since the last poll. At most `limit` bytes are kept: beyond it the oldest
    lines are dropped, whole, and counted, so memory stays bounded when polls stop."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: deque[bytes | None] = deque()
        self._size = 0
        self._dropped_lines = 0
        self._tail_lost = False

    def add(self, data: bytes) -> None:
        self._items.append(data)
        self._size += len(data)
        if self._size > self.limit:
            self._drop()

    def cut(self) -> None:
        """The session ended: a line it left unfinished must not continue in the next one."""
        if not self._items or self._items[-1] is not None:
            self._items.append(None)

    def take(self) -> Taken:
        """Everything buffered since the last call; empties the buffer."""
        taken = Taken(list(self._items), self._dropped_lines, self._tail_lost)
        self._items.clear()
        self._size = 0
        self._dropped_lines = 0
        self._tail_lost = False
        return taken

    def _drop(self) -> None:
        """Drop the oldest bytes down to the limit, then the rest of the line they ended in
        (its start is gone), so that what is left starts a line."""
        excess = self._size - self.limit
        while excess > 0:
            item = self._items.popleft()
            if item is None:
                continue
            if len(item) <= excess:
                self._dropped_lines += item.count(b"\n")
                self._size -= len(item)
                excess -= len(item)
            else:
                self._dropped_lines += item.count(b"\n", 0, excess)
                self._items.appendleft(item[excess:])
                self._size -= excess
                excess = 0
        while self._items and (head := self._items[0]) is not None:
            end = head.find(b"\n")
            if end < 0:
                self._items.popleft()
                self._size -= len(head)
                continue
            if rest := head[end + 1 :]:
                self._items[0] = rest
            else:
                self._items.popleft()
            self._size -= end + 1
            self._dropped_lines += 1
            break
        self._tail_lost = True


class _Receiver(asyncio.Protocol, asyncio.SubprocessProtocol):
    """Hands every chunk to `on_data` (a socket's, or a command's standard output)."""

    def __init__(self, on_data: Callable[[bytes], None]) -> None:
        self._on_data = on_data
        self.closed: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.stderr = b""

    def data_received(self, data: bytes) -> None:
        self._on_data(data)

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self._on_data(data)
        else:
            self.stderr = (self.stderr + data)[-_STDERR_KEPT:]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)


class Stream:
    """The background reader of one meter; `start` it from a running event loop."""

    def __init__(self, source: Tcp | Command, buffer: Buffer, timeout_s: float, retry_max_s: float):
        self.source = source
        self.buffer = buffer
        self.timeout_s = timeout_s
        self.retry_max_s = retry_max_s
        self.sessions = 0
        """Sessions opened so far (connections made, commands started)."""
        self._error: str | None = None
        self._connected = False
        self._got_data = False
        self._last_data = 0.0
        self._task: asyncio.Task[None] | None = None
        self._transport: asyncio.BaseTransport | None = None

    @property
    def problem(self) -> str | None:
        """Why no data flows now (the end of the last session, or silence), or None."""
        if self._connected and self._error is None:
            silent = time.monotonic() - self._last_data
            return f"no data for {silent:.0f} s" if silent > self.timeout_s else None
        return self._error

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"wattmeter {self.source}"
            )

    async def close(self) -> None:
        """Stop reading; waits for the reader at most `_CLOSE_WAIT_S` (a command whose exit
        the event loop is never told of must not hold a producer's shutdown)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=_CLOSE_WAIT_S)
            if not done:
                log.warning(
                    "wattmeter %s: its reader did not stop within %g s", self.source, _CLOSE_WAIT_S
                )
        self._close_transport()

    async def _run(self) -> None:
        delay = RETRY_MIN_S
        while True:
            self._got_data = False
            try:
                reason = await self._session()
            except TimeoutError:  # (an OSError too)
                reason = f"no connection within {self.timeout_s:g} s"
            except OSError as exc:
                reason = self._os_error(exc)
            finally:
                self._connected = False
                self._close_transport()
            self._error = reason
            self.buffer.cut()
            if self._got_data:
                delay = RETRY_MIN_S
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_max_s)

    async def _session(self) -> str:
        """Read until the stream ends or stays silent `timeout_s`; why it ended."""
        loop = asyncio.get_running_loop()
        receiver = _Receiver(self._on_data)
        self.sessions += 1
        if isinstance(self.source, Tcp):
            async with asyncio.timeout(self.timeout_s):
                self._transport, _ = await loop.create_connection(
                    lambda: receiver, self.source.host, self.source.port
                )
        else:
            self._transport, _ = await loop.subprocess_exec(
                lambda: receiver,
                *self.source.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: close() stops a pipeline
            )
        self._connected = True
        self._last_data = time.monotonic()
        while True:
            remaining = self._last_data + self.timeout_s - time.monotonic()
            if remaining <= 0:
                return f"no data for {self.timeout_s:g} s; restarting the stream"
            done, _ = await asyncio.wait({receiver.closed}, timeout=remaining)
            if done:
                return self._ended(receiver.closed.result(), receiver)

    def _on_data(self, data: bytes) -> None:
        self._last_data = time.monotonic()
        self._got_data = True
        self._error = None
        self.buffer.add(data)

    def _ended(self, exc: Exception | None, receiver: _Receiver) -> str:
        if isinstance(self.source, Tcp):
            return "connection closed by the meter" if exc is None else f"connection lost: {exc}"
        transport = self._transport
        code = (
            transport.get_returncode()
            if isinstance(transport, asyncio.SubprocessTransport)
            else None
        )
        lines = receiver.stderr.decode(errors="replace").strip().splitlines()
        return f"command exited with status {code}" + (f": {lines[-1]}" if lines else "")

    def _os_error(self, exc: OSError) -> str:
        if isinstance(self.source, Command) and isinstance(
            exc, FileNotFoundError | PermissionError
        ):
            return f"cannot run {self.source.argv[0]}: {exc.strerror}"
        if isinstance(exc, socket.gaierror):
            return f"cannot resolve {self.source}: {exc.strerror}"
        if exc.errno:  # asyncio's own text names the address the error already does
            return os.strerror(exc.errno)
        return str(exc) or type(exc).__name__

    def _close_transport(self) -> None:
        transport, self._transport = self._transport, None
        if transport is None:
            return
        if isinstance(transport, asyncio.SubprocessTransport):
            pid = transport.get_pid()
            if transport.get_returncode() is None and pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGTERM)
        transport.close()
