"""Per-token limits of pushes, in this API process: how many readings a token may push per
second (a token bucket: `push_rate_readings_per_s`, up to `push_rate_burst` at once) and how
many new series it may start per window (`push_max_new_series` per `push_series_window_s`).

A series is (device, metric, labels); it is new when this token has not pushed it within the
window. Memory is bounded: a token remembers at most `push_max_new_series` series (as 64-bit
hashes; the least recently pushed are forgotten first and count as new again, so that is also
how many series a token can keep alive), and at most `push_tracked_tokens` tokens are tracked
(the longest idle go first): about 150 bytes x both limits at worst. Each API replica counts
on its own: behind N replicas a token may reach N times the limits.

Over a limit: 429 with Retry-After and a message naming the setting; nothing is written.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from starlette.exceptions import HTTPException

from api.infra.config import ApiSettings
from kafka.reading import Reading


@dataclass
class _Token:
    tokens: float
    """What the rate bucket holds (readings)."""
    refilled: float
    """When the bucket was last refilled (monotonic seconds)."""
    known: OrderedDict[int, float] = field(default_factory=OrderedDict)
    """Series hash -> last pushed (monotonic), least recent first."""
    started: deque[float] = field(default_factory=deque)
    """When each series started within the window was first pushed, oldest first."""


def _too_many(message: str, retry_after_s: float) -> HTTPException:
    seconds = max(1, math.ceil(retry_after_s))
    return HTTPException(429, f"{message}; retry in {seconds} s", {"Retry-After": str(seconds)})


class PushLimits:
    """The rate and new-series limits of every pusher token; thread-safe (the route admits the
    rate on the event loop, the series in a worker thread)."""

    def __init__(self, settings: ApiSettings) -> None:
        self.rate = settings.push_rate_readings_per_s
        self.burst = max(settings.push_rate_burst, settings.push_max_readings)
        self.max_new = settings.push_max_new_series
        self.window = settings.push_series_window_s
        self.max_tokens = settings.push_tracked_tokens
        self._tokens: OrderedDict[tuple[str, str], _Token] = OrderedDict()
        self._lock = threading.Lock()

    def _token(self, key: tuple[str, str], now: float) -> _Token:
        state = self._tokens.get(key)
        if state is None:
            state = self._tokens[key] = _Token(float(self.burst), now)
            while len(self._tokens) > self.max_tokens:
                self._tokens.popitem(last=False)
        self._tokens.move_to_end(key)
        return state

    def admit_rate(self, key: tuple[str, str], count: int) -> None:
        """Take `count` readings from the token's bucket, or raise 429 (taking nothing)."""
        with self._lock:
            now = time.monotonic()
            state = self._token(key, now)
            state.tokens = min(self.burst, state.tokens + (now - state.refilled) * self.rate)
            state.refilled = now
            if count > state.tokens:
                raise _too_many(
                    f"push rate over {self.rate:g} readings/s, {self.burst} at once "
                    "(JOBSCOPE_PUSH_RATE_READINGS_PER_S, JOBSCOPE_PUSH_RATE_BURST)",
                    (count - state.tokens) / self.rate,
                )
            state.tokens -= count

    def admit_series(self, key: tuple[str, str], readings: Sequence[Reading]) -> None:
        """Count the series of `readings` this token has not pushed within the window; raise
        429 if they would start more than the limit allows (remembering nothing)."""
        series = {
            hash((r.device_id, r.metric_id, tuple(sorted(r.labels.items())))) for r in readings
        }
        with self._lock:
            now = time.monotonic()
            state = self._token(key, now)
            horizon = now - self.window
            while state.started and state.started[0] < horizon:
                state.started.popleft()
            while state.known and next(iter(state.known.values())) < horizon:
                state.known.popitem(last=False)
            new = [s for s in series if s not in state.known]
            if len(state.started) + len(new) > self.max_new:
                wait = state.started[0] - horizon if state.started else self.window
                raise _too_many(
                    f"{len(new)} new series; this token may start {self.max_new} per "
                    f"{self.window:g} s and has {self.max_new - len(state.started)} left "
                    "(JOBSCOPE_PUSH_MAX_NEW_SERIES, JOBSCOPE_PUSH_SERIES_WINDOW_S)",
                    wait,
                )
            state.started.extend(now for _ in new)
            for s in series:
                state.known[s] = now
                state.known.move_to_end(s)
            while len(state.known) > self.max_new:
                state.known.popitem(last=False)
