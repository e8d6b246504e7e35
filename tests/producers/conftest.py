"""What the producers' tests share."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kafka.message import unpack
from producers.publisher import DeliveryCounters, QueueDepth


class RecordingPublisher:
    """Stands in for the Kafka client where the subject is the runtime's schedule: keeps
    each message's device and timestamp. With `slow_publish=n`, the n-th publish takes
    250 ms, as when the client's queue is full."""

    def __init__(self, slow_publish: int | None = None) -> None:
        self.counters = DeliveryCounters()
        self.fatal_error = None
        self.sent: list[tuple[str, int]] = []
        self.slow_publish = slow_publish
        self.json_topic = ""

    async def publish(
        self, device_id: str, payload: bytes, readings: int, json: bytes = b""
    ) -> None:
        self.sent.append((device_id, unpack(payload)[0].timestamp_us))
        if len(self.sent) == self.slow_publish:
            await asyncio.sleep(0.25)

    async def wait_for(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll `check` (of what was sent) on the runtime's event loop, or fail naming `what`."""
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}: {self.sent}")
            await asyncio.sleep(0.05)

    def serve_callbacks(self) -> None:
        pass

    def undelivered(self) -> int:
        return 0

    def depth(self) -> QueueDepth:
        return QueueDepth(0, 0, 0, 0, 0, 0)
