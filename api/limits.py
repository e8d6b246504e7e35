"""Bounds on what one request may ask (devices, metrics, the size of a JSON answer) and on
how many readings answers stream at once, each refusal naming the setting behind it.

A JSON answer is one array the client must hold whole (the other formats are read as they
come): one spanning more than `json_max_span_s` is counted first, stopping at
`json_max_readings`, and refused (400, pointing to the streamed formats) past it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sized
from datetime import datetime

from api.errors import Busy, ParameterError

STREAMED = "format=ndjson, csv, parquet or arrow (streamed as they are read)"


def check_count(parameter: str, names: Sized, limit: int, setting: str, hint: str) -> None:
    """At most `limit` names in `parameter` (400 naming it otherwise)."""
    if len(names) > limit:
        raise ParameterError(
            parameter, f"{len(names)} given, at most {limit} per request ({setting}): {hint}"
        )


def json_span_over(
    fmt: str, start: datetime, end: datetime, step_s: int | None, limit_s: int
) -> bool:
    """Whether a JSON answer spans more than `limit_s` of raw readings, or more than `limit_s`
    buckets per series with a step (then its readings are counted before it is sent)."""
    if fmt != "json":
        return False
    span_s = (end - start).total_seconds()
    return span_s > limit_s if step_s is None else span_s / step_s > limit_s


def json_refused(limit_s: int, max_readings: int) -> ParameterError:
    return ParameterError(
        "format",
        f"a JSON answer over more than {limit_s} s of readings (or buckets; "
        f"JOBSCOPE_JSON_MAX_SPAN_S) holds at most {max_readings} readings "
        f"(JOBSCOPE_JSON_MAX_READINGS), and this one holds more: ask {STREAMED}, a step, "
        "or a shorter time range",
    )


class ExportSlots:
    """At most `limit` readings answers at once: each holds a ClickHouse query while it
    streams. Past the limit a request waits for a slot, at most `wait_s` and behind at most
    `queue` others (a burst of small answers is served in turn); beyond either it is refused
    (503, Retry-After) rather than left hanging."""

    def __init__(self, limit: int, queue: int, wait_s: float, retry_after_s: int) -> None:
        self.limit = limit
        self.queue = queue
        self.wait_s = wait_s
        self.retry_after_s = retry_after_s
        self.in_use = 0
        self.waiting = 0
        self._free = threading.Condition()

    def acquire(self) -> Callable[[], None]:
        """Take a slot (Busy when none frees in time); return its release, which may run
        twice."""
        with self._free:
            if self.in_use >= self.limit:
                if self.waiting >= self.queue:
                    raise self._busy(f"and {self.queue} more wait (JOBSCOPE_EXPORT_QUEUE)")
                self.waiting += 1
                try:
                    freed = self._free.wait_for(lambda: self.in_use < self.limit, self.wait_s)
                finally:
                    self.waiting -= 1
                if not freed:
                    raise self._busy(f"none freed in {self.wait_s:g} s (JOBSCOPE_EXPORT_WAIT_S)")
            self.in_use += 1
        released = threading.Event()

        def release() -> None:
            with self._free:
                if not released.is_set():
                    released.set()
                    self.in_use -= 1
                    self._free.notify()

        return release

    def _busy(self, why: str) -> Busy:
        return Busy(
            f"{self.limit} readings answers are streaming (JOBSCOPE_MAX_EXPORTS), {why}: "
            f"try again in {self.retry_after_s} s",
            self.retry_after_s,
        )
